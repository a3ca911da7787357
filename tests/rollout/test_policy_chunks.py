"""`Policy.sample_chunked` splits its prompts into calls of `rows_per_call` rows (the trainer's
eval.batch_size) unless a chunk is given, and hands each call a bucketed batch size."""
import dataclasses

import jax
import numpy as np

from rlrag_jax.models.config import ModelConfig
from rlrag_jax.rollout.policy import Policy
from rlrag_jax.sampling import Generation


class Recording(Policy):
  """Records each sampler call's rows instead of sampling; completion k of a call is [k]."""

  def sample(self, prompt_ids, rng, **kw):
    self.calls.append((len(prompt_ids), kw["batch_multiple"]))
    n = len(prompt_ids)
    zeros = np.zeros((n, 2), np.float32)
    return Generation(tokens=np.array([[k, 0] for k in range(n)], np.int32), logprobs=zeros,
                      model_logprobs=zeros, lengths=np.ones(n, np.int32),
                      mask=np.array([[1, 0]] * n, np.int32), stopped_by=["eos"] * n)


def _policy(**kw):
  cfg = ModelConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_layers=1,
                    num_heads=1, num_kv_heads=1, head_dim=8, max_position_embeddings=64)
  p = Recording(cfg, None, max_new_tokens=4, **kw)
  p.calls = []
  return p


def test_rows_per_call_is_the_default_chunk():
  prompts = [[1, 2]] * 21
  p = _policy(rows_per_call=8)
  rows, _ = p.sample_chunked(prompts, jax.random.PRNGKey(0))
  assert p.calls == [(8, 8), (8, 8), (5, 8)] and len(rows) == 21
  assert [r[0][0] for r in rows[:9]] == list(range(8)) + [0]
  p = _policy(rows_per_call=8)
  p.sample_chunked(prompts, jax.random.PRNGKey(0), chunk=16)     # an explicit chunk wins
  assert p.calls == [(16, 16), (5, 8)]
  assert dataclasses.replace(p, params=1).rows_per_call == 8
