"""Answer and retrieval metrics shared by every method, and the intervals experiments put on them.

Answer normalisation follows ARENA appendix D: lowercase; underscores to spaces; strip
punctuation; drop the articles a/an/the; collapse whitespace. Scores are the best over aliases.

Intervals over seeds and held-out examples (`experiments.seeds`, the APEX pipeline): a held-out
difference (after - before RL, arm B - arm A) is measured per (seed, example). Four intervals
of its mean, all 95% by default:
  paired_bootstrap        every (seed, example) pair one unit: leaves out seed-to-seed variance;
  hierarchical_bootstrap  seeds resampled, then examples within each drawn seed, separately;
  crossed_bootstrap       seeds resampled and, in the same replicate, one draw of examples shared
                          by every drawn seed (examples paired by their id across seeds): every
                          seed evaluates the same held-out examples, so an example that is hard
                          under one seed is hard under all, and resampling it once per replicate
                          keeps that correlation, which the hierarchical draw averages away;
  t_interval              Student-t over the per-seed means (df = seeds - 1).
A seeds-only percentile bootstrap cannot leave [min, max] of the per-seed means; the
hierarchical and crossed ones add example resampling and can (R2AG's default, mAP gain: per
seed 0.010 ± 0.002, hierarchical [-0.007, +0.028]), but their seed part is still too narrow at
few seeds. `claim` therefore asks that every seed-aware interval exclude 0. `t_pvalue` and
`holm` give the multiple-testing column of the tables.
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


def _sort_key(qid):
  """Question ids in one order whatever the rows' order: numbers first, by value, then text."""
  return (0, qid, "") if isinstance(qid, (int, float)) else (1, 0, str(qid))


def by_id_values(group) -> list:
  """A group's values in the order of its question ids (`_sort_key`): a dict {id: value};
  any other sequence is taken in its order."""
  if isinstance(group, dict):
    return [float(group[k]) for k in sorted(group, key=_sort_key)]
  return [float(x) for x in group]


def crossed_bootstrap(tables: Sequence[dict], resamples: int = 2000, seed: int = 0,
                      level: float = 0.95) -> tuple:
  """(mean, low, high) of the mean over seeds of the per-seed mean difference, seeds and
  questions crossed. tables: one {question id: paired difference} per seed (empty ones are
  dropped). Each replicate draws the questions once, with replacement, from the union of the
  ids (sorted by `_sort_key`), and as many seeds as there are, with replacement; every drawn
  seed is scored on that one question draw (a seed lacking a drawn question averages over the
  drawn questions it has), and the replicate is the mean over the drawn seeds.

  The question draws come first, then the seed draws; a range of one consumes no random
  numbers, so with one seed the result is exactly `paired_bootstrap` of its values in id
  order, and with one question per seed exactly `paired_bootstrap` of the per-seed values."""
  ts = [t for t in tables if len(t)]
  if not ts:
    return float("nan"), float("nan"), float("nan")
  ids = sorted({k for t in ts for k in t}, key=_sort_key)
  col = {k: j for j, k in enumerate(ids)}
  vals = np.zeros((len(ts), len(ids)), np.float64)      # [S, Q]
  have = np.zeros((len(ts), len(ids)), np.float64)      # [S, Q] 1 where the seed has the id
  for s, t in enumerate(ts):
    for k, v in t.items():
      vals[s, col[k]], have[s, col[k]] = float(v), 1.0
  rng = np.random.default_rng(seed)
  q_idx = rng.integers(0, len(ids), size=(resamples, len(ids)))     # [R, Q] drawn question
  picks = rng.integers(0, len(ts), size=(resamples, len(ts)))       # [R, S] drawn seed
  counts = np.zeros((resamples, len(ids)), np.float64)               # [R, Q] times drawn
  np.add.at(counts, (np.arange(resamples)[:, None], q_idx), 1.0)
  with np.errstate(invalid="ignore", divide="ignore"):
    per_seed = (counts @ (vals * have).T) / (counts @ have.T)       # [R, S] seed on the draw
  reps = np.nanmean(np.take_along_axis(per_seed, picks, axis=1), axis=1)
  mean = float(np.mean([np.mean(list(t.values())) for t in ts]))
  return (mean,) + _percentiles(reps[np.isfinite(reps)], level)


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


def t_pvalue(values: Sequence[float]) -> float:
  """Two-sided p-value of the one-sample Student-t test of mean 0 over per-seed values (the test
  `t_interval` inverts: p < 1 - level exactly when that interval excludes 0). With no spread,
  1 for a mean of 0 and 0 otherwise; nan below 2 values."""
  from scipy import stats   # pylint: disable=g-import-not-at-top
  v = np.asarray(values, np.float64)
  if v.size < 2:
    return float("nan")
  sd = float(v.std(ddof=1))
  if sd == 0.0:
    return 1.0 if float(v.mean()) == 0.0 else 0.0
  t = float(v.mean()) / (sd / np.sqrt(v.size))
  return float(2 * stats.t.sf(abs(t), v.size - 1))


def holm(pvalues: Sequence[float], alpha: float = 0.05) -> list:
  """Holm's step-down correction: for each p-value whether it is rejected at family-wise error
  `alpha`. Sorted ascending, p_(k) (k = 1..m) is rejected while p_(j) <= alpha / (m - j + 1)
  for every j <= k; the first that fails stops it. nan p-values are not in the family (m counts
  the finite ones) and are never rejected."""
  finite = [(p, i) for i, p in enumerate(pvalues) if np.isfinite(p)]
  out = [False] * len(pvalues)
  m = len(finite)
  for j, (p, i) in enumerate(sorted(finite)):
    if p > alpha / (m - j):
      break
    out[i] = True
  return out


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


def seed_intervals(groups: Sequence, resamples: int = 2000, seed: int = 0,
                   level: float = 0.95) -> dict:
  """The intervals of one paired difference, from its values grouped by seed:
  {'pooled', 'hierarchical', 't': (mean, low, high), 'crossed': (mean, low, high) when the
  groups are {question id: value} dicts (else nan: without ids nothing pairs questions across
  seeds), 'claim': claim(hierarchical, crossed, t) (without ids claim(hierarchical, t)),
  'p': `t_pvalue` of the per-seed means, 'per_seed': the per-seed means, 'pairs': the number of
  (seed, example) pairs}. A dict group's values are taken in id order (`by_id_values`), so the
  result does not depend on the order of the rows they came from."""
  keyed = bool(groups) and all(isinstance(g, dict) for g in groups)
  gs = [by_id_values(g) for g in groups if len(g)]
  per_seed = [float(np.mean(g)) for g in gs]
  hier = hierarchical_bootstrap(gs, resamples, seed, level)
  t = t_interval(per_seed, level)
  nan = (float("nan"),) * 3
  crossed = crossed_bootstrap(list(groups), resamples, seed, level) if keyed else nan
  return {"pooled": paired_bootstrap([d for g in gs for d in g], resamples, seed, level),
          "hierarchical": hier, "crossed": crossed, "t": t,
          "claim": claim(hier, crossed, t) if keyed else claim(hier, t),
          "p": t_pvalue(per_seed), "per_seed": per_seed, "pairs": sum(len(g) for g in gs)}


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
