"""Policy, value and SFT losses as pure per-token functions plus named aggregation modes.

Every loss is computed per token ([B, T]) and reduced by an aggregation mode over a
`loss_mask [B, T]` (1 on tokens the policy wrote that count). A mode returns a
(numerator, denominator) pair so a train step can sum numerators over micro-batches and divide
once by the denominator of the whole batch; `aggregate` is the one-shot form.

  sequence_mean  GRPO: mean over each sequence's tokens, then mean over sequences
  token_mean     DAPO: sum over all tokens / number of tokens
  constant       Dr. GRPO: sum over all tokens / (sequences x max_len), max_len from the config
Rows without any loss token (padding rows) count as no sequence in either of the first and last.
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from rlrag_jax.rl.kl import kl as kl_fn

Array = jax.Array


def _f32(x) -> Array:
  return jnp.asarray(x).astype(jnp.float32)


def _rows_with_tokens(m: Array) -> Array:
  return jnp.sum((jnp.sum(m, axis=-1) > 0).astype(jnp.float32))


def _sequence_mean(values: Array, mask: Array, max_len: Optional[int] = None):
  del max_len
  m = _f32(mask)
  per_row = jnp.sum(values * m, axis=-1) / jnp.maximum(jnp.sum(m, axis=-1), 1.0)  # [B]
  return jnp.sum(per_row), _rows_with_tokens(m)


def _token_mean(values: Array, mask: Array, max_len: Optional[int] = None):
  del max_len
  m = _f32(mask)
  return jnp.sum(values * m), jnp.sum(m)


def _constant(values: Array, mask: Array, max_len: Optional[int] = None):
  if not max_len or max_len < 1:
    raise ValueError("aggregation 'constant' (Dr. GRPO) needs max_len >= 1, the maximum completion "
                     f"length (config key loss.max_completion_len); found {max_len!r}")
  m = _f32(mask)
  return jnp.sum(values * m), _rows_with_tokens(m) * float(max_len)


AGGREGATIONS = {"sequence_mean": _sequence_mean, "token_mean": _token_mean, "constant": _constant}


def aggregation_terms(values: Array, mask: Array, mode: str, max_len: Optional[int] = None):
  """(numerator, denominator) of aggregation `mode` over values [B, T] and mask [B, T]."""
  if mode not in AGGREGATIONS:
    raise ValueError(f"aggregation mode {mode!r} is unknown (config key loss.aggregation); "
                     f"expected one of {sorted(AGGREGATIONS)}")
  return AGGREGATIONS[mode](values, mask, max_len)


def aggregate(values: Array, mask: Array, mode: str, max_len: Optional[int] = None) -> Array:
  """Scalar loss: numerator / denominator (0 when the mask is empty)."""
  num, den = aggregation_terms(values, mask, mode, max_len)
  return num / jnp.maximum(den, 1e-8)


# ----------------------------------------------------------------------------- policy loss
def ppo_token_loss(logp: Array, old_logp: Array, advantages: Array, eps_low: float = 0.2,
                   eps_high: Optional[float] = None, dual_clip: Optional[float] = None):
  """Per-token clipped surrogate, to be minimised.

  loss = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)) with r = exp(logp - old_logp);
  eps_high defaults to eps_low (PPO clip), a larger one is DAPO's clip-higher. With dual clip
  c > 1 (Ye et al. 2020), tokens with A < 0 are additionally capped at -A c.

  Args:
    logp, old_logp: [B, T] log-probs under the current and the sampling policy.
    advantages: [B] (one per sequence) or [B, T].

  Returns:
    (loss [B, T], info) with per-token 0/1 indicators 'clipped_low', 'clipped_high',
    'dual_clipped' and the ratio 'ratio' (all [B, T], no gradient).
  """
  eps_high = eps_low if eps_high is None else eps_high
  if dual_clip is not None and dual_clip <= 1.0:
    raise ValueError(f"dual clip constant must be > 1 (config key loss.dual_clip); found "
                     f"{dual_clip}")
  a = _f32(advantages)
  if a.ndim == 1:
    a = a[:, None]                                                           # [B, 1]
  ratio = jnp.exp(_f32(logp) - _f32(old_logp))                               # [B, T]
  unclipped = -a * ratio
  clipped = -a * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
  loss = jnp.maximum(unclipped, clipped)
  info = {
      "clipped_low": (a < 0) & (ratio < 1.0 - eps_low),
      "clipped_high": (a > 0) & (ratio > 1.0 + eps_high),
  }
  if dual_clip is not None:
    capped = -a * dual_clip
    info["dual_clipped"] = (a < 0) & (loss > capped)
    loss = jnp.where(a < 0, jnp.minimum(loss, capped), loss)
  else:
    info["dual_clipped"] = jnp.zeros_like(ratio, dtype=jnp.bool_)
  info = {k: v.astype(jnp.float32) for k, v in info.items()}
  info["ratio"] = jax.lax.stop_gradient(ratio)
  return loss, info


def policy_loss(logp: Array, old_logp: Array, advantages: Array, loss_mask: Array, *,
                eps_low: float = 0.2, eps_high: Optional[float] = None,
                dual_clip: Optional[float] = None, aggregation: str = "sequence_mean",
                max_len: Optional[int] = None, ref_logp: Optional[Array] = None,
                beta: float = 0.0, kl_estimator: str = "k3"):
  """GRPO / DAPO / Dr. GRPO objective on one batch -> (scalar loss, metrics).

  With beta > 0, beta * kl(logp, ref_logp) is added per token before aggregation (GRPO's KL
  loss term); with beta = 0 `ref_logp` may be None and the reference forward can be skipped.
  """
  tok, info = ppo_token_loss(logp, old_logp, advantages, eps_low, eps_high, dual_clip)
  metrics = {}
  if beta:
    if ref_logp is None:
      raise ValueError(f"policy_loss: beta={beta} needs ref_logp (batch key 'ref_logp')")
    k = kl_fn(logp, ref_logp, kl_estimator)
    tok = tok + beta * k
    metrics["kl"] = aggregate(jax.lax.stop_gradient(k), loss_mask, "token_mean")
  loss = aggregate(tok, loss_mask, aggregation, max_len)
  for name in ("clipped_low", "clipped_high", "dual_clipped"):
    metrics[name] = aggregate(info[name], loss_mask, "token_mean")
  metrics["clip_frac"] = metrics["clipped_low"] + metrics["clipped_high"]
  return loss, metrics


# ----------------------------------------------------------------------------- KL as a reward
def outcome_token_rewards(scores: Array, mask: Array) -> Array:
  """Scores [B] placed on the last masked token of each row -> rewards [B, T] (0 elsewhere)."""
  m = _f32(mask)
  t = m.shape[1]
  last = (t - 1) - jnp.argmax(m[:, ::-1], axis=1)                            # [B]
  onehot = (jnp.arange(t)[None, :] == last[:, None]).astype(jnp.float32) * m
  return onehot * _f32(scores)[:, None]


def kl_penalty_rewards(scores: Array, logp: Array, ref_logp: Array, mask: Array, beta: float,
                       estimator: str = "k1") -> Array:
  """PPO-style shaped rewards [B, T]: -beta * kl per policy token, plus the outcome score on the
  last policy token. Use instead of the KL loss term (then set the loss beta to 0)."""
  m = _f32(mask)
  return jax.lax.stop_gradient(kl_reward_penalty(logp, ref_logp, m, beta, estimator)
                               + outcome_token_rewards(scores, m))


def kl_reward_penalty(logp: Array, ref_logp: Array, mask: Array, beta: float,
                      estimator: str = "k1") -> Array:
  """-beta * kl(policy || ref) per policy token [B, T] (0 off the mask): the KL as a reward
  (rl.kl_form='reward'), as OpenRLHF's PPO adds it."""
  return jax.lax.stop_gradient(-beta * kl_fn(logp, ref_logp, estimator) * _f32(mask))


# ----------------------------------------------------------------------------- value and SFT
def value_token_loss(values: Array, old_values: Array, returns: Array,
                     clip_eps: Optional[float] = 0.2):
  """Clipped value loss per token: 0.5 max((V - R)^2, (V_clip - R)^2), V_clip = V_old +
  clip(V - V_old, +-clip_eps); plain 0.5 (V - R)^2 when clip_eps is None.

  Returns (loss [B, T], clipped [B, T] 0/1 where the clipped branch is the larger one).
  """
  v, r = _f32(values), _f32(returns)
  err = jnp.square(v - r)
  if clip_eps is None:
    return 0.5 * err, jnp.zeros_like(err)
  old = _f32(old_values)
  v_clip = old + jnp.clip(v - old, -clip_eps, clip_eps)
  err_clip = jnp.square(v_clip - r)
  return 0.5 * jnp.maximum(err, err_clip), (err_clip > err).astype(jnp.float32)


def value_loss(values: Array, old_values: Array, returns: Array, mask: Array,
               clip_eps: Optional[float] = 0.2, aggregation: str = "token_mean",
               max_len: Optional[int] = None):
  """Aggregated clipped value loss -> (scalar, metrics {'vf_clip_frac'})."""
  tok, clipped = value_token_loss(values, old_values, returns, clip_eps)
  return (aggregate(tok, mask, aggregation, max_len),
          {"vf_clip_frac": aggregate(clipped, mask, "token_mean")})


def sft_loss(logp: Array, mask: Array, aggregation: str = "token_mean",
             max_len: Optional[int] = None) -> Array:
  """Masked cross-entropy: aggregate(-logp) over the target tokens."""
  return aggregate(-_f32(logp), mask, aggregation, max_len)
