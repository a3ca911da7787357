"""Counting XLA compiles (jax.monitoring's backend-compile events), so that a run can log
`compile/count` and `compile/seconds` per step and a test can bound them.

With the persistent compilation cache on (`rlrag_jax.compile_cache`), a program that jit hands
to the backend is either compiled or read back from the cache folder. Both fire the backend
compile event (jax wraps `compiler.compile_or_get_cached` in it: pxla._cached_compilation); a
read-back fires `/jax/compilation_cache/cache_hits` and `.../cache_retrieval_time_sec` inside
it, just before. So `compile/count` counts every program jit had to obtain (compiled or read
back) and `compile/cache_hits` how many of those came from the cache; real compiles are the
difference.
"""
from __future__ import annotations

import collections

import jax

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
CACHE_RETRIEVAL_EVENT = "/jax/compilation_cache/cache_retrieval_time_sec"


class CompileCounter:
  """Counts backend compiles from construction until `close()`; use as a context manager.

  `take()` returns the compiles since the previous `take()` as {'compile/count': n,
  'compile/seconds': s, 'compile/cache_hits': h, 'compile/cache_seconds': r}: n programs
  obtained in s seconds, h of them read back from the persistent cache in r seconds of
  retrieval (so n - h were compiled). `total` holds the same over the whole life, and
  `by_function` each program name's [count, seconds, cache hits].
  """

  def __init__(self):
    self.count = 0
    self.seconds = 0.0
    self.cache_hits = 0
    self.cache_seconds = 0.0
    self.by_function = collections.defaultdict(lambda: [0, 0.0, 0])
    self._mark = self._totals()
    self._hit_pending = False       # a cache hit fired; its backend compile event comes next
    self._open = True
    jax.monitoring.register_event_listener(self._on_event)
    jax.monitoring.register_event_duration_secs_listener(self._on_duration)

  def _on_event(self, event: str, **kwargs) -> None:
    if event == CACHE_HIT_EVENT:
      self.cache_hits += 1
      self._hit_pending = True

  def _on_duration(self, event: str, duration: float, **kwargs) -> None:
    if event == BACKEND_COMPILE_EVENT:
      self.count += 1
      self.seconds += float(duration)
      entry = self.by_function[str(kwargs.get("fun_name", "?"))]
      entry[0] += 1
      entry[1] += float(duration)
      entry[2] += int(self._hit_pending)
      self._hit_pending = False
    elif event == CACHE_RETRIEVAL_EVENT:
      self.cache_seconds += float(duration)

  def _totals(self) -> tuple:
    return (self.count, self.seconds, self.cache_hits, self.cache_seconds)

  @staticmethod
  def _as_dict(t: tuple) -> dict:
    return {"compile/count": float(t[0]), "compile/seconds": t[1],
            "compile/cache_hits": float(t[2]), "compile/cache_seconds": t[3]}

  def take(self) -> dict:
    now = self._totals()
    out = self._as_dict(tuple(a - b for a, b in zip(now, self._mark)))
    self._mark = now
    return out

  @property
  def total(self) -> dict:
    return self._as_dict(self._totals())

  def summary(self) -> str:
    """One line for the run's log: programs obtained, how many compiled and how many read back
    from the persistent cache, with their seconds."""
    return (f"{self.count} ({self.seconds:.1f} s): {self.count - self.cache_hits} compiled, "
            f"{self.cache_hits} read from the persistent cache ({self.cache_seconds:.1f} s)")

  def by_function_lines(self) -> list:
    """'name: n x, s s, h hits' per program name, most seconds first."""
    rows = sorted(self.by_function.items(), key=lambda kv: -kv[1][1])
    return [f"{name}: {n} x, {s:.2f} s, {h} from cache" for name, (n, s, h) in rows]

  def close(self) -> None:
    if self._open:
      for unregister, fn in ((jax.monitoring.unregister_event_listener, self._on_event),
                             (jax.monitoring.unregister_event_duration_listener,
                              self._on_duration)):
        try:
          unregister(fn)
        except (AssertionError, ValueError):
          pass
      self._open = False

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
