"""The cache-free causal attention as Pallas kernels (rlrag_jax.models.flash_attention), run in
Pallas' interpreter on CPU, against the dense attention of models.decoder: outputs and the
gradients of q, k and v; its GPU lowering; and the model with either attention."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlrag_jax.models import decoder, flash_attention
from rlrag_jax.models.config import ModelConfig
from rlrag_jax.models.decoder import DecoderLM, init_params


def _inputs(b, t, h, kv, d, dtype=jnp.float32, seed=0):
  rs = np.random.RandomState(seed)
  q = jnp.asarray(rs.randn(b, t, h, d), jnp.float32).astype(dtype)
  k = jnp.asarray(rs.randn(b, t, kv, d), jnp.float32).astype(dtype)
  v = jnp.asarray(rs.randn(b, t, kv, d), jnp.float32).astype(dtype)
  key_mask = np.ones((b, t), bool)
  key_mask[1, :t // 2 + 5] = False          # left padding past the first block
  if b > 2:
    key_mask[2, :3] = False
  if b > 3:
    key_mask[3] = False                     # a padding row of a micro-batch: no key at all
  return q, k, v, jnp.asarray(key_mask), jnp.asarray(rs.randn(b, t, h, d), jnp.float32)


def _dense(q, k, v, key_mask):
  t = q.shape[1]
  causal = jnp.arange(t)[None, :] <= jnp.arange(t)[:, None]
  allowed = (causal[None] & key_mask[:, None, :])[:, None]
  return decoder._attend(q, k, v, allowed)


@pytest.mark.parametrize("t,h,kv,blocks", [(40, 4, 2, (16, 16)), (64, 3, 1, (32, 16)),
                                           (37, 2, 2, (16, 32))])
def test_outputs_and_gradients_equal_the_dense_attention(t, h, kv, blocks):
  """GQA and not, query and key blocks of different sizes, a length that is not a multiple of
  either, left padding, a row with no key: equal where a query has a key; a query with none
  gets zeros and no gradient in the kernels (the dense softmax spreads it uniformly)."""
  q, k, v, key_mask, g = _inputs(4, t, h, kv, 16)
  bq, bk = blocks
  flash = lambda q, k, v: flash_attention.attend(q, k, v, key_mask, block_q=bq, block_k=bk)
  dense = lambda q, k, v: _dense(q, k, v, key_mask)
  live = np.asarray(jnp.cumsum(key_mask, axis=1) > 0)            # a key at or before t
  got, want = flash(q, k, v), dense(q, k, v)
  np.testing.assert_allclose(np.asarray(got)[live], np.asarray(want)[live], atol=2e-5, rtol=1e-5)
  assert np.all(np.asarray(got)[~live] == 0)
  gm = jnp.where(jnp.asarray(live)[:, :, None, None], g, 0.0)    # gradient of live rows only
  loss = lambda f: lambda q, k, v: jnp.sum(f(q, k, v) * gm)
  grads = jax.grad(loss(flash), argnums=(0, 1, 2))(q, k, v)
  for a, b_ in zip(grads, jax.grad(loss(dense), argnums=(0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b_), atol=5e-5, rtol=1e-4)
  assert all(np.isfinite(np.asarray(x)).all() for x in grads)
  assert not np.asarray(grads[0])[3].any()            # the keyless row passes no gradient


def test_bfloat16_within_rounding_of_float32():
  q, k, v, key_mask, _ = _inputs(2, 48, 4, 2, 32, seed=1)
  f32 = flash_attention.attend(q, k, v, key_mask, block_q=16, block_k=16)
  b16 = flash_attention.attend(*(x.astype(jnp.bfloat16) for x in (q, k, v)), key_mask,
                               block_q=16, block_k=16)
  assert b16.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(b16, np.float32), np.asarray(f32), atol=3e-2, rtol=3e-2)


def test_bfloat16_gradients_within_rounding_of_the_key_blocked_xla_path():
  """dq, dk, dv in bf16 (GQA, left padding, a keyless row, query and key blocks of different
  sizes) against the key-blocked XLA attention (`decoder.attend_blocked`): each relative to
  the float32 gradients of the same bf16-rounded inputs. Both paths round twice on the way (the
  probabilities and their gradient cast to bf16 for the GEMMs, then the bf16 result), each at
  most u/2 = 2^-9 of an element, so both stay below 2u; and the kernel is no less accurate
  than the XLA path (within 25% of its error, and within 2u of its gradients)."""
  u = 2.0 ** -8
  b, t, h, kv, d = 4, 64, 4, 2, 32
  q, k, v, key_mask, g = _inputs(b, t, h, kv, d, seed=2)
  live = jnp.cumsum(key_mask, axis=1) > 0
  gm = jnp.where(live[:, :, None, None], g, 0.0)
  causal = jnp.arange(t)[None, :] <= jnp.arange(t)[:, None]
  allowed = (causal[None] & key_mask[:, None, :])[:, None]
  flash = lambda q, k, v: flash_attention.attend(q, k, v, key_mask, block_q=32, block_k=16)
  xla = lambda q, k, v: decoder.attend_blocked(q, k, v, allowed, 16)

  def grads(f, dtype):
    loss = lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32) * gm)
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*(x.astype(dtype) for x in (q, k, v)))

  q, k, v = (x.astype(jnp.bfloat16).astype(jnp.float32) for x in (q, k, v))   # exact in bf16
  ref = grads(xla, jnp.float32)
  got, want = grads(flash, jnp.bfloat16), grads(xla, jnp.bfloat16)
  rel = lambda a, r: float(np.linalg.norm(np.asarray(a, np.float64) - np.asarray(r, np.float64))
                           / np.linalg.norm(np.asarray(r, np.float64)))
  for name, a, c, r in zip(("dq", "dk", "dv"), got, want, ref):
    assert a.dtype == jnp.bfloat16 and c.dtype == jnp.bfloat16, name
    err_flash, err_xla = rel(a, r), rel(c, r)
    assert err_flash < 2 * u and err_xla < 2 * u, (name, err_flash, err_xla)
    assert err_flash <= 1.25 * err_xla + 1e-4, (name, err_flash, err_xla)
    assert rel(a, c) < 2 * u, (name, rel(a, c))


def test_gpu_lowering_is_three_triton_kernels_without_a_loop_around_them():
  sd = jax.ShapeDtypeStruct
  q, kv = sd((4, 256, 8, 64), jnp.bfloat16), sd((4, 256, 2, 64), jnp.bfloat16)
  m, g = sd((4, 256), jnp.bool_), sd((4, 256, 8, 64), jnp.bfloat16)

  def fwd_bwd(q, k, v, m, g):
    out, vjp = jax.vjp(lambda q, k, v: flash_attention.attend(q, k, v, m), q, k, v)
    return out, vjp(g)

  text = jax.jit(fwd_bwd).trace(q, kv, kv, m, g).lower(lowering_platforms=("cuda",)).as_text()
  assert text.count("__gpu$xla.gpu.triton") == 3 and "stablehlo.while" not in text


def test_shapes_the_kernels_cannot_tile_are_refused():
  q, k, v, key_mask, _ = _inputs(2, 20, 2, 2, 8)
  with pytest.raises(ValueError, match="head_dim 8 must be a power of two >= 16"):
    flash_attention.attend(q, k, v, key_mask)
  q, k, v, key_mask, _ = _inputs(2, 20, 2, 2, 16)
  with pytest.raises(ValueError, match="block_k 24 must be a power of two"):
    flash_attention.attend(q, k, v, key_mask, block_k=24)


def test_the_model_gives_the_same_logits_and_gradients_with_either_attention():
  """DecoderLM with model.attention='pallas' (the cache-free forward) against 'xla', float32,
  remat on: logits on live positions and the parameter gradients of a masked loss."""
  cfg = ModelConfig(vocab_size=61, hidden_size=64, intermediate_size=96, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=16, remat=True)
  params = init_params(DecoderLM(cfg), jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(3, 61, (3, 21)), jnp.int32)
  mask = jnp.asarray(np.arange(21)[None, :] >= np.array([[0], [7], [2]]))

  def loss(c):
    def f(p):
      logits, _ = DecoderLM(c).apply({"params": p}, ids, mask)
      return jnp.sum(jnp.where(mask[..., None], logits, 0.0) ** 2) * 1e-3, logits
    return f

  (lx, logits_x), gx = jax.value_and_grad(loss(cfg), has_aux=True)(params)
  (lp, logits_p), gp = jax.value_and_grad(loss(cfg.replace(attention="pallas")), has_aux=True)(
      params)
  live = np.asarray(mask)
  np.testing.assert_allclose(np.asarray(logits_p)[live], np.asarray(logits_x)[live], atol=2e-5,
                             rtol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(gp), jax.tree_util.tree_leaves(gx)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-4)


def test_a_cpu_run_with_the_pallas_attentions_is_warned_that_they_are_interpreted(caplog):
  from configs import arena
  from rlrag_jax.training import steps
  c = arena.get_config("")
  c.model.attention = "pallas"
  with caplog.at_level("WARNING", logger="rlrag_jax.trainer"):
    steps._warn_interpreted_kernels(c.model)
  assert "model.attention='pallas' on cpu" in caplog.text and "interpreter" in caplog.text
  caplog.clear()
  c.model.attention = "xla"
  steps._warn_interpreted_kernels(c.model)
  assert caplog.text == ""


def test_the_sampler_prefill_into_a_fresh_cache_runs_the_kernel_and_equals_xla():
  """With model.attention='pallas' the sampler's prefill into a fresh cache (empty_cache) is the
  flash kernel over the prompt: the same last logits, cache and greedy continuations as 'xla';
  lowered for CUDA it is one Triton call a layer, and none when the cache may hold a prefix."""
  from rlrag_jax.models.decoder import init_cache
  from rlrag_jax.sampling import sampler
  cfg = ModelConfig(vocab_size=61, hidden_size=64, intermediate_size=96, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=16)
  cfg_p = cfg.replace(attention="pallas")
  params = init_params(DecoderLM(cfg), jax.random.PRNGKey(1))
  rng = np.random.default_rng(1)
  ids = jnp.asarray(rng.integers(3, 61, (3, 19)), jnp.int32)
  mask = jnp.asarray(np.arange(19)[None, :] >= np.array([[0], [11], [4]]))
  (lx, cx), (lp, cp) = (sampler.prefill(c, params, ids, mask, init_cache(c, 3, 27),
                                        empty_cache=True) for c in (cfg, cfg_p))
  np.testing.assert_allclose(np.asarray(lp), np.asarray(lx), atol=2e-5, rtol=1e-5)
  assert int(cp["index"]) == int(cx["index"]) == 19
  live = np.asarray(cx["mask"])
  assert np.array_equal(np.asarray(cp["mask"]), live) and live.sum() == 19 + 8 + 15
  # Padding slots (never read) differ past the first layer: a query with no key gets zeros from
  # the kernel and a uniform average from the dense softmax.
  for a, b in zip(jax.tree_util.tree_leaves(cp["layers"]), jax.tree_util.tree_leaves(cx["layers"])):
    np.testing.assert_allclose(np.asarray(a)[live], np.asarray(b)[live], atol=1e-5, rtol=1e-5)
  prompts = [list(map(int, rng.integers(3, 61, n))) for n in (4, 9, 2)]
  gen = [sampler.generate_with_params(c, params, prompts, max_new_tokens=5, temperature=0.0,
                                      eos_ids=(), rng=0) for c in (cfg, cfg_p)]
  assert np.array_equal(np.asarray(gen[0].tokens), np.asarray(gen[1].tokens))

  def kernels(empty_cache):
    cache = jax.eval_shape(lambda: init_cache(cfg_p, 3, 27))
    lowered = sampler.prefill.trace(cfg_p, params, ids, mask, cache, empty_cache=empty_cache)
    text = lowered.lower(lowering_platforms=("cuda",)).as_text()
    return text.count("__gpu$xla.gpu.triton"), text.count("cached_kernel")
  assert kernels(True) == (cfg.num_layers, 0)       # the prompt alone: the training forward
  assert kernels(False)[0] == cfg.num_layers and kernels(False)[1] > 0   # onto a cache


def test_a_prefill_onto_a_cache_that_holds_a_prefix_equals_xla():
  """attend_cached: new tokens at cache slots start.. attend the cached prefix and themselves.
  The kernel against the dense attention (a masked hole inside the prefix, left padding, a row
  with no key), then the model: a prompt prefilled in two pieces and continued (the sampler's
  prefix reuse, CachedContexts.extend) with 'pallas' equals 'xla'."""
  from rlrag_jax.models.decoder import init_cache
  from rlrag_jax.sampling import sampler
  from rlrag_jax.sampling.contexts import CachedContexts
  b, t, s, start = 3, 21, 70, 37
  q, _, _, _, _ = _inputs(b, t, 4, 2, 16, seed=2)
  rs = np.random.RandomState(3)
  k, v = (jnp.asarray(rs.randn(b, s, 2, 16), jnp.float32) for _ in range(2))
  km = np.ones((b, s), bool)
  km[0, 40:45] = False
  km[1, :20] = False
  km[2] = False
  km[:, start + t:] = False
  slots = start + np.arange(t)
  allowed = jnp.asarray((np.arange(s)[None, :] <= slots[:, None])[None] & km[:, None, :])[:, None]
  want = decoder._attend(q, k, v, allowed)
  got = flash_attention.attend_cached(q, k, v, jnp.asarray(km), jnp.int32(start), block_q=16,
                                      block_k=16)
  live = np.asarray(allowed[:, 0].any(-1))
  np.testing.assert_allclose(np.asarray(got)[live], np.asarray(want)[live], atol=2e-6, rtol=1e-5)
  assert not np.asarray(got)[~live].any()

  cfg = ModelConfig(vocab_size=61, hidden_size=64, intermediate_size=96, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=16)
  params = init_params(DecoderLM(cfg), jax.random.PRNGKey(4))
  ids = jnp.asarray(np.random.default_rng(4).integers(3, 61, (2, 30)), jnp.int32)
  mask = jnp.asarray(np.arange(30)[None, :] >= np.array([[0], [6]]))
  outs = []
  for c in (cfg, cfg.replace(attention="pallas")):
    cache = init_cache(c, 2, 40)
    _, cache = sampler.prefill(c, params, ids[:, :12], mask[:, :12], cache, empty_cache=True)
    outs.append(sampler.prefill(c, params, ids[:, 12:], mask[:, 12:], cache))
  (lx, cx), (lp, cp) = outs
  np.testing.assert_allclose(np.asarray(lp), np.asarray(lx), atol=2e-5, rtol=1e-5)
  live = np.asarray(cx["mask"])
  for a, b_ in zip(jax.tree_util.tree_leaves(cp["layers"]), jax.tree_util.tree_leaves(cx["layers"])):
    np.testing.assert_allclose(np.asarray(a)[live], np.asarray(b_)[live], atol=1e-5, rtol=1e-5)
  prompts = [[int(x) for x in ids[i, :n]] for i, n in ((0, 9), (1, 14))]
  toks = []
  for c in (cfg, cfg.replace(attention="pallas")):
    ctx = CachedContexts(c, params, pad_id=0)
    ctx.start(prompts, jax.random.PRNGKey(0), max_new_tokens=3, greedy=True)
    gen = ctx.extend([1, 0, 1], [[5, 6, 7], [8, 9], [10]], jax.random.PRNGKey(1),
                     max_new_tokens=4, greedy=True)
    toks.append(np.asarray(gen.tokens))
  assert np.array_equal(toks[0], toks[1])
