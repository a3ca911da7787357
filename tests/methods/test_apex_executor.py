"""The APEX executor's Algorithm 2 (executor.py) and its prompts' parsers (prompts.py): control
flow against scripted models and a scripted retriever, the oracle's trajectories, batching, and
malformed outputs that fall back instead of raising."""
import itertools

import pytest

from rlrag_jax.data.schema import Step
from rlrag_jax.methods.apex import executor, prompts
from rlrag_jax.methods.apex.prompts import Ask
from rlrag_jax.retrieval import Hit


def hit(i, text=""):
  return Hit(id=f"d{i}", score=1.0 - i / 100, title=f"T{i}", text=text or f"passage {i}")


class Script:
  """A model answering each Ask by a rule per kind; records every batch it was called with."""

  def __init__(self, **rules):
    self.rules, self.batches = rules, []

  def __call__(self, asks):
    self.batches.append(list(asks))
    out = []
    for a in asks:
      r = self.rules.get(a.kind, "")
      out.append(r(a) if callable(r) else r)
    return out


def fixed_search(*hit_lists):
  """Every query gets the next list of hits (the last one repeats)."""
  seq = iter(itertools.chain(hit_lists, itertools.repeat(hit_lists[-1])))
  queries = []

  def search(qs):
    queries.extend(qs)
    return [next(seq) for _ in qs]
  search.queries = queries
  return search


def run_one(plan, model, search, max_hops=3, **kw):
  return executor.run([executor.solve("Main?", plan, max_hops=max_hops, **kw)], model, search)[0]


# ------------------------------------------------------------------------------ parsers
@pytest.mark.parametrize("text,want", [("answer", ("answer", True)), ("Retrieve.", ("retrieve", True)),
                                       ("  ANSWER now", ("answer", True)), ("", ("retrieve", False)),
                                       (None, ("retrieve", False)), ("maybe", ("retrieve", False)),
                                       ("42 answer", ("answer", True)), (b"\xff", ("retrieve", False))])
def test_check_decision_parses_or_defaults_to_retrieve(text, want):
  assert prompts.parse_decision("check", text) == want


def test_continue_decision_defaults_to_stop_and_text_outputs_fall_back():
  assert prompts.parse_decision("continue", "continue") == ("continue", True)
  assert prompts.parse_decision("continue", "<junk>") == ("stop", False)
  assert prompts.parse_query("\n\n  Query: \"Who founded X?\"\nmore", "fb") == ("Who founded X?", True)
  assert prompts.parse_query("   \n", "Who is #1?") == ("Who is #1?", False)
  assert prompts.parse_answer("Answer: Rome\nbecause ...") == "Rome"
  assert prompts.parse_answer(12) == "12" and prompts.parse_answer(None) == ""
  assert prompts.first_line(" ".join(["w"] * 50), max_words=5) == "w w w w w"
  assert prompts.repeats("who founded x", ["Who founded X?"])
  assert not prompts.repeats("who founded y", ["Who founded X?"])
  assert prompts.normalized("Born in 1952!") == "born in 1952"


def test_prompts_render_their_sections():
  a = Ask("query", "Where was Ann born?", knowledge=(("Who wrote B?", "Ann"),),
          passages=(("Ann", "Ann was born in Rome."),), tried=("Ann birthplace",))
  text = a.text("compact")
  assert text.startswith("[query]\n") and text.endswith("Reply:")
  for piece in ("- Who wrote B? -> Ann", "[1] Ann: Ann was born in Rome.",
                "Question: Where was Ann born?", "Tried: Ann birthplace"):
    assert piece in text
  assert a.text("paper").startswith(prompts.INSTRUCTIONS["query_next"])
  assert Ask("query", "q").instruction() == prompts.INSTRUCTIONS["query"]
  assert "Hop 2 of 3" in Ask("continue", "q", hop=2, max_hops=3).text()
  assert "Main question: M" in Ask("synthesis", "M").text()
  msgs = a.chat_messages()
  assert [m["role"] for m in msgs] == ["system", "user"] and "Tried:" in msgs[1]["content"]


# ------------------------------------------------------------------------------ Algorithm 2
def test_sufficient_knowledge_skips_retrieval():
  model = Script(check="answer", known_answer="Rome", synthesis="Rome")
  search = fixed_search([hit(1)])
  t = run_one(["Where?"], model, search)
  assert search.queries == [] and t.retrievals == 0
  assert [a.kind for a, _ in t.calls] == ["check", "known_answer", "synthesis"]
  assert t.answer == "Rome" and t.counts()["skipped_retrieval"] == 1


def test_hops_are_bounded_and_continuation_is_asked_from_the_second_hop():
  model = Script(check="retrieve", query=lambda a: f"q{len(a.tried)}", **{"continue": "continue"},
                 sub_answer="A", synthesis="A")
  search = fixed_search([hit(1)], [hit(2)], [hit(3)], [hit(4)])
  t = run_one(["S?"], model, search, max_hops=3)
  kinds = [a.kind for a, _ in t.calls]
  assert kinds == ["check", "query", "continue", "query", "continue", "query", "sub_answer",
                   "synthesis"]
  assert search.queries == ["q0", "q1", "q2"] and t.steps[0]["stopped_by"] == "max_hops"
  conts = [a for a, _ in t.calls if a.kind == "continue"]
  assert [(c.hop, c.max_hops) for c in conts] == [(1, 3), (2, 3)]
  # the later query prompt lists the earlier queries; the answer sees every new passage
  assert [a.tried for a, _ in t.calls if a.kind == "query"] == [(), ("q0",), ("q0", "q1")]
  answer_ask = next(a for a, _ in t.calls if a.kind == "sub_answer")
  assert [p[0] for p in answer_ask.passages] == ["T1", "T2", "T3"]


def test_stop_decision_and_nothing_new_end_the_loop():
  model = Script(check="retrieve", query="same query", **{"continue": "stop"}, sub_answer="A",
                 synthesis="A")
  t = run_one(["S?"], model, fixed_search([hit(1)]))
  assert t.steps[0]["stopped_by"] == "decision" and t.retrievals == 1
  model.rules["continue"] = "continue"
  search = fixed_search([hit(1), hit(2)], [hit(2), hit(1)])       # the second hop: nothing new
  t = run_one(["S?"], model, search)
  s = t.steps[0]
  assert s["stopped_by"] == "nothing_new" and s["retrieved"] == [["d1", "d2"], []]
  assert s["repeated_queries"] == 1 and t.retrievals == 2
  answer_ask = next(a for a, _ in t.calls if a.kind == "sub_answer")
  assert len(answer_ask.passages) == 2                            # seen passages are not repeated


def test_references_are_resolved_with_earlier_sub_answers():
  answers = iter(["Ann Bell", "Rome"])
  model = Script(check="retrieve", query=lambda a: a.question, **{"continue": "stop"},
                 sub_answer=lambda a: next(answers), synthesis="Rome")
  search = fixed_search([hit(1)])
  t = run_one(["Who wrote B?", "Where was #1 born?"], model, search)
  assert search.queries == ["Who wrote B?", "Where was Ann Bell born?"]
  assert t.steps[1]["resolved"] == "Where was Ann Bell born?"
  synth = t.calls[-1][0]
  assert synth.knowledge == (("Who wrote B?", "Ann Bell"), ("Where was Ann Bell born?", "Rome"))


def test_malformed_outputs_fall_back_and_never_raise():
  junk = Script(check="%%%", query="", **{"continue": "?!"}, sub_answer="", synthesis="\n\n")
  t = run_one(["S1?", "S2 #1?", "S3 #7?"], junk, fixed_search([hit(1)]))
  assert [s["decision"] for s in t.steps] == ["retrieve"] * 3      # the safe default
  assert [s["queries"] for s in t.steps] == [["S1?"], ["S2 #1?"], ["S3 #7?"]]  # the sub-question
  assert [s["stopped_by"] for s in t.steps] == ["decision"] * 3    # 'continue' junk: stop
  assert t.answer == "" and t.counts()["parse_fallbacks"] == 9     # check, query, continue


def test_questions_are_batched_per_round():
  model = Script(check="retrieve", query=lambda a: a.question, **{"continue": "stop"},
                 sub_answer="A", synthesis="A")
  calls = []

  def search(qs):
    calls.append(list(qs))
    return [[hit(1)] for _ in qs]
  procs = [executor.solve(f"M{i}?", [f"S{i}?"] * (i + 1), max_hops=2) for i in range(3)]
  traces = executor.run(procs, model, search)
  assert [len(t.steps) for t in traces] == [1, 2, 3]
  assert [len(b) for b in model.batches[:2]] == [3, 3] and calls[0] == ["S0?", "S1?", "S2?"]
  # every round is one model call: the longest plan (3 steps) takes 4 model rounds a step
  # (check, query, continue before hop 2, answer) and the synthesis
  assert len(model.batches) == 3 * 4 + 1


# ------------------------------------------------------------------------------ oracle
def _gold():
  return [Step("Who wrote B?", "Ann Bell", ["d1"]), Step("Where was #1 born?", "Rome", ["d2"]),
          Step("Is Rome older than Paris (#2)?", "yes", [])]


def test_oracle_trajectory_targets():
  gold = _gold()
  search = lambda qs: [[hit(1, "B was written by Ann Bell.")] if "wrote" in q else
                       [hit(2, "Ann Bell was born in Rome.")] for q in qs]
  procs = [executor.solve("Main?", [g.question for g in gold], max_hops=3, gold=gold,
                          gold_answer="yes")]
  t = executor.run(procs, executor.oracle_outputs, search)[0]
  assert t.supported and t.answer == "yes"
  got = [(a.kind, out) for a, out in t.calls]
  assert got == [("check", "retrieve"), ("query", "Who wrote B?"), ("continue", "stop"),
                 ("sub_answer", "Ann Bell"),
                 ("check", "retrieve"), ("query", "Where was Ann Bell born?"), ("continue", "stop"),
                 ("sub_answer", "Rome"),
                 ("check", "answer"), ("known_answer", "yes"), ("synthesis", "yes")]


def test_oracle_keeps_searching_with_an_entity_query_and_flags_missed_support():
  gold = [Step("Where was Ann Bell born?", "Rome", ["d9"])]
  search = fixed_search([hit(1)], [hit(2)], [hit(3)])
  t = executor.run([executor.solve("M?", ["Where was Ann Bell born?"], max_hops=3, gold=gold,
                                   gold_answer="Rome")], executor.oracle_outputs, search)[0]
  assert search.queries == ["Where was Ann Bell born?", "Ann Bell", "Ann Bell"]
  assert [out for a, out in t.calls if a.kind == "continue"] == ["continue", "continue"]
  assert not t.supported
  # an answer already known needs no passage: the oracle answers from knowledge
  gold = [Step("Who wrote B?", "Ann", ["d1"]), Step("Who is the author of B?", "Ann", ["d1"])]
  t = executor.run([executor.solve("M?", [g.question for g in gold], max_hops=2, gold=gold,
                                   gold_answer="Ann")], executor.oracle_outputs,
                   lambda qs: [[hit(1, "Ann wrote B.")] for _ in qs])[0]
  assert [s["decision"] for s in t.steps] == ["retrieve", "answer"] and t.supported
  with pytest.raises(ValueError, match="no target"):
    executor.oracle_outputs([Ask("check", "q")])


@pytest.mark.parametrize("q,want", [("Who was the director of The Journey and the Compass?",
                                     "The Journey and the Compass"),
                                    ("When was Silvar Arhaxnal born?", "Silvar Arhaxnal"),
                                    ("which one is older?", "")])
def test_entity_query(q, want):
  assert executor.entity_query(q) == want


def test_naive_rag_is_one_search_and_one_answer():
  model = Script(sub_answer="Rome")
  search = fixed_search([hit(1), hit(2)])
  t = executor.run([executor.naive_rag("Where?")], model, search)[0]
  assert search.queries == ["Where?"] and [a.kind for a, _ in t.calls] == ["sub_answer"]
  assert len(t.calls[0][0].passages) == 2 and t.answer == "Rome" and t.retrievals == 1
