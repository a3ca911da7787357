"""Evaluation of a policy on a task's held-out examples (`Task.evaluate`'s rows), averaged,
with per-hop and per-dataset breakdowns."""
from __future__ import annotations

import collections
from typing import Sequence

import jax
import numpy as np


def evaluate(task, policy, examples: Sequence, *, batch_size: int = 64, seed: int = 0,
             progress: bool = True, desc: str = "eval", judge=None) -> dict:
  """Runs `task.evaluate` a batch at a time and averages its rows' metrics; returns
  {'all': {...}, 'hops=k': {...}, 'dataset=name': {...} (when the examples come from several
  datasets), 'rows': [per-example dicts: the metrics, 'prediction', 'hops', 'id', 'dataset',
  'completion']}.

  `judge` (optional: a `judge.OpenAIJudge` with the method's prompt) adds a 'judge' accuracy
  column, judged on each row's `EvalRow.prediction`, a batch at a time
  (`judge_many`); None ("not judged": the endpoint failed) scores 0.

  The calls and failures of the endpoints used meanwhile (that judge, and the task's own
  `monitors()`, e.g. a reward judge or SPARKLE's endpoint reader) are in 'all' as
  '<name>/calls', '<name>/failures' (counts, not means), '<name>/failure_rate' and
  '<name>/failures_<kind>' (see `judge.Span`). Too many failures raise `judge.EndpointFailing`.
  """
  from tqdm.auto import tqdm
  from rlrag_jax import judge as judge_lib
  span = judge_lib.Span(list(task.monitors()) + ([judge.monitor] if judge is not None else []))
  rows, has_hops = [], False
  rng = jax.random.PRNGKey(seed)
  batches = range(0, len(examples), batch_size)
  it = tqdm(batches, desc=desc, unit="batch", leave=False) if progress else batches
  for start in it:
    chunk = list(examples[start:start + batch_size])
    rng, sub = jax.random.split(rng)
    got = list(task.evaluate(policy, chunk, sub))
    if len(got) != len(chunk):
      raise ValueError(f"{type(task).__name__}.evaluate returned {len(got)} rows for "
                       f"{len(chunk)} examples")
    if judge is not None:
      verdicts = judge.judge_many([(r.example.question, r.prediction, r.example.answers)
                                   for r in got])
    for k, r in enumerate(got):
      ex = r.example
      m = {**r.metrics, "prediction": r.prediction}
      has_hops = has_hops or hasattr(ex, "hops")
      m["hops"] = int(getattr(ex, "hops", 0) or 0)
      m["id"] = getattr(ex, "id", "")
      m["dataset"] = getattr(ex, "source", "") or ""
      m["completion"] = r.prediction if r.completion is None else r.completion
      if judge is not None:
        m["judge"] = float(verdicts[k] is True)
      rows.append(m)
  out = {"all": {**_mean(rows), **span.metrics()}, "rows": rows}
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
