"""The sampler's packed decode step against DecoderLM's own cached decode, fp32 and bf16."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlrag_jax.models import init_cache
from rlrag_jax.models.config import ModelConfig
from rlrag_jax.models.decoder import DecoderLM, accumulates_in_f32, init_params
from rlrag_jax.sampling import decode, prefill
from rlrag_jax.sampling import fast_decode


def _config(dtype, tied):
  return ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=8, tie_word_embeddings=tied,
                     attention_bias=True, dtype=dtype, param_dtype=dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("tied,qk_norm", [(False, False), (True, False), (False, True)])
def test_packed_decode_step_matches_the_module(dtype, tied, qk_norm):
  cfg = _config(dtype, tied).replace(qk_norm=qk_norm)
  params = init_params(DecoderLM(cfg), jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  if qk_norm:                  # Qwen3's per-head norms, with weights that are not all ones
    for i in range(cfg.num_layers):
      attn = params["model"][f"layers_{i}"]["self_attn"]
      for n in ("q_norm", "k_norm"):
        attn[n]["weight"] = jnp.asarray(rng.uniform(0.5, 1.5, cfg.head_dim), jnp.float32)
  ids = jnp.asarray(rng.integers(3, 97, (3, 6)), jnp.int32)
  mask = jnp.asarray([[0, 0, 1, 1, 1, 1], [1] * 6, [0, 0, 0, 0, 1, 1]], jnp.bool_)
  _, cache = prefill(cfg, params, ids, mask, init_cache(cfg, 3, 10))
  tok = jnp.asarray([5, 7, 11], jnp.int32)
  active = jnp.asarray([True, False, True])
  want, want_cache = decode(cfg, params, tok, active, jax.tree_util.tree_map(jnp.copy, cache))
  got, got_cache = fast_decode.decode_step(cfg, fast_decode.pack_params(cfg, params), tok,
                                           active, cache)
  assert got.dtype == want.dtype == jnp.float32
  tol = 1e-5 if dtype == "float32" else 5e-2       # bf16: rounding of the two op orders
  live = np.asarray(active)                        # a finished row's logits are never read
  np.testing.assert_allclose(np.asarray(got)[live], np.asarray(want)[live], atol=tol, rtol=tol)
  assert np.array_equal(np.asarray(got_cache["mask"]), np.asarray(want_cache["mask"]))


def test_reduced_precision_matmuls_accumulate_in_f32():
  assert not accumulates_in_f32(_config("float32", False))
  assert accumulates_in_f32(_config("bfloat16", False))
  # bf16 logits stay close to the f32 model's on the same (bf16-rounded) weights
  c16, c32 = _config("bfloat16", False), _config("float32", False)
  p16 = init_params(DecoderLM(c16), jax.random.PRNGKey(1))
  p32 = jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), p16)
  ids = jnp.asarray(np.random.default_rng(1).integers(3, 97, (2, 9)), jnp.int32)
  l16, _ = DecoderLM(c16).apply({"params": p16}, ids)
  l32, _ = DecoderLM(c32).apply({"params": p32}, ids)
  assert l16.dtype == jnp.float32
  assert float(jnp.max(jnp.abs(l16 - l32))) < 0.05 * float(jnp.max(jnp.abs(l32)))


def test_tied_bf16_head_reads_the_embedding_without_a_float32_copy():
  """The tied head contracts the bf16 embedding's hidden axis directly. Written as
  `x @ embed.T`, XLA:CPU first wrote a float32 copy of the whole [V, E] table on every decode
  step (for a tied 0.5B model 0.54 GB written and 0.82 GB read, more than its layers)."""
  cfg = _config("bfloat16", True).replace(vocab_size=4096, hidden_size=64, param_dtype="float32")
  params = init_params(DecoderLM(cfg), jax.random.PRNGKey(0))
  packed = fast_decode.pack_params(cfg, params)
  cache = init_cache(cfg, 4, 16)
  tok, active = jnp.zeros((4,), jnp.int32), jnp.ones((4,), jnp.bool_)
  hlo = jax.jit(fast_decode.decode_step, static_argnums=0).lower(
      cfg, packed, tok, active, cache).compile().as_text()
  hlo = hlo[hlo.index("ENTRY"):]          # what the step materialises, not fused internals
  v, e = cfg.vocab_size, cfg.hidden_size
  results = [m.group(2) for m in re.finditer(r"^\s*(ROOT )?%\S+ = (\w+\[[0-9,]*\])", hlo, re.M)]
  assert f"bf16[{v},{e}]" in results or f"f32[4,{v}]" in results, results[:20]  # parsed
  copies = [r for r in results if r in (f"f32[{v},{e}]", f"f32[{e},{v}]")]
  assert not copies, copies
