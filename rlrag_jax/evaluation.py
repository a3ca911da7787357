"""Greedy evaluation of a policy on a task's held-out examples, with a per-hop breakdown."""
from __future__ import annotations

import collections
from typing import Sequence

import jax
import numpy as np


def evaluate(task, policy, examples: Sequence, *, batch_size: int = 64, seed: int = 0,
             progress: bool = True, desc: str = "eval", judge=None) -> dict:
  """Runs greedy rollouts and averages `task.eval_metrics`; returns {'all': {...}, 'hops=k': {...},
  'dataset=name': {...} (when the examples come from several datasets), 'rows': [per-example
  dicts]}.

  `judge(question, prediction, answers) -> True | False | None` (optional, e.g.
  `judge.OpenAIJudge` with the method's prompt) adds a 'judge' accuracy column, judged on the
  'prediction' string that eval_metrics returns; None ("not judged": the endpoint failed) scores
  0 and is counted in 'judge/failures' (a count, not a mean).
  """
  from tqdm.auto import tqdm
  rows, failures, has_hops = [], 0, False
  rng = jax.random.PRNGKey(seed)
  batches = range(0, len(examples), batch_size)
  it = tqdm(batches, desc=desc, unit="batch", leave=False) if progress else batches
  for start in it:
    chunk = list(examples[start:start + batch_size])
    rng, sub = jax.random.split(rng)
    if hasattr(task, "eval_rollout"):       # a task whose evaluation differs from training
      episodes = task.eval_rollout(policy, chunk, sub)
    else:
      episodes = task.rollout(policy, chunk, sub, group_size=1, greedy=True)
    if hasattr(task, "eval_metrics_batch"):   # one call a batch (e.g. one encoder call)
      batch_metrics = list(task.eval_metrics_batch(episodes))
    else:
      batch_metrics = [task.eval_metrics(ep) for ep in episodes]
    for ep, em in zip(episodes, batch_metrics):
      m = dict(em)
      has_hops = has_hops or hasattr(ep.example, "hops")
      m["hops"] = int(getattr(ep.example, "hops", 0) or 0)
      m["id"] = getattr(ep.example, "id", "")
      m["dataset"] = getattr(ep.example, "source", "") or ""
      m["completion"] = ep.text
      if judge is not None:
        verdict = judge(ep.example.question, m.get("prediction", ""), ep.example.answers)
        m["judge"] = float(verdict is True)
        failures += verdict is None
      rows.append(m)
  out = {"all": _mean(rows), "rows": rows}
  if judge is not None:
    out["all"]["judge/failures"] = float(failures)
  by_hops = collections.defaultdict(list)
  for r in rows:
    if has_hops:
      by_hops[r["hops"]].append(r)
  for h in sorted(by_hops):
    out[f"hops={h}"] = _mean(by_hops[h])
  by_dataset = collections.defaultdict(list)
  for r in rows:
    by_dataset[r["dataset"]].append(r)
  if len(by_dataset) > 1:              # a mixed evaluation set: each dataset on its own too
    for name in sorted(by_dataset):
      out[f"dataset={name}"] = _mean(by_dataset[name])
  return out


def _mean(rows) -> dict:
  keys = [k for k in (rows[0] if rows else {}) if isinstance(rows[0][k], (int, float, np.floating))
          and k != "hops"]
  out = {k: float(np.mean([r[k] for r in rows])) for k in keys}
  out["n"] = len(rows)
  return out
