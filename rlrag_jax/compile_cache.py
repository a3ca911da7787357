"""JAX's persistent compilation cache for a run (config key `compile_cache`): every program XLA
compiles is written to a folder, and a later process that compiles the same program (same
lowered module, devices, compile options, jax and XLA versions: jax's cache key) reads it back
instead, so that compiles are paid once per machine, not once per run.

  'auto'   $XDG_CACHE_HOME/rlrag_jax/xla, else ~/.cache/rlrag_jax/xla (off, with a warning,
           where that folder cannot be made)
  ''       off
  a path   that folder

CPU compiles are cached too: jax's default skips programs that compiled in under a second
(`jax_persistent_cache_min_compile_time_secs` = 1), and on CPU nearly all of ours do; a read
back takes milliseconds (docs/results/compile_cache). The folder is trusted code: share it only
with people who may run code on your machine. It is not pruned (jax_compilation_cache_max_size
-1): delete it to reclaim the space.
"""
from __future__ import annotations

import logging
import os
import pathlib
from typing import Optional

import jax
from jax.experimental.compilation_cache import compilation_cache as jax_cc

log = logging.getLogger("rlrag_jax.compile_cache")

# Cache every program, whatever its compile time or size.
MIN_COMPILE_SECS = 0.0
MIN_ENTRY_BYTES = -1          # -1: no size floor (0 would let jax pick a filesystem default)


def cache_dir(spec: str) -> Optional[pathlib.Path]:
  """The folder `compile_cache` = `spec` names ('auto': under the user cache dir), None if ''."""
  spec = str(spec).strip()
  if not spec:
    return None
  if spec == "auto":
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "rlrag_jax" / "xla"
  return pathlib.Path(spec).expanduser()


def enable(spec: str) -> Optional[pathlib.Path]:
  """Points jax's persistent compilation cache at `cache_dir(spec)` (None: turns it off) and
  returns that folder. Call it before the first compile of the programs to cache: jax opens the
  folder once, at the first compile after this; a different folder set later takes effect
  through `reset_cache`, done here."""
  path = cache_dir(spec)
  if path is not None:
    try:
      path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
      if str(spec).strip() != "auto":
        raise OSError(f"config key compile_cache={spec!r}: cannot create the folder {path}: "
                      f"{e}") from e
      log.warning("compile_cache='auto': cannot create %s (%s); the cache is off", path, e)
      path = None
  if path is not None:
    # jax 0.10 keys entries by the folder's path: one spelling of it (docs/results/compile_cache)
    path = path.resolve()
  new = str(path) if path is not None else None
  old = jax.config.jax_compilation_cache_dir
  if new != old:
    jax.config.update("jax_compilation_cache_dir", new)
    if old is not None:
      jax_cc.reset_cache()            # jax holds the folder it opened at its first compile
  if path is not None:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECS)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", MIN_ENTRY_BYTES)
  return path
