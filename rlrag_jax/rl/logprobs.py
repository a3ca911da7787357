"""Per-token log-probabilities and entropies of a causal LM.

Batches hold `input_ids [B, T]` (left-padded prompt + completion) and `attention_mask [B, T]`.
Log-probs are aligned to their targets: `logp[:, t] = log p(ids[:, t] | ids[:, <t])` and
`logp[:, 0] = 0` (nothing predicts the first slot), so a `loss_mask [B, T]` over the tokens the
policy wrote indexes logp directly.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

Array = jax.Array


def token_logprobs(logits: Array, targets: Array) -> Array:
  """log softmax(logits)[targets] in float32.

  Args:
    logits: [..., V] scores; row i is the distribution over `targets[i]`.
    targets: [...] integer ids, same leading shape as `logits`.

  Returns:
    [...] float32 log-probabilities. Uses logsumexp + a gather, so the full [..., V] log-softmax
    is never materialised.
  """
  logits = logits.astype(jnp.float32)
  lse = jax.nn.logsumexp(logits, axis=-1)                                    # [...]
  picked = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
  return picked - lse


def token_entropy(logits: Array) -> Array:
  """Entropy of softmax(logits) over the last axis, float32: lse - sum(p * logits)."""
  logits = logits.astype(jnp.float32)
  lse = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
  p = jnp.exp(logits - lse)
  return lse[..., 0] - jnp.sum(p * logits, axis=-1)


def shift_logprobs(logits: Array, input_ids: Array, with_entropy: bool = False,
                   temperature: float = 1.0):
  """Logits of the whole sequence [B, T, V] -> aligned logp [B, T] (and entropy [B, T]).

  Position t gets the score of `input_ids[:, t]` under `logits[:, t - 1]`; position 0 gets 0.
  Entropy at t is that of the distribution that predicted slot t (0 at t = 0).
  """
  return predicted_logprobs(logits[:, :-1], input_ids, with_entropy=with_entropy,
                             temperature=temperature)


def predicted_logprobs(pred: Array, input_ids: Array, with_entropy: bool = False,
                       temperature: float = 1.0, start: int = 0, entropy_grad: bool = False):
  """Like `shift_logprobs`, from the logits of positions start..T-2 only: pred [B, T-1-start, V].

  A model that projects only those positions onto the vocabulary skips the slice of the full
  [B, T, V] logits, and with it a full-size copy in the backward pass (the slice's transpose
  pads the logits gradient back to T columns before the head's weight gradient). With
  `start > 0` (see `rollout.batch.logits_start`) the prompt's positions are skipped too: the
  outputs are still [B, T], with 0 at positions 0..start, which no target there may need.
  The entropy carries no gradient unless `entropy_grad` (an entropy bonus in the loss).
  """
  if temperature != 1.0:
    pred = pred.astype(jnp.float32) / temperature
  lp = token_logprobs(pred, input_ids[:, start + 1:])                        # [B, T-1-start]
  lp = jnp.pad(lp, ((0, 0), (start + 1, 0)))
  if not with_entropy:
    return lp
  ent = jnp.pad(token_entropy(pred if entropy_grad else jax.lax.stop_gradient(pred)),
                ((0, 0), (start + 1, 0)))
  return lp, ent


def completion_logprobs(apply_fn: Callable, params, input_ids: Array, attention_mask: Array,
                        *, temperature: float = 1.0, with_entropy: bool = False):
  """Runs the LM once and returns aligned per-token log-probs [B, T] (float32).

  Args:
    apply_fn: `module.apply`; called as `apply_fn({'params': params}, input_ids, attention_mask)`
      and may return logits or `(logits, cache)`.
    params: the param pytree.
    input_ids: [B, T] int.
    attention_mask: [B, T] (1 on real tokens).
    temperature: logits are divided by it, matching a sampler that drew at this temperature.
    with_entropy: also return the per-token entropy [B, T] (no gradient flows through it).
  """
  out = apply_fn({"params": params}, input_ids, attention_mask)
  logits = out[0] if isinstance(out, tuple) else out                         # [B, T, V]
  return shift_logprobs(logits, input_ids, with_entropy=with_entropy, temperature=temperature)
