"""The ANN benchmarks' shared measures (bench.retrieval and bench.retrieval_scale, which runs
under `bench.retrieval --scale`): Recall@k against exact neighbours, and the smallest knob value
(ScaNN leaves to search, HNSW efSearch) that reaches a target recall."""
from __future__ import annotations

import numpy as np


def recall(found: np.ndarray, truth: np.ndarray) -> float:
  k = truth.shape[1]
  return float(np.mean([len(set(f[:k].tolist()) & set(t.tolist())) / k
                        for f, t in zip(found, truth)]))


def tune(evaluate, grid, target: float, steps: int = 4):
  """Smallest knob value reaching `target`: walk the ascending `grid`, then bisect (integers)
  between the last miss and the first hit. evaluate(x) -> (recall, seconds).

  Returns (x, recall, seconds) at the smallest value found, or None if the grid never reaches it.
  """
  lo, hit = None, None
  for x in grid:
    rec, dt = evaluate(x)
    if rec >= target:
      hit = (x, rec, dt)
      break
    lo = x
  if hit is None:
    return None
  if lo is not None:
    hi = hit[0]
    for _ in range(steps):
      if hi - lo <= 1:
        break
      mid = (lo + hi) // 2
      rec, dt = evaluate(mid)
      if rec >= target:
        hi, hit = mid, (mid, rec, dt)
      else:
        lo = mid
  return hit
