"""The benchmark's knob tuner and a tiny end-to-end run (no timings asserted)."""
import pytest

from rlrag_jax.bench import retrieval as bench


def test_tune_finds_the_smallest_knob_meeting_the_target():
  calls = []

  def evaluate(x):   # recall rises with x and first reaches 0.95 at x = 300
    calls.append(x)
    return min(1.0, 0.95 * x / 300), 0.0

  x, rec, _ = bench._tune(evaluate, [16, 32, 64, 128, 256, 512], 0.95, steps=10)
  assert x == 300 and rec >= 0.95
  assert bench._tune(evaluate, [16, 32], 0.95) is None
  x, _, _ = bench._tune(evaluate, [400, 800], 0.95)    # first grid point already meets it
  assert x == 400


def test_recall_counts_overlap():
  import numpy as np
  truth = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
  found = np.array([[4, 3, 9, 1], [0, 0, 0, 0]])
  assert bench._recall(found, truth) == pytest.approx((3 / 4 + 0) / 2)


@pytest.mark.slow
def test_bench_runs_small(capsys):
  bench.main(["--sizes", "3000", "--dim", "32", "--queries", "50", "--reps", "1", "--skip-encoder",
              "--hnsw-max-ef", "512"])
  out = capsys.readouterr().out
  assert "ANN @Recall@10>=0.95 (ScaNN vs HNSW)" in out and "exact top-k" in out
