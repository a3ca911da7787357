"""ARENA prompt, parser, rewards and SFT targets: hand-computed cases, fuzzing, real data."""

import hypothesis
import numpy as np
import pytest
from hypothesis import strategies as st

from rlrag_jax.data import loaders
from rlrag_jax.data.schema import Context
from rlrag_jax.data.schema import Example
from rlrag_jax.data.schema import Step
from rlrag_jax.data.schema import Triple
from rlrag_jax.methods import arena
from rlrag_jax.methods.arena import parsing
from rlrag_jax.methods.arena import prompts
from rlrag_jax.methods.arena import rewards as rw
from rlrag_jax.methods.arena import sft

ANSWERS = ["Christopher Nolan", "Nolan"]
GOLD = [2, 3]
ANALYSIS = "<analysis>[3] says Y starred in Inception. [2] says Nolan directed it.</analysis>"


def _c(rel="[2, 3]", analysis=ANALYSIS, ans="Christopher Nolan"):
  return f"<relevance>{rel}</relevance>{analysis}<answer>{ans}</answer>"


def _score(completion, answers=ANSWERS, gold=GOLD, **w):
  r = arena.reward(completion, answers, gold, **w)
  return r["format"], r["accuracy"], r["relevance"], r["bonus"], r["total"]


# ---------------------------------------------------------------------------------------------
# Rewards, one hand-computed case each: (format, accuracy, relevance, bonus, total).

CASES = {
    "perfect": (_c(), (1, 1, 1, 10, 13)),
    "perfect, newlines between parts": (
        "\n<relevance>[3,2]</relevance>\n" + ANALYSIS + "\n\n<answer> Nolan </answer>\n",
        (1, 1, 1, 10, 13)),
    "wrong answer": (_c(ans="Steven Spielberg"), (1, 0, 1, 0, 2)),
    "partial relevance (subset)": (_c(rel="[2]"), (1, 1, 0.5, 0, 2.5)),
    "partial relevance (superset)": (_c(rel="[1, 2, 3]"), (1, 1, 0.5, 0, 2.5)),
    "duplicate ids are a set": (_c(rel="[3, 2, 2]"), (1, 1, 1, 10, 13)),
    "no overlap": (_c(rel="[1, 4]"), (1, 1, 0, 0, 2)),
    "empty id list": (_c(rel="[]"), (1, 1, 0, 0, 2)),
    "missing analysis": ("<relevance>[2, 3]</relevance><answer>Nolan</answer>", (0, 1, 1, 0, 2)),
    "missing answer": ("<relevance>[2, 3]</relevance>" + ANALYSIS, (0, 0, 1, 0, 1)),
    "missing relevance": (ANALYSIS + "<answer>Nolan</answer>", (0, 1, 0, 0, 1)),
    "no tags at all": ("The answer is Christopher Nolan.", (0, 0, 0, 0, 0)),
    "empty string": ("", (0, 0, 0, 0, 0)),
    "answer first": (
        "<answer>Nolan</answer><relevance>[2, 3]</relevance>" + ANALYSIS, (0, 1, 1, 0, 2)),
    "analysis before relevance": (
        ANALYSIS + "<relevance>[2, 3]</relevance><answer>Nolan</answer>", (0, 1, 1, 0, 2)),
    "duplicated answer part": (_c(ans="Spielberg") + "<answer>Nolan</answer>", (0, 0, 1, 0, 1)),
    "duplicated relevance part": ("<relevance>[1]</relevance>" + _c(), (0, 1, 0, 0, 1)),
    "duplicated analysis part": (_c(analysis=ANALYSIS * 2), (0, 1, 1, 0, 2)),
    "text before": ("Sure! " + _c(), (0, 1, 1, 0, 2)),
    "text after": (_c() + " Hope this helps.", (0, 1, 1, 0, 2)),
    "special token after": (_c() + "<|im_end|>", (0, 1, 1, 0, 2)),
    "text between parts": (
        "<relevance>[2, 3]</relevance>so" + ANALYSIS + "<answer>Nolan</answer>", (0, 1, 1, 0, 2)),
    "empty answer": (_c(ans=""), (0, 0, 1, 0, 1)),
    "blank answer": (_c(ans=" \n "), (0, 0, 1, 0, 1)),
    "answer only an article": (_c(ans="The"), (1, 0, 1, 0, 2)),
    "empty analysis": (_c(analysis="<analysis> </analysis>"), (0, 1, 1, 0, 2)),
    # The relevance part must be a JSON list of integers; anything else scores relevance 0
    # (never repaired) and leaves the format alone (format = the three parts, in order).
    "ids without brackets": (_c(rel="2, 3"), (1, 1, 0, 0, 2)),
    "ids in separate brackets": (_c(rel="[2][3]"), (1, 1, 0, 0, 2)),
    "trailing double comma": (_c(rel="[2,,"), (1, 1, 0, 0, 2)),
    "bare integer": (_c(rel="2"), (1, 1, 0, 0, 2)),
    "parenthesised id": (_c(rel="(2)"), (1, 1, 0, 0, 2)),
    "nested list": (_c(rel="[[2, 3]]"), (1, 1, 0, 0, 2)),
    "ids in words": (_c(rel="2 and 3"), (1, 1, 0, 0, 2)),
    "ids not a list": (_c(rel="references two and three"), (1, 1, 0, 0, 2)),
    "float id": (_c(rel="[2.5]"), (1, 1, 0, 0, 2)),
    "boolean id": (_c(rel="[true, 3]"), (1, 1, 0, 0, 2)),
    "negative id": (_c(rel="[-2, 3]"), (1, 1, 0, 0, 2)),
    "non-ASCII digits": (_c(rel="[٢, ٣]"), (1, 1, 0, 0, 2)),
    "huge id": (_c(rel="[" + "9" * 5000 + "]"), (1, 1, 0, 0, 2)),
    "JSON list, odd spacing": (_c(rel=" [ 3 ,2 ] "), (1, 1, 1, 10, 13)),
    "unclosed answer": ("<relevance>[2, 3]</relevance>" + ANALYSIS + "<answer>Nolan",
                        (0, 0, 1, 0, 1)),
    "unclosed analysis": ("<relevance>[2, 3]</relevance><analysis>x<answer>Nolan</answer>",
                          (0, 1, 1, 0, 2)),
    "close before open": ("<relevance>[2, 3]</relevance>" + ANALYSIS + "</answer>Nolan<answer>",
                          (0, 0, 1, 0, 1)),
    "answer nested in analysis, no answer part": (
        "<relevance>[2, 3]</relevance><analysis>so <answer>Nolan</answer></analysis>",
        (0, 0, 1, 0, 1)),
    "answer tags inside analysis and an answer part": (
        _c(analysis="<analysis>maybe <answer>Spielberg</answer></analysis>", ans="Nolan"),
        (0, 0, 1, 0, 1)),
    "overlapping relevance and analysis": (
        "<relevance>[2, 3]<analysis></relevance>x</analysis><answer>Nolan</answer>",
        (0, 1, 0, 0, 1)),
    "nested relevance inside answer": (
        "<analysis>x</analysis><answer>Nolan<relevance>[2, 3]</relevance></answer>",
        (0, 0, 0, 0, 0)),
    "uppercase tags": (_c().replace("answer>", "Answer>"), (0, 0, 1, 0, 1)),
    "spaced tags": (_c().replace("<answer>", "< answer >"), (0, 0, 1, 0, 1)),
    "huge analysis": (_c(analysis="<analysis>" + "x" * 1_000_000 + "</analysis>"),
                      (1, 1, 1, 10, 13)),
    "huge junk before": ("y" * 1_000_000 + _c(), (0, 1, 1, 0, 2)),
    "many open tags": ("<answer>" * 10_000 + _c(), (0, 0, 1, 0, 1)),
    "unicode answer and analysis": (
        _c(analysis="<analysis>[2] 说 克里斯托弗·诺兰 😀</analysis>", ans="Christopher\u00a0Nolan"),
        (1, 1, 1, 10, 13)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_reward_hand_computed(name):
  completion, expected = CASES[name]
  assert _score(completion) == pytest.approx(expected), name


def test_reward_unicode_alias_and_no_gold():
  c = "<relevance>[]</relevance><analysis>none needed</analysis><answer>zürich</answer>"
  assert _score(c, answers=["Zürich"], gold=[]) == (1, 1, 1, 10, 13)
  assert _score(c, answers=["Zurich"], gold=[]) == (1, 0, 1, 0, 2)
  assert _score(c, answers=["Zürich"], gold=[1]) == (1, 1, 0, 0, 2)


@pytest.mark.parametrize("completion", [None, 3, b"<answer>Nolan</answer>", ["x"]])
def test_reward_non_string_completion_scores_zero(completion):
  assert _score(completion) == (0, 0, 0, 0, 0)
  assert not arena.parse(completion).well_formed


def test_reward_rejects_gold_ids_that_are_not_numbers():
  with pytest.raises(TypeError, match="gold_ids must be reference numbers"):
    arena.reward(_c(), ANSWERS, ["2", "3"])
  assert arena.reward(_c(), ANSWERS, np.array([2, 3]))["total"] == 13.0


@pytest.mark.parametrize("answer,aliases,expected", [
    ("The Christopher Nolan.", ["Christopher Nolan"], 1.0),   # article and punctuation
    ("christopher   NOLAN", ["Christopher Nolan"], 1.0),      # case and spaces
    ("Christopher_Nolan", ["Christopher Nolan"], 1.0),        # underscores
    ("an apple", ["Apple"], 1.0),
    ("Nolan's", ["Nolans"], 1.0),
    ("Nolan", ["Christopher Nolan", "Nolan"], 1.0),           # any alias
    ("Nolan", "Nolan", 1.0),                                  # one str alias
    ("Christopher", ["Christopher Nolan"], 0.0),              # exact, not partial
    ("Christopher Nolan Jr", ["Christopher Nolan"], 0.0),
    ("the", ["a"], 0.0),                                      # normalises to "" on both sides
])
def test_answer_normalisation(answer, aliases, expected):
  assert arena.reward(_c(ans=answer), aliases, GOLD)["accuracy"] == expected


def test_weights_change_total():
  w = dict(w_format=2.0, w_accuracy=3.0, w_relevance=0.5, bonus_value=7.0)
  assert _score(_c(), **w) == (1, 1, 1, 7, 2 + 3 + 0.5 + 7)
  assert _score(_c(rel="[2]"), **w) == (1, 1, 0.5, 0, 2 + 3 + 0.25)
  assert _score(_c(ans="x"), **w) == (1, 0, 1, 0, 2 + 0.5)
  assert _score(_c(), bonus_value=0.0)[4] == 3.0
  assert _score(_c(), w_format=0.0)[3:] == (10, 12.0)   # the bonus does not depend on weights
  with pytest.raises(TypeError):
    arena.reward(_c(), ANSWERS, GOLD, w_fmt=1.0)


# ---------------------------------------------------------------------------------------------
# Parser.

def test_parse_fields_and_problems():
  p = arena.parse("\n" + _c(rel="[ 3 ,2 ]", ans="  Nolan \n") + "\n")
  assert p == parsing.Parsed([3, 2], ANALYSIS[10:-11], "Nolan", True, ())
  bad = arena.parse("x" + _c(rel="2, 3"))
  assert not bad.well_formed and bad.relevance_ids is None and bad.answer == "Christopher Nolan"
  assert any("outside the three parts" in s for s in bad.problems)
  lenient = arena.parse("x" + _c(rel="2, 3"), relevance_parse="lenient")
  assert lenient.relevance_ids == [2, 3] and lenient.problems == bad.problems
  missing = arena.parse(ANALYSIS)
  assert missing.relevance_ids is None and missing.answer is None
  assert any("found 0 and 0" in s for s in missing.problems)
  with pytest.raises(ValueError, match="relevance_parse"):
    arena.parse(_c(), relevance_parse="loose")


@pytest.mark.parametrize("content,strict,lenient", [
    ("[1, 3]", [1, 3], [1, 3]), ("[]", [], []), (" [ 7 ] ", [7], [7]),
    ("[01,2]", None, [1, 2]),                      # JSON has no leading zeros
    ("1, 3", None, [1, 3]), ("[1 3]", None, [1, 3]), ("(1; 3)", None, [1, 3]),
    ("[1,]", None, [1]), ("", None, []), ("[1, 3", None, [1, 3]), ("[2,,", None, [2]),
    ("2", None, [2]), ("(2)", None, [2]), ("[[2]]", None, [2]),
    ("1 and 3", None, None), ("[1e3]", None, None), ("none", None, None),
    ("[1.5]", None, None), ("[-1]", None, None), ("[true]", None, None), ('["1"]', None, None),
    ("[" + "1" * 10 + "]", None, None), ("[" + "1" * 9 + "]", [111111111], [111111111]),
])
def test_relevance_id_rules(content, strict, lenient):
  assert parsing.parse_ids(content) == strict
  assert parsing.parse_ids(content, "lenient") == lenient
  for mode, ids in (("strict", strict), ("lenient", lenient)):
    p = arena.parse(_c(rel=content), relevance_parse=mode)
    assert p.relevance_ids == ids and p.well_formed          # the format ignores the content
    want = 0.0 if ids is None else rw.relevance_score(ids, GOLD)
    assert arena.reward(_c(rel=content), ANSWERS, GOLD,
                        relevance_parse=mode)["relevance"] == want


_FRAGMENTS = st.sampled_from(
    list(parsing.TAGS) + ["[", "]", ",", " ", "\n", "1", "23", "-", "Nolan", "x", "<", ">", "/",
                          "٣", "\u00a0", "😀", "<answer", "answer>", "9" * 12])


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(st.one_of(st.text(max_size=300), st.lists(_FRAGMENTS, max_size=40).map("".join)))
def test_parse_and_reward_never_raise(text):
  p = arena.parse(text)
  assert isinstance(p.well_formed, bool)
  assert p.well_formed == (not p.problems)
  if p.relevance_ids is not None:
    assert all(isinstance(i, int) and i >= 0 for i in p.relevance_ids)
  if p.well_formed:
    assert p.relevance_ids is not None and p.analysis.strip() and p.answer
  r = arena.reward(text, ANSWERS, GOLD)
  assert r["format"] in (0, 1) and r["accuracy"] in (0, 1) and r["relevance"] in (0, 0.5, 1)
  assert r["bonus"] == (10.0 if (r["format"], r["accuracy"], r["relevance"]) == (1, 1, 1) else 0)
  assert r["total"] == r["format"] + r["accuracy"] + r["relevance"] + r["bonus"]


_FREE_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=60).filter(
    lambda s: s.strip() and not any(t in s for t in parsing.TAGS))


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(st.lists(st.integers(0, 10**9 - 1), max_size=6), _FREE_TEXT, _FREE_TEXT,
                  st.sampled_from(["", "\n", " \n\t"]))
def test_parse_round_trips_a_well_formed_completion(ids, analysis, answer, sep):
  text = (f"{sep}<relevance>[{', '.join(map(str, ids))}]</relevance>{sep}"
          f"<analysis>{analysis}</analysis>{sep}<answer>{answer}</answer>{sep}")
  p = arena.parse(text)
  assert p.well_formed, p.problems
  assert (p.relevance_ids, p.analysis, p.answer) == (ids, analysis, answer.strip())


# ---------------------------------------------------------------------------------------------
# Prompts and numbering.

def _example():
  return Example(
      id="ex1", question="Who directed the film that  stars Y?", answers=list(ANSWERS),
      contexts=[
          Context("d1", "Filler", "Nothing to see here. Really."),
          Context("d2", "Inception", "Inception is a 2010 film directed by Christopher Nolan. "
                  "It stars Y.", sentences=["Inception is a 2010 film directed by Christopher "
                                            "Nolan.", "It stars Y."]),
          Context("d3", "Y", "Y is an actor.\nHe starred in Inception."),
          Context("d4", "Other", "Other text."),
      ],
      gold_ids=["d3", "d2"],
      decomposition=[Step("Which film stars Y?", "Inception", ["d3"]),
                     Step("#1 >> director", "Christopher Nolan", ["d2"])],
      hops=2)


def test_reference_numbers():
  ex = _example()
  n = arena.reference_numbers(ex)
  assert n.ids == ("d1", "d2", "d3", "d4") and n.gold == (2, 3) and n.missing == ()
  assert n.number("d4") == 4 and n.number("zz") is None
  ex.gold_ids = ["d4", "gone"]
  assert arena.reference_numbers(ex).gold == (4,)
  assert arena.reference_numbers(ex).missing == ("gone",)


def test_build_prompt_numbers_references_in_order():
  ex = _example()
  p = arena.build_prompt(ex.question, [(c.title, c.text) for c in ex.contexts])
  assert p.startswith(arena.INSTRUCTION + "\nUser:\n<question>Who directed the film that "
                      "stars Y?</question>\n<references>\n[1] Filler:")
  expected_refs = ("[1] Filler: Nothing to see here. Really.\n"
                   "[2] Inception: Inception is a 2010 film directed by Christopher Nolan. "
                   "It stars Y.\n"
                   "[3] Y: Y is an actor. He starred in Inception.\n"
                   "[4] Other: Other text.")
  assert expected_refs in p
  assert p.endswith("[4] Other: Other text.\n</references>\nAssistant:\n")
  assert arena.prompt_for(ex) == p
  assert arena.build_prompt(ex.question, ex.contexts) == p               # Context objects work
  assert "[2] Inception: Inception is a …" in arena.build_prompt(ex.question, ex.contexts, 15)
  assert "[1] untitled text" in arena.build_prompt("q", [("", "untitled text")])
  with pytest.raises(ValueError, match=r"passages\[1\]"):
    arena.build_prompt("q", [("t", "x"), "just a string"])
  for tag in parsing.TAGS:
    assert tag in arena.INSTRUCTION
  # The paper's Table 1 wording (spot checks of each line).
  for line in ("A conversation between User and Assistant. The user asks a question and gives "
               "some references.", "<references>[ references starting with numbers ]"
               "</references>", "Assistant's response must contain EXACTLY three sections:",
               "in square brackets, e.g. [1,5]]</relevance>",
               "<answer>[ answer with ONLY a short phrase or single word. no explanations ]"):
    assert line in arena.INSTRUCTION


def test_build_messages():
  ex = _example()
  sys_msg, user = arena.messages_for(ex)
  assert sys_msg == {"role": "system", "content": arena.INSTRUCTION}
  assert user["role"] == "user" and user["content"].startswith(
      "<question>Who directed the film that stars Y?</question>\n<references>\n[1] Filler:")
  assert user["content"].endswith("[4] Other: Other text.\n</references>")
  (only,) = arena.build_messages(ex.question, ex.contexts, system=False)
  assert only["role"] == "user"
  assert only["content"] == arena.INSTRUCTION + "\n\n" + user["content"]


# ---------------------------------------------------------------------------------------------
# SFT targets.

def test_gold_completion_from_decomposition():
  ex = _example()
  g = arena.gold_completion(ex)
  assert g == ("<relevance>[2, 3]</relevance>\n<analysis>Which film stars Y? [3] says Inception. "
               "[2] says the director of Inception is Christopher Nolan. So the answer is "
               "Christopher Nolan.</analysis>\n<answer>Christopher Nolan</answer>")
  assert arena.reward(g, ex.answers, arena.reference_numbers(ex).gold)["total"] == 13.0
  ex.decomposition = [Step("which film stars Y", "Inception", ["d3", "d2"]),
                      Step("#1 >> shares border with", "Dunkirk", []),
                      Step("#3 >> #2", "?", ["gone"])]
  assert sft.analysis_steps(ex) == [
      "Which film stars Y? [2][3] says Inception.",
      "Inception shares border with Dunkirk.",
      "The Dunkirk of #3 is ?."]


def test_gold_completion_from_triples_facts_and_fallback():
  ex = _example()
  ex.decomposition = []
  ex.triples = [Triple("Inception", "director", "Christopher Nolan"),   # head is a gold title
                Triple("The film", "cast_member", "Y"),                   # tail in a gold text
                Triple("Q", "award received", "Oscar")]                   # nothing to cite
  assert sft.analysis_steps(ex) == [
      "[2] says the director of Inception is Christopher Nolan.",
      "[3] says the cast member of The film is Y.",
      "The award received of Q is Oscar."]
  ex.triples = []
  ex.meta = {"supporting_facts": [["Y", 1], ["d2", 0], ["Missing", 0], ["Y", 99], ["bad"]]}
  assert sft.analysis_steps(ex) == [
      "[3] says: He starred in Inception.",
      "[2] says: Inception is a 2010 film directed by Christopher Nolan."]
  ex.meta = {}
  assert sft.analysis_steps(ex, max_fact_chars=30) == [
      "[2] says: Inception is a 2010 …", "[3] says: Y is an actor."]
  for g in (arena.gold_completion(ex), arena.gold_completion(ex, max_fact_chars=10)):
    assert arena.reward(g, ex.answers, [2, 3])["total"] == 13.0


def test_gold_completion_strips_tags_and_handles_no_gold():
  ex = _example()
  ex.decomposition = []
  ex.contexts[1].sentences = ["Evil <answer>Spielberg</answer> <ans<answer>wer>text."]
  g = arena.gold_completion(ex)
  assert arena.parse(g).well_formed and "Spielberg" in g
  assert arena.reward(g, ex.answers, [2, 3])["total"] == 13.0
  ex.gold_ids = []
  g = arena.gold_completion(ex)
  assert g.startswith("<relevance>[]</relevance>\n<analysis>So the answer is Christopher Nolan.")
  assert arena.reward(g, ex.answers, [])["total"] == 13.0


def test_sft_pair_and_batched_rewards():
  ex = _example()
  prompt, target = sft.sft_pair(ex)
  assert prompt == arena.prompt_for(ex) and target == arena.gold_completion(ex)
  comps = [target, _c(rel="[2]"), "junk", _c(ans="nope")]
  out = rw.rewards(comps, [ex] * 4)
  assert set(out) == set(rw.KEYS)
  for k in rw.KEYS:
    assert out[k].shape == (4,) and out[k].dtype == np.float32
  np.testing.assert_allclose(out["total"], [13.0, 2.5, 0.0, 2.0])
  np.testing.assert_allclose(rw.rewards(comps[:1], [ex], bonus_value=1.0)["total"], [4.0])
  with pytest.raises(ValueError, match="one example per completion"):
    rw.rewards(comps, [ex])


# ---------------------------------------------------------------------------------------------
# Real data (through the shared loaders): every gold target is well formed and scores 13.

@pytest.mark.data
@pytest.mark.parametrize("name,split", [("hotpotqa", "dev"), ("hotpotqa", "train"),
                                        ("2wiki", "dev"), ("musique", "dev"),
                                        ("musique", "train")])
def test_gold_completion_on_real_data_scores_maximum(shared_data_dir, name, split):
  folder = shared_data_dir / loaders.FOLDERS[name]
  examples = loaders.load_dataset(name, path=folder, split=split)
  assert examples
  completions = [arena.gold_completion(ex) for ex in examples]
  totals = rw.rewards(completions, examples)["total"]
  bad = [(ex.id, c) for ex, c, t in zip(examples, completions, totals) if t != 13.0]
  assert not bad, f"{len(bad)} of {len(examples)} gold targets score below 13, e.g. {bad[:2]}"
  for ex in examples:
    numbering = arena.reference_numbers(ex)
    assert numbering.gold and not numbering.missing, ex.id
    assert [numbering.ids[n - 1] for n in numbering.gold] == sorted(
        ex.gold_ids, key=numbering.ids.index)


def test_accuracy_modes_f1_and_judge():
  # F1 of "Nolan directed" vs "Christopher Nolan": 1 common token, P = R = 1/2 -> F1 = 0.5;
  # against the alias "Nolan": P = 1/2, R = 1 -> 2/3 (the best alias counts).
  r = arena.reward(_c(ans="Nolan directed"), ANSWERS, GOLD, accuracy="f1")
  assert r["accuracy"] == pytest.approx(2 / 3) and r["bonus"] == 0.0
  assert r["total"] == pytest.approx(1 + 2 / 3 + 1)
  calls = []

  def judge(answer, aliases):
    calls.append((answer, aliases))
    return {"Chris Nolan": True, "Spielberg": False}.get(answer)   # anything else: not judged
  assert arena.reward(_c(ans="Chris Nolan"), ANSWERS, GOLD, accuracy="judge",
                      judge=judge)["total"] == 13.0
  assert arena.reward(_c(ans="Spielberg"), ANSWERS, GOLD, accuracy="judge",
                      judge=judge)["accuracy"] == 0.0
  assert arena.reward(_c(ans="???"), ANSWERS, GOLD, accuracy="judge",
                      judge=judge)["accuracy"] == 0.0
  assert calls[0] == ("Chris Nolan", ANSWERS)
  with pytest.raises(ValueError, match="no judge is configured"):
    arena.reward(_c(), ANSWERS, GOLD, accuracy="judge")
  with pytest.raises(ValueError, match="reward.accuracy"):
    arena.reward(_c(), ANSWERS, GOLD, accuracy="bleu")
