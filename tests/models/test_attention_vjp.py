"""`attend_blocked`'s hand-written backward pass (the flash-attention one, over key blocks)
against autodiff of the dense `_attend`: outputs and gradients w.r.t. q, k, v under padding,
causal and cache-slot masks, blocks that do and do not divide the keys, grouped-query heads;
the whole model's gradient; and the memory that motivated it, read from XLA's analysis."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlrag_jax.models.config import ModelConfig
from rlrag_jax.models.decoder import DecoderLM, _attend, attend_blocked, init_params


def _masks(kind, b, t, s, r):
  """allowed [B, 1, T, S] and the queries that have at least one allowed key [B, T]."""
  start = r.integers(0, s // 2, b)
  start[0] = 0
  key_mask = np.arange(s)[None, :] >= start[:, None]             # left padding per row
  if kind == "padding":                                           # no causal mask (encoder-like)
    allowed = np.broadcast_to(key_mask[:, None, :], (b, t, s))
  else:                     # causal; "cache": the T queries are the last T of S slots (prefill)
    q_slot = np.arange(t) + (s - t)
    allowed = (np.arange(s)[None, :] <= q_slot[:, None])[None] & key_mask[:, None, :]
  return jnp.asarray(allowed[:, None]), jnp.asarray(allowed.any(-1))


def _case(kind, t, h, kv, d=8, b=3, seed=0):
  r = np.random.default_rng(seed)
  s = t + 11 if kind == "cache" else t
  q = jnp.asarray(r.standard_normal((b, t, h, d)), jnp.float32)
  k = jnp.asarray(r.standard_normal((b, s, kv, d)), jnp.float32)
  v = jnp.asarray(r.standard_normal((b, s, kv, d)), jnp.float32)
  allowed, live = _masks(kind, b, t, s, r)
  w = jnp.asarray(r.standard_normal((b, t, h, d)), jnp.float32)  # a cotangent on live queries
  w = w * live[:, :, None, None]
  return q, k, v, allowed, live, w


# Every mask kind with a block that divides T (48 of T=48) and ones that do not (5, 16 of 37);
# heads (H, K): GQA groups of 2 and 3 as the Qwen models use, and plain multi-head.
CASES = [("causal", (4, 2), 16), ("causal", (6, 2), 5), ("causal", (3, 3), 48),
         ("padding", (4, 2), 5), ("padding", (6, 2), 48), ("padding", (3, 3), 16),
         ("cache", (4, 2), 48), ("cache", (6, 2), 16), ("cache", (3, 3), 5)]


@pytest.mark.parametrize("kind,heads,block", CASES)
def test_outputs_and_gradients_equal_dense_attention(kind, heads, block):
  t = 48 if block == 48 else 37
  q, k, v, allowed, live, w = _case(kind, t, *heads)
  m = np.asarray(live)[:, :, None, None]
  blocked_fn = lambda q, k, v, allowed: attend_blocked(q, k, v, allowed, block)
  out = jax.jit(blocked_fn)(q, k, v, allowed)
  np.testing.assert_allclose(np.where(m, out, 0), np.where(m, _attend(q, k, v, allowed), 0),
                             atol=1e-5, rtol=1e-5)
  assert not np.any(np.where(m, 0, out))                         # dead queries: zeros
  grad = lambda f: jax.jit(jax.grad(lambda q, k, v: jnp.sum(f(q, k, v, allowed) * w),
                                    argnums=(0, 1, 2)))
  dense, blocked = grad(_attend)(q, k, v), grad(blocked_fn)(q, k, v)
  for name, a, b in zip("qkv", blocked, dense):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5, err_msg=f"d{name}")


def test_a_dead_query_passes_no_gradient():
  q, k, v, allowed, live, _ = _case("causal", 37, 4, 2)
  assert not np.all(live)
  dq = jax.grad(lambda q: jnp.sum(attend_blocked(q, k, v, allowed, 8)))(q)
  assert not np.any(np.asarray(dq)[~np.asarray(live)])
  assert np.all(np.isfinite(dq))


def test_bf16_gradients_follow_the_f32_reference():
  """In bf16 the probabilities and dS enter their matmuls in bf16 (f32 accumulation), as the
  forward's P V does: close to the f32 gradients at bf16's precision, not equal."""
  q, k, v, allowed, live, w = _case("causal", 64, 4, 2, d=16)
  loss = lambda f, dt: lambda q, k, v: jnp.sum(
      f(q.astype(dt), k.astype(dt), v.astype(dt), allowed).astype(jnp.float32) * w)
  ref = jax.grad(loss(_attend, jnp.float32), argnums=(0, 1, 2))(q, k, v)
  got = jax.grad(loss(lambda *a: attend_blocked(*a, 16), jnp.bfloat16), argnums=(0, 1, 2))(
      q, k, v)
  for a, b in zip(got, ref):
    assert a.dtype == jnp.float32
    err = np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b)))
    assert err < 3e-2, err                                       # bf16: 8 bits of mantissa


@pytest.mark.parametrize("remat", [False, True])
def test_model_gradient_with_blocked_attention_equals_the_dense_model(remat):
  cfg = ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8, remat=remat)
  params = init_params(DecoderLM(cfg), jax.random.PRNGKey(0))
  ids = jnp.asarray(np.random.default_rng(0).integers(1, 61, (2, 21)), jnp.int32)
  mask = jnp.asarray(np.arange(21)[None, :] >= np.array([[0], [6]]))

  def loss(c):
    def f(p):
      logits, _ = DecoderLM(c).apply({"params": p}, ids, mask)
      return jnp.sum(jnp.where(mask[..., None], jax.nn.log_softmax(logits), 0)[..., :7])
    return jax.jit(jax.value_and_grad(f))

  (l_dense, g_dense), (l_blocked, g_blocked) = (loss(cfg)(params),
                                                loss(cfg.replace(attention_block=8))(params))
  np.testing.assert_allclose(l_blocked, l_dense, rtol=1e-6)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g_blocked),
                          jax.tree_util.tree_leaves(g_dense)):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5, err_msg=jax.tree_util.keystr(path))


def test_gradient_keeps_less_than_one_score_matrix():
  """Memory-efficient attention keeps O(T x block) scores at a time and O(T x H x D) per query,
  so its gradient program needs less than one f32 [B, H, T, S] score matrix of temporaries,
  which dense attention materialises. Autodiff of the online-softmax scan instead saved the
  [B, T, H, D] f32 accumulator once per key block: S / block x T x H x D floats, exactly one
  score matrix when D = block, before anything else."""
  b, t, h, kv, d, block = 1, 2048, 4, 2, 64, 64
  q = jax.ShapeDtypeStruct((b, t, h, d), jnp.float32)
  k = jax.ShapeDtypeStruct((b, t, kv, d), jnp.float32)
  allowed = jax.ShapeDtypeStruct((b, 1, t, t), jnp.bool_)
  grad = jax.jit(jax.grad(lambda q, k, v, a: jnp.sum(attend_blocked(q, k, v, a, block)),
                          argnums=(0, 1, 2)))
  temp = grad.lower(q, k, k, allowed).compile().memory_analysis().temp_size_in_bytes
  scores = b * h * t * t * 4
  assert math.isclose(t / block * t * h * d * 4, scores)        # the old residuals' size
  assert temp < scores, (temp, scores)
