"""Packing prompts + completions, and the logits window the train steps may skip to."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rlrag_jax.rl.packing import logits_start, pack


def test_pack_layout_by_hand():
  b = pack([[5, 6, 7], [8]], [[1, 2], [3, 4, 9]], [[1, 1], [1, 0, 1]], pad_id=0, bucket=4)
  # p_len 3, c_len 3 -> T = round_up(6, 4) = 8; completions start at column 3.
  np.testing.assert_array_equal(b["input_ids"], [[5, 6, 7, 1, 2, 0, 0, 0],
                                                 [0, 0, 8, 3, 4, 9, 0, 0]])
  np.testing.assert_array_equal(b["attention_mask"], [[1, 1, 1, 1, 1, 0, 0, 0],
                                                      [0, 0, 1, 1, 1, 1, 0, 0]])
  np.testing.assert_array_equal(b["loss_mask"], [[0, 0, 0, 1, 1, 0, 0, 0],
                                                 [0, 0, 0, 1, 0, 1, 0, 0]])
  with pytest.raises(ValueError, match="row 0: loss mask has 1 entries for 2 tokens"):
    pack([[1]], [[2, 3]], [[1]])


def test_pack_prompt_loss_weights_the_prompt_after_its_first_token():
  b = pack([[5, 6, 7], [8, 4]], [[1, 2], [3]], [[1, 1], [0]], pad_id=0, bucket=4,
           prompt_loss=0.25)
  # Nothing predicts a prompt's first token; completion weights are unchanged.
  np.testing.assert_allclose(b["loss_mask"], [[0, .25, .25, 1, 1, 0, 0, 0],
                                              [0, 0, .25, 0, 0, 0, 0, 0]])
  assert b["loss_mask"].dtype == np.float32
  assert pack([[5]], [[1]])["loss_mask"].dtype == np.int32
  with pytest.raises(ValueError, match="prompt_loss must be >= 0"):
    pack([[1]], [[2]], prompt_loss=-1.0)


def test_logits_start_by_hand():
  m = np.zeros((2, 10), np.int32)
  m[0, 9] = 1
  assert logits_start(m, 1, align=1) == 8   # only position 8 predicts a loss token
  assert logits_start(m, 4, align=1) == 5   # 4 positions kept: 5..8
  assert logits_start(m, 1, align=4) == 8
  assert logits_start(m, 4, align=4) == 4   # 5 moved down to a multiple of 4
  m[1, 6:8] = 1
  assert logits_start(m, 1, align=1) == 5   # the first loss column over all rows is 6
  assert logits_start(m, 3, align=1) == 3   # span 5..8 is 4 positions -> 6 kept: 3..8
  assert logits_start(m, 16, align=1) == 0  # rounding up past the row keeps everything
  assert logits_start(np.zeros((3, 7)), 4) == 0
  first = np.zeros((1, 5))
  first[0, 0] = 1                           # a loss token in column 0 (never scored): keep all
  assert logits_start(first, 1, align=1) == 0
  # The bench's tiny layout: prompts padded to 64 columns, 64 completion tokens.
  tiny = np.zeros((4, 128))
  tiny[:, 64:] = 1
  assert logits_start(tiny, 64, align=1) == 63 and logits_start(tiny, 64) == 56
  with pytest.raises(ValueError, match=r"\[B, T\]"):
    logits_start(np.zeros(5))
  with pytest.raises(ValueError, match="bucket"):
    logits_start(m, 0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 9), st.integers(0, 6)), min_size=1, max_size=5),
       st.integers(1, 8), st.integers(1, 8))
def test_logits_start_never_cuts_a_loss_token(rows, bucket, align):
  prompts = [list(range(1, p + 1)) for p, _ in rows]
  completions = [list(range(1, c + 1)) for _, c in rows]
  b = pack(prompts, completions, bucket=4)
  m, width = b["loss_mask"], b["loss_mask"].shape[1]
  s = logits_start(m, bucket, align)
  assert 0 <= s <= width - 2 and s % align == 0
  cols = np.flatnonzero(m.any(axis=0))
  if cols.size:
    assert s < max(cols[0], 1)                      # the predictor of the first loss token
    assert s >= logits_start(m, bucket, 1) - align + 1   # moved down by less than `align`
