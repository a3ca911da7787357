"""Token-budget micro-batches: the plan by hand, its budget and shard multiple on random lengths,
and the layouts it packs (pack's widths, rows moved between the whole batch and a micro-batch)."""
import logging

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rlrag_jax.rl import packing as batch_lib
from rlrag_jax.rl.packing import (pack, pack_micro_batch, packed_lengths, plan_micro_batches,
                                   put_rows, take_rows, width_buckets, width_rows)


def _plan(plan):
  return [(m.rows.tolist(), m.size, m.width) for m in plan]


def test_plan_by_hand():
  # totals 32, 5, 5, 16, 7, 5 -> longest first: 0, 3, 4, 1, 2, 5. Episode 0 is 32 wide
  # (bucket 8): width 32 takes 64 // 32 = 2 rows, 0 and 3. The short ones share width 8,
  # whose row count is 64 // 8 = 8: 4 episodes and 4 zero rows.
  p, c = [2] * 6, [30, 3, 3, 14, 5, 3]
  assert _plan(plan_micro_batches(p, c, 64, bucket=8)) == [([0, 3], 2, 32),
                                                           ([4, 1, 2, 5], 8, 8)]
  # Width is pack's: the longest prompt plus the longest completion of the micro-batch
  # (9 + 9 -> 24 columns, not 16 as each alone).
  assert _plan(plan_micro_batches([9, 1], [1, 9], 48, bucket=8)) == [([0, 1], 2, 24)]
  assert _plan(plan_micro_batches([9, 1], [1, 9], 40, bucket=8)) == [([0], 2, 16), ([1], 2, 16)]
  assert plan_micro_batches([], [], 64) == []
  with pytest.raises(ValueError, match="2 prompt lengths but 1 completion"):
    plan_micro_batches([1, 2], [3], 64)


def test_plan_pads_rows_to_the_shard_multiple_and_warns_once_over_budget(caplog):
  p, c = [2] * 6, [30, 3, 3, 14, 5, 3]
  batch_lib._over_budget_warned = False
  with caplog.at_level(logging.WARNING, logger="rlrag_jax.rl.packing"):
    plan = plan_micro_batches(p, c, 64, bucket=8, shards=4)
    plan_micro_batches(p, c, 64, bucket=8, shards=4)
  # Four rows (one per shard) of width 32 exceed 64 tokens: the fewest rows a micro-batch
  # can have, filled with real episodes rather than zero rows.
  assert _plan(plan) == [([0, 3, 4, 1], 4, 32), ([2, 5], 8, 8)]
  assert len([r for r in caplog.records if "over budget" in r.message]) == 1
  # An episode longer than the budget gets a micro-batch of its own.
  batch_lib._over_budget_warned = True
  assert _plan(plan_micro_batches([4, 4, 4], [100, 2, 2], 64, bucket=8)) == [
      ([0], 1, 104), ([1, 2], 8, 8)]


def test_one_row_count_per_width_from_a_bounded_set_of_widths():
  assert [width_rows(w, 64) for w in (8, 24, 32, 64, 104)] == [8, 2, 2, 1, 1]
  assert [width_rows(w, 64, 4) for w in (8, 16, 32)] == [8, 4, 4]
  # bucket 8: multiples of 8 up to 128, then of 16 up to 256, of 32 ...
  assert width_buckets(130, 8) == list(range(8, 129, 8)) + [144]
  assert width_buckets(1, 8) == [8]
  assert len(width_buckets(4096, 16)) == 16 + 8 * 4


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 90)), min_size=1, max_size=40),
       st.integers(8, 400), st.sampled_from([1, 2, 4]), st.sampled_from([1, 4, 8]))
def test_plan_covers_every_episode_within_budget(lengths, budget, shards, bucket):
  p, c = zip(*lengths)
  batch_lib._over_budget_warned = True           # quiet
  plan = plan_micro_batches(p, c, budget, bucket=bucket, shards=shards)
  rows = np.concatenate([m.rows for m in plan])
  assert sorted(rows.tolist()) == list(range(len(lengths)))
  for m in plan:
    assert m.size % shards == 0 and len(m.rows) <= m.size == width_rows(m.width, budget, shards)
    assert m.size * m.width <= budget or m.size == shards
    assert m.width in width_buckets(max(p) + max(c), bucket)
    assert m.width == batch_lib.geometric_round(max(p[i] for i in m.rows) +
                                                max(c[i] for i in m.rows), bucket)
    assert m.prompt_len == max(p[i] for i in m.rows)


def test_micro_batch_layouts_match_the_whole_batch():
  rng = np.random.default_rng(0)
  prompts = [list(rng.integers(2, 50, size=k)) for k in (3, 7, 2, 5, 1)]
  completions = [list(rng.integers(2, 50, size=k)) for k in (20, 2, 9, 1, 4)]
  whole = pack(prompts, completions, pad_id=0, bucket=4)
  p_len = max(len(x) for x in prompts)
  x = rng.normal(size=whole["input_ids"].shape).astype(np.float32)
  back = np.zeros_like(x)
  for mb in plan_micro_batches(*packed_lengths(prompts, completions), 24, bucket=4, shards=2):
    part = pack_micro_batch(prompts, completions, None, mb, pad_id=0, bucket=4)
    assert part["input_ids"].shape == (mb.size, mb.width)
    assert not part["attention_mask"][len(mb.rows):].any()          # zero pad rows
    for key in ("input_ids", "attention_mask", "loss_mask"):
      np.testing.assert_array_equal(take_rows(whole[key], p_len, mb), part[key])
    put_rows(back, take_rows(x, p_len, mb), p_len, mb)
  real = whole["attention_mask"] > 0
  np.testing.assert_array_equal(back[real], x[real])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12)), min_size=1, max_size=6),
       st.integers(2, 14))
def test_packed_lengths_follow_pack_truncation(lengths, max_len):
  prompts = [[3] * a for a, _ in lengths]
  completions = [[4] * b for _, b in lengths]
  p, c = packed_lengths(prompts, completions, max_len)
  b = pack(prompts, completions, bucket=1, max_len=max_len)
  np.testing.assert_array_equal(b["attention_mask"].sum(axis=1), p + c)
  np.testing.assert_array_equal(b["loss_mask"].sum(axis=1), c)
