"""A one-token decode step specialised for the sampler's inner loop.

Same math, params and cache layout as `DecoderLM` (a drop-in for `DecoderLM.apply` with T=1),
arranged for CPU decode speed, where each step streams every weight once for a handful of rows:

  * q/k/v kernels are packed into one [E, (H+2K)*D] matrix and gate/up into one [E, 2F] matrix
    (`pack_params`, once per generate call, outside the loop), so a layer is 4 matmuls, not 7;
  * attention over the cache is an elementwise product + reduction over the [B, S, K, D] layout,
    which XLA fuses into one pass, instead of a batched dot that first transposes the whole cache
    of every layer on every step (`config.decode_attention` 'xla'; 'pallas' is one kernel a
    layer for GPUs: `sampling.cache_attention`).

Numerics follow `DecoderLM` (RMSNorm and softmax in f32, matmuls in the compute dtype); the
sampler's tests compare both against `transformers`. Param-driven: biases are used where the
param tree has them (q/k/v for Qwen2, o_proj for some Llama variants), and so are Qwen3's
per-head q/k RMS norms.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from rlrag_jax.models.config import ModelConfig
from rlrag_jax.models.decoder import accumulates_in_f32, apply_rope, rope_inv_freq
from rlrag_jax.sampling import cache_attention


def _flat_kernel(w):
  """[E, H, D] -> [E, H*D] (a free reshape)."""
  return w.reshape(w.shape[0], -1)


def pack_params(config: ModelConfig, params) -> dict:
  """The decode-friendly view of a `DecoderLM` param tree (concatenated projections)."""
  dt = config.compute_dtype
  model = params["model"]
  layers = []
  for i in range(config.num_layers):
    layer = model[f"layers_{i}"]
    attn, mlp = layer["self_attn"], layer["mlp"]
    names = ("q_proj", "k_proj", "v_proj")
    packed = {
        "ln1": layer["input_layernorm"]["weight"],
        "ln2": layer["post_attention_layernorm"]["weight"],
        "qkv": jnp.concatenate([_flat_kernel(attn[n]["kernel"]).astype(dt) for n in names], 1),
        "o": attn["o_proj"]["kernel"].reshape(-1, config.hidden_size).astype(dt),  # [H*D, E]
        "gate_up": jnp.concatenate([mlp["gate_proj"]["kernel"].astype(dt),
                                    mlp["up_proj"]["kernel"].astype(dt)], 1),   # [E, 2F]
        "down": mlp["down_proj"]["kernel"].astype(dt),
    }
    if "bias" in attn["q_proj"]:
      packed["qkv_bias"] = jnp.concatenate([attn[n]["bias"].reshape(-1).astype(dt)
                                            for n in names])
    if "bias" in attn["o_proj"]:
      packed["o_bias"] = attn["o_proj"]["bias"].astype(dt)
    if "q_norm" in attn:
      packed["q_norm"], packed["k_norm"] = attn["q_norm"]["weight"], attn["k_norm"]["weight"]
    layers.append(packed)
  # The embedding and the head in the compute dtype once per generate call: cast inside the
  # step, a float32 master embedding was read (and a bf16 copy written) on every decode step,
  # for a tied 0.5B model more bytes than the rest of the weights together.
  out = {"layers": tuple(layers), "embed": model["embed_tokens"]["embedding"].astype(dt),
         "norm": model["norm"]["weight"]}
  if not config.tie_word_embeddings:
    out["lm_head"] = params["lm_head"]["kernel"].astype(dt)
  return out


def _mm(x, w, config: ModelConfig):
  """x @ w in the compute dtype; reduced dtypes accumulate in f32 (as DecoderLM does)."""
  if not accumulates_in_f32(config):
    return jnp.dot(x, w)
  return jnp.dot(x, w, preferred_element_type=jnp.float32).astype(config.compute_dtype)


def _rms(x, w, eps, dtype):
  xf = x.astype(jnp.float32)
  xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
  return (w.astype(jnp.float32) * xf).astype(dtype)


def _step_tables(config: ModelConfig, cache, active):
  """Per step, shared by every layer: RoPE cos / sin [B, 1, D] at each row's position, the new
  key mask [B, S] and the mask as an additive bias [B, S] float32."""
  # RoPE position = number of real tokens before this one (left padding safe).
  pos = jnp.sum(cache["mask"].astype(jnp.int32), axis=1)                  # [B]
  freqs = pos.astype(jnp.float32)[:, None] * jnp.asarray(rope_inv_freq(config))
  emb = jnp.concatenate([freqs, freqs], axis=-1)[:, None, :]               # [B, 1, D]
  key_mask = jax.lax.dynamic_update_slice(cache["mask"], active[:, None],
                                          (0, cache["index"]))            # [B, S]
  neg = jnp.finfo(jnp.float32).min
  # The mask as an additive bias, once per step: s + 0 is s and s + neg rounds to neg (|s| is
  # far below neg's ulp), so every layer's softmax sees what `where(mask, s, neg)` gives, and
  # the add fuses into the score reduction instead of a select pass over [B, S, K, G].
  key_bias = jnp.where(key_mask, np.float32(0), neg)
  return jnp.cos(emb), jnp.sin(emb), key_mask, key_bias


def _attention(config: ModelConfig, lp, lc, x, rope, key_bias, index, read_slots, live):
  """One layer's attention sub-block: writes the new K/V at slot `index` and attends over the
  filled slots [0, index] (`cache_attention.attend`'s `length`). -> (x + attention, layer cache)."""
  dt = config.compute_dtype
  b = x.shape[0]
  h, kh, d = config.num_heads, config.num_kv_heads, config.head_dim
  y = _rms(x, lp["ln1"], config.rms_norm_eps, dt)
  qkv = _mm(y, lp["qkv"], config)                                          # [B, (H+2K)*D]
  if "qkv_bias" in lp:
    qkv = qkv + lp["qkv_bias"]
  q = qkv[:, :h * d].reshape(b, h, d)
  k = qkv[:, h * d:(h + kh) * d].reshape(b, kh, d)
  v = qkv[:, (h + kh) * d:].reshape(b, kh, d)
  if "q_norm" in lp:
    q = _rms(q, lp["q_norm"], config.rms_norm_eps, dt)
    k = _rms(k, lp["k_norm"], config.rms_norm_eps, dt)
  q, k = apply_rope(q, *rope), apply_rope(k, *rope)
  ck = jax.lax.dynamic_update_slice(lc["k"], k[:, None].astype(lc["k"].dtype), (0, index, 0, 0))
  cv = jax.lax.dynamic_update_slice(lc["v"], v[:, None].astype(lc["v"].dtype), (0, index, 0, 0))
  out = cache_attention.attend(q, ck, cv, key_bias, np.float32(1.0 / math.sqrt(d)),
                               config.decode_attention,
                               splits=config.decode_attention_splits or None,
                               length=index + 1, read_slots=read_slots,
                               live=live)                                  # [B, K, G, D]
  y = _mm(out.reshape(b, h * d), lp["o"], config)
  if "o_bias" in lp:
    y = y + lp["o_bias"]
  return x + y, {"k": ck, "v": cv}


def _mlp(config: ModelConfig, lp, x):
  y = _rms(x, lp["ln2"], config.rms_norm_eps, config.compute_dtype)
  gu = _mm(y, lp["gate_up"], config)                                       # [B, 2F]
  f = gu.shape[-1] // 2
  return x + _mm(jax.nn.silu(gu[:, :f]) * gu[:, f:], lp["down"], config)


def _head(config: ModelConfig, packed, x):
  """Final norm and the LM head: x [B, E] -> logits [B, V] float32."""
  dt = config.compute_dtype
  x = _rms(x, packed["norm"], config.rms_norm_eps, dt)
  tied = config.tie_word_embeddings
  # Reduced precision: contract the embedding's hidden axis directly; `x @ embed.T` made
  # XLA:CPU write a float32 copy of the whole table every step. Float32 keeps `embed.T`, whose
  # sums the CPU defaults' committed numbers were decoded with (dot_general differs in the last
  # bit there).
  if tied and jnp.dtype(dt) != jnp.float32:
    logits = jax.lax.dot_general(x, packed["embed"], (((1,), (1,)), ((), ())),
                                 preferred_element_type=jnp.float32)     # [B, V]
  else:
    head = packed["embed"].T if tied else packed["lm_head"]             # [E, V], compute dtype
    logits = jnp.dot(x, head, preferred_element_type=jnp.float32)        # [B, V]
  return logits.astype(jnp.float32)


def decode_step(config: ModelConfig, packed, tokens, active, cache, read_slots=None,
                skip_inactive: bool = False):
  """tokens [B] int32, active [B] bool -> (logits [B, V] f32 for the next token, new cache).

  Writes each row's token at slot cache['index'] (masked out of the cache where not active),
  exactly as `DecoderLM.apply(params, tokens[:, None], active[:, None], cache=cache)` does. The
  attention reads the cache only up to the filled length index + 1 (`cache_attention`'s module
  doc: 'xla' in bucketed prefixes, 'pallas' block by block); `read_slots` (static, optional) is
  a bound on index + 1 known at trace time (`bench.memory`'s plan; None: traced).
  `skip_inactive` (static): rows not `active` are finished and their logits unused (the
  sampler's loop): 'pallas' then reads none of their cache (their attention is zeros).
  """
  cos, sin, key_mask, key_bias = _step_tables(config, cache, active)
  index = cache["index"]
  x = packed["embed"][tokens].astype(config.compute_dtype)                 # [B, E]
  new_layers = []
  for lp, lc in zip(packed["layers"], cache["layers"]):
    x, layer_cache = _attention(config, lp, lc, x, (cos, sin), key_bias, index, read_slots,
                                active if skip_inactive else None)
    new_layers.append(layer_cache)
    x = _mlp(config, lp, x)
  new_cache = {"layers": tuple(new_layers), "mask": key_mask, "index": index + 1}
  return _head(config, packed, x), new_cache
