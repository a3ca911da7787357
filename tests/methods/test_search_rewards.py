"""Learning When to Search: protocol, parser, conciseness rules and rewards, against hand values."""
import json
import math
import types

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rlrag_jax.data.schema import Context, Example, Step
from rlrag_jax.methods import search
from rlrag_jax.methods.search import conciseness, parsing, prompts, rewards

INFO = "\n\n<information>Doc 1 (Title: Titanic) Titanic is a 1997 film.</information>\n\n"


def _b(queries, answer="James Cameron", reflect="ok"):
  """A structure-(B) completion with one round per query."""
  rounds = "".join(f"\n<search>{q}</search>{INFO}<reflect>{reflect}</reflect>" for q in queries)
  return f"<think>need facts</think>{rounds}\n<answer>{answer}</answer>"


def _a(answer="James Cameron"):
  return f"<think>I know it</think>\n<reflect>sure</reflect>\n<answer>{answer}</answer>"


# ---------------------------------------------------------------- prompt and protocol

def test_build_prompt_holds_question_and_every_tag():
  p = search.build_prompt("  Who directed Titanic? ")
  assert p.endswith("Question: Who directed Titanic?\n")
  for tag in search.TAGS:
    assert f"<{tag}>" in p and f"</{tag}>" in p
  assert search.SEARCH_STOP == "</search>" and search.STOP_STRINGS == ("</search>",)


def test_format_observation_accepts_objects_pairs_and_dicts():
  hits = [types.SimpleNamespace(title="Titanic", text="A 1997 film."),
          ("James Cameron", "Canadian  director.\n"),
          {"title": "Avatar", "text": "A 2009 film."}]
  assert search.format_observation(hits) == (
      "Doc 1 (Title: Titanic) A 1997 film.\n"
      "Doc 2 (Title: James Cameron) Canadian director.\n"
      "Doc 3 (Title: Avatar) A 2009 film.")
  assert search.format_observation([]) == ""


def test_format_observation_removes_protocol_tags_from_documents():
  obs = search.format_observation([("T", "x </information> y <answer>z</answer>")])
  assert obs == "Doc 1 (Title: T) x y z"
  with pytest.raises(TypeError, match="hit 0 is int"):
    search.format_observation([3])


def test_observation_block_is_what_the_parser_reads_as_information():
  text = "<think>t</think><search>q</search>" + search.observation_block("Doc 1 (Title: a) b")
  text += "<reflect>r</reflect><answer>x</answer>"
  p = search.parse(text)
  assert p.structure == "B" and p.information == ["Doc 1 (Title: a) b"]


@pytest.mark.parametrize("text, query", [
    ("<think>t</think>\n<search> Titanic director </search>", "Titanic director"),
    ("<search>first</search> <information>i</information> <search>second</search>", "second"),
    ("<search>first</search> then <search>unfinished", None),      # last <search> is unclosed
    ("no tags at all", None),
    ("<search>   </search>", None),                                 # blank
    ("<search>a <think> b</search>", None),                         # holds another tag
    ("</search>", None),
])
def test_extract_query_takes_the_last_search(text, query):
  assert search.extract_query(text) == query


def test_extract_query_never_raises_on_odd_input():
  assert search.extract_query(None) is None
  assert search.extract_query(b"<search>x</search>") == "x"    # decoded, as parse does
  assert search.extract_query(b"<search>\xff</search>") == "\ufffd"
  assert search.extract_query(12) is None

  class Unprintable:
    def __str__(self):
      raise RuntimeError("no")
  assert search.extract_query(Unprintable()) is None
  assert search.parse(Unprintable()).errors == ["completion is not readable as text"]


# ---------------------------------------------------------------- parser

def test_structure_a():
  p = search.parse(_a())
  assert p.structure == "A" and p.valid and p.errors == []
  assert [t for t, _ in p.segments] == ["think", "reflect", "answer"]
  assert p.segments[0] == ("think", "I know it")
  assert p.answer == "James Cameron" and p.reflects == ["sure"]
  assert p.retrieval_count == 0 and p.queries == []


def test_structure_b_with_three_rounds():
  p = search.parse(_b(["Titanic director", "James Cameron birthplace", "Kapuskasing"]))
  assert p.structure == "B" and p.errors == []
  assert p.queries == ["Titanic director", "James Cameron birthplace", "Kapuskasing"]
  assert p.retrieval_count == 3 and len(p.information) == 3 and len(p.reflects) == 3
  assert [t for t, _ in p.segments] == (["think"] + ["search", "information", "reflect"] * 3
                                        + ["answer"])


def test_information_is_opaque_system_text():
  # Tags inside a system-written <information> block neither break nor add segments.
  text = ("<think>t</think><search>q</search>\n<information>Doc 1 (Title: x) <answer>no</answer>"
          " <search>z</search></information>\n<reflect>r</reflect><answer>yes</answer>")
  p = search.parse(text)
  assert p.structure == "B" and p.answer == "yes" and p.queries == ["q"]


BROKEN = {
    "missing think": "<reflect>r</reflect><answer>a</answer>",
    "missing reflect (A)": "<think>t</think><answer>a</answer>",
    "answer before reflect": "<think>t</think><answer>a</answer><reflect>r</reflect>",
    "search without information": "<think>t</think><search>q</search><reflect>r</reflect>"
                                  "<answer>a</answer>",
    "information without search": "<think>t</think><information>i</information>"
                                  "<reflect>r</reflect><answer>a</answer>",
    "no reflect after information": "<think>t</think><search>q</search>"
                                    "<information>i</information><answer>a</answer>",
    "search after reflect without think": "<search>q</search><information>i</information>"
                                          "<reflect>r</reflect><answer>a</answer>",
    "no answer": "<think>t</think><reflect>r</reflect>",
    "two answers": "<think>t</think><reflect>r</reflect><answer>a</answer><answer>b</answer>",
    "two thinks": "<think>t</think><think>t</think><reflect>r</reflect><answer>a</answer>",
    "text before": "Sure! <think>t</think><reflect>r</reflect><answer>a</answer>",
    "text between": "<think>t</think> so <reflect>r</reflect><answer>a</answer>",
    "text after": "<think>t</think><reflect>r</reflect><answer>a</answer> done",
    "unclosed answer": "<think>t</think><reflect>r</reflect><answer>a",
    "nested answer in think": "<think>t<answer>a</answer></think><reflect>r</reflect>"
                              "<answer>a</answer>",
    "stray closing tag": "<think>t</think></reflect><reflect>r</reflect><answer>a</answer>",
    "mismatched close": "<think>t</reflect><reflect>r</reflect><answer>a</answer>",
    "blank answer": "<think>t</think><reflect>r</reflect><answer>  </answer>",
    "blank query": "<think>t</think><search> </search><information>i</information>"
                   "<reflect>r</reflect><answer>a</answer>",
    "search after answer (A)": "<think>t</think><reflect>r</reflect><answer>a</answer>"
                               "<search>q</search>",
    "empty": "",
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_variants_are_invalid(name):
  p = search.parse(BROKEN[name])
  assert p.structure is None and not p.valid and p.errors, name
  assert search.reward(BROKEN[name], ["a"])["format"] == -1.0


def test_parse_recovers_queries_and_answer_from_invalid_output():
  p = search.parse("Sure. <think>x <search>q1</search> <search>q2</search> <answer>A</answer>")
  assert p.structure is None
  assert p.queries == ["q1", "q2"] and p.retrieval_count == 2 and p.answer == "A"
  # a blank search is not a search call, as for extract_query
  assert search.parse(BROKEN["blank query"]).retrieval_count == 0


def test_parse_never_raises_on_non_strings():
  for x in (None, b"<think>t</think>", 3.5, ["<answer>a</answer>"]):
    assert isinstance(search.parse(x), parsing.Parsed)


_TOKENS = st.sampled_from(
    [f"<{t}>" for t in prompts.TAGS] + [f"</{t}>" for t in prompts.TAGS]
    + ["", " ", "\n", "q", "who is it?", "Paris", "<", ">", "</", "<search", "search>"])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=200), st.lists(_TOKENS, max_size=30).map("".join)))
def test_parse_and_reward_never_raise(text):
  p = search.parse(text)
  assert p.retrieval_count == len(p.queries)
  assert (p.structure is None) == bool(p.errors)
  embed = lambda qs: np.array([[len(q) + 1.0, q.count("e") + 1.0] for q in qs])
  r = search.reward(text, ["Paris"], queries_embeddings=embed, stage=2)
  assert set(r) == {"format", "search", "answer", "total", "retrieval_count", "correct"}
  assert math.isclose(r["total"], r["format"] + r["search"] + r["answer"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["<search>", "</search>", "<think>", "</think>", "<answer>",
                                 "</answer>", " ", "q", "Paris"]), max_size=25).map("".join))
def test_extract_query_agrees_with_the_parser(text):
  # Without system blocks, the query the rollout would search is the parser's last query.
  q = search.extract_query(text)
  if q is not None:
    assert search.parse(text).queries[-1] == q


# ---------------------------------------------------------------- conciseness rules

RULE_CASES = {  # query that breaks exactly that one rule
    "non_empty": "   ",
    "question_mark": "Titanic director?",
    "question_word": "WHO directed Titanic",
    "filler_word": "information about Titanic director",
    "sentence_verb": "Titanic director is",
    "max_words": "Titanic 1997 film director birthplace Canada province",
}


def test_every_rule_has_a_case():
  assert set(RULE_CASES) == set(conciseness.RULE_NAMES)


@pytest.mark.parametrize("rule", sorted(RULE_CASES))
def test_each_rule_alone(rule):
  assert conciseness.violations(RULE_CASES[rule]) == [rule]
  assert not conciseness.is_concise(RULE_CASES[rule])


@pytest.mark.parametrize("query", [
    "Titanic director",
    "The Godfather director",                   # articles are allowed
    "Howard Hughes Isaac Whoopi",               # words containing listed words are fine
    "US president May 1968",                    # ambiguous name-words are not listed
    "Will Smith TV show",
    "Titanic 1997 film director birthplace Canada",   # exactly 6 words
])
def test_concise_queries(query):
  assert conciseness.violations(query) == []


def test_word_rules_are_case_insensitive_and_split_on_punctuation():
  assert conciseness.violations("Who's Titanic director") == ["question_word"]
  assert conciseness.violations("Tell me Titanic director") == ["sentence_verb"]
  assert conciseness.violations("PLEASE Titanic director") == ["filler_word"]
  assert conciseness.violations("a b c", max_words=2) == ["max_words"]
  assert conciseness.violations(None) == ["non_empty"]


def test_rule_lists_hold_the_documented_question_words():
  assert conciseness.QUESTION_WORDS == {
      "who", "what", "when", "where", "which", "why", "how", "whom", "whose"}


@pytest.mark.parametrize("question, query", [
    ("Who is the director of Titanic?", "the director of Titanic"),
    ("Blue Moon Rising >> performer", "Blue Moon Rising performer"),
    ("Who is the spouse of the director of film Polish Wedding?",   # 8 words -> drop 'of', 'the'
     "spouse director film Polish Wedding"),
    ("Who is it?", "it"),
    ("What is about?", ""),
])
def test_to_keywords(question, query):
  assert conciseness.to_keywords(question) == query


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=120))
def test_to_keywords_is_concise_or_empty(text):
  q = conciseness.to_keywords(text)
  assert q == "" or conciseness.is_concise(q)


# ---------------------------------------------------------------- search reward

def test_single_search_concise_vs_verbose():
  assert search.reward(_b(["Titanic director"]), ["James Cameron"])["search"] == 0.0
  assert search.reward(_b(["who directed the film Titanic?"]), ["James Cameron"])["search"] == -1.0
  assert search.reward(_a(), ["James Cameron"])["search"] == 0.0


def test_mean_pairwise_cosine_by_hand():
  # Unnormalised rows; cosines: (1,2) = 0, (1,3) = 1/sqrt2, (2,3) = 1/sqrt2 -> mean sqrt2/3.
  e = np.array([[2.0, 0.0, 0.0], [0.0, 3.0, 0.0], [4.0, 4.0, 0.0]])
  assert rewards.mean_pairwise_cosine(e) == pytest.approx(math.sqrt(2) / 3)
  # cosines 0.6, -1, -0.6 -> mean -1/3
  e2 = np.array([[1.0, 0.0], [0.6, 0.8], [-5.0, 0.0]])
  assert rewards.mean_pairwise_cosine(e2) == pytest.approx(-1 / 3)
  # a zero row has cosine 0 with the others: pairs (1,2)=1, (1,3)=0, (2,3)=0 -> 1/3
  assert rewards.mean_pairwise_cosine([[1, 1], [2, 2], [0, 0]]) == pytest.approx(1 / 3)


def test_multi_search_reward_is_minus_mean_pairwise_cosine():
  comp = _b(["Titanic director", "James Cameron birthplace", "Kapuskasing"])
  e = np.array([[2.0, 0.0, 0.0], [0.0, 3.0, 0.0], [4.0, 4.0, 0.0]])
  assert search.reward(comp, ["x"], queries_embeddings=e)["search"] == pytest.approx(
      -math.sqrt(2) / 3)
  # the callable form gets the parsed queries
  seen = []
  def embed(qs):
    seen.append(list(qs))
    return e
  assert search.reward(comp, ["x"], queries_embeddings=embed)["search"] == pytest.approx(
      -math.sqrt(2) / 3)
  assert seen == [["Titanic director", "James Cameron birthplace", "Kapuskasing"]]
  # two identical directions -> -1; RC > 1 ignores conciseness
  assert search.reward(_b(["who?", "who??"]), ["x"], queries_embeddings=[[1, 2], [2, 4]])[
      "search"] == pytest.approx(-1.0)


def test_missing_or_misshaped_embeddings_are_caller_errors():
  comp = _b(["a b", "c d", "e f"])
  with pytest.raises(ValueError, match=r"3 search calls.*\[3, d\]"):
    search.reward(comp, ["x"])
  with pytest.raises(ValueError, match=r"shape \[3, d\].*\(2, 2\)"):
    search.reward(comp, ["x"], queries_embeddings=np.ones((2, 2)))
  with pytest.raises(ValueError, match="NaN"):
    search.reward(comp, ["x"], queries_embeddings=np.full((3, 2), np.nan))
  # not needed when RC <= 1: ignored
  assert search.reward(_b(["a b"]), ["x"], queries_embeddings=np.ones((7, 2)))["search"] == 0.0


# ---------------------------------------------------------------- answer reward and total

E3 = np.array([[1.0, 0.0], [0.6, 0.8], [-5.0, 0.0]])       # mean pairwise cosine -1/3
QUERIES = {0: [], 1: ["Titanic director"],
           3: ["Titanic director", "James Cameron birthplace", "Kapuskasing"]}

# (stage, correct, RC) -> r_a, by hand with beta = 0.3
ANSWER_VALUES = {
    (1, True, 0): 1.0, (1, True, 1): 1.0, (1, True, 3): 1.0,
    (1, False, 0): -1.0, (1, False, 1): -0.7, (1, False, 3): -0.1,
    (2, True, 0): 1.0, (2, True, 1): 0.7, (2, True, 3): 0.1,
    (2, False, 0): -1.0, (2, False, 1): -1.0, (2, False, 3): -1.0,
}


@pytest.mark.parametrize("key", sorted(ANSWER_VALUES))
def test_answer_reward_stages(key):
  stage, correct, rc = key
  answer = "James Cameron" if correct else "Steven Spielberg"
  comp = _b(QUERIES[rc], answer=answer) if rc else _a(answer)
  r = search.reward(comp, ["James Cameron", "Jim Cameron"],
                    queries_embeddings=E3 if rc == 3 else None, stage=stage)
  assert r["retrieval_count"] == rc
  assert r["answer"] == pytest.approx(ANSWER_VALUES[key])
  assert rewards.answer_reward(correct, rc, stage, 0.3) == pytest.approx(ANSWER_VALUES[key])


def test_total_by_hand():
  # valid B (+1), RC = 3 with mean cosine -1/3 (+1/3), stage 2 correct (1 - 0.9 = 0.1)
  r = search.reward(_b(QUERIES[3], answer="the James Cameron."), ["James Cameron"],
                    queries_embeddings=E3, stage=2)
  assert r == pytest.approx({"format": 1.0, "search": 1 / 3, "answer": 0.1,
                             "total": 1 + 1 / 3 + 0.1, "retrieval_count": 3,
                             "correct": 1.0})
  # invalid (text after answer), RC = 1 verbose (-1), stage 1 wrong (-1 + 0.5*1) with beta 0.5
  r = search.reward(_b(["where was Cameron born?"], answer="Ottawa") + " bye", ["Kapuskasing"],
                    stage=1, beta=0.5)
  assert r == pytest.approx({"format": -1.0, "search": -1.0, "answer": -0.5, "total": -2.5, "correct": 0.0,
                             "retrieval_count": 1})


def test_missing_answer_is_wrong():
  comp = "<think>t</think><search>Titanic director</search>" + INFO + "<reflect>r</reflect>"
  r = search.reward(comp, ["James Cameron"], stage=1)
  assert r["answer"] == pytest.approx(-0.7) and r["format"] == -1.0
  assert search.reward(comp, ["James Cameron"], stage=2)["answer"] == -1.0


def test_correctness_options():
  comp = _a("James Cameron director")          # F1 vs 'James Cameron': p = 2/3, r = 1 -> 0.8
  assert search.reward(comp, ["James Cameron"])["answer"] == -1.0                 # EM
  assert search.reward(comp, ["James Cameron"], match="f1")["answer"] == 1.0
  assert search.reward(comp, ["James Cameron"], match="f1", f1_threshold=0.81)["answer"] == -1.0
  calls = []
  def judge(pred, answers):
    calls.append((pred, answers))
    return True
  assert search.reward(comp, "James Cameron", judge=judge)["answer"] == 1.0
  assert calls == [("James Cameron director", ["James Cameron"])]
  # the judge is not asked when there is no answer
  assert search.reward("<think>t</think>", ["x"], judge=judge)["answer"] == -1.0
  assert len(calls) == 1


def test_caller_errors():
  with pytest.raises(ValueError, match="stage must be one of"):
    search.reward(_a(), ["x"], stage=3)
  with pytest.raises(ValueError, match="match must be one of"):
    search.reward(_a(), ["x"], match="bleu")


def test_score_keeps_parse_and_verdict():
  s = search.score(_a(), ["James Cameron"])
  assert s.correct and s.parsed.structure == "A" and s.as_dict()["total"] == 2.0


# ---------------------------------------------------------------- gold trajectories

def _two_hop():
  return Example(
      id="ex1", question="Who is the spouse of the Green performer?",
      answers=["Miquette Giraudy", "Miquette"],
      contexts=[Context("c1", "Green (album)", "Green is by Steve Hillage."),
                Context("c2", "Steve Hillage", "Hillage married Miquette Giraudy.")],
      decomposition=[Step("Who is the performer of Green?", "Steve Hillage", ["c1"]),
                     Step("Who is the spouse of #1?", "Miquette Giraudy", ["c2"])])


def test_gold_trajectory_b():
  ex = _two_hop()
  asked = []
  def observations(q):
    asked.append(q)
    return search.format_observation([("Doc", f"about {q}")])
  text = search.gold_trajectory(ex, observations)
  p = search.parse(text)
  assert p.structure == "B" and p.errors == []
  assert p.queries == ["the performer of Green", "the spouse of Steve Hillage"]   # '#1' replaced
  assert asked == p.queries
  assert all(conciseness.is_concise(q) for q in p.queries)
  assert p.information[0] == "Doc 1 (Title: Doc) about the performer of Green"
  assert p.answer == "Miquette Giraudy"
  # the rollout splits it at the stop string and appends exactly observation_block(...)
  first_turn = text[:text.index(search.SEARCH_STOP) + len(search.SEARCH_STOP)]
  assert search.extract_query(first_turn) == "the performer of Green"
  r = search.reward(text, ex.answers, queries_embeddings=[[1.0, 0.0], [0.0, 1.0]], stage=2)
  assert r == pytest.approx({"format": 1.0, "search": 0.0, "answer": 1 - 0.3 * 2,
                             "total": 1.4, "retrieval_count": 2, "correct": 1.0})


def test_gold_trajectory_falls_back_to_titles_and_to_the_question():
  ex = _two_hop()
  ex.decomposition[0] = Step("What is about?", "Steve Hillage", ["c1"])   # nothing concise left
  assert search.gold_queries(ex)[0] == "Green album"                    # title 'Green (album)'
  ex.decomposition = []                                                 # HotpotQA: none
  p = search.parse(search.gold_trajectory(ex, lambda q: "Doc 1 (Title: x) y"))
  assert p.structure == "B" and p.queries == ["the spouse of the Green performer"]
  assert p.reflects == ["Found Miquette Giraudy. Done."]
  ex.contexts = []
  ex.decomposition = [Step("What is about?", "x", ["c1"])]
  with pytest.raises(ValueError, match="example 'ex1' step 0"):
    search.gold_queries(ex)


def test_gold_trajectory_a():
  ex = _two_hop()
  text = search.gold_trajectory_direct(ex)
  assert search.parse(text).structure == "A"
  assert search.reward(text, ex.answers, stage=2) == pytest.approx(
      {"format": 1.0, "search": 0.0, "answer": 1.0, "total": 2.0, "retrieval_count": 0,
       "correct": 1.0})


@pytest.mark.data
def test_gold_trajectories_on_real_musique(shared_data_dir):
  n = 0
  with open(shared_data_dir / "musique" / "dev.jsonl") as f:
    for line in f:
      r = json.loads(line)
      paras = {str(p["idx"]): p for p in r["paragraphs"]}
      ex = Example(
          id=r["id"], question=r["question"], answers=[r["answer"]],
          contexts=[Context(i, p["title"], p["paragraph_text"]) for i, p in paras.items()],
          decomposition=[Step(d["question"], d["answer"],
                              [str(d["paragraph_support_idx"])])
                         for d in r["question_decomposition"]])
      text = search.gold_trajectory(
          ex, lambda q: search.format_observation([(p["title"], p["paragraph_text"][:80])
                                                   for p in list(paras.values())[:2]]))
      p = search.parse(text)
      assert p.structure == "B", (ex.id, p.errors)
      assert p.retrieval_count == len(ex.decomposition)
      assert all(conciseness.is_concise(q) for q in p.queries), (ex.id, p.queries)
      assert not any("#" in q for q in p.queries), (ex.id, p.queries)
      assert search.reward(text, ex.answers, queries_embeddings=lambda qs: np.eye(len(qs)),
                           stage=1)["answer"] == 1.0
      n += 1
  assert n > 50


def test_eq8_unified_ablations_and_performed_count_by_hand():
  # Three queries with embeddings whose pairwise cosines are 1, 0, 0: pair sum 1.
  emb = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
  text = _b(QUERIES[3], answer="James Cameron")
  eq8 = search.reward(text, ["James Cameron"], emb, stage=1, rs_form="eq8")
  pm = search.reward(text, ["James Cameron"], emb, stage=1, rs_form="pairwise_mean")
  assert eq8["search"] == pytest.approx(-1 / (3 * 2))      # Eq. 8: sum / (N (N - 1))
  assert pm["search"] == pytest.approx(-1 / 3)              # mean over the 3 pairs
  # Unified answer reward: correct 1 - beta RC, wrong -1 + beta RC, in either stage.
  for stage in (1, 2):
    u = search.reward(text, ["James Cameron"], emb, stage=stage, answer_form="unified")
    assert u["answer"] == pytest.approx(1 - 0.3 * 3)
    w = search.reward(text, ["Spielberg"], emb, stage=stage, answer_form="unified")
    assert w["answer"] == pytest.approx(-1 + 0.3 * 3) and w["correct"] == 0.0
  # Ablations drop a component from the total but still report it.
  no_rs = search.reward(text, ["James Cameron"], emb, stage=1, use_search=False)
  assert no_rs["total"] == pytest.approx(1.0 + 1.0) and no_rs["search"] == pytest.approx(-1 / 3)
  no_ra = search.reward(text, ["James Cameron"], emb, stage=1, use_answer=False)
  assert no_ra["total"] == pytest.approx(1.0 - 1 / 3)
  # Only performed retrievals count: with 2 performed (the third refused past max_turns),
  # RC = 2 and r_s scores the first two queries (cosine 1).
  two = search.reward(text, ["James Cameron"], emb[:2], stage=2, retrieval_count=2)
  assert two["retrieval_count"] == 2 and two["search"] == pytest.approx(-1.0)
  assert two["answer"] == pytest.approx(1 - 0.3 * 2)
  with pytest.raises(ValueError, match="rs_form"):
    search.reward(text, ["x"], emb, rs_form="mean")
  with pytest.raises(ValueError, match="answer_form"):
    search.reward(text, ["x"], emb, answer_form="both")
