"""Per-token log-probs: the gather against numpy, and the alignment against prefix forwards."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlrag_jax import rl
from rlrag_jax.models.config import ModelConfig
from rlrag_jax.models.decoder import DecoderLM, init_params

CFG = ModelConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=8)


def _np_log_softmax(x):
  x = np.asarray(x, np.float64)
  m = x.max(-1, keepdims=True)
  return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def test_token_logprobs_and_entropy():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 5, 11)).astype(np.float32) * 3
  targets = rng.integers(0, 11, size=(2, 5))
  ls = _np_log_softmax(logits)
  want = np.take_along_axis(ls, targets[..., None], -1)[..., 0]
  np.testing.assert_allclose(np.asarray(rl.token_logprobs(logits, targets)), want, atol=1e-5)
  ent = -(np.exp(ls) * ls).sum(-1)
  np.testing.assert_allclose(np.asarray(rl.token_entropy(logits)), ent, atol=1e-5)
  # bfloat16 logits are upcast before the softmax.
  lp16 = rl.token_logprobs(jnp.asarray(logits, jnp.bfloat16), targets)
  assert lp16.dtype == jnp.float32


def test_completion_logprobs_alignment():
  """logp[:, t] = log p(ids[:, t] | ids[:, <t]), checked by running each prefix on its own."""
  model = DecoderLM(CFG)
  params = jax.jit(lambda r: init_params(model, r))(jax.random.PRNGKey(0))
  rng = np.random.default_rng(1)
  b, t = 2, 7
  ids = rng.integers(0, CFG.vocab_size, size=(b, t)).astype(np.int32)
  mask = np.ones((b, t), np.int32)
  mask[1, :2] = 0                                   # left padding on row 1
  fn = jax.jit(rl.completion_logprobs, static_argnums=0, static_argnames=("with_entropy",))
  logp, ent = fn(model.apply, params, ids, mask, with_entropy=True)
  logp, ent = np.asarray(logp), np.asarray(ent)
  assert logp.shape == (b, t) and np.all(logp[:, 0] == 0) and np.all(ent[:, 0] == 0)
  # Every prefix ids[row, first real token : pos], left-padded to length t, in one batch; the
  # last slot then predicts ids[row, pos].
  cases, prefixes, prefix_masks = [], [], []
  for row in range(b):
    start = int(np.argmax(mask[row]))
    for pos in range(start + 1, t):
      n = pos - start
      p = np.zeros(t, np.int32)
      p[t - n:] = ids[row, start:pos]
      pm = np.zeros(t, np.int32)
      pm[t - n:] = 1
      cases.append((row, pos))
      prefixes.append(p)
      prefix_masks.append(pm)
  logits, _ = jax.jit(model.apply)({"params": params}, np.stack(prefixes), np.stack(prefix_masks))
  ls = _np_log_softmax(np.asarray(logits)[:, -1])                           # [cases, V]
  for i, (row, pos) in enumerate(cases):
    assert logp[row, pos] == pytest.approx(ls[i, ids[row, pos]], abs=2e-5), (row, pos)
    assert ent[row, pos] == pytest.approx(-(np.exp(ls[i]) * ls[i]).sum(), abs=2e-5)


def test_shift_logprobs_temperature():
  rng = np.random.default_rng(2)
  logits = rng.normal(size=(2, 6, 9)).astype(np.float32) * 2
  ids = rng.integers(0, 9, size=(2, 6))
  got = np.asarray(rl.shift_logprobs(logits, ids, temperature=2.0))
  ls = _np_log_softmax(logits[:, :-1] / 2.0)
  want = np.take_along_axis(ls, ids[:, 1:, None], -1)[..., 0]
  np.testing.assert_allclose(got[:, 1:], want, atol=1e-5)
  assert np.all(got[:, 0] == 0)
