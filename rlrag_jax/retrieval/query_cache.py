"""Query embeddings from an encoder, cached by query text (rollouts ask the same queries again:
the reward that scores a query reuses the rollout's embedding, a group repeats a query)."""
from __future__ import annotations

from typing import Sequence

import numpy as np


class QueryEmbeddings:
  """`self(queries) -> [n, d]` unit rows; one encoder call for the queries not yet cached. The
  cache is cleared when it exceeds `max_size` entries."""

  def __init__(self, encoder, max_size: int = 200_000, batch_size: int = 64):
    self.encoder, self.max_size, self.batch_size = encoder, int(max_size), int(batch_size)
    self.cache = {}
    self.encoded = 0                # queries sent to the encoder so far

  def __call__(self, queries: Sequence[str]) -> np.ndarray:
    queries = list(queries)
    todo = sorted({q for q in queries if q not in self.cache})
    if todo:
      if len(self.cache) + len(todo) > self.max_size:
        self.cache.clear()
      for q, e in zip(todo, self.encoder.encode_queries(todo, batch_size=self.batch_size)):
        self.cache[q] = e
      self.encoded += len(todo)
    if not queries:
      return np.zeros((0, self.encoder.dim), np.float32)
    return np.stack([self.cache[q] for q in queries])
