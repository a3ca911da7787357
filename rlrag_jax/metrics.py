"""Answer and retrieval metrics shared by every method, and the intervals experiments put on them.

Answer normalisation follows ARENA appendix D: lowercase; underscores to spaces; strip
punctuation; drop the articles a/an/the; collapse whitespace. Scores are the best over aliases.

Intervals over seeds and held-out examples (`experiments.seeds`, the APEX pipeline): a held-out
difference (after - before RL, arm B - arm A) is measured per (seed, example). Three intervals
of its mean, all 95% by default:
  paired_bootstrap        every (seed, example) pair one unit: leaves out seed-to-seed variance;
  hierarchical_bootstrap  seeds resampled, then examples within each drawn seed;
  t_interval              Student-t over the per-seed means (df = seeds - 1).
With few seeds a percentile bootstrap over seeds cannot leave [min, max] of the per-seed means
and is too narrow; `claim` therefore asks that both seed-aware intervals exclude 0.
"""
from __future__ import annotations

import collections
import re
import string
from typing import Iterable, Sequence

import numpy as np

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
  s = str(s).lower().replace("_", " ")
  s = "".join(ch for ch in s if ch not in _PUNCT)
  s = _ARTICLES.sub(" ", s)
  return " ".join(s.split())


def _aliases(answers) -> list:
  return [answers] if isinstance(answers, str) else list(answers)


def exact_match(pred: str, answers) -> float:
  """1.0 when the normalised prediction equals any normalised alias, else 0.0."""
  p = normalize_answer(pred)
  return float(any(p == normalize_answer(a) for a in _aliases(answers)))


def _f1_one(pred: str, gold: str) -> float:
  p, g = normalize_answer(pred).split(), normalize_answer(gold).split()
  if not p or not g:
    return float(p == g)
  common = collections.Counter(p) & collections.Counter(g)
  same = sum(common.values())
  if same == 0:
    return 0.0
  precision, recall = same / len(p), same / len(g)
  return 2 * precision * recall / (precision + recall)


def f1(pred: str, answers) -> float:
  """Token F1 of the normalised strings, best over aliases."""
  return max((_f1_one(pred, a) for a in _aliases(answers)), default=0.0)


def recall_at_k(retrieved: Sequence, gold: Iterable, k: int) -> float:
  """Fraction of gold ids found in the first k retrieved ids (0.0 when gold is empty)."""
  gold = set(gold)
  if not gold:
    return 0.0
  return len(gold & set(list(retrieved)[:k])) / len(gold)


def full_recall_at_k(retrieved: Sequence, gold: Iterable, k: int) -> float:
  """1.0 when every gold id is in the first k retrieved ids."""
  gold = set(gold)
  return float(bool(gold) and gold <= set(list(retrieved)[:k]))


def average_precision(retrieved: Sequence, gold: Iterable) -> float:
  """Average precision of a ranked list against a gold set, normalised by |gold| (missed gold
  ids count as zero precision; a repeated id counts as a miss)."""
  gold = set(gold)
  if not gold:
    return 0.0
  hits, total = 0, 0.0
  seen = set()
  for rank, rid in enumerate(retrieved, start=1):
    if rid in gold and rid not in seen:
      hits += 1
      total += hits / rank
    seen.add(rid)
  return total / len(gold)


# ------------------------------------------------------------------------------- intervals
def mean_std(values: Sequence[float]) -> tuple:
  """(mean, sample std with ddof=1; 0 for one value)."""
  v = np.asarray(values, np.float64)
  return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0


def _percentiles(means: np.ndarray, level: float) -> tuple:
  tail = (1 - level) / 2 * 100
  return float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))


def paired_bootstrap(diffs: Sequence[float], resamples: int = 2000, seed: int = 0,
                     level: float = 0.95) -> tuple:
  """(mean, low, high): the mean of paired differences and its percentile bootstrap interval,
  every difference one independent unit."""
  d = np.asarray(diffs, np.float64)
  if d.size == 0:
    return float("nan"), float("nan"), float("nan")
  rng = np.random.default_rng(seed)
  idx = rng.integers(0, d.size, size=(resamples, d.size))
  return (float(d.mean()),) + _percentiles(d[idx].mean(axis=1), level)


def hierarchical_bootstrap(groups: Sequence[Sequence[float]], resamples: int = 2000,
                           seed: int = 0, level: float = 0.95) -> tuple:
  """(mean, low, high) of the mean over seeds of the per-seed mean difference. groups: one
  sequence of paired differences per seed (empty ones are dropped). Each resample draws as many
  seeds as there are, with replacement, then each drawn seed's examples with replacement, and
  averages the drawn seeds' means (each seed weighs the same).

  The seed draws come first, then each seed's example draws; with one seed the seed draws
  consume no random numbers (a range of one), so the result is exactly
  `paired_bootstrap(groups[0], resamples, seed)`."""
  gs = [np.asarray(g, np.float64) for g in groups if len(g)]
  if not gs:
    return float("nan"), float("nan"), float("nan")
  rng = np.random.default_rng(seed)
  picks = rng.integers(0, len(gs), size=(resamples, len(gs)))   # [R, S] drawn seed per slot
  slot_means = np.empty(picks.shape, np.float64)
  for s, g in enumerate(gs):
    where = picks == s
    idx = rng.integers(0, g.size, size=(int(where.sum()), g.size))
    slot_means[where] = g[idx].mean(axis=1)
  return (float(np.mean([g.mean() for g in gs])),) + _percentiles(slot_means.mean(axis=1), level)


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple:
  """(mean, low, high): the Student-t interval of the mean of per-seed values, mean ±
  t_{(1+level)/2, n-1} · sd / sqrt(n) with the sample sd (ddof=1); nan bounds below 2 values."""
  v = np.asarray(values, np.float64)
  if v.size == 0:
    return float("nan"), float("nan"), float("nan")
  return t_interval_from_moments(float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0,
                                 int(v.size), level)


def t_interval_from_moments(mean: float, sd: float, n: int, level: float = 0.95) -> tuple:
  """`t_interval` from the mean, the sample sd (ddof=1) and the number of values."""
  from scipy import stats   # pylint: disable=g-import-not-at-top
  if n < 2:
    return float(mean), float("nan"), float("nan")
  half = float(stats.t.ppf((1 + level) / 2, n - 1)) * sd / np.sqrt(n)
  return float(mean), float(mean - half), float(mean + half)


def claim(*intervals: Sequence[float]) -> str:
  """'> 0' or '< 0' when every (mean, low, high) interval lies on that side of 0, 'includes 0'
  when one does not, 'n/a' when one is undefined (nan: fewer than 2 seeds for a t interval)."""
  if not intervals or any(not np.isfinite(iv[1]) or not np.isfinite(iv[2]) for iv in intervals):
    return "n/a"
  if all(iv[1] > 0 for iv in intervals):
    return "> 0"
  if all(iv[2] < 0 for iv in intervals):
    return "< 0"
  return "includes 0"


def seed_intervals(groups: Sequence[Sequence[float]], resamples: int = 2000, seed: int = 0,
                   level: float = 0.95) -> dict:
  """The three intervals of one paired difference, from its values grouped by seed:
  {'pooled', 'hierarchical', 't': (mean, low, high), 'claim': claim(hierarchical, t),
  'per_seed': the per-seed means, 'pairs': the number of (seed, example) pairs}."""
  gs = [list(map(float, g)) for g in groups if len(g)]
  per_seed = [float(np.mean(g)) for g in gs]
  hier = hierarchical_bootstrap(gs, resamples, seed, level)
  t = t_interval(per_seed, level)
  return {"pooled": paired_bootstrap([d for g in gs for d in g], resamples, seed, level),
          "hierarchical": hier, "t": t, "claim": claim(hier, t), "per_seed": per_seed,
          "pairs": sum(len(g) for g in gs)}


def stratified_bootstrap(groups: Sequence[Sequence[float]], resamples: int = 2000, seed: int = 0,
                         level: float = 0.95) -> tuple:
  """(mean, low, high) of the unweighted mean of the group means (e.g. the average EM over
  datasets, each dataset weighing the same whatever its size): each resample draws every
  group's values with replacement, within the group, and averages the group means. Empty
  groups are left out; nan when none is left."""
  gs = [np.asarray(g, np.float64) for g in groups if len(g)]
  if not gs:
    return float("nan"), float("nan"), float("nan")
  rng = np.random.default_rng(seed)
  means = np.zeros(resamples, np.float64)
  for g in gs:
    means += g[rng.integers(0, g.size, size=(resamples, g.size))].mean(axis=1)
  return (float(np.mean([g.mean() for g in gs])),) + _percentiles(means / len(gs), level)
