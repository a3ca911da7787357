"""The persistent compilation cache (rlrag_jax.compile_cache) on CPU: a program compiled by one
process is read back by the next, and the CompileCounter tells the two apart."""
import json
import os
import pathlib
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


# ------------------------------------------------------------------------------------ a whole run
def _timing(key: str) -> bool:
  return (key.startswith("compile/") or key.endswith("_s") or
          any(t in key for t in ("time", "seconds", "minutes", "per_s", "latency")))


def _numbers(workdir) -> tuple:
  """A run's metrics rows without timings, and its final evaluation summary."""
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  rows = [{k: v for k, v in r.items() if not _timing(k)} for r in rows]
  summary = json.loads((workdir / "eval_summary.json").read_text())
  return rows, {k: v for k, v in summary.items() if not _timing(k)}


@pytest.mark.slow
def test_a_training_run_gives_the_same_numbers_from_a_warm_cache(tmp_path):
  """The README's main job at a tiny size, twice in fresh processes over one cache folder: the
  second reads its programs back instead of compiling them, and every number it logs and
  evaluates equals the first's to the last bit (issue 34 asked whether a warm cache moves
  results)."""
  from rlrag_jax.bench import accelerator
  root = pathlib.Path(__file__).resolve().parents[1]
  cache = tmp_path / "cache"
  logs, numbers = [], []
  for i in range(2):
    workdir = tmp_path / f"run{i}"
    cmd = [sys.executable, "-m", "rlrag_jax.train", "--config=configs/arena.py",
           f"--workdir={workdir}", "--quiet", f"--config.compile_cache={cache}",
           *accelerator.REDUCED_MAIN_ARGS, "--config.rl.steps=2"]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    logs.append(accelerator.parse_compile_line(proc.stdout + proc.stderr))
    numbers.append(_numbers(workdir))
  cold, warm = logs
  # (a cold run may read back a program it compiled itself earlier, for another function)
  assert cold["cache_hits"] <= 0.1 * cold["compiles"], logs
  assert warm["cache_hits"] >= 0.9 * warm["compiles"] > 0, logs
  (rows0, sum0), (rows1, sum1) = numbers
  assert len(rows0) == len(rows1) > 0 and any("reward/total" in r for r in rows0)
  assert rows1 == rows0
  assert sum1 == sum0
