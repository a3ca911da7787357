"""A tiny decoder trained in seconds on a rule that needs its context: x[t+1] = x[t-1].

Random weights make poor references for "greedy tokens equal between two code paths": their
logits sit in near-ties, so float reordering alone flips tokens. This model is trained (on CPU,
a few seconds) to continue any context by repeating its last two tokens (a b a b ...), which it
can only do by attending to the previous position through the KV cache, with wide logit margins.
A path that corrupts cached keys, positions or masks changes its tokens; one that only reorders
floats does not.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlrag_jax.models.config import ModelConfig
from rlrag_jax.models.decoder import DecoderLM, init_params


def config(vocab: int = 256, **shape) -> ModelConfig:
  base = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_layers=2,
              num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=4096,
              model_type="qwen2", attention_bias=True)
  base.update(shape)
  return ModelConfig(**base)


def batch(rng: np.random.Generator, size: int, length: int, vocab: int):
  """Random prefixes (no loss) of random length, then the alternation of their last two tokens."""
  ids = rng.integers(3, vocab, (size, length))
  cut = rng.integers(2, length // 2, size)
  loss = np.zeros((size, length), np.float32)
  for i, c in enumerate(cut):
    for t in range(c, length):
      ids[i, t] = ids[i, t - 2]
    loss[i, c - 1:length - 1] = 1.0          # position t predicts t + 1
  return ids.astype(np.int32), loss


def train(vocab: int = 256, steps: int = 300, length: int = 128, batch_size: int = 32,
          lr: float = 3e-3, seed: int = 0, **shape):
  """-> (ModelConfig, params, final loss)."""
  cfg = config(vocab, **shape)
  model = DecoderLM(cfg)
  params = init_params(model, jax.random.PRNGKey(seed))
  opt = optax.adamw(optax.warmup_cosine_decay_schedule(0.0, lr, 20, steps, lr / 10))
  state = opt.init(params)

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def step(params, state, ids, loss_mask):
    def loss_fn(p):
      logits, _ = model.apply({"params": p}, ids)
      lp = jax.nn.log_softmax(logits[:, :-1])
      nll = -jnp.take_along_axis(lp, ids[:, 1:, None], -1)[..., 0]
      return jnp.sum(nll * loss_mask[:, :-1]) / jnp.sum(loss_mask[:, :-1])
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss

  rng = np.random.default_rng(seed)
  loss = float("nan")
  for _ in range(steps):
    ids, mask = batch(rng, batch_size, length, vocab)
    params, state, loss = step(params, state, ids, mask)
  return cfg, params, float(loss)
