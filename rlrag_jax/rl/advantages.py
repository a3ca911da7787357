"""Advantage estimators: group-relative (GRPO, Dr. GRPO, RLOO) and per-token GAE (PPO).

Outcome estimators share one signature, `fn(rewards [N], index [N]) -> advantages [N]`, where
`index` names each reward's group (the engine's group ids, `training.batch.Batch.group_ids`;
groups of any sizes, in any order), as verl's estimators take theirs: none reshapes by
position. They are looked up by name in ADVANTAGE_ESTIMATORS. GAE needs a critic and has its
own signature.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def _by_group(rewards, index, where: str) -> tuple:
  """Rewards [N] laid out by group, as named by `index` [N] (any hashables: equal values form
  one group, of any size, anywhere in the batch): (dense [K, W] float32, the group's rewards in
  their batch order and 0 past its size; valid [K, W] bool; counts [K, 1] float32; slots [N],
  where each reward sits in dense.reshape(-1)). Groups of one size in consecutive runs give
  exactly rewards.reshape(K, G), so per-group sums are those of a reshape."""
  r = jnp.asarray(rewards, jnp.float32)
  index = np.asarray(index)
  if r.ndim != 1 or index.shape != r.shape:
    raise ValueError(f"{where}: rewards {r.shape} and index {index.shape} must both be [N]")
  n = r.shape[0]
  if n == 0:
    raise ValueError(f"{where}: no rewards")
  _, first, ids = np.unique(index, return_index=True, return_inverse=True)
  ids = np.argsort(np.argsort(first, kind="stable"), kind="stable")[ids.reshape(-1)]  # by first
  order = np.argsort(ids, kind="stable")                     # group-major, batch order within
  counts = np.bincount(ids)
  col = np.arange(n) - np.repeat(np.cumsum(counts) - counts, counts)
  k, w = counts.size, int(counts.max())
  take = np.full((k, w), n, np.int64)                        # n: the appended 0
  take[ids[order], col] = order
  slots = np.empty(n, np.int64)
  slots[order] = ids[order] * w + col
  dense = jnp.concatenate([r, jnp.zeros(1, jnp.float32)])[take]
  return (dense, jnp.asarray(take < n), jnp.asarray(counts[:, None], jnp.float32),
          jnp.asarray(slots))


def group_advantages(rewards: Array, index, scale_std: bool = True, eps: float = 1e-4) -> Array:
  """GRPO advantages: (r - mean_g) / (std_g + eps), or r - mean_g when not `scale_std`, over
  the groups `index` [N] names (verl's `index`: a group id per reward; any sizes).

  std_g is the sample standard deviation (ddof=1, as torch.std in TRL); a group of one sample
  has advantage 0. Returns [N] float32.
  """
  r, valid, count, slots = _by_group(rewards, index, "rl.group_advantages")   # [K, W]
  # Means and variances multiply by the reciprocal of the count: what XLA makes of a division
  # by a constant group size, so equal groups give the float32 results of a fixed-size reshape.
  centred = jnp.where(valid, r - jnp.sum(r, axis=1, keepdims=True) * (1.0 / count), 0.0)
  if scale_std:
    ss = jnp.sum(centred * centred, axis=1, keepdims=True)
    std = jnp.where(count > 1, jnp.sqrt(ss * (1.0 / jnp.maximum(count - 1, 1))), 0.0)
    centred = centred / (std + eps)
  return centred.reshape(-1)[slots]


def rloo_advantages(rewards: Array, index) -> Array:
  """REINFORCE leave-one-out: r_i - mean_{j != i} r_j over the groups `index` [N] names (0 for
  a group of one). Returns [N] float32."""
  r, valid, count, slots = _by_group(rewards, index, "rl.rloo_advantages")   # [K, W]
  others = (jnp.sum(r, axis=1, keepdims=True) - r) * (1.0 / jnp.maximum(count - 1, 1))
  return jnp.where(valid & (count > 1), r - others, 0.0).reshape(-1)[slots]


ADVANTAGE_ESTIMATORS = {
    "grpo": group_advantages,
    "dr_grpo": functools.partial(group_advantages, scale_std=False),
    "rloo": rloo_advantages,
}


def gae(rewards: Array, values: Array, mask: Array, gamma: float, lam: float):
  """Generalised advantage estimation over the policy's tokens.

  Tokens with mask 0 (prompt, padding, retrieved text) are skipped: the successor of a policy
  token is the next policy token in the row, and the value after the last one is 0 (episode end).
  Put rewards on policy tokens (e.g. the outcome on the last one); rewards on masked tokens are
  ignored.

  Args:
    rewards: [B, T] per-token rewards.
    values: [B, T] critic values V(s_t) at each token.
    mask: [B, T] 1 on policy tokens.
    gamma: discount.
    lam: GAE lambda.

  Returns:
    (advantages [B, T], returns [B, T]) float32, both 0 where mask is 0; returns = A + V.
  """
  rewards = jnp.asarray(rewards, jnp.float32)
  values = jnp.asarray(values, jnp.float32)
  m = jnp.asarray(mask).astype(jnp.float32)
  if not rewards.shape == values.shape == m.shape:
    raise ValueError(f"rl.gae: rewards {rewards.shape}, values {values.shape} and mask {m.shape} "
                     "must all be [B, T]")

  def backward(carry, xs):
    next_value, next_adv = carry                                             # [B], [B]
    r, v, mk = xs
    delta = r + gamma * next_value - v
    adv = delta + gamma * lam * next_adv
    next_value = mk * v + (1.0 - mk) * next_value
    next_adv = mk * adv + (1.0 - mk) * next_adv
    return (next_value, next_adv), adv

  zeros = jnp.zeros(rewards.shape[0], jnp.float32)
  _, adv = jax.lax.scan(backward, (zeros, zeros), (rewards.T, values.T, m.T), reverse=True)
  adv = adv.T * m                                                            # [B, T]
  return adv, (adv + values) * m


def masked_whiten(x: Array, mask: Array, eps: float = 1e-8, shift_mean: bool = True) -> Array:
  """(x - mean) / std over the masked entries (PPO's advantage whitening); 0 where mask is 0."""
  m = jnp.asarray(mask).astype(jnp.float32)
  n = jnp.maximum(jnp.sum(m), 1.0)
  mean = jnp.sum(x * m) / n
  var = jnp.sum(jnp.square(x - mean) * m) / n
  out = (x - mean) * jax.lax.rsqrt(var + eps)
  if not shift_mean:
    out = out + mean
  return out * m
