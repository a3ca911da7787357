"""SPARKLE's parsers (the proxy's three roles, the reader) and its system reward, against
hand-written outputs and hand-computed values."""
import pytest

from rlrag_jax.methods.sparkle import parsing, rewards
from rlrag_jax.methods.sparkle.triples import Candidate

MALFORMED = ["", None, 17, "maybe", "<think>", "Retrieval Query:   ", "<<<;;>>>", "[0]",
             "[99]", "Reasoning Chain: <a; b>", "\x00\x01", "Yesterday I", "Nope"]


# ------------------------------------------------------------------------------ RD
@pytest.mark.parametrize("text,want", [
    ("Yes (retrieval is required)", True), ("No (retrieval is not required)", False),
    ("  yes", True), ("NO.", False), ("**Yes**, because", True), ("No retrieval", False)])
def test_decision_reads_the_first_word(text, want):
  d = parsing.parse_decision(text)
  assert d.retrieve is want and d.well_formed


@pytest.mark.parametrize("text", MALFORMED)
@pytest.mark.parametrize("default", [True, False])
def test_malformed_decision_takes_the_default(text, default):
  d = parsing.parse_decision(text, default=default)
  assert d.retrieve is default and not d.well_formed


def test_rendered_decisions_parse_back():
  for b in (True, False):
    assert parsing.parse_decision(parsing.render_decision(b)).retrieve is b


# ------------------------------------------------------------------------------ QF
def test_formulation_reads_chain_need_and_query():
  text = ("Reasoning Chain: <The Promise (1995 film); directed by; Margarethe von Trotta>, "
          "<Margarethe von Trotta;  has spouse ; [unknown]>\n"
          "To continue answering the question, we need to know: Who is her spouse?\n"
          "Retrieval Query:  Who is Margarethe von Trotta's spouse?\nextra line")
  f = parsing.parse_formulation(text, fallback="Q")
  assert f.well_formed
  assert f.chain == (("The Promise (1995 film)", "directed by", "Margarethe von Trotta"),
                     ("Margarethe von Trotta", "has spouse", "[unknown]"))
  assert f.need == "Who is her spouse?"
  assert f.query == "Who is Margarethe von Trotta's spouse?"


def test_formulation_round_trips_its_renderer():
  chain = [("A", "r", "B"), ("B", "s", parsing.UNKNOWN)]
  f = parsing.parse_formulation(parsing.render_formulation(chain, "what s of B", "s of B?"), "x")
  assert (f.chain, f.need, f.query, f.well_formed) == (tuple(chain), "what s of B", "s of B?",
                                                       True)


def test_triples_after_the_need_are_not_chain_links():
  f = parsing.parse_formulation("Reasoning Chain: <a; b; c>\nTo continue answering the question, "
                                "we need to know: <x; y; z>\nRetrieval Query: q", "fb")
  assert f.chain == (("a", "b", "c"),) and f.query == "q"


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_formulation_falls_back_to_the_given_query(text):
  f = parsing.parse_formulation(text, fallback="  the latest   thought ")
  assert not f.well_formed and f.query == "the latest thought"


# ------------------------------------------------------------------------------ KI
CANDS = [Candidate("A", "directed_by", "B", "d1"), Candidate("B", "born_in", "C", "d2"),
         Candidate("C", "located_in", "D", "d3")]


@pytest.mark.parametrize("text,index", [
    ("<B; born_in; C>", 1), ("<b ;  BORN_IN; c >", 1), ("I pick <C; located_in; D> here", 2),
    ("[1]", 0), ("3", 2), (" [2] <unrelated; x; y>", 1),
    ("<nope; x; y> <A; directed_by; B>", 0)])
def test_selection_names_a_candidate_by_text_or_number(text, index):
  s = parsing.parse_selection(text, CANDS)
  assert s.index == index and s.well_formed


@pytest.mark.parametrize("text", MALFORMED + ["<A; directed_by; Z>", "[4]", "0"])
def test_malformed_selection_takes_the_fallback(text):
  assert parsing.parse_selection(text, CANDS) == parsing.Selection(0, False)
  assert parsing.parse_selection(text, CANDS, fallback=None) == parsing.Selection(None, False)
  assert parsing.parse_selection(text, [], fallback=0) == parsing.Selection(None, False)


def test_rendered_selections_parse_back():
  for i in range(len(CANDS)):
    for by in ("triple", "index"):
      assert parsing.parse_selection(parsing.render_selection(CANDS, i, by), CANDS).index == i


# ------------------------------------------------------------------------------ the reader
@pytest.mark.parametrize("text,kind,body", [
    ("<think> I need  X </think> trailing", "think", "I need X"),
    ("<think>a</think><think>b</think>", "think", "a"),
    ("<think>so</think><answer> Volker Schlöndorff </answer>", "answer", "Volker Schlöndorff"),
    ("<answer></answer>", "answer", ""),
    ("no tags at all", "malformed", "no tags at all"),
    ("<think>   </think>", "malformed", "<think> </think>"),
    (None, "malformed", "")])
def test_reader_thoughts(text, kind, body):
  t = parsing.parse_thought(text)
  assert (t.kind, t.text) == (kind, body)


def test_reasoning_reader_splits_lines_and_reads_boxed():
  assert parsing.parse_thought("\n\nFirst, find X.\nThen Y.", reasoning=True) == \
      parsing.Thought("think", "First, find X.")
  assert parsing.parse_thought("So it is \\boxed{\\text{{Paris}}}.", reasoning=True) == \
      parsing.Thought("answer", "\\text{{Paris}}")
  assert parsing.parse_thought("unclosed \\boxed{Paris", reasoning=True).kind == "think"
  assert parsing.parse_thought("  \n ", reasoning=True).kind == "malformed"
  assert parsing.boxed("\\boxed{a} then \\boxed{b}") == "b"


def test_extract_answer_is_the_first_answer_or_empty():
  th = [parsing.Thought("think", "x"), parsing.Thought("answer", "A"),
        parsing.Thought("answer", "B")]
  assert parsing.extract_answer(th) == "A"
  assert parsing.extract_answer(th[:1]) == ""


# ------------------------------------------------------------------------------ reward
def reward(cfg, ctx=("g1", "x"), gold=("g1", "g2"), pred="Paris France", answers=("Paris",),
           texts=()):
  return rewards.system_reward(context_ids=ctx, context_texts=texts, gold_ids=gold,
                               prediction=pred, answers=answers, cfg=cfg)


def test_reward_both_weightings_by_hand():
  # recall 1/2; F1("paris france", "paris") = 2 * (1/2 * 1) / (1/2 + 1) = 2/3
  r = reward(rewards.RewardConfig(alpha=0.3, weighting="paper"))
  assert r["recall"] == 0.5 and r["f1"] == pytest.approx(2 / 3) and r["recall_kind"] == "gold"
  assert r["total"] == pytest.approx(0.3 * 0.5 + 0.7 * 2 / 3)
  r = reward(rewards.RewardConfig(alpha=0.3, weighting="code"))
  assert r["total"] == pytest.approx(0.7 * 0.5 + 0.3 * 2 / 3)
  assert reward(rewards.RewardConfig(alpha=0.0))["total"] == pytest.approx(2 / 3)
  assert reward(rewards.RewardConfig(alpha=1.0))["total"] == pytest.approx(0.5)


def test_reward_without_gold_documents_uses_answer_string_recall():
  cfg = rewards.RewardConfig()
  r = reward(cfg, gold=(), pred="", texts=["The capital is Paris, France."])
  assert (r["recall"], r["recall_kind"], r["f1"], r["total"]) == (1.0, "answer", 0.0,
                                                                  pytest.approx(0.3))
  assert reward(cfg, gold=(), texts=["Parisian food"])["recall"] == 0.0    # whole words only


@pytest.mark.parametrize("pred", [None, "", 3, "<answer>"])
def test_reward_of_a_missing_or_malformed_answer_is_the_recall_term_only(pred):
  r = reward(rewards.RewardConfig(), pred=pred)
  assert r["f1"] == 0.0 and r["total"] == pytest.approx(0.3 * 0.5)


def test_reward_config_rejects_bad_values():
  with pytest.raises(ValueError, match="weighting"):
    rewards.RewardConfig(weighting="other")
  with pytest.raises(ValueError, match="alpha"):
    rewards.RewardConfig(alpha=1.5)


@pytest.mark.parametrize("text,index", [("[2]", 1), ("3", 2), ("The Silent Coast", 0),
                                        ("  the silent coast: a film", 0), ("Silent", None)])
def test_direct_ki_names_a_document_by_number_or_title(text, index):
  titles = ["The Silent Coast", "Tamnal Quilothsyl", "Rekrhu"]
  s = parsing.parse_document(text, titles, fallback=None)
  assert s.index == index and s.well_formed == (index is not None)
  assert parsing.parse_document("??", titles).index == 0
