"""Llama / Qwen2 / Qwen3 decoder in `flax.linen`, pure-functional over an explicit param pytree.

Param tree (mirrors the Hugging Face names so conversion is a table, see `hf_io.py`):

  model/embed_tokens/embedding                [V, E]         ('vocab', 'embed')
  model/layers_{i}/input_layernorm/weight     [E]            ('norm',)
  model/layers_{i}/self_attn/q_proj/kernel    [E, H, D]      ('embed', 'heads', 'head_dim')
  model/layers_{i}/self_attn/{k,v}_proj/kernel[E, K, D]      ('embed', 'kv_heads', 'head_dim')
  model/layers_{i}/self_attn/{q,k,v}_proj/bias [H|K, D]     (attention_bias: Qwen2; optional)
  model/layers_{i}/self_attn/{q,k}_norm/weight [D]           ('head_dim',)  (Qwen3: before RoPE)
  model/layers_{i}/self_attn/o_proj/kernel    [H, D, E]      ('heads', 'head_dim', 'embed')
  model/layers_{i}/self_attn/o_proj/bias      [E]            (o_proj_bias: Llama/Qwen3 bias)
  model/layers_{i}/post_attention_layernorm/weight
  model/layers_{i}/mlp/{gate,up}_proj/kernel  [E, F]         ('embed', 'mlp')
  model/layers_{i}/mlp/down_proj/kernel       [F, E]         ('mlp', 'embed')
  model/norm/weight                           [E]
  lm_head/kernel                              [E, V]         ('embed', 'vocab')   (absent when tied)
  value_head/kernel, value_head/bias          [E, 1], [1]    (ValueLM only)

The KV cache is an explicit pytree too (see `init_cache`): slots are written at `cache['index']`,
`cache['mask']` marks which slots hold real tokens, so left-padded batches of different prompt
lengths share one write position and attend causally in slot order.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from rlrag_jax.models.config import ModelConfig

Array = jax.Array
_part = nn.with_logical_partitioning
_ACTIVATION_SHARDING = contextvars.ContextVar("activation_sharding", default=None)


@contextlib.contextmanager
def activation_sharding(spec_fn):
  """While a step is traced inside this context, the decoder's activations carry sharding
  constraints: `spec_fn(logical_names, shape)` returns their Sharding (None: left to XLA).

  Without them XLA's propagation decided alone, and for FSDP it chose to keep each weight sharded
  over its 'embed' dimension and all-reduce the matmul outputs, which leaves them replicated: a
  7B update over 8 devices kept every device's activations for the whole batch.
  `models.sharding.activation_constraints(mesh, rules)` gives the rule-table version.
  """
  token = _ACTIVATION_SHARDING.set(spec_fn)
  try:
    yield
  finally:
    _ACTIVATION_SHARDING.reset(token)


def _constrain(x, names):
  spec_fn = _ACTIVATION_SHARDING.get()
  if spec_fn is None:
    return x
  sharding = spec_fn(tuple(names), x.shape)
  return x if sharding is None else jax.lax.with_sharding_constraint(x, sharding)


# ------------------------------------------------------------------------------------ RoPE
def rope_inv_freq(config: ModelConfig) -> np.ndarray:
  """Inverse frequencies [D/2], with 'linear' or 'llama3' scaling applied (float32, as HF)."""
  d = config.head_dim
  inv = 1.0 / (config.rope_theta ** (np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / d))
  inv = inv.astype(np.float32)
  rs = config.rope_scaling
  if rs.rope_type == "linear":
    inv = inv / np.float32(rs.factor)
  elif rs.rope_type == "llama3":
    old = rs.original_max_position_embeddings
    low_wavelen = old / rs.low_freq_factor
    high_wavelen = old / rs.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > low_wavelen, inv / rs.factor, inv)
    smooth = (old / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    inv = np.where(medium, smoothed, scaled).astype(np.float32)
  return inv


def rope_cos_sin(positions: Array, config: ModelConfig):
  """positions [B, T] -> cos, sin [B, T, 1, D] in float32."""
  inv = jnp.asarray(rope_inv_freq(config))
  freqs = positions.astype(jnp.float32)[..., None] * inv  # [B, T, D/2]
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb)[:, :, None, :], jnp.sin(emb)[:, :, None, :]


def apply_rope(x: Array, cos: Array, sin: Array) -> Array:
  """x [B, T, H, D]; rotate-half convention of the Llama family."""
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  out = x.astype(jnp.float32) * cos + rotated.astype(jnp.float32) * sin
  return out.astype(x.dtype)


# ------------------------------------------------------------------------------------ cache
def init_cache(config: ModelConfig, batch: int, max_len: int, dtype=None) -> dict:
  """Empty KV cache for `batch` rows and `max_len` slots."""
  dtype = dtype or config.compute_dtype
  shape = (batch, max_len, config.num_kv_heads, config.head_dim)
  layers = tuple({"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}
                 for _ in range(config.num_layers))
  return {"layers": layers, "mask": jnp.zeros((batch, max_len), jnp.bool_),
          "index": jnp.zeros((), jnp.int32)}


def default_positions(attention_mask: Array, cache: Optional[dict] = None) -> Array:
  """RoPE position of each token: the count of real tokens before it (left padding safe)."""
  m = attention_mask.astype(jnp.int32)
  pos = jnp.cumsum(m, axis=1) - 1
  if cache is not None:
    pos = pos + jnp.sum(cache["mask"].astype(jnp.int32), axis=1, keepdims=True)
  return jnp.maximum(pos, 0)


# ------------------------------------------------------------------------------------ layers
class RMSNorm(nn.Module):
  eps: float
  dtype: jnp.dtype
  param_dtype: jnp.dtype
  axis_name: str = "norm"               # logical axis of the weight (q/k norms: "head_dim")

  @nn.compact
  def __call__(self, x):
    w = self.param("weight", _part(nn.initializers.ones, (self.axis_name,)), (x.shape[-1],),
                   self.param_dtype)
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
    return (w.astype(jnp.float32) * xf).astype(self.dtype)


def accumulates_in_f32(cfg: ModelConfig) -> bool:
  """Matmuls in a reduced compute dtype (bf16) accumulate in f32 and are cast back: what
  GPU/TPU matrix units do anyway, and on XLA:CPU a bf16 x bf16 -> bf16 dot runs ~10x slower
  than bf16 x bf16 -> f32. f32 compute is left exactly as it is."""
  return jnp.dtype(cfg.compute_dtype) != jnp.float32


def _f32_dot_general(lhs, rhs, dimension_numbers, precision=None, **kw):
  kw["preferred_element_type"] = jnp.float32
  return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision, **kw)


def _cast_back(module, cfg: ModelConfig):
  if not accumulates_in_f32(cfg):
    return module
  return lambda x: module(x).astype(cfg.compute_dtype)


def _dense(features, axes, cfg: ModelConfig, name, use_bias=False, bias_axes=None):
  """A projection; its output is f32 when the compute dtype accumulates in f32 (callers cast
  back with `_cast_back`, or keep f32 as the LM head does)."""
  return nn.Dense(
      features=features, use_bias=use_bias, dtype=cfg.compute_dtype,
      param_dtype=cfg.params_dtype, name=name,
      dot_general=_f32_dot_general if accumulates_in_f32(cfg) else None,
      kernel_init=_part(nn.initializers.normal(0.02), axes),
      bias_init=_part(nn.initializers.zeros, bias_axes) if use_bias else nn.initializers.zeros)


def _einsum(shape, spec, axes, cfg: ModelConfig, name, use_bias=False, bias_axes=None):
  """A projection with a multi-dimensional kernel (heads kept as their own axis).

  nn.Einsum rather than nn.DenseGeneral: DenseGeneral checks logical axis names against its
  flattened 2-D kernel, which fails under a mesh with logical rules.
  """
  return _cast_back(nn.Einsum(
      shape=shape, einsum_str=spec, use_bias=use_bias, dtype=cfg.compute_dtype,
      param_dtype=cfg.params_dtype, name=name,
      preferred_element_type=jnp.float32 if accumulates_in_f32(cfg) else None,
      kernel_init=_part(nn.initializers.normal(0.02), axes),
      bias_init=_part(nn.initializers.zeros, bias_axes) if use_bias else nn.initializers.zeros),
      cfg)


class Attention(nn.Module):
  config: ModelConfig

  @nn.compact
  def __call__(self, x, cos, sin, allowed, layer_cache, empty_cache: bool = False):
    """x [B,T,E]; allowed [B,1,T,S] bool; layer_cache None or (k, v, index) with k/v [B,S,K,D].
    empty_cache (static): the cache holds nothing yet (index 0), so attending over it equals
    attending over these T tokens alone, which lets a prefill use the flash kernel."""
    cfg = self.config
    e, h, k_h, d = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    q = _einsum((e, h, d), "bte,ehd->bthd", ("embed", "heads", "head_dim"), cfg, "q_proj",
                cfg.attention_bias, ("heads", "head_dim"))(x)
    k = _einsum((e, k_h, d), "bte,ehd->bthd", ("embed", "kv_heads", "head_dim"), cfg, "k_proj",
                cfg.attention_bias, ("kv_heads", "head_dim"))(x)
    v = _einsum((e, k_h, d), "bte,ehd->bthd", ("embed", "kv_heads", "head_dim"), cfg, "v_proj",
                cfg.attention_bias, ("kv_heads", "head_dim"))(x)
    if cfg.qk_norm:           # Qwen3: each head's q and k RMS-normalised before RoPE
      norm = lambda name: RMSNorm(cfg.rms_norm_eps, cfg.compute_dtype, cfg.params_dtype,
                                  "head_dim", name=name)
      q, k = norm("q_norm")(q), norm("k_norm")(k)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    q = _constrain(q, ("activation_batch", "activation_length", "activation_heads", None))
    new_kv = None
    t = q.shape[1]
    own_k, own_v = k, v
    if layer_cache is not None:
      ck, cv, index = layer_cache
      k = jax.lax.dynamic_update_slice(ck, k.astype(ck.dtype), (0, index, 0, 0))
      v = jax.lax.dynamic_update_slice(cv, v.astype(cv.dtype), (0, index, 0, 0))
      new_kv = {"k": k, "v": v}
    if cfg.attention == "pallas" and t > 1 and (layer_cache is None or empty_cache):
      # Without a cache, or into an empty one (the T tokens sit in slots 0..T-1, the rest are
      # masked), `allowed` is causal & the key mask (Backbone), so its last query row over the
      # first T slots is the tokens' own key mask.
      out = _flash(q, own_k.astype(q.dtype), own_v.astype(q.dtype), allowed[:, 0, -1, :t])
    elif cfg.attention == "pallas" and t > 1:
      # Onto a cache holding `index` slots: `allowed`'s last query row (slot index + T - 1) is
      # the key mask up to that slot and False after it, where the kernel's causal bound ends.
      out = _flash(q, k.astype(q.dtype), v.astype(q.dtype), allowed[:, 0, -1, :], index)
    elif cfg.attention_block > 0 and q.shape[1] > 1:
      out = attend_blocked(q, k.astype(q.dtype), v.astype(q.dtype), allowed,
                           cfg.attention_block)                     # [B, T, H, D]
    else:
      out = _attend(q, k.astype(q.dtype), v.astype(q.dtype), allowed)  # [B, T, H, D]
    out = _constrain(out, ("activation_batch", "activation_length", "activation_heads", None))
    y = _einsum((h, d, e), "bthd,hde->bte", ("heads", "head_dim", "embed"), cfg, "o_proj",
                cfg.o_proj_bias, ("norm",))(out)
    return y, new_kv


def _flash(q, k, v, key_mask, start=None):
  """`flash_attention.attend` (or, with `start`, `attend_cached` onto a cache holding `start`
  slots), per device's rows under a mesh: a Pallas call is not split by XLA's partitioner (it
  would gather every row), so it runs inside `shard_map` over the batch axes the activation
  rules give (heads stay whole on each device)."""
  from rlrag_jax.models import flash_attention
  spec_fn = _ACTIVATION_SHARDING.get()
  sharding = spec_fn(("activation_batch", None, None, None), q.shape) if spec_fn else None
  if start is None:
    fn, args = flash_attention.attend, (q, k, v, key_mask)
  else:
    fn, args = flash_attention.attend_cached, (q, k, v, key_mask, start)
  if sharding is None or sharding.mesh.size == 1:
    return fn(*args)
  rows = jax.sharding.PartitionSpec(sharding.spec[0])
  specs = (rows,) * 4 + ((jax.sharding.PartitionSpec(),) if start is not None else ())
  return jax.shard_map(fn, mesh=sharding.mesh, in_specs=specs, out_specs=rows,
                       check_vma=False)(*args)


def _attend(q, k, v, allowed):
  """Grouped-query attention. q [B,T,H,D], k/v [B,S,K,D], allowed [B,1,T,S]."""
  b, t, h, d = q.shape
  kv = k.shape[2]
  qg = q.reshape(b, t, kv, h // kv, d)
  scores = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32)
  scores = scores / np.float32(math.sqrt(d))
  scores = jnp.where(allowed[:, :, None], scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bkgts,bskd->btkgd", probs, v, preferred_element_type=jnp.float32)
  return out.astype(q.dtype).reshape(b, t, h, d)


def _key_blocks(k, v, allowed, block: int):
  """k/v [B,S,K,D], allowed [B,1,T,S] -> keys, values and mask in blocks of `block` along S
  (the last block padded with disallowed keys): [N,B,blk,K,D] twice and [N,B,T,blk]."""
  b, s, kv, d = k.shape
  t = allowed.shape[2]
  nb = -(-s // block)
  pad = nb * block - s
  if pad:
    k = jnp.pad(k, ((0, 0), (0, pad), (0, 0), (0, 0)))
    v = jnp.pad(v, ((0, 0), (0, pad), (0, 0), (0, 0)))
    allowed = jnp.pad(allowed, ((0, 0), (0, 0), (0, 0), (0, pad)))
  kb = jnp.moveaxis(k.reshape(b, nb, block, kv, d), 1, 0)
  vb = jnp.moveaxis(v.reshape(b, nb, block, kv, d), 1, 0)
  ab = jnp.moveaxis(allowed[:, 0].reshape(b, t, nb, block), 2, 0)
  return kb, vb, ab


def _unblock(xb, s: int):
  """[N,B,blk,K,D] -> [B,S,K,D]: the inverse of `_key_blocks` on keys, padding dropped."""
  n, b, blk, kv, d = xb.shape
  return jnp.moveaxis(xb, 0, 1).reshape(b, n * blk, kv, d)[:, :s]


def _block_scores(qg, kc, ac, scale):
  """Scaled scores of queries qg [B,T,K,G,D] against one key block kc [B,blk,K,D] (f32,
  [B,K,G,T,blk]) and where they are allowed ([B,1,1,T,blk])."""
  sc = jnp.einsum("btkgd,bskd->bkgts", qg, kc, preferred_element_type=jnp.float32) * scale
  return sc, ac[:, None, None]


def _blocked_forward(q, k, v, allowed, block: int):
  """The online softmax over key blocks: out [B,T,H,D] in q's dtype and the log-sum-exp of
  each query's allowed scores [B,K,G,T] (f32; 0 for a query with no allowed key)."""
  b, t, h, d = q.shape
  kv = k.shape[2]
  g = h // kv
  kb, vb, ab = _key_blocks(k, v, allowed, block)
  qg = q.reshape(b, t, kv, g, d)
  scale = np.float32(1.0 / math.sqrt(d))
  neg = jnp.finfo(jnp.float32).min

  def step(carry, xs):
    m, l, acc = carry              # [B, K, G, T], [B, K, G, T], [B, T, K, G, D] (f32)
    kc, vc, ac = xs
    sc, ok = _block_scores(qg, kc, ac, scale)
    sc = jnp.where(ok, sc, neg)
    m_new = jnp.maximum(m, jnp.max(sc, axis=-1))
    p = jnp.where(ok, jnp.exp(sc - m_new[..., None]), 0.0)
    corr = jnp.exp(m - m_new)
    l = l * corr + jnp.sum(p, axis=-1)
    pv = jnp.einsum("bkgts,bskd->btkgd", p.astype(vc.dtype), vc,
                    preferred_element_type=jnp.float32)
    acc = acc * jnp.moveaxis(corr, 3, 1)[..., None] + pv
    return (m_new, l, acc), None

  init = (jnp.full((b, kv, g, t), neg, jnp.float32), jnp.zeros((b, kv, g, t), jnp.float32),
          jnp.zeros((b, t, kv, g, d), jnp.float32))
  (m, l, acc), _ = jax.lax.scan(step, init, (kb, vb, ab))
  live = l > 0
  lse = jnp.where(live, m + jnp.log(jnp.where(live, l, 1.0)), 0.0)
  l = jnp.moveaxis(l, 3, 1)[..., None]                                  # [B, T, K, G, 1]
  out = jnp.where(l > 0, acc / jnp.where(l > 0, l, 1.0), 0.0)
  return out.astype(q.dtype).reshape(b, t, h, d), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def attend_blocked(q, k, v, allowed, block: int):
  """`_attend` without the [T, S] score matrix, forward or backward: keys in blocks of `block`
  under an online softmax (running max and sum per query), so memory grows with T * block
  instead of T * S. Equal to `_attend` on every query with at least one allowed key; a query
  with none (a left-padding slot, never read) gets zeros and passes no gradient.

  The backward pass is written out (`_blocked_backward`) rather than derived: reverse-mode of
  the scan saved each step's carry, the [B, T, H, D] f32 accumulator once per key block, S /
  block x T x H x D floats (D / block of the f32 score matrix: 1.75 GiB per device and layer for
  the 7B's 4 x 4,096-token share of a micro-batch). Only q, k, v, the output and each query's
  log-sum-exp are saved; each block's probabilities are recomputed from them.
  """
  return _blocked_forward(q, k, v, allowed, block)[0]


def _attend_blocked_fwd(q, k, v, allowed, block):
  out, lse = _blocked_forward(q, k, v, allowed, block)
  return out, (q, k, v, allowed, out, lse)


def _blocked_backward(block, res, g):
  """Gradients of `attend_blocked` one key block at a time. With P = softmax(S) over the
  allowed keys, O = P V and dO = g:
    dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(dO * O)),  dQ = dS K,  dK = dS^T Q
  (scaled by 1/sqrt(D) where S is); rowsum(P * dP) = rowsum(dO * O) because O = P V.
  P of a block is exp(S - lse) on its allowed keys: no running statistics are needed."""
  q, k, v, allowed, out, lse = res
  b, t, h, d = q.shape
  s, kv = k.shape[1], k.shape[2]
  gq = h // kv
  kb, vb, ab = _key_blocks(k, v, allowed, block)
  qg = q.reshape(b, t, kv, gq, d)
  dog = g.astype(q.dtype).reshape(b, t, kv, gq, d)
  delta = jnp.einsum("btkgd,btkgd->bkgt", dog.astype(jnp.float32),
                     out.reshape(b, t, kv, gq, d).astype(jnp.float32))      # [B, K, G, T]
  scale = np.float32(1.0 / math.sqrt(d))

  def step(dq, xs):
    kc, vc, ac = xs
    sc, ok = _block_scores(qg, kc, ac, scale)
    p = jnp.where(ok, jnp.exp(sc - lse[..., None]), 0.0)                 # [B, K, G, T, blk]
    dv = jnp.einsum("bkgts,btkgd->bskd", p.astype(vc.dtype), dog,
                    preferred_element_type=jnp.float32)
    dp = jnp.einsum("btkgd,bskd->bkgts", dog, vc, preferred_element_type=jnp.float32)
    ds = (p * (dp - delta[..., None]) * scale).astype(q.dtype)
    dq = dq + jnp.einsum("bkgts,bskd->btkgd", ds, kc, preferred_element_type=jnp.float32)
    dk = jnp.einsum("bkgts,btkgd->bskd", ds, qg, preferred_element_type=jnp.float32)
    return dq, (dk, dv)

  dq, (dkb, dvb) = jax.lax.scan(step, jnp.zeros((b, t, kv, gq, d), jnp.float32), (kb, vb, ab))
  return (dq.astype(q.dtype).reshape(b, t, h, d), _unblock(dkb, s).astype(k.dtype),
          _unblock(dvb, s).astype(v.dtype), None)


attend_blocked.defvjp(_attend_blocked_fwd, _blocked_backward)


class MLP(nn.Module):
  config: ModelConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    proj = lambda features, axes, name: _cast_back(_dense(features, axes, cfg, name), cfg)
    gate = proj(cfg.intermediate_size, ("embed", "mlp"), "gate_proj")(x)
    up = proj(cfg.intermediate_size, ("embed", "mlp"), "up_proj")(x)
    hidden = _constrain(nn.silu(gate) * up, ("activation_batch", "activation_length",
                                             "activation_mlp"))
    return proj(cfg.hidden_size, ("mlp", "embed"), "down_proj")(hidden)


class Block(nn.Module):
  config: ModelConfig

  @nn.compact
  def __call__(self, x, cos, sin, allowed, layer_cache, empty_cache: bool = False):
    cfg = self.config
    norm = lambda name: RMSNorm(cfg.rms_norm_eps, cfg.compute_dtype, cfg.params_dtype, name=name)
    y, new_kv = Attention(cfg, name="self_attn")(norm("input_layernorm")(x), cos, sin, allowed,
                                                 layer_cache, empty_cache)
    x = x + y
    x = x + MLP(cfg, name="mlp")(norm("post_attention_layernorm")(x))
    x = _constrain(x, ("activation_batch", "activation_length", "activation_embed"))
    return x, new_kv


def plain_block(config: ModelConfig):
  """`f(params, x, cos, sin, allowed) -> y`: one `Block` without a cache, as a function."""
  def apply(params, x, cos, sin, allowed):
    return Block(config, parent=None).apply({"params": params}, x, cos, sin, allowed, None)[0]
  return apply


def remat_block(config: ModelConfig):
  """`f(params, x, cos, sin, allowed) -> y`: one `Block` (no cache) whose activations are
  recomputed in the backward pass instead of kept from the forward.

  Only the block's input is saved. The recomputation reads `x + 0 * g[..., :1]`, where `g` is
  the cotangent arriving from the block above: a data dependency (float multiplication by 0 is
  not simplified away, for its NaN semantics) that no compiler can hoist into the forward pass
  or merge with it. `jax.checkpoint` relies on optimisation barriers instead, and XLA:CPU
  removes those before common-subexpression elimination, so there the "rematerialised" update
  kept every activation (a 0.5B update's temporaries did not change with `model.remat`) and an
  ahead-of-time memory analysis on CPU could not show what remat saves. The row-local
  `g[..., :1]` keeps the dependency free of cross-device communication.
  """
  apply = plain_block(config)

  @jax.custom_vjp
  def f(params, x, cos, sin, allowed):
    return apply(params, x, cos, sin, allowed)

  def fwd(params, x, cos, sin, allowed):
    return apply(params, x, cos, sin, allowed), (params, x, cos, sin, allowed)

  def bwd(res, g):
    params, x, cos, sin, allowed = res
    x = x + (g[..., :1] * 0).astype(x.dtype)
    # The weights too: under FSDP the forward pass all-gathers each layer's weights, and XLA
    # merged the recomputation's gather with it, keeping every layer's gathered weights alive
    # until its backward pass (a 7B layer's 466 MB per device, each layer).
    zero = jnp.sum(g[:1, :1, :1] * 0)
    params = jax.tree_util.tree_map(lambda p: p + zero.astype(p.dtype), params)
    _, vjp = jax.vjp(lambda p, h: apply(p, h, cos, sin, allowed), params, x)
    d_params, d_x = vjp(g)
    return d_params, d_x, None, None, None

  f.defvjp(fwd, bwd)
  return f


def _scanned_blocks(block_fn, layer_params: list, x, cos, sin, allowed):
  """`model.scan_layers`: the blocks (without a cache) as one `lax.scan` over their params
  stacked on a leading layer axis. XLA compiles one block instead of num_layers, and under
  FSDP each iteration all-gathers only its own layer's weights: unrolled, XLA:CPU scheduled
  the gathers early and kept many layers' weights alive at once (a 7B update on 8 devices,
  32 x 4,096 tokens a micro-batch: 69.8 GiB per device unrolled, 35.9 scanned). The stack is
  a copy of the params and its gradient one of theirs, which costs more than it saves on one
  device (the 0.5B update at 64 x 512: 8.5 GiB of temporaries unrolled, 13.1 scanned)."""
  stacked = jax.tree_util.tree_map(lambda *ps: jnp.stack(ps), *layer_params)

  def body(h, p):
    return block_fn(p, h, cos, sin, allowed), None

  x, _ = jax.lax.scan(body, x, stacked)
  return x


class Backbone(nn.Module):
  """Embeddings, the decoder blocks and the final norm; returns hidden states [B, T, E]."""
  config: ModelConfig

  def setup(self):
    cfg = self.config
    self.embed_tokens = nn.Embed(
        cfg.vocab_size, cfg.hidden_size, dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
        embedding_init=_part(nn.initializers.normal(0.02), ("vocab", "embed")))
    self.layers = [Block(cfg, name=f"layers_{i}") for i in range(cfg.num_layers)]
    self.norm = RMSNorm(cfg.rms_norm_eps, cfg.compute_dtype, cfg.params_dtype)

  def __call__(self, input_ids, attention_mask=None, positions=None, cache=None,
               empty_cache: bool = False):
    """empty_cache (static, with a cache): it holds nothing yet (a fresh `init_cache`)."""
    b, t = input_ids.shape
    if attention_mask is None:
      attention_mask = jnp.ones((b, t), jnp.bool_)
    attention_mask = attention_mask.astype(jnp.bool_)
    if positions is None:
      positions = default_positions(attention_mask, cache)
    cos, sin = rope_cos_sin(positions, self.config)
    if cache is None:
      key_mask = attention_mask                                   # [B, S=T]
      q_slot = jnp.arange(t)
      new_mask, index = None, None
    else:
      index = cache["index"]
      key_mask = jax.lax.dynamic_update_slice(cache["mask"], attention_mask, (0, index))
      q_slot = index + jnp.arange(t)
      new_mask = key_mask
    s = key_mask.shape[1]
    causal = jnp.arange(s)[None, :] <= q_slot[:, None]            # [T, S]
    allowed = (causal[None] & key_mask[:, None, :])[:, None]      # [B, 1, T, S]
    x = self.embed_tokens(input_ids)
    x = _constrain(x, ("activation_batch", "activation_length", "activation_embed"))
    new_layers = []
    remat = self.config.remat and cache is None and not self.is_initializing()
    block_fn = remat_block(self.config) if remat else None
    if self.config.scan_layers and cache is None and not self.is_initializing():
      x = _scanned_blocks(block_fn or plain_block(self.config),
                          [layer.variables["params"] for layer in self.layers], x, cos, sin,
                          allowed)
      return self.norm(x), None
    for i, layer in enumerate(self.layers):
      if remat:
        x, kv = block_fn(layer.variables["params"], x, cos, sin, allowed), None
      else:
        lc = None if cache is None else (cache["layers"][i]["k"], cache["layers"][i]["v"], index)
        x, kv = layer(x, cos, sin, allowed, lc, empty_cache and cache is not None)
      new_layers.append(kv)
    x = self.norm(x)
    new_cache = None
    if cache is not None:
      new_cache = {"layers": tuple(new_layers), "mask": new_mask, "index": index + t}
    return x, new_cache

  def attend(self, x):
    """Tied LM head: x [..., E] -> logits [..., V] (f32 accumulation, see accumulates_in_f32)."""
    if not accumulates_in_f32(self.config):
      return self.embed_tokens.attend(x)
    emb = self.embed_tokens.embedding.astype(self.config.compute_dtype)
    return jnp.dot(x.astype(emb.dtype), emb.T, preferred_element_type=jnp.float32)


class DecoderLM(nn.Module):
  """Causal LM: `apply(params, ids, mask, positions, cache) -> (logits [B,T,V] f32, cache)`."""
  config: ModelConfig

  def setup(self):
    cfg = self.config
    self.model = Backbone(cfg)
    if not cfg.tie_word_embeddings:
      self.lm_head = _dense(cfg.vocab_size, ("embed", "vocab"), cfg, "lm_head")

  def __call__(self, input_ids, attention_mask=None, positions=None, cache=None):
    h, cache = self.model(input_ids, attention_mask, positions, cache)
    logits = self.model.attend(h) if self.config.tie_word_embeddings else self.lm_head(h)
    logits = _constrain(logits.astype(jnp.float32),
                        ("activation_batch", "activation_length", "activation_vocab"))
    return logits, cache


class ValueLM(nn.Module):
  """Critic: the same backbone with a scalar head per token -> (values [B, T] f32, cache)."""
  config: ModelConfig

  def setup(self):
    cfg = self.config
    self.model = Backbone(cfg)
    self.value_head = nn.Dense(1, dtype=jnp.float32, param_dtype=cfg.params_dtype,
                               kernel_init=_part(nn.initializers.normal(0.02), ("embed", None)),
                               bias_init=_part(nn.initializers.zeros, (None,)))

  def __call__(self, input_ids, attention_mask=None, positions=None, cache=None):
    h, cache = self.model(input_ids, attention_mask, positions, cache)
    return self.value_head(h.astype(jnp.float32))[..., 0], cache


def init_params(module: nn.Module, rng, seq_len: int = 8):
  """Random params as a plain pytree (logical-axis boxes removed); jitted, so one compile
  instead of thousands of eager ops."""
  ids = jnp.zeros((1, seq_len), jnp.int32)
  init = lambda r: nn.meta.unbox(module.init(r, ids)["params"])
  return jax.jit(init)(rng)


def logical_axes(module: nn.Module, seq_len: int = 8):
  """The logical axis names of every param, as a pytree of PartitionSpecs (no allocation)."""
  ids = jnp.zeros((1, seq_len), jnp.int32)
  abstract = jax.eval_shape(module.init, jax.random.PRNGKey(0), ids)
  return nn.get_partition_spec(abstract)["params"]


def value_params_from_policy(policy_params, value_params):
  """Starts a critic from a policy checkpoint: copy the backbone, keep the fresh value head."""
  return {"model": policy_params["model"], "value_head": value_params["value_head"]}
