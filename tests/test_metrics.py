"""rlrag_jax.metrics against hand-computed values (the intervals also against scipy and a
printed t table)."""
import numpy as np
import pytest

from rlrag_jax import metrics
from rlrag_jax.metrics import (average_precision, exact_match, f1, full_recall_at_k,
                               normalize_answer, recall_at_k)


@pytest.mark.parametrize("raw,normalized", [
    ("The Eiffel Tower!", "eiffel tower"),
    ("An_apple, a day.", "apple day"),          # underscore -> space, articles dropped
    ("new_york", "new york"),                   # underscore splits, not joins
    ("U.S.A.", "usa"),                          # punctuation removed inside tokens
    ("Theater of the Absurd", "theater of absurd"),   # 'the' only as a whole word
    ("  A   an  THE  ", ""),
    ("Rock-'n'-roll", "rocknroll"),
])
def test_normalize_answer(raw, normalized):
  assert normalize_answer(raw) == normalized


def test_exact_match():
  assert exact_match("the  Eiffel_Tower.", ["Eiffel Tower"]) == 1.0
  assert exact_match("Eiffel", ["Eiffel Tower"]) == 0.0
  assert exact_match("New_York", "new york") == 1.0            # a single string is one alias
  assert exact_match("NYC", ["New York City", "nyc"]) == 1.0   # best over aliases
  assert exact_match("no", ["yes"]) == 0.0
  assert exact_match("anything", []) == 0.0


def test_f1_partial_overlap():
  # pred -> [quick, brown, fox] (3), gold -> [quick, red, fox, jumps] (4), common 2:
  # P = 2/3, R = 1/2, F1 = 2PR / (P + R) = 4/7.
  assert f1("The quick brown fox", "quick red fox jumps") == pytest.approx(4 / 7)
  # Repeated tokens count with multiplicity: pred [a1, a1, b] vs gold [a1, b, b]: common 2,
  # P = R = 2/3 -> F1 = 2/3.
  assert f1("a1 a1 b", "a1 b b") == pytest.approx(2 / 3)
  # Best over aliases: 'paris' vs ['paris france' (F1 2/3), 'paris' (1.0)].
  assert f1("Paris", ["Paris, France", "paris"]) == 1.0
  assert f1("Paris", ["Paris, France"]) == pytest.approx(2 / 3)
  assert f1("london", ["paris"]) == 0.0
  assert f1("the", "a") == 1.0          # both normalise to nothing
  assert f1("x", "the") == 0.0
  assert f1("x", []) == 0.0


RANKED = ["d3", "d1", "d7", "d2", "d5"]


def test_recall_and_full_recall():
  gold = {"d1", "d2", "d9"}
  assert recall_at_k(RANKED, gold, 1) == 0.0
  assert recall_at_k(RANKED, gold, 2) == pytest.approx(1 / 3)
  assert recall_at_k(RANKED, gold, 4) == pytest.approx(2 / 3)
  assert recall_at_k(RANKED, gold, 10) == pytest.approx(2 / 3)
  assert recall_at_k(RANKED, [], 3) == 0.0
  assert full_recall_at_k(RANKED, gold, 5) == 0.0
  assert full_recall_at_k(RANKED, ["d1", "d2"], 3) == 0.0
  assert full_recall_at_k(RANKED, ["d1", "d2"], 4) == 1.0
  assert full_recall_at_k(RANKED, [], 4) == 0.0


def test_average_precision():
  # Hits at ranks 2 and 4: precisions 1/2 and 2/4; d9 never retrieved -> divide by 3.
  assert average_precision(RANKED, {"d1", "d2", "d9"}) == pytest.approx((1 / 2 + 2 / 4) / 3)
  assert average_precision(RANKED, {"d3", "d1"}) == 1.0
  # Hits at ranks 3 and 5: (1/3 + 2/5) / 2.
  assert average_precision(RANKED, ["d7", "d5"]) == pytest.approx((1 / 3 + 2 / 5) / 2)
  # A repeated id is counted once: hits at ranks 1 and 3 -> (1 + 2/3) / 2.
  assert average_precision(["d1", "d1", "d2"], {"d1", "d2"}) == pytest.approx(5 / 6)
  assert average_precision(RANKED, []) == 0.0
  assert average_precision([], {"d1"}) == 0.0


# ------------------------------------------------------------------------------- intervals
# Two-sided 95% Student-t quantiles t_{0.975, df} from a printed table (e.g. NIST/SEMATECH
# e-Handbook, table 1.3.6.7.2), independent of scipy.
T975 = {1: 12.706, 2: 4.303, 4: 2.776, 9: 2.262}


def test_one_seed_hierarchical_is_the_pooled_bootstrap():
  """One seed: drawing the seed consumes no random numbers, so the example draws are
  paired_bootstrap's, number for number."""
  d = np.random.default_rng(7).normal(0.1, 1.0, size=57)
  for seed in (0, 3):
    assert metrics.hierarchical_bootstrap([d], 500, seed) == metrics.paired_bootstrap(d, 500,
                                                                                      seed)
  assert np.isnan(metrics.hierarchical_bootstrap([[], []])[0])


def test_hierarchical_bootstrap_carries_between_seed_spread():
  """Seeds that are the same examples shifted by a constant: the pooled interval's width does
  not see the shifts' spread across seeds, the hierarchical one does. Reference: the resampled
  mean of S seeds with shifts c and examples x (n each) has variance var(c) / S + var(x) / (S n)
  (population variances), so the 95% interval is about ±1.96 of its sqrt. With 16 seeds the
  resampled mean is close to normal, and 4,000 resamples put a percentile width within ~2% of
  its limit (checked over several data seeds): 5% is the tolerance."""
  rng = np.random.default_rng(0)
  x = rng.normal(0.0, 1.0, size=50)
  n, S, R = x.size, 16, 4000
  width = lambda iv: iv[2] - iv[1]
  same = [x] * S
  ref_same = 2 * 1.96 * np.sqrt(x.var() / (S * n))
  assert width(metrics.hierarchical_bootstrap(same, R)) == pytest.approx(ref_same, rel=0.05)
  assert width(metrics.paired_bootstrap(np.concatenate(same), R)) == pytest.approx(ref_same,
                                                                                   rel=0.05)
  shifts = np.linspace(-0.6, 0.6, S)
  shifted = [x + c for c in shifts]
  hier = metrics.hierarchical_bootstrap(shifted, R)
  ref = 2 * 1.96 * np.sqrt(shifts.var() / S + x.var() / (S * n))
  assert hier[0] == pytest.approx(x.mean())                 # the shifts average to 0
  assert width(hier) == pytest.approx(ref, rel=0.05)
  assert width(hier) > 2 * width(metrics.paired_bootstrap(np.concatenate(shifted), R))


def test_t_interval_against_a_printed_table_and_scipy():
  from scipy import stats
  for df in (1, 2, 4, 9):
    v = np.random.default_rng(df).normal(0.05, 0.03, size=df + 1)
    mean, lo, hi = metrics.t_interval(v)
    half = T975[df] * v.std(ddof=1) / np.sqrt(v.size)
    assert mean == pytest.approx(v.mean())
    assert (lo, hi) == pytest.approx((mean - half, mean + half), abs=2e-3 * half)
    ci = stats.ttest_1samp(v, 0.0).confidence_interval(0.95)
    assert (lo, hi) == pytest.approx((ci.low, ci.high))
  # issue 34's example: R2AG long_warmup Full-Recall gains per seed
  assert metrics.t_interval([0.080, -0.005, 0.040])[1:] == pytest.approx((-0.067, 0.144),
                                                                         abs=5e-4)
  assert metrics.t_interval_from_moments(0.1, 0.0, 3) == (0.1, 0.1, 0.1)
  assert np.isnan(metrics.t_interval([0.3])[1]) and metrics.t_interval([0.3])[0] == 0.3


def test_claim_needs_every_interval_on_one_side():
  assert metrics.claim((0.1, 0.01, 0.2), (0.1, 0.001, 0.3)) == "> 0"
  assert metrics.claim((-0.1, -0.2, -0.01)) == "< 0"
  assert metrics.claim((0.1, 0.01, 0.2), (0.1, -0.05, 0.25)) == "includes 0"
  assert metrics.claim((0.1, 0.01, 0.2), (0.1, float("nan"), float("nan"))) == "n/a"


def test_seed_intervals_by_hand():
  groups = [[1.0, 0.0, 0.0, 0.0], [], [0.5, 0.5], [1.0, 1.0, 0.0]]
  iv = metrics.seed_intervals(groups, resamples=300, seed=1)
  assert iv["per_seed"] == pytest.approx([0.25, 0.5, 2 / 3]) and iv["pairs"] == 9
  assert iv["pooled"] == metrics.paired_bootstrap(
      [1, 0, 0, 0, 0.5, 0.5, 1, 1, 0], 300, 1)
  assert iv["hierarchical"][0] == pytest.approx(np.mean([0.25, 0.5, 2 / 3]))
  assert iv["t"] == pytest.approx(metrics.t_interval([0.25, 0.5, 2 / 3]))
  assert iv["claim"] == metrics.claim(iv["hierarchical"], iv["t"])


def test_stratified_bootstrap_averages_groups_equally():
  """One group: the plain bootstrap of its values (the same draws). Several: the mean of the
  group means (not of the pooled values), and a group without spread adds none."""
  from rlrag_jax import metrics
  v = [0.0, 1.0, 1.0, 0.0, 1.0]
  assert metrics.stratified_bootstrap([v], 500, seed=3) == metrics.paired_bootstrap(v, 500, seed=3)
  mean, lo, hi = metrics.stratified_bootstrap([[1.0] * 10, [0.0, 0.0]], 200)
  assert (mean, lo, hi) == (0.5, 0.5, 0.5)
  mean, lo, hi = metrics.stratified_bootstrap([[1.0] * 30, [0.0, 1.0] * 5, []], 2000)
  assert mean == 0.75 and lo < 0.75 < hi and lo >= 0.5 and hi <= 1.0


def _tables(matrix, ids=None):
  """One {question id: value} per row of a [seeds, questions] matrix."""
  ids = ids if ids is not None else [f"q{j:03d}" for j in range(np.shape(matrix)[1])]
  return [dict(zip(ids, map(float, row))) for row in matrix]


def test_crossed_bootstrap_reduces_to_the_one_factor_bootstraps():
  """No spread between seeds (every seed the same per-question values): each replicate is the
  mean of one question draw, the question-only bootstrap of the per-question means, draw for
  draw (questions are drawn first). One question per seed: each replicate is the mean of the
  drawn seeds' values, the seeds-only bootstrap (a range of one consumes no random numbers)."""
  x = np.random.default_rng(5).normal(0.1, 1.0, size=40)
  for seed in (0, 4):
    crossed = metrics.crossed_bootstrap(_tables([x] * 3), 500, seed)
    assert crossed == pytest.approx(metrics.paired_bootstrap(x, 500, seed), rel=1e-12)
  per_seed = [0.3, -0.1, 0.25, 0.05]
  crossed = metrics.crossed_bootstrap([{"only": v} for v in per_seed], 500, 2)
  assert crossed == pytest.approx(metrics.paired_bootstrap(per_seed, 500, 2), rel=1e-12)
  assert np.isnan(metrics.crossed_bootstrap([{}, {}])[0])


def test_crossed_bootstrap_against_a_replicate_by_replicate_loop():
  """The vectorised replicates against a plain loop over the same draws, with a seed that
  lacks two questions (it averages over the drawn questions it has) and ids that are not in
  order: the questions are the sorted union of ids."""
  ids = ["c", "a", "d", "b", "e"]
  tables = [dict(zip(ids, [1.0, 0.0, 0.5, 0.0, 1.0])), dict(zip(ids, [0.0, 0.0, 1.0, 1.0, 0.0])),
            {"a": 1.0, "b": 0.25, "e": -0.5}]
  R, seed = 300, 11
  got = metrics.crossed_bootstrap(tables, R, seed)
  rng = np.random.default_rng(seed)
  union = sorted(ids)
  q_idx = rng.integers(0, len(union), size=(R, len(union)))
  picks = rng.integers(0, len(tables), size=(R, len(tables)))
  reps = []
  for r in range(R):
    drawn = [union[j] for j in q_idx[r]]
    seed_means = []
    for s in picks[r]:
      vals = [tables[s][q] for q in drawn if q in tables[s]]
      if vals:
        seed_means.append(np.mean(vals))
    reps.append(np.mean(seed_means))
  assert got[0] == pytest.approx(np.mean([np.mean(list(t.values())) for t in tables]))
  assert got[1:] == pytest.approx((np.percentile(reps, 2.5), np.percentile(reps, 97.5)))


def test_crossed_bootstrap_counts_shared_question_difficulty_once():
  """Seeds that are the same questions x shifted by constants c (a crossed design, as when
  every seed evaluates the same held-out set): the mean over the drawn seeds and one shared
  question draw has variance var(c) / S + var(x) / n; the hierarchical draw (questions drawn
  anew per seed) gives var(c) / S + var(x) / (S n), too narrow by the question part. Same
  tolerance argument as the hierarchical test above."""
  rng = np.random.default_rng(0)
  x = rng.normal(0.0, 1.0, size=50)
  n, S, R = x.size, 16, 4000
  width = lambda iv: iv[2] - iv[1]
  shifts = np.linspace(-0.6, 0.6, S)
  matrix = np.asarray([x + c for c in shifts])
  crossed = metrics.crossed_bootstrap(_tables(matrix), R)
  assert crossed[0] == pytest.approx(x.mean())
  ref = 2 * 1.96 * np.sqrt(shifts.var() / S + x.var() / n)
  assert width(crossed) == pytest.approx(ref, rel=0.05)
  assert width(crossed) > 1.3 * width(metrics.hierarchical_bootstrap(list(matrix), R))


def test_seed_intervals_of_id_keyed_groups_ignore_row_order():
  """Groups given as {id: value}: the order the rows came in changes no interval (values are
  taken in id order), the crossed interval is there and the claim asks all three."""
  rng = np.random.default_rng(2)
  m = rng.normal(0.05, 0.3, size=(3, 30))
  tables = _tables(m)
  shuffled = [dict(sorted(t.items(), key=lambda kv: rng.random())) for t in tables]
  a, b = metrics.seed_intervals(tables, 300), metrics.seed_intervals(shuffled, 300)
  assert a == b
  assert a["crossed"] == metrics.crossed_bootstrap(tables, 300)
  assert a["claim"] == metrics.claim(a["hierarchical"], a["crossed"], a["t"])
  assert a["p"] == pytest.approx(metrics.t_pvalue(m.mean(axis=1)))


def test_t_pvalue_and_holm_by_hand():
  from scipy import stats
  v = [0.012, 0.008, 0.010]
  assert metrics.t_pvalue(v) == pytest.approx(stats.ttest_1samp(v, 0.0).pvalue)
  # p < 0.05 exactly when the 95% t interval excludes 0
  assert (metrics.t_pvalue(v) < 0.05) == (metrics.t_interval(v)[1] > 0)
  assert metrics.t_pvalue([0.0, 0.0, 0.0]) == 1.0 and metrics.t_pvalue([0.2, 0.2]) == 0.0
  assert np.isnan(metrics.t_pvalue([0.3]))
  # m = 4 finite: sorted 0.005 <= 0.05/4, 0.01 <= 0.05/3, 0.03 > 0.05/2 stops (0.04 too)
  assert metrics.holm([0.01, 0.04, 0.03, float("nan"), 0.005]) == [True, False, False, False,
                                                                   True]
  assert metrics.holm([0.04, 0.04]) == [False, False]        # 0.04 > 0.05 / 2
  assert metrics.holm([0.02, 0.04]) == [True, True]          # 0.02 <= 0.025, 0.04 <= 0.05
  assert metrics.holm([]) == []
