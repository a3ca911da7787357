"""Shared fixtures: the real-data folder (skip when absent, fail under CI=true); the XLA flag the
suite compiles with."""
import os
import pathlib

# XLA:CPU's LLVM backend at optimisation level 1, not the default 3 nor 0: the suite's unit
# tests are mostly compiles of tiny models (level 0 compiles them ~10% faster), while its
# end-to-end tests run real compute (MiniLM encodes, prefills, updates over real-data prompts)
# that level 0 leaves unvectorised and level 1 runs about as fast as 3. Measured on SPARKLE's paper-preset test, cold cache: level 0 ~236 s, 1 160 s,
# 3 ~185 s; tests/rl/test_train_step.py: 104 s, 117 s, 116 s. Set XLA_FLAGS with your own
# --xla_backend_optimization_level to override. Read when jax first creates its CPU backend,
# so it is set here, before any test runs a computation; subprocesses inherit it.
_FLAGS = os.environ.get("XLA_FLAGS", "")
if "--xla_backend_optimization_level" not in _FLAGS:
  os.environ["XLA_FLAGS"] = (_FLAGS + " --xla_backend_optimization_level=1").strip()

import jax
import pytest

from _deps import ci
from rlrag_jax.data.paths import data_dir


@pytest.fixture(scope="session")
def shared_data_dir() -> pathlib.Path:
  """The folder with the real HotpotQA/2Wiki/MuSiQue/Bamboogle samples."""
  d = data_dir()
  if not d.is_dir():
    msg = f"real data samples not found at {d} (set RLRAG_DATA_DIR)"
    if ci():
      pytest.fail(msg + "; under CI=true they are required")
    pytest.skip(msg)
  return d


# Which tests compile with XLA's cheap settings (`jax_disable_most_optimizations`: LLVM level 0,
# no expensive passes). Most of the suite compiles tiny random models and runs them a few times,
# so compiling is most of its time. The tests on the real data samples (they use
# `shared_data_dir`) run real compute: MiniLM over real passages, prefills and updates over
# real-data prompts, which unoptimised code runs slowly. RLRAG_TEST_XLA=cheap|optimised forces
# one setting for every test (to measure the split).
_XLA_MODE = os.environ.get("RLRAG_TEST_XLA", "auto")


def _cheap_compile(item) -> bool:
  if _XLA_MODE != "auto":
    return _XLA_MODE == "cheap"
  return "shared_data_dir" not in getattr(item, "fixturenames", ())


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
  """Set the compile effort before any of the test's fixtures (module-scoped ones included) run.
  The flag is read at each compile; subprocesses read it from the environment."""
  cheap = _cheap_compile(item)
  jax.config.update("jax_disable_most_optimizations", cheap)
  os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1" if cheap else "0"


def _shared_fixtures(item) -> tuple:
  """The module- or class-scoped fixtures `item` uses (an expensive shared run, such as a trained
  reader): tests that share one are grouped so it is built once."""
  defs = getattr(item, "_fixtureinfo", None)
  if defs is None:
    return ()
  return tuple(sorted(name for name, fds in defs.name2fixturedefs.items()
                      if fds and fds[-1].scope in ("module", "class")))


def pytest_itemcollected(item):
  """Under `pytest -n 2 --dist loadgroup` (the README's test command), the tests of a module that
  share a module- or class-scoped fixture (a trained reader, an executor run, a tiny model
  trained for the KV-reuse tests) form one group: they run on one worker, one after another, so
  the fixture is built once rather than once per worker (tests/rollout/test_kv_reuse.py's
  ~50-second model was trained on both workers while only the `slow` tests were grouped). A
  test without one is its own unit, so that one module's long end-to-end tests spread over
  both workers instead of queueing on one. xdist (3.8) turns the marker into a
  group by rewriting `item._nodeid`, which pytest 9.2 no longer reads (its nodeid comes from
  `item._id`): there every group was split and each module fixture built once per worker, so
  setup.cfg pins pytest below 9.2. Without xdist the marker does nothing."""
  shared = _shared_fixtures(item)
  if shared and not item.get_closest_marker("xdist_group"):
    # one group a module, whichever of its shared fixtures a test uses: a fixture used by
    # tests that also use another one would otherwise be built in two groups
    item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0] + ":shared"))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
  """The slow tests first (a stable sort: each module keeps its order), so that the long ones
  do not start last and leave a worker idle."""
  items[:] = sorted(items, key=lambda item: item.get_closest_marker("slow") is None)
