"""Bounded compiles: packed batch widths and logits windows fall in a bounded set of sizes
however prompt lengths vary, checked on the real datasets' ARENA paper prompts."""
import math

import ml_collections
import numpy as np
import pytest

from rlrag_jax.data import sources
from rlrag_jax.generate import byte_level_tokenizer
from rlrag_jax.methods.arena import prompts
from rlrag_jax.rl.packing import geometric_round, logits_start, pack


def test_geometric_round_by_hand():
  # unit 64, 8 per octave: multiples of 64 up to 1024, of 128 up to 2048, of 256 up to 4096.
  assert [geometric_round(n, 64) for n in (1, 64, 65, 1000, 1024)] == [64, 64, 128, 1024, 1024]
  assert [geometric_round(n, 64) for n in (1025, 1100, 2048, 2049, 4000)] == [
      1152, 1152, 2048, 2304, 4096]
  sizes = {geometric_round(n, 64) for n in range(1, 8193)}
  assert len(sizes) == 16 + 8 + 8 + 8               # linear part, then 8 per octave
  assert all(s % 64 == 0 and s >= n for n, s in ((n, geometric_round(n, 64))
                                                 for n in range(1, 8193, 37)))
  with pytest.raises(ValueError, match="unit and per_octave must be >= 1"):
    geometric_round(5, 0)


def test_real_data_prompt_spread_compiles_a_bounded_set_of_update_shapes(shared_data_dir):
  cfg = ml_collections.ConfigDict(dict(
      source="files", dir=str(shared_data_dir), mix=("hotpotqa:train", "musique:train"),
      eval_mix=("hotpotqa:dev", "2wiki:dev", "musique:dev"), max_train=0, max_eval=0,
      skip_invalid=False, allow_short=True, check_overlap=True, max_contexts=0, val_mix=()))
  sel = sources.select(cfg, seed=0)
  tok = byte_level_tokenizer()
  lengths = [len(tok(prompts.prompt_for(ex, None, prompts.INSTRUCTION),
                     add_special_tokens=False)["input_ids"])
             for ex in list(sel.train) + list(sel.eval)]
  assert len(lengths) > 300 and max(lengths) > 2 * min(lengths)    # a real spread
  rng = np.random.default_rng(0)
  shapes, widths = set(), set()
  for _ in range(300):                 # RL batches of 8 prompts x random completion lengths
    idx = rng.integers(0, len(lengths), 8)
    comps = [[5] * int(c) for c in rng.integers(1, 257, 8)]
    batch = pack([[7] * lengths[i] for i in idx], comps, bucket=64)
    width = batch["input_ids"].shape[1]
    shapes.add((width, logits_start(batch["loss_mask"], 64)))
    widths.add(width)
  # The bound: the widths' geometric sizes between the shortest and longest possible batch,
  # times the windows' sizes up to the longest completion (+ its prompt-side alignment).
  lo, hi = min(lengths) + 1, max(lengths) + 256
  width_bound = len({geometric_round(n, 64) for n in range(lo, hi + 1)})
  window_bound = len({geometric_round(n, 64) for n in range(1, 256 + 2)})
  assert len(widths) <= width_bound
  assert len(shapes) <= width_bound * window_bound
  # Against plain multiples of 64, the widths the same batches would take.
  linear = math.ceil(hi / 64) - lo // 64
  assert width_bound <= 8 * math.ceil(math.log2(hi / 1024)) + 16 < linear
