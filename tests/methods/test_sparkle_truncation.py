"""SPARKLE's truncated-call metric: the share of the proxy's decisions, formulations and
selections whose generation hit the role's token cap without a stop, on hand-built samples, on
the scripted agent loop (a proxy that cuts every selection and every second decision) and in the
report's line."""
import pytest

from rlrag_jax.methods.sparkle import agent as agent_lib
from rlrag_jax.methods.sparkle import report
from test_sparkle_agent import Scripted, make, store, w  # noqa: F401  (fixtures)


def test_counts_and_rates_by_hand():
  S = agent_lib.Sample
  samples = [S("rd", "p", (1,), truncated=True), S("rd", "p", (1,)), S("rd", "p", (1,)),
             S("rd", "p", (1, 2), forced=True, truncated=True),      # the tree's: no call
             S("qf", "p", (1,)), S("ki", "p", (1,), truncated=True), S("ki", "p", (1,))]
  counts = agent_lib.truncation_counts(samples)
  assert counts == {"decisions": 3.0, "truncated_decisions": 1.0, "formulations": 1.0,
                    "truncated_formulations": 0.0, "selections": 2.0,
                    "truncated_selections": 1.0}
  assert agent_lib.truncation_rates(counts) == pytest.approx(
      {"truncated_decision_rate": 1 / 3, "truncated_formulation_rate": 0.0,
       "truncated_selection_rate": 0.5})
  # no call of a role: rate 0, not a division by zero
  assert agent_lib.truncation_rates(agent_lib.truncation_counts([]))[
      "truncated_selection_rate"] == 0.0


class Cutting(Scripted):
  """The oracle proxy, its every selection and every second decision reported as cut."""

  def __init__(self, *a, **kw):
    super().__init__(*a, **kw)
    self.cut = {"rd": 0, "qf": 0, "ki": 0}
    self.calls = 0

  def propose(self, role, texts, greedy):
    out = []
    for text, ids, _ in super().propose(role, texts, greedy):
      self.calls += 1
      cut = role == "ki" or (role == "rd" and self.calls % 2 == 0)
      self.cut[role] += cut
      out.append((text, ids, cut))
    return out


def test_the_agent_loop_carries_the_proxy_truncation(w, store):
  examples = w.split("train")[:6]
  a, s = make(w, store, examples)
  cutting = Cutting(w, examples)
  a.propose = cutting.propose
  made = []
  a.run([ex.question for ex in examples], samples=made)
  counts = agent_lib.truncation_counts([smp for m in made for smp in m])
  assert counts["decisions"] == cutting.proposed["rd"] > 0
  assert counts["selections"] == cutting.proposed["ki"] > 0
  assert counts["truncated_decisions"] == cutting.cut["rd"] > 0
  assert counts["truncated_selections"] == cutting.proposed["ki"]     # every one cut
  assert counts["truncated_formulations"] == 0
  rates = agent_lib.truncation_rates(counts)
  assert rates["truncated_selection_rate"] == 1.0
  assert rates["truncated_decision_rate"] == pytest.approx(
      cutting.cut["rd"] / cutting.proposed["rd"])


def test_report_line_gives_the_sums_ratio():
  # an eval summary holds per-question means over n questions: 10 decisions, 2 cut; 4
  # selections, 1 cut; 4 formulations, none cut
  summary = {"n": 4, "decisions": 2.5, "truncated_decisions": 0.5, "formulations": 1.0,
             "truncated_formulations": 0.0, "selections": 1.0, "truncated_selections": 0.25}
  line = report.truncation_line(summary, {"rd": 8, "qf": 160, "ki": 48, "reader": 160})
  assert "decisions 0.200 (2 of 10, cap 8)" in line
  assert "selections 0.250 (1 of 4, cap 48)" in line
  assert "formulations 0.000 (0 of 4, cap 160)" in line
  assert report.truncation_line({"n": 4, "f1": 0.5}, {}) == ""     # a summary without them
