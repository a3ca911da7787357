"""Packing prompts + completions into the token batches the RL and SFT steps consume.

Layout (every row the same length T: a multiple of `bucket`, coarser for long rows, see
`geometric_round`, so that a run compiles its update for a bounded set of lengths):

  input_ids       [B, T]  left-padded prompt, then the completion, then right padding
  attention_mask  [B, T]  1 on real tokens
  loss_mask       [B, T]  1 on completion tokens that count in the loss (the policy wrote them);
                          0 on the prompt, padding, and tokens the environment inserted
                          (e.g. retrieved passages inside a multi-turn completion)

Left-padding the prompts aligns every completion to start at the same column, which keeps the
slices cheap; positions are recomputed from the attention mask by the model.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np


def round_up(n: int, bucket: int) -> int:
  return max(bucket, -(-n // bucket) * bucket)


def geometric_round(n: int, unit: int, per_octave: int = 8) -> int:
  """Rounds n up to a multiple of `unit`, coarser as n grows: multiples of `unit` up to
  2 * per_octave * unit, then of unit * 2^k, keeping at most ~per_octave sizes per doubling.
  Every length a run meets maps to a bounded set of sizes (compiled programs): ~per_octave *
  log2(max / (2 * per_octave * unit)) beyond the 2 * per_octave linear ones."""
  if unit < 1 or per_octave < 1:
    raise ValueError(f"geometric_round: unit and per_octave must be >= 1; got {unit}, "
                     f"{per_octave}")
  step = unit
  while n > step * per_octave * 2:
    step *= 2
  return round_up(n, step)


def pack(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
         completion_loss_masks: Optional[Sequence[Sequence[int]]] = None, *, pad_id: int = 0,
         bucket: int = 16, max_len: Optional[int] = None, prompt_loss: float = 0.0) -> dict:
  """Returns {input_ids, attention_mask, loss_mask} as int32 numpy arrays.

  `completion_loss_masks[i]` (same length as completions[i]) marks which completion tokens the
  policy wrote; default all. With `max_len`, prompts are truncated from the left and completions
  from the right so that prompt + completion fits. `prompt_loss` > 0 also puts that weight on
  the prompt tokens after the first (language-model training on the prompt, for SFT of a
  from-scratch model); loss_mask is then float32.
  """
  if prompt_loss < 0:
    raise ValueError(f"pack: prompt_loss must be >= 0, found {prompt_loss}")
  if len(prompts) != len(completions):
    raise ValueError(f"pack: {len(prompts)} prompts but {len(completions)} completions")
  prompts = [list(p) for p in prompts]
  completions = [list(c) for c in completions]
  if completion_loss_masks is None:
    masks = [[1] * len(c) for c in completions]
  else:
    masks = [list(m) for m in completion_loss_masks]
    for i, (m, c) in enumerate(zip(masks, completions)):
      if len(m) != len(c):
        raise ValueError(f"pack: row {i}: loss mask has {len(m)} entries for {len(c)} tokens")
  if max_len is not None:
    for i in range(len(prompts)):
      room = max_len - len(completions[i])
      if room < 1:
        completions[i] = completions[i][: max_len - 1]
        masks[i] = masks[i][: max_len - 1]
        room = 1
      prompts[i] = prompts[i][-room:]
  p_len = max((len(p) for p in prompts), default=1)
  c_len = max((len(c) for c in completions), default=0)
  total = geometric_round(p_len + c_len, bucket)
  b = len(prompts)
  ids = np.full((b, total), pad_id, np.int32)
  attn = np.zeros((b, total), np.int32)
  loss = np.zeros((b, total), np.float32 if prompt_loss else np.int32)
  for i, (p, c, m) in enumerate(zip(prompts, completions, masks)):
    start = p_len - len(p)
    ids[i, start:p_len] = p
    attn[i, start:p_len] = 1
    if prompt_loss:
      loss[i, start + 1:p_len] = prompt_loss
    ids[i, p_len:p_len + len(c)] = c
    attn[i, p_len:p_len + len(c)] = 1
    loss[i, p_len:p_len + len(c)] = m
  return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss}


def pad_rows(batch: dict, multiple: int) -> tuple:
  """Pads the batch dimension to a multiple (for even sharding); returns (batch, n_real)."""
  n = next(iter(batch.values())).shape[0]
  target = round_up(n, multiple)
  if target == n:
    return batch, n
  out = {}
  for k, v in batch.items():
    pad = np.zeros((target - n,) + v.shape[1:], v.dtype)
    out[k] = np.concatenate([v, pad], axis=0)
  return out, n


def logits_start(loss_mask, bucket: int = 16, align: int = 8) -> int:
  """The train steps' static `logits_start` for a packed batch [B, T]: logits are then computed
  for positions logits_start..T-2 only. Their count spans from the position before the first
  loss token (in any row) to T - 2, rounded up by `geometric_round(., bucket)` so that batches
  of similar layouts share one compiled program; the start is then moved down to a multiple of
  `align` (on XLA:CPU a slice at an odd column cost the arena-sized update 4%, an aligned one
  nothing). No position before the start predicts a loss token. 0 when nothing is masked in.
  """
  m = np.asarray(loss_mask)
  if m.ndim != 2:
    raise ValueError(f"logits_start: loss_mask must be [B, T]; got shape {m.shape}")
  if bucket < 1 or align < 1:
    raise ValueError(f"logits_start: bucket and align must be >= 1; got {bucket}, {align}")
  cols = np.flatnonzero(m.any(axis=0))
  if cols.size == 0:
    return 0
  width = m.shape[1]
  keep = geometric_round(width - max(int(cols[0]), 1), bucket)   # predictors of cols[0]..T-1
  return max(width - 1 - keep, 0) // align * align
