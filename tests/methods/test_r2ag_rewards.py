"""R2AG's output parser and Top-Survivor step reward against hand-computed values."""
import itertools

import pytest

from rlrag_jax.methods.r2ag import parsing, rewards
from rlrag_jax.methods.r2ag.rewards import RewardConfig, step_reward
from rlrag_jax.metrics import average_precision

CFG = RewardConfig()


def out(base=(), pred=(), think=True, stop=False):
  return parsing.parse(parsing.render("r", base, pred, stop=stop) if think else
                       "".join(f"<base-Q>{q}</base-Q>" for q in base))


# ------------------------------------------------------------------------------ parsing
def test_parse_reads_queries_stop_and_none():
  s = parsing.parse("<think>x</think><base-Q> Who  wrote A? </base-Q><base-Q>Where is B?</base-Q>"
                    "<predicted-Q>none</predicted-Q>")
  assert s.think and s.base == ("Who wrote A?", "Where is B?") and s.predicted == ()
  assert (s.base_parts, s.predicted_parts, s.stop) == (2, 1, False)
  s = parsing.parse("<think>done</think><base-Q>Stop retrieval.</base-Q>"
                    "<predicted-Q>None</predicted-Q>")
  assert s.stop and s.base == () and s.queries == () and s.base_parts == 1


@pytest.mark.parametrize("text", [
    "", None, 17, "<base-Q>q</base-Q>", "<think>unclosed <base-Q>q</base-Q>",
    "<base-Q>before</base-Q><think>t</think>", "<think>t</think><base-Q>open",
    "<think>t</think><base-Q>   </base-Q>", "<think>t</think><base-Q>a</predicted-Q>",
    "<<<>>></think><think>"])
def test_malformed_outputs_parse_to_no_queries_without_raising(text):
  s = parsing.parse(text)
  assert s.queries == () and not s.stop


def test_parts_before_the_think_do_not_count():
  s = parsing.parse("<base-Q>early</base-Q><think>t</think><predicted-Q>p</predicted-Q>")
  assert s.base == () and s.predicted == ("p",) and s.base_parts == 0


def test_render_round_trips():
  s = parsing.parse(parsing.render("k", ["a?", "b?"], ["c?"]))
  assert (s.base, s.predicted, s.stop) == (("a?", "b?"), ("c?",), False)
  s = parsing.parse(parsing.render("k", ["a?"]))
  assert s.predicted == () and s.predicted_parts == 1          # "none"


# ------------------------------------------------------------------------------ AP
def _ap_brute(ranked, gold):
  """Average precision written out from its definition: at every rank holding a first
  occurrence of a gold document, the share of the first u ranks that are first-occurrence gold."""
  gold = set(gold)
  firsts = [d in gold and d not in ranked[:u] for u, d in enumerate(ranked)]
  return sum(sum(firsts[:u + 1]) / (u + 1) for u in range(len(ranked)) if firsts[u]) / len(gold)


def test_average_precision_matches_its_definition():
  docs = ["A", "B", "x", "y"]
  for n in range(1, 5):
    for ranked in itertools.product(docs, repeat=n):
      assert average_precision(list(ranked), {"A", "B", "C"}) == pytest.approx(
          _ap_brute(list(ranked), {"A", "B", "C"}))
  assert average_precision(["A"], set()) == 0.0
  assert average_precision(["A", "A"], {"A"}) == 1.0          # a repeat is a miss, AP <= 1


def test_the_reports_retrieval_columns_by_hand():
  from rlrag_jax.methods.r2ag.task import retrieval_metrics
  # gold g1 g2 g3; retrieved x, g2, g1, y, g2: 2 of 3 gold found; AP = (1/2 + 2/3) / 3
  m = retrieval_metrics(["x", "g2", "g1", "y", "g2"], ("g1", "g2", "g3"))
  assert m == pytest.approx({"recall": 2 / 3, "full_recall": 0.0, "at_k": 5.0,
                             "map": (1 / 2 + 2 / 3) / 3})
  assert retrieval_metrics(["g1", "g2"], ("g2", "g1")) == {
      "recall": 1.0, "full_recall": 1.0, "at_k": 2.0, "map": 1.0}
  assert retrieval_metrics([], ("g1",)) == {"recall": 0.0, "full_recall": 0.0, "at_k": 0.0,
                                            "map": 0.0}


# ------------------------------------------------------------------------------ the reward
def test_every_term_by_hand():
  s = out(["q1", "q2", "q3"], ["p1", "p2"])
  r = step_reward(s, [["B"], ["X"], ["A"]], [["C"], ["B"]], prior={"A"}, gold={"A", "B", "C"},
                  truncated=False, cfg=CFG)
  # new gold: B (base q1); A was retrieved before; C (predicted p1); B again (p2) is not new.
  assert (r["mh_base"], r["mh_pred"]) == (1, 1)
  assert r["mh"] == pytest.approx(1 + 1.25 * 1)
  # AP^b over [B, X, A]: (1/1 + 2/3) / 3; AP^p over [C, B]: (1/1 + 2/2) / 3
  assert r["ap_base"] == pytest.approx((1 + 2 / 3) / 3)
  assert r["ap_pred"] == pytest.approx(2 / 3)
  assert r["jh"] == 0 and r["format"] == pytest.approx(0.02) and r["complete"] == 1
  assert r["total"] == pytest.approx(0.2 * 2.25 + 0.2 * ((1 + 2 / 3) / 3 + 2 / 3) + 0.02)
  r2 = step_reward(s, [["B"], ["X"], ["A"]], [["C"], ["B"]], {"A"}, {"A", "B", "C"}, False,
                   RewardConfig(weighting="sum"))
  assert r2["total"] == pytest.approx(2.25 + (1 + 2 / 3) / 3 + 2 / 3 + 0.02)


def test_a_gold_document_hit_twice_in_one_step_counts_once():
  s = out(["q1", "q2"], ["p1"])
  r = step_reward(s, [["B"], ["B"]], [["B"]], set(), {"B", "C"}, False, CFG)
  assert (r["mh_base"], r["mh_pred"], r["new_gold"]) == (1, 0, 1)
  assert r["ap_base"] == pytest.approx(1 / 2)     # [B, B]: rank 1 hit, rank 2 a repeat
  assert r["ap_pred"] == pytest.approx(1 / 2)     # any gold hit counts in AP, new or not


def test_ap_reads_only_the_top_t_queries_and_mh_reads_all():
  s = out(["q1", "q2", "q3", "q4", "q5"], ["p1", "p2", "p3"])
  r = step_reward(s, [["x"], ["x2"], ["x3"], ["x4"], ["G"]], [["y"], ["y2"], ["H"]], set(),
                  {"G", "H"}, False, CFG)
  assert r["ap"] == 0 and r["mh_base"] == 1 and r["mh_pred"] == 1


def test_joint_hit_needs_stop_and_every_gold_document():
  stop = out(stop=True)
  r = step_reward(stop, [], [], {"A", "B"}, {"A", "B"}, False, CFG)
  assert r["jh"] == 1 and r["total"] == pytest.approx(0.3 + 0.02) and r["zeroed"] == 0
  r = step_reward(out(["q"]), [["B"]], [], {"A"}, {"A", "B"}, False, CFG)
  assert r["jh"] == 0 and r["complete"] == 1 and r["total"] > 0      # complete, no stop


@pytest.mark.parametrize("case, rule", [
    ("early_stop", rewards.EARLY_STOP), ("no_think", rewards.NO_THINK),
    ("truncated", rewards.TRUNCATED)])
def test_zeroing_rules(case, rule):
  if case == "early_stop":
    r = step_reward(out(stop=True), [], [], {"A"}, {"A", "B"}, False, CFG)
  elif case == "no_think":
    s = out(["q"], think=False)
    assert s.base == ()                                   # no think: its parts are not read
    r = step_reward(s, [], [], set(), {"A"}, False, CFG)
  else:
    r = step_reward(out(["q"]), [["A"]], [], set(), {"A", "B"}, True, CFG)
    assert r["mh"] == 1                                   # components still reported
  assert r["total"] == 0 and r["zeroed"] == rule


def test_format_reward_per_kind_and_capped():
  assert step_reward(out(["a", "b", "c"]), [[], [], []], [], set(), {"G"}, False,
                     CFG)["format"] == pytest.approx(0.02)   # base parts + "none"
  only_base = parsing.parse("<think>t</think><base-Q>a</base-Q><base-Q>b</base-Q>")
  assert step_reward(only_base, [[], []], [], set(), {"G"}, False,
                     CFG)["format"] == pytest.approx(0.01)


def test_unknown_weighting_and_keys_are_errors():
  with pytest.raises(ValueError, match="weighting"):
    RewardConfig(weighting="mean")
  with pytest.raises(ValueError, match="r2ag.reward.*bogus"):
    RewardConfig.from_config({"bogus": 1})
