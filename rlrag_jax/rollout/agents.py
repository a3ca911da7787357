"""Many agent programs driven side by side, their requests batched per round.

An agent program is a generator: it yields a request (a model call, a retrieval, ...), receives
the reply, and finally returns its result. Writing an agent this way keeps its control flow
plain Python (loops, early stops, per-question branching) while `drive` gives the accelerator
one batched call per request type per round: every program's pending request of type T goes to
`handlers[T](requests) -> replies` together.

  def agent(question):
    query = yield Generate(prompt=question)      # one batched model call per round
    hits = yield Search(query)                   # one batched retrieval per round
    return hits

  results = drive([agent(q) for q in questions], {Generate: model_fn, Search: search_fn})

Used by APEX-Searcher's executor (its Algorithm 2, methods/apex/executor.py).
"""
from __future__ import annotations

from typing import Callable, Iterator, Mapping, Sequence


def drive(programs: Sequence[Iterator], handlers: Mapping[type, Callable]) -> list:
  """Runs the generators to the end; returns their return values in order. A request whose
  type has no handler is an error naming the type."""
  results = [None] * len(programs)
  pending = {}
  for i, p in enumerate(programs):
    _advance(p, i, None, pending, results, first=True)
  while pending:
    by_type = {}
    for i, request in pending.items():
      by_type.setdefault(type(request), []).append(i)
    replies = {}
    for kind, idx in by_type.items():
      handler = handlers.get(kind)
      if handler is None:
        raise TypeError(f"drive: a program yielded a {kind.__name__} request but the handlers "
                        f"only take {[t.__name__ for t in handlers]}")
      out = list(handler([pending[i] for i in idx]))
      if len(out) != len(idx):
        raise ValueError(f"drive: the {kind.__name__} handler returned {len(out)} replies for "
                         f"{len(idx)} requests")
      replies.update(zip(idx, out))
    pending = {}
    for i in sorted(replies):
      _advance(programs[i], i, replies[i], pending, results)
  return results


def _advance(p, i, reply, pending, results, first=False):
  try:
    pending[i] = next(p) if first else p.send(reply)
  except StopIteration as stop:
    results[i] = stop.value
