"""Advantage estimators: group-relative (GRPO, Dr. GRPO, RLOO) and per-token GAE (PPO).

Outcome estimators share one signature, `fn(rewards [N], group_size) -> advantages [N]`, where
`rewards` is ordered by group (the G samples of prompt 0, then those of prompt 1, ...), and are
looked up by name in ADVANTAGE_ESTIMATORS. GAE needs a critic and has its own signature.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

Array = jax.Array


def _grouped(rewards: Array, group_size: int, where: str) -> Array:
  rewards = jnp.asarray(rewards, jnp.float32)
  if rewards.ndim != 1:
    raise ValueError(f"{where}: rewards must be [N], found shape {rewards.shape}")
  if group_size < 1 or rewards.shape[0] % group_size:
    raise ValueError(f"{where}: group_size={group_size} must be >= 1 and divide the number of "
                     f"rewards N={rewards.shape[0]}")
  return rewards.reshape(-1, group_size)                                     # [N/G, G]


def group_advantages(rewards: Array, group_size: int, scale_std: bool = True,
                     eps: float = 1e-4) -> Array:
  """GRPO advantages: (r - mean_g) / (std_g + eps), or r - mean_g when not `scale_std`.

  std_g is the sample standard deviation (ddof=1, as torch.std in TRL); a group of one sample
  has advantage 0. Returns [N] float32.
  """
  r = _grouped(rewards, group_size, "rl.group_advantages")
  centred = r - jnp.mean(r, axis=1, keepdims=True)
  if scale_std:
    if group_size > 1:
      std = jnp.sqrt(jnp.sum(centred * centred, axis=1, keepdims=True) / (group_size - 1))
    else:
      std = jnp.zeros_like(centred)
    centred = centred / (std + eps)
  return centred.reshape(-1)


def rloo_advantages(rewards: Array, group_size: int) -> Array:
  """REINFORCE leave-one-out: r_i - mean_{j != i} r_j (0 for a group of one). Returns [N]."""
  r = _grouped(rewards, group_size, "rl.rloo_advantages")
  if group_size == 1:
    return jnp.zeros(r.size, jnp.float32)
  others = (jnp.sum(r, axis=1, keepdims=True) - r) / (group_size - 1)
  return (r - others).reshape(-1)


def keyed_advantages(rewards: Array, keys, scale_std: bool = True, eps: float = 1e-4) -> Array:
  """Group-relative advantages for groups of any sizes, named by `keys` [N] (e.g. the parent
  node of tree decisions): (r - mean_k) / (std_k + eps) with the sample std (ddof=1), or
  r - mean_k without `scale_std`. A group of one has advantage 0. Returns [N] float32."""
  import numpy as np
  r = jnp.asarray(rewards, jnp.float32)
  keys = np.asarray(keys)
  if r.ndim != 1 or keys.shape != r.shape:
    raise ValueError(f"rl.keyed_advantages: rewards {r.shape} and keys {keys.shape} must be [N]")
  _, idx = np.unique(keys, return_inverse=True)
  idx = jnp.asarray(idx.reshape(-1))
  k = int(idx.max()) + 1 if r.size else 0
  count = jax.ops.segment_sum(jnp.ones_like(r), idx, k)
  mean = jax.ops.segment_sum(r, idx, k) / count
  centred = r - mean[idx]
  if not scale_std:
    return centred
  ss = jax.ops.segment_sum(centred * centred, idx, k)
  std = jnp.where(count > 1, jnp.sqrt(ss / jnp.maximum(count - 1, 1)), 0.0)
  return centred / (std[idx] + eps)


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
