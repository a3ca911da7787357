"""Single-turn rollouts: each prompt gets `group_size` sampled completions, no environment."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from rlrag_jax.tasks import Episode


def decode_keeping_tags(tokenizer, ids: Sequence[int]) -> str:
  """A completion's text with the tokenizer's added tags kept (parsers read '<answer>' and the
  like) and its EOS text removed."""
  return tokenizer.decode(list(ids), skip_special_tokens=False).replace(
      tokenizer.eos_token or "\x00", "").strip()


def completion_ids(gen, row: int) -> list:
  """The generated tokens of one row (up to and including its stop/EOS token)."""
  n = int(np.asarray(gen.lengths)[row])
  return [int(t) for t in np.asarray(gen.tokens)[row, :n]]


def single_turn(policy, examples: Sequence, prompt_ids: Callable, decode: Callable, rng, *,
                group_size: int = 1, greedy: bool = False, shared_prefill: bool = True) -> list:
  """Returns list[Episode], group-major: example i's samples at [i*G, (i+1)*G).

  With `shared_prefill` (default) each prompt is prefilled once and its KV rows forked to its G
  samples; without, every sample prefills its own copy (the reference path).
  """
  unique = [prompt_ids(ex) for ex in examples]
  prompts = [ids for ids in unique for _ in range(group_size)]
  if shared_prefill and group_size > 1:
    gen = policy.sample(unique, rng, greedy=greedy, group_size=group_size)
  else:
    gen = policy.sample(prompts, rng, greedy=greedy)
  episodes = []
  for row, p in enumerate(prompts):
    ex = examples[row // group_size]
    comp = completion_ids(gen, row)
    episodes.append(Episode(example=ex, prompt_ids=p, completion_ids=comp,
                            loss_mask=[1] * len(comp), text=decode(comp),
                            info={"stopped_by": _stopped_by(gen, row)}))
  return episodes


def _stopped_by(gen, row: int) -> str:
  s = getattr(gen, "stopped_by", None)
  if s is None:
    return ""
  return str(np.asarray(s)[row]) if not isinstance(s, (list, tuple)) else str(s[row])
