"""Set-Equivalence Plan Reward (SEPR, APEX-Searcher section 2.2.1).

A predicted plan (ordered sub-questions) is scored against the gold decomposition as sets, up
to order and paraphrase:

  1. embed every sub-question with a sentence encoder; sim[i, j] = cosine(pred_i, gold_j);
  2. a one-to-one assignment of predicted to gold sub-questions minimising the total cost
     1 - sim (Hungarian algorithm, `scipy.optimize.linear_sum_assignment`, rectangular allowed);
  3. the matched pairs M are the assigned pairs with sim >= threshold;
  4. precision |M| / |pred|, recall |M| / |gold|, reward = their harmonic mean (F1), and 0 when
     either plan is empty or nothing matches.

The paper's text lost the threshold's value ("empirically tuned"); ours is calibrated on the
world's paraphrase templates by `rlrag_jax.methods.apex.calibrate` (see DEFAULT_THRESHOLD).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

# Chosen by `python -m rlrag_jax.methods.apex.calibrate` on the embedded world's sub-question
# templates with the packaged MiniLM encoder (docs/results/apex_sepr_threshold/): the best
# balanced accuracy over a 0.01 grid; 93% of paraphrase pairs match, 80% of "other relation,
# same subject" pairs and all "same relation, other subject" pairs are rejected.
DEFAULT_THRESHOLD = 0.9


def _matrix(sim) -> np.ndarray:
  sim = np.asarray(sim, dtype=np.float64)
  if sim.ndim != 2:
    raise ValueError(f"sepr: similarity must be a [pred, gold] matrix, got shape {sim.shape}")
  if not np.all(np.isfinite(sim)):
    raise ValueError("sepr: similarity matrix holds non-finite values")
  return sim


def match_pairs(sim: np.ndarray, threshold: float) -> list:
  """The Hungarian assignment on cost 1 - sim, kept where sim >= threshold: [(i, j), ...]."""
  from scipy.optimize import linear_sum_assignment   # pylint: disable=g-import-not-at-top
  sim = _matrix(sim)
  if sim.size == 0:
    return []
  rows, cols = linear_sum_assignment(1.0 - sim)
  return [(int(i), int(j)) for i, j in zip(rows, cols) if sim[i, j] >= threshold]


def sepr_from_similarity(sim: np.ndarray, threshold: float) -> float:
  """SEPR from a [P, G] cosine-similarity matrix (P predicted, G gold sub-questions)."""
  sim = _matrix(sim)
  p, g = sim.shape
  if p == 0 or g == 0:
    return 0.0
  m = len(match_pairs(sim, threshold))
  if m == 0:
    return 0.0
  precision, recall = m / p, m / g
  return float(2 * precision * recall / (precision + recall))


class SEPRScorer:
  """SEPR for a batch of (predicted, gold) plans with ONE encoder call for the whole batch.

  `encoder` is anything with `.encode(texts, batch_size) -> [N, d]` unit rows (the shared
  `retrieval.encoder.Encoder`; tests pass stand-ins). Identical strings are embedded once.
  """

  def __init__(self, encoder, threshold: float = DEFAULT_THRESHOLD, batch_size: int = 256):
    if not 0.0 < float(threshold) <= 1.0:
      raise ValueError(f"sepr threshold must be in (0, 1], got {threshold}")
    self.encoder = encoder
    self.threshold = float(threshold)
    self.batch_size = int(batch_size)
    self.encoder_calls = 0

  def similarities(self, preds: Sequence[Sequence[str]], golds: Sequence[Sequence[str]]) -> list:
    """[P_k, G_k] cosine matrices, one per pair, from one batched encode of all texts."""
    if len(preds) != len(golds):
      raise ValueError(f"sepr: {len(preds)} predicted plans but {len(golds)} gold plans")
    texts = sorted({t for plan in list(preds) + list(golds) for t in plan})
    if texts:
      emb = np.asarray(self.encoder.encode(texts, batch_size=max(self.batch_size, len(texts))),
                       np.float64)
      self.encoder_calls += 1
      emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    row = {t: i for i, t in enumerate(texts)}
    out = []
    for pred, gold in zip(preds, golds):
      if not pred or not gold:
        out.append(np.zeros((len(pred), len(gold))))
        continue
      a = emb[[row[t] for t in pred]]
      b = emb[[row[t] for t in gold]]
      out.append(np.clip(a @ b.T, -1.0, 1.0))
    return out

  def __call__(self, preds: Sequence[Sequence[str]], golds: Sequence[Sequence[str]]) -> list:
    return [sepr_from_similarity(s, self.threshold) for s in self.similarities(preds, golds)]
