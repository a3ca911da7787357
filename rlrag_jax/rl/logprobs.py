"""Per-token log-probabilities and entropies of a causal LM.

Batches hold `input_ids [B, T]` (left-padded prompt + completion) and `attention_mask [B, T]`.
Log-probs are aligned to their targets: `logp[:, t] = log p(ids[:, t] | ids[:, <t])` and
`logp[:, 0] = 0` (nothing predicts the first slot), so a `loss_mask [B, T]` over the tokens the
policy wrote indexes logp directly.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp

from rlrag_jax import settings as settings_lib

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
  `start > 0` (see `rl.packing.logits_start`) the prompt's positions are skipped too: the
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


# ------------------------------------------------------------------------------------ chunked
DEFAULT_LOGITS_CHUNK = 2 ** 26    # logit elements (tokens x vocab) per chunk: 256 MiB in f32
# The backward pass of a chunk of the LM head (`rl.head_backward`, `sft.head_backward`):
# 'fused' (`fused_head_stats`), 'autodiff', or 'auto' (fused in reduced-precision compute, where
# the accelerator presets run; autodiff in float32, whose exact sums the CPU defaults'
# committed results were made with).
HEAD_BACKWARDS = settings_lib.HEAD_BACKWARDS


def use_fused_backward(mode: str, compute_dtype, entropy_grad: bool) -> bool:
  """Whether a chunked head takes the fused backward; an entropy bonus needs autodiff."""
  if mode not in HEAD_BACKWARDS:
    raise ValueError(f"head_backward={mode!r}; expected one of {HEAD_BACKWARDS}")
  if entropy_grad:
    return False
  return mode == "fused" or (mode == "auto" and jnp.dtype(compute_dtype) != jnp.float32)


def chunk_positions(rows: int, positions: int, vocab: int, budget: int) -> int:
  """Positions per chunk so that rows x positions x vocab logits stay within `budget` elements
  (at least one position); `positions` when everything fits at once or `budget` is 0 (off)."""
  if budget <= 0 or rows * positions * vocab <= budget:
    return positions
  return max(1, min(positions, budget // (rows * vocab)))


def _head_stats(h: Array, head: Array, targets: Array, *, transposed: bool, temperature: float,
                with_entropy: bool, entropy_grad: bool, with_hits: bool) -> dict:
  """One chunk: h [B, C, E] @ head -> f32 logits [B, C, V] -> the per-token statistics [B, C].

  `head` is [E, V] (an untied LM head's kernel) or, with `transposed`, [V, E] (a tied
  embedding); both are already in the compute dtype, and reduced dtypes accumulate in f32."""
  logits = _head_logits(h, head, transposed, temperature)                 # [B, C, V]
  out = {"lp": token_logprobs(logits, targets)}
  if with_entropy:
    out["ent"] = token_entropy(logits if entropy_grad else jax.lax.stop_gradient(logits))
  if with_hits:
    out["hit"] = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  return out


def _head_logits(h: Array, head: Array, transposed: bool, temperature: float) -> Array:
  spec = "bce,ve->bcv" if transposed else "bce,ev->bcv"
  logits = jnp.einsum(spec, h, head, preferred_element_type=jnp.float32)   # [B, C, V]
  return logits / temperature if temperature != 1.0 else logits


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def fused_head_stats(h: Array, head: Array, targets: Array, transposed: bool,
                     temperature: float, with_entropy: bool, with_hits: bool) -> dict:
  """`_head_stats` of one chunk (no entropy gradient) with a hand-written backward pass that
  reads the chunk's logits once: the forward keeps only the log-sum-exp [B, C]; the backward
  recomputes the logits with one GEMM and turns them into the log-prob's gradient,
  (onehot(target) - softmax) * g / temperature, in one elementwise pass, cast to the compute
  dtype for the two GEMMs that follow (h's and the head's gradients). Autodiff of the same
  chunk under `jax.checkpoint` reads the float32 logits about four times more (max, sum, the
  softmax's gradient, the gather's scatter), which XLA:GPU's plan of a 0.5B update shows as
  most of the step's memory traffic (docs/results/memory/)."""
  return _fused_fwd(h, head, targets, transposed, temperature, with_entropy, with_hits)[0]


def _fused_fwd(h, head, targets, transposed, temperature, with_entropy, with_hits):
  logits = _head_logits(h, head, transposed, temperature)
  lse = jax.nn.logsumexp(logits, axis=-1)                                  # [B, C]
  picked = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
  out = {"lp": picked - lse}
  if with_entropy:
    p = jnp.exp(logits - lse[..., None])
    out["ent"] = lse - jnp.sum(p * logits, axis=-1)
  if with_hits:
    out["hit"] = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  return out, (h, head, targets, lse)


def _fused_bwd(transposed, temperature, with_entropy, with_hits, res, g):
  del with_entropy, with_hits                   # neither carries a gradient
  h, head, targets, lse = res
  logits = _head_logits(h, head, transposed, temperature)
  vocab = logits.shape[-1]
  onehot = jnp.arange(vocab, dtype=jnp.int32) == targets[..., None].astype(jnp.int32)
  scale = g["lp"][..., None] / temperature
  dlogits = ((onehot.astype(jnp.float32) - jnp.exp(logits - lse[..., None])) * scale)
  dlogits = dlogits.astype(h.dtype)
  dh_spec, dw_spec = ("bcv,ve->bce", "bce,bcv->ve") if transposed else \
      ("bcv,ev->bce", "bce,bcv->ev")
  dh = jnp.einsum(dh_spec, dlogits, head, preferred_element_type=jnp.float32).astype(h.dtype)
  dw = jnp.einsum(dw_spec, h, dlogits, preferred_element_type=jnp.float32).astype(head.dtype)
  return dh, dw, None


fused_head_stats.defvjp(_fused_fwd, _fused_bwd)


def chunked_head_logprobs(h: Array, head: Array, targets: Array, *, chunk: int,
                          transposed: bool = False, temperature: float = 1.0,
                          with_entropy: bool = False, entropy_grad: bool = False,
                          with_hits: bool = False, fused: bool = False,
                          first=None) -> dict:
  """Per-token log-probs (and entropies, greedy hits) of `targets` under the LM head, without
  ever holding the [B, N, V] logits.

  Args:
    h: [B, N, E] final hidden states of the predicting positions.
    head: the LM head's weight in the compute dtype: [E, V], or [V, E] with `transposed`.
    targets: [B, N] the ids each position predicts.
    chunk: logit elements per chunk (`chunk_positions`); the positions are cut into chunks of
      that many tokens, and each chunk's logits are recomputed in the backward pass
      (`jax.checkpoint` inside a `lax.scan`), so the update's live logits are one chunk's. The
      gradient of `head` accumulates over the chunks, in float32 whatever the compute dtype
      (`_scan_f32_head_grad`), and is cast to `head`'s dtype once.
    fused: each chunk's backward pass is `fused_head_stats`'s (one recomputation of the
      logits, one elementwise pass over them) instead of autodiff's; not with `entropy_grad`.
      Equal to autodiff's gradients up to rounding, which is why the float32 CPU defaults keep
      autodiff's exact sums (`use_fused_backward`: `rl.head_backward` 'auto').
    first: None, or a traced int32 scalar: the first position whose statistics are needed.
      A chunk that ends before it is skipped at run time (`lax.cond`), its outputs 0 and its
      gradients nothing, so one program serves every `first` (the token-budget update's
      logits start) at the cost of at most one chunk more than a window cut at `first`.

  Returns {'lp': [B, N] f32, 'ent': [B, N] (with_entropy), 'hit': [B, N] (with_hits)}; the
  entropy carries no gradient unless `entropy_grad`.
  """
  b, n, e = h.shape
  vocab = head.shape[0] if transposed else head.shape[1]
  c = chunk_positions(b, n, vocab, chunk)
  stats = functools.partial(_head_stats, transposed=transposed, temperature=temperature,
                            with_entropy=with_entropy, entropy_grad=entropy_grad,
                            with_hits=with_hits)
  if fused and entropy_grad:
    raise ValueError("chunked_head_logprobs: fused=True gives the entropy no gradient; an "
                     "entropy bonus (entropy_grad) needs the autodiff path")
  if fused:
    stats = lambda hc, w, tc: fused_head_stats(hc, w, tc, transposed, float(temperature),
                                               with_entropy, with_hits)
  if c >= n:
    return stats(h, head, targets)
  chunks = -(-n // c)
  pad = chunks * c - n
  hs = jnp.pad(h, ((0, 0), (0, pad), (0, 0))).reshape(b, chunks, c, e)
  ts = jnp.pad(targets, ((0, 0), (0, pad))).reshape(b, chunks, c)
  hs, ts = jnp.swapaxes(hs, 0, 1), jnp.swapaxes(ts, 0, 1)                # [chunks, B, c, ...]
  # chunk j holds positions j c .. j c + c - 1: needed when its last one is >= first
  live = None if first is None else (jnp.arange(chunks) * c + c - 1) >= first   # [chunks]
  spec = _ChunkSpec(transposed, float(temperature), with_entropy, entropy_grad, with_hits, fused)
  out = _scan_chunks(hs, head, ts, stats, spec, live)
  # [chunks, B, c] -> [B, N]
  return {k: jnp.swapaxes(v, 0, 1).reshape(b, chunks * c)[:, :n] for k, v in out.items()}


def _scan_chunks(hs: Array, head: Array, ts: Array, stats, spec, live) -> dict:
  """`stats(hc, head, tc)` of every chunk of hs [chunks, B, c, E] and ts [chunks, B, c] (the
  `live` ones only, when given), as {name: [chunks, B, c]}."""
  if jnp.dtype(head.dtype) != jnp.float32:
    # Reduced precision: autodiff of the scan below sums the head's gradient over the chunks in
    # the head's dtype, so bf16 rounding piles up with the chunk count (a relative error of
    # ~1e-2 at 512 chunks against ~2e-3 unchunked); this scan carries it in float32 instead.
    return _scan_f32_head_grad(hs, head, ts, spec, live)
  # The fused backward recomputes its logits itself and keeps only [B, C] of its forward.
  body = (lambda w, hc, tc: stats(hc, w, tc)) if spec.fused else \
      jax.checkpoint(lambda w, hc, tc: stats(hc, w, tc))
  if live is not None:
    body = _skippable(body, jax.eval_shape(body, head, hs[0], ts[0]))
  xs = (hs, ts) if live is None else (hs, ts, live)
  # `head` is a constant of the scan (not a carry): JAX hoists loop-invariant residuals, so
  # the backward pass reads the one weight instead of a copy per chunk.
  _, out = jax.lax.scan(lambda _, x: (None, body(head, *x)), None, xs)
  return out


def _skippable(body, shapes):
  """`body(w, hc, tc)` run only where its chunk is live: zeros of `shapes` (and no gradient)
  for a chunk before the first needed position."""
  def run(w, hc, tc, live):
    zeros = lambda w, hc, tc: jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype),
                                                     shapes)
    return jax.lax.cond(live, body, zeros, w, hc, tc)
  return run


# ------------------------------------------------------------------ float32 head-gradient sum
@dataclasses.dataclass(frozen=True)
class _ChunkSpec:
  """The static settings of one chunked head (hashable: a custom_vjp's nondiff argument)."""
  transposed: bool
  temperature: float
  with_entropy: bool
  entropy_grad: bool
  with_hits: bool
  fused: bool


def _stats_from_logits(logits: Array, targets: Array, spec: _ChunkSpec) -> dict:
  """One chunk's statistics from its float32 logits [B, C, V] (already divided by the
  temperature): the same sums as `_head_stats` and `_fused_fwd`, and the log-sum-exp."""
  lse = jax.nn.logsumexp(logits, axis=-1)                                  # [B, C]
  picked = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
  out = {"lp": picked - lse}
  if spec.with_entropy:
    p = jnp.exp(logits - lse[..., None])
    out["ent"] = lse - jnp.sum(p * logits, axis=-1)
  if spec.with_hits:
    out["hit"] = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  return out, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _scan_f32_head_grad(hs: Array, head: Array, ts: Array, spec: _ChunkSpec,
                        live=None) -> dict:
  """`chunked_head_logprobs`' chunk scan over hs [chunks, B, c, E] and ts [chunks, B, c] with a
  backward pass that sums the head's gradient over the chunks in a float32 carry and casts it
  to `head`'s dtype once at the end, as MaxText's vocabulary tiling and Liger's fused linear
  cross-entropy do. Each chunk's backward recomputes its logits (as `jax.checkpoint` would):
  the log-prob's gradient is (onehot - softmax) * g / temperature with `spec.fused`, else
  autodiff's (which also carries an entropy bonus's gradient, `spec.entropy_grad`); it is cast
  to the compute dtype for the two GEMMs, which accumulate in float32. `live` [chunks] (or
  None: all): the chunks to run; the others give zeros, forward and backward."""
  return _scan_f32_fwd(hs, head, ts, spec, live)[0]


def _scan_f32_fwd(hs, head, ts, spec, live=None):
  def chunk(hc, tc):
    return _stats_from_logits(_head_logits(hc, head, spec.transposed, spec.temperature), tc,
                              spec)

  def step(_, xs):
    if live is None:
      return None, chunk(*xs)
    hc, tc, on = xs
    shapes = jax.eval_shape(chunk, hc, tc)
    zeros = lambda hc, tc: jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype),
                                                  shapes)
    return None, jax.lax.cond(on, chunk, zeros, hc, tc)
  xs = (hs, ts) if live is None else (hs, ts, live)
  _, (out, lses) = jax.lax.scan(step, None, xs)
  return out, (hs, head, ts, lses, live)


def _scan_f32_bwd(spec, res, g):
  hs, head, ts, lses, live = res
  temp = spec.temperature
  dh_spec, dw_spec = ("bcv,ve->bce", "bce,bcv->ve") if spec.transposed else \
      ("bcv,ev->bce", "bce,bcv->ev")
  g_ent = g["ent"] if spec.with_entropy and spec.entropy_grad else None

  def step(dw, xs):
    hc, tc, lse, g_lp, g_e = xs
    raw = _head_logits(hc, head, spec.transposed, 1.0)                      # [B, c, V] f32
    if spec.fused:
      onehot = jnp.arange(raw.shape[-1], dtype=jnp.int32) == tc[..., None].astype(jnp.int32)
      logits = raw / temp if temp != 1.0 else raw
      draw = (onehot.astype(jnp.float32) - jnp.exp(logits - lse[..., None])) * \
          (g_lp[..., None] / temp)
    else:
      def stats(r):
        out, _ = _stats_from_logits(r / temp if temp != 1.0 else r, tc, spec)
        return {"lp": out["lp"], **({"ent": out["ent"]} if g_e is not None else {})}
      _, vjp = jax.vjp(stats, raw)
      (draw,) = vjp({"lp": g_lp, **({"ent": g_e} if g_e is not None else {})})
    draw = draw.astype(hc.dtype)
    dh = jnp.einsum(dh_spec, draw, head, preferred_element_type=jnp.float32).astype(hc.dtype)
    dw = dw + jnp.einsum(dw_spec, hc, draw, preferred_element_type=jnp.float32)
    return dw, dh

  def skippable(dw, xs):
    *xs, on = xs
    return jax.lax.cond(on, step, lambda dw, xs: (dw, jnp.zeros_like(xs[0])), dw, tuple(xs))

  xs = (hs, ts, lses, g["lp"], g_ent)
  dw, dhs = jax.lax.scan(step if live is None else skippable,
                         jnp.zeros(head.shape, jnp.float32),
                         xs if live is None else xs + (live,))
  return dhs, dw.astype(head.dtype), None, None


_scan_f32_head_grad.defvjp(_scan_f32_fwd, _scan_f32_bwd)
