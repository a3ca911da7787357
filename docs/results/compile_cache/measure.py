"""`python3 -m rlrag_jax.train` with a second CompileCounter over the whole process (model build,
the stages, the final evaluation and export; the trainer's own counter sees the stages only),
which prints every program's compiles and cache hits at exit. Same flags as rlrag_jax.train:

  python3 docs/results/compile_cache/measure.py --config=configs/arena.py --workdir=/tmp/cc_run1 \
      --quiet --config.compile_cache=/tmp/cc_cache
"""
import atexit
import sys
import time

from absl import app

from rlrag_jax import train
from rlrag_jax.training.compiles import CompileCounter

_counter = CompileCounter()
_start = time.time()


def _report():
  _counter.close()
  print(f"[measure] wall {time.time() - _start:.1f} s; XLA compiles over the process: "
        f"{_counter.summary()}", file=sys.stderr)
  for line in _counter.by_function_lines():
    print(f"[measure]   {line}", file=sys.stderr)


if __name__ == "__main__":
  atexit.register(_report)
  app.run(train.main)
