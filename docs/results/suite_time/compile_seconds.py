"""A pytest plugin that writes, per test, its wall seconds and the seconds and count of XLA
programs it obtained (jax's `/jax/core/compile/backend_compile_duration` event: a program
compiled, or read back from the persistent cache) as one JSON line to $COMPPROF_OUT.

  PYTHONPATH=docs/results/suite_time COMPPROF_OUT=/tmp/cold.jsonl XDG_CACHE_HOME=$(mktemp -d) \
      CI=true python3 -m pytest -p compile_seconds -n 0 TESTS...

Programs compiled in a subprocess (the CLI tests) are not counted."""
import json
import os
import time

import pytest
from jax import monitoring

_EVENT = "/jax/core/compile/backend_compile_duration"
_state = {"seconds": 0.0, "programs": 0}


def _listen(event, duration, **_):
  if event == _EVENT:
    _state["seconds"] += duration
    _state["programs"] += 1


monitoring.register_event_duration_secs_listener(_listen)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  s0, n0, t0 = _state["seconds"], _state["programs"], time.time()
  yield
  with open(os.environ.get("COMPPROF_OUT", "compile_seconds.jsonl"), "a") as f:
    f.write(json.dumps(dict(test=item.nodeid, wall=time.time() - t0,
                            compile=_state["seconds"] - s0, n=_state["programs"] - n0)) + "\n")
