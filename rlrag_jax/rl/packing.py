"""Packing prompts + completions into the token batches the RL and SFT steps consume (host
side, numpy, config-free: every setting is an argument).

Layout (every row the same length T: a multiple of `bucket`, coarser for long rows, see
`geometric_round`, so that a run compiles its update for a bounded set of lengths):

  input_ids       [B, T]  left-padded prompt, then the completion, then right padding
  attention_mask  [B, T]  1 on real tokens
  loss_mask       [B, T]  1 on completion tokens that count in the loss (the policy wrote them);
                          0 on the prompt, padding, and tokens the environment inserted
                          (e.g. retrieved passages inside a multi-turn completion)

Left-padding the prompts aligns every completion to start at the same column, which keeps the
slices cheap; positions are recomputed from the attention mask by the model.

Token-budget micro-batches (`rl.tokens_per_micro_batch`): `plan_micro_batches` sorts episodes by
length and groups them so that each micro-batch's padded rows x width stays within a budget;
`pack_micro_batch` packs one at its own width, and `take_rows` / `put_rows` move per-token
arrays between the whole batch's layout and a micro-batch's.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Optional, Sequence

import numpy as np

from rlrag_jax.rollout.batch import geometric_round, round_up

log = logging.getLogger(__name__)


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


def packed_lengths(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                   max_len: Optional[int] = None) -> tuple:
  """(prompt lengths, completion lengths) [n] int arrays as `pack` lays the rows out (after
  its max_len truncation: the completion keeps at most max_len - 1 tokens, the prompt the
  room left): what `plan_micro_batches` plans with."""
  p = np.array([len(x) for x in prompts], np.int64)
  c = np.array([len(x) for x in completions], np.int64)
  if max_len is not None:
    c = np.minimum(c, max_len - 1)
    p = np.minimum(p, np.maximum(max_len - c, 1))
  return p, c


@dataclasses.dataclass(frozen=True)
class MicroBatch:
  """One token-budget micro-batch: `rows` (episode indices, longest first) packed by `pack`
  into `width` columns with the prompts left-padded to `prompt_len`, then padded with
  all-zero rows (`pad_rows`) to `size` rows: `width_rows(width, ...)`, the one row count of
  its width."""
  rows: np.ndarray
  size: int
  width: int
  prompt_len: int


_over_budget_warned = False


def width_rows(width: int, budget: int, shards: int = 1) -> int:
  """The row count every micro-batch of this width is padded to: the most rows of `width`
  tokens within `budget`, a multiple of `shards`, and at least `shards` (one row per device,
  over budget when even that is more than `budget`). One row count per width, so the update
  compiles one program per width bucket (`width_buckets`), whatever the batch's lengths."""
  shards = max(int(shards), 1)
  return max(shards, int(budget) // int(width) // shards * shards)


def width_buckets(max_len: int, bucket: int) -> list:
  """Every width `pack` can give when the longest prompt plus the longest completion is at most
  `max_len` tokens: the sizes of `geometric_round(., bucket)` up to
  geometric_round(max_len, bucket). A token-budget run compiles each update program
  (accumulate, log-prob forward) at most once per entry."""
  out, n = [], 1
  while True:
    w = geometric_round(n, bucket)
    out.append(w)
    if w >= geometric_round(max(int(max_len), 1), bucket):
      return out
    n = w + 1


def plan_micro_batches(prompt_lens: Sequence[int], completion_lens: Sequence[int],
                       budget: int, *, bucket: int = 16, shards: int = 1) -> list:
  """Episodes -> token-budget micro-batches, a list of `MicroBatch` (host side, pure).

  Episodes are taken longest first (prompt + completion) and each micro-batch is filled
  greedily while its rows fit its width's row count, `width_rows(width, budget, shards)`;
  width is `pack`'s: `geometric_round(longest prompt + longest completion, bucket)`. Each
  micro-batch is then padded with zero rows to that row count. So the update's live
  activations follow the budget, not the longest episode of the batch, and a run compiles
  one shape per width bucket (`width_buckets`). A micro-batch holds at least `shards` rows
  (one per device): when even that exceeds the budget (an episode longer than
  budget / shards), it runs over budget, with one warning.
  """
  p = np.asarray(prompt_lens, np.int64).reshape(-1)
  c = np.asarray(completion_lens, np.int64).reshape(-1)
  if p.shape != c.shape:
    raise ValueError(f"plan_micro_batches: {p.size} prompt lengths but {c.size} completion "
                     "lengths")
  if budget < 1 or bucket < 1 or shards < 1:
    raise ValueError(f"plan_micro_batches: budget, bucket and shards must be >= 1; got "
                     f"{budget}, {bucket}, {shards}")
  plan, cur, pm, cm = [], [], 0, 0

  def close():
    width = geometric_round(pm + cm, bucket)
    plan.append(MicroBatch(rows=np.array(cur, np.int64), size=width_rows(width, budget, shards),
                           width=width, prompt_len=int(pm)))

  for i in np.argsort(-(p + c), kind="stable"):
    npm, ncm = max(pm, int(p[i])), max(cm, int(c[i]))
    if cur and len(cur) + 1 > width_rows(geometric_round(npm + ncm, bucket), budget, shards):
      close()
      cur, npm, ncm = [], int(p[i]), int(c[i])
    cur.append(int(i))
    pm, cm = npm, ncm
  if cur:
    close()
  _warn_over_budget(plan, budget)
  return plan


def _warn_over_budget(plan, budget: int) -> None:
  global _over_budget_warned
  over = [m for m in plan if m.size * m.width > budget]
  if over and not _over_budget_warned:
    _over_budget_warned = True
    m = max(over, key=lambda m: m.size * m.width)
    log.warning("token budget %d per micro-batch is below %d rows x %d tokens (the fewest rows, "
                "one per data x fsdp shard, at the width of its longest episode): such "
                "micro-batches run over budget", budget, m.size, m.width)


def pack_micro_batch(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                     completion_loss_masks: Optional[Sequence[Sequence[int]]], mb: MicroBatch,
                     **pack_kwargs) -> dict:
  """`pack` of the micro-batch's rows (`pack_kwargs`: pad_id, bucket, max_len, prompt_loss as
  the plan was made with), padded with all-zero rows to mb.size."""
  sel = lambda xs: None if xs is None else [xs[i] for i in mb.rows]
  batch = pack(sel(prompts), sel(completions), sel(completion_loss_masks), **pack_kwargs)
  if batch["input_ids"].shape[1] != mb.width:
    raise ValueError(f"pack_micro_batch: packed width {batch['input_ids'].shape[1]} differs "
                     f"from the planned {mb.width}: plan with the lengths and bucket pack uses "
                     "(packed_lengths)")
  return pad_rows(batch, mb.size)[0]


def take_rows(x: np.ndarray, prompt_len: int, mb: MicroBatch) -> np.ndarray:
  """The micro-batch's rows of a per-token array x [B, T] laid out as `pack` lays the whole
  batch (prompts left-padded to `prompt_len`), moved to the micro-batch's layout
  [mb.size, mb.width] (prompts left-padded to mb.prompt_len: every row shifts left by the
  difference); 0 on pad rows and on columns the whole batch did not have."""
  d = int(prompt_len) - mb.prompt_len
  out = np.zeros((mb.size, mb.width) + x.shape[2:], x.dtype)
  seg = x[mb.rows, d:d + mb.width]
  out[:len(mb.rows), :seg.shape[1]] = seg
  return out


def put_rows(x: np.ndarray, y, prompt_len: int, mb: MicroBatch) -> None:
  """The inverse of `take_rows`: writes y [mb.size, mb.width] (a forward's per-token output on
  the micro-batch) into the micro-batch's rows of x [B, T], in place. Every real token of a
  row lands in its column of the whole-batch layout."""
  d = int(prompt_len) - mb.prompt_len
  w = min(mb.width, x.shape[1] - d)
  x[mb.rows, d:d + w] = np.asarray(y)[:len(mb.rows), :w]


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
