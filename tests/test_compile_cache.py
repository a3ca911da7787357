"""The persistent compilation cache (rlrag_jax.compile_cache) on CPU: a program compiled by one
process is read back by the next, and the CompileCounter tells the two apart."""
import json
import os
import subprocess
import sys

import pytest

from rlrag_jax import compile_cache

# One process: point the cache at argv[1], compile a small jitted function, and print the
# counter's totals and by-program rows. With argv[2], then switch the cache to that folder and
# compile a second function (the switch must reach jax, which opened the first folder already).
_SCRIPT = r"""
import json, sys
import jax, jax.numpy as jnp
from rlrag_jax import compile_cache
from rlrag_jax.training.compiles import CompileCounter
with CompileCounter() as counter:
  compile_cache.enable(sys.argv[1])
  x = jnp.arange(48.0).reshape(6, 8)
  y = jax.jit(lambda a: jnp.tanh(a @ a.T).sum(axis=0))(x)
  jax.block_until_ready(y)
  first = dict(counter.by_function)
  if len(sys.argv) > 2:
    compile_cache.enable(sys.argv[2])
    jax.block_until_ready(jax.jit(lambda a: jnp.cos(a) * 3.0)(x))
print(json.dumps({"total": counter.total, "first": first, "y": [float(v) for v in y]}))
"""


def _run(tmp_path, *args, env=None) -> dict:
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XDG_CACHE_HOME": str(tmp_path / "xdg"),
         **(env or {})}
  out = subprocess.run([sys.executable, "-c", _SCRIPT, *map(str, args)], env=env, check=True,
                       capture_output=True, text=True, timeout=120)
  return json.loads(out.stdout.strip().splitlines()[-1])


def _jit_entries(folder) -> list:
  return sorted(p.name for p in folder.iterdir() if p.name.startswith("jit_")) \
      if folder.is_dir() else []


def test_second_process_reads_the_program_back_instead_of_compiling(tmp_path):
  cache, other = tmp_path / "cache", tmp_path / "other"
  cold = _run(tmp_path, cache, other)
  assert cold["total"]["compile/count"] >= 1
  assert cold["total"]["compile/cache_hits"] == 0
  assert any(name.startswith("jit__lambda") for name in _jit_entries(cache)), _jit_entries(cache)
  # The folder set after the first compiles is the one the second function is written to.
  assert _jit_entries(other) and not set(_jit_entries(other)) & set(_jit_entries(cache))

  warm = _run(tmp_path, cache)
  lam = warm["first"]["jit(<lambda>)"]                # [count, seconds, cache hits]
  assert lam[0] == 1 and lam[2] == 1, warm["first"]
  # Every program of the first function came from the cache: no real backend compile.
  assert warm["total"]["compile/cache_hits"] == warm["total"]["compile/count"] >= 1
  assert warm["total"]["compile/cache_seconds"] > 0
  assert warm["y"] == cold["y"]


def test_empty_spec_turns_the_cache_off_and_writes_nothing(tmp_path):
  env_dir = tmp_path / "from_env"                   # the env var jax reads, overridden by ''
  off = _run(tmp_path, "", env={"JAX_COMPILATION_CACHE_DIR": str(env_dir)})
  assert off["total"]["compile/count"] >= 1 and off["total"]["compile/cache_hits"] == 0
  assert _jit_entries(env_dir) == []
  assert not (tmp_path / "xdg").exists()


def test_auto_is_under_the_user_cache_dir(tmp_path, monkeypatch):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  assert compile_cache.cache_dir("auto") == tmp_path / "rlrag_jax" / "xla"
  monkeypatch.delenv("XDG_CACHE_HOME")
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  assert compile_cache.cache_dir("auto") == tmp_path / "home" / ".cache" / "rlrag_jax" / "xla"
  assert compile_cache.cache_dir("") is None
  assert compile_cache.cache_dir(str(tmp_path / "x")) == tmp_path / "x"


def test_auto_turns_off_where_the_folder_cannot_be_made_and_a_named_path_raises(tmp_path,
                                                                              monkeypatch):
  blocker = tmp_path / "a_file"
  blocker.write_text("")
  monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
  with pytest.raises(OSError, match="compile_cache"):
    compile_cache.enable(str(blocker / "xla"))
  assert compile_cache.enable("auto") is None
