"""Expanding a reasoning-augmented retrieval tree for a question at inference (and evaluation).

Round by round, every open branch (the question plus the documents retrieved on it) gets one
output of the steering model. A branch whose output stops (or has no well-formed query) ends.
Otherwise its first `t_base` base queries (per question when given: the paper's t = M/2 of the
question's dataset) each open a child branch; each query retrieves its
top-`top_k` documents, and the first `t_pred` predicted queries (when `use_predicted`) retrieve
theirs too, which join every child of that branch (the paper's composite node: a predicted
future hop rides along with the base hop it follows). A child that adds no new document to its
branch is not expanded further. At most `max_branches` branches per question stay open per
round, and at most `max_iterations` rounds run (L_MAX-I). The documents a question used, D_s, are
every document retrieved anywhere in its tree, in the order first retrieved.

`steer(prompts) -> texts` and `search(queries, k) -> [[doc id, ...], ...]` are batched over all
questions of a round; nothing here knows a model or an index.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional, Sequence

from rlrag_jax.methods.r2ag import parsing


@dataclasses.dataclass(frozen=True)
class TreeConfig:
  top_k: int = 1
  t_base: int = 2
  t_pred: int = 1
  use_predicted: bool = True
  max_iterations: int = 5
  max_branches: int = 8


@dataclasses.dataclass
class TreeResult:
  docs: list = dataclasses.field(default_factory=list)      # D_s in first-retrieved order
  iterations: int = 0          # rounds in which the question's tree made a model call
  calls: int = 0               # steering-model outputs
  stopped: bool = False        # some branch emitted the stop signal
  steer_s: float = 0.0         # this question's share of steering-model time
  search_s: float = 0.0        # and of retrieval time
  outputs: list = dataclasses.field(default_factory=list)   # (round, branch docs, text)


def expand(questions: Sequence[str], steer: Callable, search: Callable,
           cfg: TreeConfig, t_bases: Optional[Sequence[int]] = None) -> list:
  """`t_bases`: each question's own t_base (the paper's t = M/2 per dataset), else cfg's."""
  results = [TreeResult() for _ in questions]
  t_of = list(t_bases) if t_bases is not None else [cfg.t_base] * len(questions)
  active = [(qi, ()) for qi in range(len(questions))]
  for rnd in range(cfg.max_iterations):
    if not active:
      break
    t0 = time.perf_counter()
    texts = steer([(questions[qi], docs) for qi, docs in active])
    t1 = time.perf_counter()
    plans, queries = [], []
    for (qi, docs), text in zip(active, texts):
      res = results[qi]
      res.calls += 1
      res.iterations = rnd + 1
      res.outputs.append((rnd, list(docs), text))
      step = parsing.parse(text)
      if step.stop:
        res.stopped = True
      base = [] if step.stop else list(step.base[:t_of[qi]])
      pred = [] if step.stop or not cfg.use_predicted else list(step.predicted[:cfg.t_pred])
      plans.append((len(queries), len(base), len(pred)))
      queries += base + pred
    hits = search(queries, cfg.top_k) if queries else []
    t2 = time.perf_counter()
    nxt = {}
    for (qi, docs), (start, nb, np_) in zip(active, plans):
      res = results[qi]
      base_hits = hits[start:start + nb]
      pred_docs = [d for h in hits[start + nb:start + nb + np_] for d in h]
      groups = base_hits if base_hits else ([[]] if pred_docs else [])
      for h in groups:
        child = list(docs)
        for d in list(h) + pred_docs:
          if d not in child:
            child.append(d)
          if d not in res.docs:
            res.docs.append(d)
        if len(child) > len(docs) and len(nxt.setdefault(qi, [])) < cfg.max_branches:
          nxt[qi].append(tuple(child))
    # time split evenly over the questions that took part in the round
    share = len({qi for qi, _ in active})
    for qi in {qi for qi, _ in active}:
      results[qi].steer_s += (t1 - t0) / share
      results[qi].search_s += (t2 - t1) / share
    active = [(qi, c) for qi in sorted(nxt) for c in nxt[qi]]
  return results
