"""`Policy`: current params + sampling settings, the one handle rollouts use to generate."""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

from rlrag_jax.models.config import ModelConfig


@dataclasses.dataclass
class Policy:
  config: ModelConfig
  params: Any
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  max_new_tokens: int = 128
  stop: tuple = ()                      # token-id sequences that end a row (kept in the output)
  eos_ids: tuple = ()
  pad_id: int = 0
  # The most prompts one sampler call takes when a task samples many at once (tree nodes,
  # executor rounds, an auxiliary reader's requests): `sample_chunked`'s default chunk. The
  # trainer and the evaluation commands set it from config key 'eval.batch_size'.
  rows_per_call: int = 64

  def with_params(self, params) -> "Policy":
    return dataclasses.replace(self, params=params)

  def contexts(self, chunk_bucket: int = 16, length_bucket: int = 64):
    """A `sampling.CachedContexts` with these params and settings: rows continued across calls
    with their KV cache kept (multi-turn and tree rollouts)."""
    from rlrag_jax.sampling import CachedContexts
    return CachedContexts(self.config, self.params, temperature=self.temperature,
                          top_k=self.top_k, top_p=self.top_p, eos_ids=tuple(self.eos_ids),
                          pad_id=self.pad_id, chunk_bucket=chunk_bucket,
                          length_bucket=length_bucket)

  def sample(self, prompt_ids: Sequence[Sequence[int]], rng, *, greedy: bool = False,
             max_new_tokens: Optional[int] = None, stop: Optional[Sequence] = None,
             max_new_tokens_per_row=None, **sampler_kwargs):
    """Samples one continuation per prompt -> `sampling.Generation`.

    `sampler_kwargs` go to `generate_with_params` (e.g. `batch_multiple`, which the multi-turn
    loop uses so that shrinking batches share compiled programs).
    """
    from rlrag_jax.sampling import generate_with_params
    return generate_with_params(
        self.config, self.params, [list(p) for p in prompt_ids],
        max_new_tokens=int(max_new_tokens or self.max_new_tokens),
        temperature=0.0 if greedy else self.temperature,
        top_k=self.top_k, top_p=self.top_p,
        stop=tuple(self.stop if stop is None else stop), rng=rng,
        eos_ids=tuple(self.eos_ids), pad_id=self.pad_id,
        max_new_tokens_per_row=max_new_tokens_per_row, **sampler_kwargs)

  def sample_chunked(self, prompt_ids: Sequence[Sequence[int]], rng, *,
                     chunk: Optional[int] = None,
                     greedy: bool = True, max_new_tokens: Optional[int] = None,
                     max_new_tokens_per_row=None) -> tuple:
    """One continuation per prompt, `chunk` rows at a time, each call padded to coarse shape
    buckets (batch size and prompt length, `rollout.batch.geometric_round`) so that calls of
    varying size and length reuse a bounded set of compiled programs. Prompts must fit
    max_position_embeddings - max_new_tokens. `chunk` defaults to `rows_per_call`. Returns
    ([(completion ids, stopped_by)], rng after one split per chunk)."""
    import jax
    from rlrag_jax.rollout.batch import geometric_round
    from rlrag_jax.rollout.single_turn import completion_ids
    chunk = max(1, int(chunk or self.rows_per_call))
    n_new = int(max_new_tokens or self.max_new_tokens)
    room = int(self.config.max_position_embeddings) - n_new
    out = []
    for start in range(0, len(prompt_ids), chunk):
      part = [list(p) for p in prompt_ids[start:start + chunk]]
      rng, sub = jax.random.split(rng)
      per_row = (None if max_new_tokens_per_row is None
                 else list(max_new_tokens_per_row[start:start + chunk]))
      gen = self.sample(part, sub, greedy=greedy, max_new_tokens=n_new,
                        max_new_tokens_per_row=per_row,
                        batch_multiple=geometric_round(len(part), 8, per_octave=2),
                        prompt_length=min(room, geometric_round(max(map(len, part)), 64,
                                                                per_octave=2)))
      out += [(completion_ids(gen, r), gen.stopped_by[r]) for r in range(len(part))]
    return out, rng


def checkpoint_policy(lm, tokenizer, max_new_tokens: int, **sampling) -> Policy:
  """A `Policy` over a loaded checkpoint (an `LM`: `run_dirs.load_trained`): its params, its eos
  ids (else the tokenizer's) and the tokenizer's pad id; `sampling` sets temperature / top_k /
  top_p."""
  eos = tuple(lm.config.eos_token_id) or (
      (tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else ())
  return Policy(lm.config, lm.params, max_new_tokens=int(max_new_tokens), eos_ids=eos,
                pad_id=tokenizer.pad_token_id or 0, **sampling)
