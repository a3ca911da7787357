"""Memory-efficient (key-blocked, online-softmax) attention against the dense reference."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlrag_jax.models.config import ModelConfig
from rlrag_jax.models.decoder import DecoderLM, _attend, attend_blocked, init_params


def _inputs(b=3, t=37, h=4, kv=2, d=8, seed=0):
  r = np.random.default_rng(seed)
  q = jnp.asarray(r.standard_normal((b, t, h, d)), jnp.float32)
  k = jnp.asarray(r.standard_normal((b, t, kv, d)), jnp.float32)
  v = jnp.asarray(r.standard_normal((b, t, kv, d)), jnp.float32)
  start = np.array([0, 5, 30])[:b]                          # left padding per row
  key_mask = np.arange(t)[None, :] >= start[:, None]        # [B, S]
  causal = np.tril(np.ones((t, t), bool))
  allowed = jnp.asarray((causal[None] & key_mask[:, None, :])[:, None])   # [B, 1, T, S]
  live = jnp.asarray(key_mask)                              # queries with >= 1 allowed key
  return q, k, v, allowed, live


@pytest.mark.parametrize("block", [1, 8, 16, 64])
def test_equals_dense_attention_and_its_gradients(block):
  q, k, v, allowed, live = _inputs()
  w = jnp.asarray(np.random.default_rng(1).standard_normal(q.shape), jnp.float32)
  dense = _attend(q, k, v, allowed)
  blocked = attend_blocked(q, k, v, allowed, block)
  m = live[:, :, None, None]
  np.testing.assert_allclose(np.where(m, blocked, 0), np.where(m, dense, 0), atol=1e-5)
  assert not np.any(np.where(m, 0, blocked))                # dead queries: zeros
  loss = lambda f: lambda q, k, v: jnp.sum(jnp.where(m, f(q, k, v, allowed), 0) * w)
  g_dense = jax.grad(loss(_attend), argnums=(0, 1, 2))(q, k, v)
  g_blocked = jax.grad(loss(lambda *a: attend_blocked(*a, block)), argnums=(0, 1, 2))(q, k, v)
  for a, b in zip(g_blocked, g_dense):
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_no_score_matrix_in_the_gradient_program():
  t = 256
  q, k, v, allowed, _ = _inputs(b=1, t=t, seed=2)
  grad = lambda f: jax.jit(jax.grad(lambda q, k, v: jnp.sum(f(q, k, v, allowed)),
                                    argnums=(0, 1, 2)))
  dense_hlo = grad(_attend).lower(q, k, v).as_text()
  blocked_hlo = grad(lambda *a: attend_blocked(*a, 32)).lower(q, k, v).as_text()
  scores = f"x{t}x{t}xf32>"                                 # [..., T, S] f32 (the bool mask
  assert scores in dense_hlo                                # itself is an input: [B,1,T,S] i1)
  assert scores not in blocked_hlo


def test_model_with_blocked_attention_matches_the_dense_model():
  cfg = ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8)
  params = init_params(DecoderLM(cfg), jax.random.PRNGKey(0))
  ids = jnp.asarray(np.random.default_rng(0).integers(1, 61, (2, 21)), jnp.int32)
  mask = jnp.asarray(np.arange(21)[None, :] >= np.array([[0], [6]]))
  dense, _ = DecoderLM(cfg).apply({"params": params}, ids, mask)
  blocked, _ = DecoderLM(cfg.replace(attention_block=8)).apply({"params": params}, ids, mask)
  np.testing.assert_allclose(np.asarray(blocked)[np.asarray(mask)],
                             np.asarray(dense)[np.asarray(mask)], atol=1e-5)
