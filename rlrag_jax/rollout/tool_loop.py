"""Tool-interleaved rollouts: generate until a stop sequence, let the environment answer, go on.

One call runs a whole batch of multi-turn episodes:

  turn t:  every row that is still active is sampled in ONE jitted generate call, up to its own
           token budget; its KV cache is kept from the previous turn, so only the observation
           just appended is prefilled (`kv_reuse`; or the whole context is re-prefilled);
           each row's turn ends at EOS, at a stop sequence (the tool call, e.g. '</search>') or at
           its length limit;
  then:    rows that ended at a stop sequence and still have tool calls left ask the environment;
           an observation is tokenized, truncated to `max_obs_tokens` (and to the room left under
           `max_total_len`), and appended with loss mask 0; `None` finishes the row.

Rows finish independently: a row that answered without a tool call, hit EOS, ran out of tool
calls or of length leaves the active set and is never sampled again, so it does not wait for
(nor pay for) the rows that keep searching. Only turn bookkeeping (decoding a turn's tokens,
asking the environment, tokenizing observations) is per-row Python, between generate calls.

The environment is either a callable `env(row, turn_text, completion_text)` or an object with
`batch(rows, turn_texts, completion_texts) -> list` (one call per turn, e.g. to embed every query
at once). It returns per row `None`, an observation string, or an `Observation` (text + a record
for the turn log, e.g. the query and the retrieved ids, + a tail that truncation must keep, e.g.
the closing tag of an <information> block).

Limits: `max_turns` is the number of tool calls (observations) a row may receive; a row that asks
for one more ends there ('max_turns'). `max_total_len` bounds prompt + completion tokens.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import jax
import numpy as np

from rlrag_jax.sampling import stop as stop_lib
from rlrag_jax.sampling.sampler import pow2_bucket

# Why a row finished.
FINISH_EOS = "eos"                  # the policy ended the episode
FINISH_NO_CALL = "no_tool_call"     # the environment returned None for a tool call
FINISH_MAX_TURNS = "max_turns"      # a tool call beyond `max_turns`
FINISH_LENGTH = "length"            # the per-turn or total length budget ran out


@dataclasses.dataclass
class Observation:
  """What the environment appends after a tool call."""
  text: str
  info: dict = dataclasses.field(default_factory=dict)   # recorded in the turn (query, ids, ...)
  tail: str = ""          # appended after `text`; kept whole when the observation is truncated


@dataclasses.dataclass
class Turn:
  """One generate call of one row, and what the environment added after it."""
  index: int
  generated: int          # policy tokens written in this turn
  stopped_by: str         # sampler's reason: 'eos' | 'stop' | 'length'
  text: str               # decoded policy tokens of this turn
  observation_tokens: int = 0
  truncated: bool = False             # the observation was cut (max_obs_tokens / max_total_len)
  info: dict = dataclasses.field(default_factory=dict)   # the environment's record

  @property
  def tool_call(self) -> bool:
    return self.observation_tokens > 0 or bool(self.info)


@dataclasses.dataclass
class ToolLoopResult:
  """Per row (same order as the prompts)."""
  completion_ids: list       # list[list[int]]: policy and observation tokens after the prompt
  loss_mask: list            # list[list[int]]: 1 on policy tokens, 0 on observation tokens
  turns: list                # list[list[Turn]]
  finish_reason: list        # list[str]: FINISH_*
  num_tool_calls: list       # list[int]: observations appended

  def texts(self, tokenizer, skip_special_tokens: bool = False) -> list:
    return tokenizer.batch_decode(self.completion_ids, skip_special_tokens=skip_special_tokens)


def _call_env(env, rows: list, turn_texts: list, completions: list) -> list:
  if hasattr(env, "batch"):
    out = list(env.batch(rows, turn_texts, completions))
    if len(out) != len(rows):
      raise ValueError(f"run_tool_loop: env.batch returned {len(out)} observations for "
                       f"{len(rows)} rows")
    return out
  return [env(r, t, c) for r, t, c in zip(rows, turn_texts, completions)]


def _as_observation(obs, row: int) -> Optional[Observation]:
  if obs is None or isinstance(obs, Observation):
    return obs
  if isinstance(obs, str):
    return Observation(obs)
  raise TypeError(f"run_tool_loop: the environment returned {type(obs).__name__} for row {row}; "
                  "expected None, a str or an Observation")


def truncate_observation(body: list, tail: list, limit: int) -> tuple:
  """(ids, cut): body + tail cut to `limit` tokens, the tail kept whole when it fits."""
  ids = list(body) + list(tail)
  if len(ids) <= limit:
    return ids, False
  keep_tail = list(tail) if len(tail) <= limit else []
  return list(body)[:limit - len(keep_tail)] + keep_tail, True


def _encode(tokenizer, texts: list) -> list:
  if not texts:
    return []
  return tokenizer(texts, add_special_tokens=False)["input_ids"]


def run_tool_loop(policy, prompts: Sequence[Sequence[int]], env, *, rng, tokenizer,
                  max_turns: int, max_obs_tokens: int, max_total_len: int,
                  stop: Sequence = (), greedy: bool = False,
                  max_new_tokens: Optional[int] = None, min_batch: int = 8,
                  context_bucket: int = 64, group_size: int = 1,
                  kv_reuse: bool = True) -> ToolLoopResult:
  """Runs tool-interleaved episodes for a batch of prompts.

  Args:
    policy: a `rollout.Policy` (anything with `.sample(prompt_ids, rng, greedy=, max_new_tokens=,
      stop=, max_new_tokens_per_row=, batch_multiple=)` returning a `sampling.Generation`).
    prompts: token ids per row.
    env: the tool environment (see the module docstring).
    rng: a jax PRNG key; turn t samples with `fold_in(rng, t)`.
    tokenizer: decodes turns for the environment and encodes observations.
    max_turns: tool calls (observations) per row; >= 0.
    max_obs_tokens: observation tokens kept per tool call (the `tail` included).
    max_total_len: prompt + completion tokens per row.
    stop: stop sequences that end a turn (strings, encoded with `tokenizer`, or token-id lists).
    greedy: greedy decoding instead of sampling.
    max_new_tokens: policy tokens per turn (default `policy.max_new_tokens`).
    min_batch: the active rows of a turn are padded to a power of two >= this, and
    context_bucket: their contexts are left-padded to a multiple of this; both keep the number of
      compiled generate programs small as the active set shrinks and the contexts grow.
    group_size: prompts come in runs of G identical rows (a GRPO group); the first turn prefills
      each distinct prompt once and forks its KV rows (with kv_reuse and a policy that has
      `contexts()`).
    kv_reuse: keep the KV cache between turns (`sampling.CachedContexts`): a turn prefills only
      the observation just appended, not the whole context. Needs a policy with `contexts()`;
      False (or a policy without it) re-prefills every context each turn.
  """
  if max_turns < 0 or max_obs_tokens < 0:
    raise ValueError(f"run_tool_loop: max_turns ({max_turns}) and max_obs_tokens "
                     f"({max_obs_tokens}) must be >= 0")
  prompts = [list(map(int, p)) for p in prompts]
  n = len(prompts)
  too_long = [i for i, p in enumerate(prompts) if len(p) >= max_total_len]
  if too_long:
    raise ValueError(f"run_tool_loop: prompt {too_long[0]} has {len(prompts[too_long[0]])} tokens, "
                     f"which leaves no room under max_total_len={max_total_len}")
  per_turn = int(max_new_tokens or policy.max_new_tokens)
  stops = stop_lib.normalize_stops(stop, tokenizer)
  comp = [[] for _ in range(n)]
  mask = [[] for _ in range(n)]
  turns = [[] for _ in range(n)]
  calls = [0] * n
  finish = [""] * n
  g = int(group_size)
  if g < 1 or n % g or any(prompts[i] != prompts[i - i % g] for i in range(n)):
    raise ValueError(f"run_tool_loop: group_size={group_size} needs the prompts in runs of "
                     f"{group_size} identical rows; got {n} prompts that are not")
  ctx = (policy.contexts(length_bucket=context_bucket)
         if kv_reuse and hasattr(policy, "contexts") else None)
  active = list(range(n))
  called = []                        # the rows of the previous turn, in its order
  obs_new = [[] for _ in range(n)]   # observation tokens appended since the row's last turn
  t = 0
  while active:
    contexts = [prompts[i] + comp[i] for i in active]
    room = np.minimum([max_total_len - len(c) for c in contexts], per_turn)
    width = -(-max(len(c) for c in contexts) // context_bucket) * context_bucket
    key = jax.random.fold_in(rng, t)
    kw = dict(greedy=greedy, max_new_tokens=per_turn, stop=stops, max_new_tokens_per_row=room)
    if ctx is None:
      gen = policy.sample(contexts, key, batch_multiple=pow2_bucket(len(active), min_batch),
                          prompt_length=width, **kw)
    elif t == 0:
      gen = ctx.start(prompts[::g], key, group_size=g, prompt_length=width,
                      batch_multiple=pow2_bucket(n // g, max(1, min_batch // g)), **kw)
    else:
      slot = {i: j for j, i in enumerate(called)}
      gen = ctx.extend([slot[i] for i in active], [obs_new[i] for i in active], key,
                       batch_multiple=pow2_bucket(len(active), min_batch), **kw)
    called = list(active)
    lengths = np.asarray(gen.lengths)
    toks = np.asarray(gen.tokens)
    new = [toks[j, :lengths[j]].tolist() for j in range(len(active))]
    turn_texts = tokenizer.batch_decode(new, skip_special_tokens=False)
    asking = []                         # (position in active, row) of tool calls
    for j, i in enumerate(active):
      comp[i] += new[j]
      mask[i] += [1] * len(new[j])
      reason = gen.stopped_by[j]
      turns[i].append(Turn(index=t, generated=len(new[j]), stopped_by=reason, text=turn_texts[j]))
      if reason == "stop":
        if calls[i] >= max_turns:
          finish[i] = FINISH_MAX_TURNS
        elif len(prompts[i]) + len(comp[i]) >= max_total_len:
          finish[i] = FINISH_LENGTH
        else:
          asking.append((j, i))
      else:
        finish[i] = FINISH_EOS if reason == "eos" else FINISH_LENGTH
    if asking:
      rows = [i for _, i in asking]
      completions = tokenizer.batch_decode([comp[i] for i in rows], skip_special_tokens=False)
      obs = [_as_observation(o, i)
             for o, i in zip(_call_env(env, rows, [turn_texts[j] for j, _ in asking],
                                       completions), rows)]
      bodies = _encode(tokenizer, [o.text for o in obs if o is not None])
      tails = _encode(tokenizer, [o.tail for o in obs if o is not None])
      k = 0
      for i, o in zip(rows, obs):
        if o is None:
          finish[i] = FINISH_NO_CALL
          continue
        body, tail = bodies[k], (tails[k] if o.tail else [])
        k += 1
        limit = min(max_obs_tokens, max_total_len - len(prompts[i]) - len(comp[i]))
        ids, cut = truncate_observation(body, tail, limit)
        comp[i] += ids
        mask[i] += [0] * len(ids)
        obs_new[i] = ids
        calls[i] += 1
        turn = turns[i][-1]
        turn.observation_tokens, turn.truncated, turn.info = len(ids), cut, dict(o.info)
        if len(prompts[i]) + len(comp[i]) >= max_total_len:
          finish[i] = FINISH_LENGTH
    active = [i for i in active if not finish[i]]
    t += 1
  return ToolLoopResult(comp, mask, turns, finish, calls)
