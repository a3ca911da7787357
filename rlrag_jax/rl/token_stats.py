"""Per-token statistics of a packed batch under the policy: log-probs of its tokens, the
entropies of the distributions that predicted them and greedy hits, from a window of logits
positions (a static start) or the whole row with a traced start, computed at once or in chunks
of the LM head (`rl.logprobs.chunked_head_logprobs`), so no [tokens, vocab] array lives in an
update. Shared by every update step and forward of `rl.step_factories`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

from rlrag_jax.models import sharding as shd
from rlrag_jax.rl.logprobs import (chunk_positions, chunked_head_logprobs, predicted_logprobs,
                                   use_fused_backward)

Array = jax.Array


def _constrain(x: Array, names, mesh: Mesh, rules) -> Array:
  spec = shd.logical_to_mesh_spec(names, x.shape, mesh, rules)
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def _predictor_logits(lm, input_ids, attention_mask, start: int = 0):
  """DecoderLM method: logits of positions start..T-2 only, the predictors of tokens
  start+1..T-1.

  Slicing the hidden states [B, T, E] instead of the logits [B, T, V] saves a full-size copy of
  the logits (and of their gradient) per step; on XLA:CPU that copy was ~20% of a small
  model's policy update. `start` skips the prompt's positions as well, whose logits no loss
  reads (TRL's `logits_to_keep`): the head's matmul, the softmax and their gradients shrink to
  the completion's width.
  """
  h, _ = lm.model(input_ids, attention_mask)
  h = h[:, start:-1]                                                         # [B, T-1-start, E]
  logits = lm.model.attend(h) if lm.config.tie_word_embeddings else lm.lm_head(h)
  return logits.astype(jnp.float32)                                          # [B, T-1-start, V]


def _pred_logits(module, params, mb, mesh, rules, start: int):
  logits = module.apply({"params": params}, mb["input_ids"], mb["attention_mask"], start,
                        method=_predictor_logits)
  return _constrain(logits, ("activation_batch", "activation_length", "activation_vocab"),
                    mesh, rules)                                             # [b, T-1-start, V]


def _predictor_hidden(lm, input_ids, attention_mask, start: int = 0):
  """DecoderLM method: the final hidden states of positions start..T-2 [B, T-1-start, E]."""
  h, _ = lm.model(input_ids, attention_mask)
  return h[:, start:-1]


def lm_head_weight(config, params) -> tuple:
  """(weight in the compute dtype, transposed): the untied head's kernel [E, V], or the tied
  embedding [V, E] (transposed=True)."""
  if config.tie_word_embeddings:
    return params["model"]["embed_tokens"]["embedding"].astype(config.compute_dtype), True
  return params["lm_head"]["kernel"].astype(config.compute_dtype), False


def compute_params(module, params, mesh: Mesh, rules=shd.RULES):
  """The decoder's weight matrices cast to the compute dtype where they are stored, so that FSDP
  all-gathers them in bf16, not as float32 masters (left alone, XLA gathered first and cast
  after: a 7B LM head took 2.2 GB per device in float32). 1-D weights (norms) and a critic's
  float32 value head stay as stored; on one device nothing changes."""
  cfg = module.config
  dt = cfg.compute_dtype
  if mesh.devices.size == 1 or jnp.dtype(dt) == jnp.dtype(cfg.params_dtype):
    return params
  sh = shd.param_shardings(module, mesh, rules)

  def cast(path, p, s):
    if p.ndim < 2 or any(getattr(k, "key", None) == "value_head" for k in path):
      return p
    return jax.lax.with_sharding_constraint(p.astype(dt), s)
  return jax.tree_util.tree_map_with_path(cast, params, sh)


def token_stats(module, params, mb, mesh, rules, start, *, chunk: int, **kw) -> dict:
  """Aligned per-token statistics [b, T] of a micro-batch: 'lp' (log-prob of each token), and
  'ent' (entropy of the distribution that predicted it) / 'hit' (greedy prediction right),
  each 0 at positions 0..start (`window_stats`).

  `start` a Python int: the logits window starts there (one program per start). A traced
  int32 scalar (the token-budget step, one program per width): the window is the whole row,
  its head chunks before `start` are skipped at run time (`chunked_head_logprobs`' `first`),
  and positions 0..start are set to 0, so the numbers are the int form's up to the summation
  order of the head's chunks.
  """
  if isinstance(start, (int, np.integer)):
    return window_stats(module, params, mb, mesh, rules, int(start), chunk=chunk, **kw)
  out = window_stats(module, params, mb, mesh, rules, 0, chunk=chunk, first=start, **kw)
  keep = jnp.arange(mb["input_ids"].shape[1])[None, :] > start              # [1, T]
  return {k: jnp.where(keep, v, jnp.zeros((), v.dtype)) for k, v in out.items()}


def window_stats(module, params, mb, mesh, rules, start: int, *, chunk: int,
                  temperature: float = 1.0, with_entropy: bool = False,
                  entropy_grad: bool = False, with_hits: bool = False,
                  head_backward: str = "auto", first=None) -> dict:
  """`token_stats` over the window of positions start..T-2 (a static start).

  When the window's logits [b, T-1-start, V] fit in `chunk` elements (or chunk = 0) they are
  computed at once (`_pred_logits`); else from the hidden states in chunks of tokens against
  the LM head, each chunk recomputed in the backward pass (`chunked_head_logprobs`, which
  skips the chunks before a traced `first`), so no [tokens, vocab] array lives in the update.
  """
  ids = mb["input_ids"]
  cfg = module.config
  params = compute_params(module, params, mesh, rules)
  b, n = ids.shape[0], ids.shape[1] - 1 - start
  pad = lambda x: jnp.pad(x, ((0, 0), (start + 1, 0)))
  # `chunk` bounds one device's logits: the rows are sharded over the batch axes, so a chunk
  # spans shards-times more positions than one device's budget over all rows would give
  # (XLA:GPU's plan of a 7B update on 8 H100s: 8x fewer passes over the head's weight and
  # gradient, docs/results/memory/).
  shards = int(np.prod([mesh.shape[a] for a in shd.BATCH_AXES if a in mesh.shape]))
  rows = b // shards if shards > 1 and b % shards == 0 else b
  if chunk_positions(rows, n, cfg.vocab_size, chunk) >= n:
    pred = _pred_logits(module, params, mb, mesh, rules, start)             # [b, n, V]
    out = predicted_logprobs(pred, ids, with_entropy=with_entropy, temperature=temperature,
                             start=start, entropy_grad=entropy_grad)
    out = dict(zip(("lp", "ent"), out)) if with_entropy else {"lp": out}
    if with_hits:
      out["hit"] = pad((jnp.argmax(pred, axis=-1) == ids[:, start + 1:]).astype(jnp.float32))
    return out
  h = module.apply({"params": params}, ids, mb["attention_mask"], start,
                   method=_predictor_hidden)                                # [b, n, E]
  h = _constrain(h, ("activation_batch", "activation_length", "activation_embed"), mesh, rules)
  head, transposed = lm_head_weight(cfg, params)
  if mesh.devices.size > 1:
    # Gathered once for all chunks: left FSDP-sharded, the weight is a loop constant of the
    # chunk scan that XLA all-gathered in every chunk, and its gradient was reduce-scattered
    # in every chunk (XLA:GPU's plan of a 7B update on 8 H100s: 8.7 of its 26.9 TB of
    # traffic a step, docs/results/memory/). Replicated, the chunks accumulate the gradient
    # locally and the constraint's transpose reduce-scatters it once.
    head = _constrain(head, (None, None), mesh, rules)
  # `head_backward` 'auto': reduced-precision compute (the accelerator presets) takes the
  # hand-written chunk backward; float32 (the CPU defaults) keeps autodiff's.
  fused = use_fused_backward(head_backward, cfg.compute_dtype, entropy_grad)
  out = chunked_head_logprobs(h, head, ids[:, start + 1:], chunk=chunk * (b // rows),
                              transposed=transposed,
                              temperature=temperature, with_entropy=with_entropy,
                              entropy_grad=entropy_grad, with_hits=with_hits, fused=fused,
                              first=first)
  return {k: pad(v) for k, v in out.items()}
