"""Counting XLA compiles (jax.monitoring's backend-compile events), so that a run can log
`compile/count` and `compile/seconds` per step and a test can bound them."""
from __future__ import annotations

import jax

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class CompileCounter:
  """Counts backend compiles from construction until `close()`; use as a context manager.

  `take()` returns the compiles since the previous `take()` as
  {'compile/count': n, 'compile/seconds': s}; `total` holds the same over the whole life.
  """

  def __init__(self):
    self.count = 0
    self.seconds = 0.0
    self._mark = (0, 0.0)
    self._open = True
    jax.monitoring.register_event_duration_secs_listener(self._on_event)

  def _on_event(self, event: str, duration: float, **kwargs) -> None:
    if event == BACKEND_COMPILE_EVENT:
      self.count += 1
      self.seconds += float(duration)

  def take(self) -> dict:
    out = {"compile/count": float(self.count - self._mark[0]),
           "compile/seconds": self.seconds - self._mark[1]}
    self._mark = (self.count, self.seconds)
    return out

  @property
  def total(self) -> dict:
    return {"compile/count": float(self.count), "compile/seconds": self.seconds}

  def close(self) -> None:
    if self._open:
      try:
        jax.monitoring.unregister_event_duration_listener(self._on_event)
      except (AssertionError, ValueError):
        pass
      self._open = False

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
