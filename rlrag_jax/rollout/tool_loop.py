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
  prompts = [list(map(int, p)) for p in prompts]
  _check_loop_args(prompts, max_turns, max_obs_tokens, max_total_len, group_size)
  lim = _Limits(max_turns=max_turns, max_obs_tokens=max_obs_tokens, max_total_len=max_total_len,
                per_turn=int(max_new_tokens or policy.max_new_tokens),
                stops=stop_lib.normalize_stops(stop, tokenizer), greedy=greedy,
                min_batch=min_batch, context_bucket=context_bucket, group_size=int(group_size))
  rows = _Rows.start(prompts)
  ctx = (policy.contexts(length_bucket=context_bucket)
         if kv_reuse and hasattr(policy, "contexts") else None)
  active = list(range(len(prompts)))
  called = []                        # the rows of the previous turn, in its order
  t = 0
  while active:
    gen = _sample_turn(policy, ctx, rows, lim, active, called, t, jax.random.fold_in(rng, t))
    called = list(active)
    turn_texts, asking = _record_turn(tokenizer, rows, lim, active, gen, t)
    if asking:
      _serve_tool_calls(env, tokenizer, rows, lim, asking, turn_texts)
    active = [i for i in active if not rows.finish[i]]
    t += 1
  return ToolLoopResult(rows.comp, rows.mask, rows.turns, rows.finish, rows.calls)


@dataclasses.dataclass(frozen=True)
class _Limits:
  """`run_tool_loop`'s settings, resolved once."""
  max_turns: int
  max_obs_tokens: int
  max_total_len: int
  per_turn: int               # policy tokens per turn
  stops: list                 # stop sequences as token-id lists
  greedy: bool
  min_batch: int
  context_bucket: int
  group_size: int


@dataclasses.dataclass
class _Rows:
  """Per-row state of one tool loop (same order as the prompts)."""
  prompts: list
  comp: list                  # completion tokens so far (policy and observations)
  mask: list                  # their loss mask
  turns: list                 # list[Turn] per row
  calls: list                 # observations appended
  finish: list                # FINISH_* once the row is done, else ''
  obs_new: list               # observation tokens appended since the row's last turn

  @classmethod
  def start(cls, prompts: list) -> "_Rows":
    n = len(prompts)
    return cls(prompts, [[] for _ in range(n)], [[] for _ in range(n)], [[] for _ in range(n)],
               [0] * n, [""] * n, [[] for _ in range(n)])

  def length(self, i: int) -> int:
    """Prompt + completion tokens of row i."""
    return len(self.prompts[i]) + len(self.comp[i])


def _check_loop_args(prompts: list, max_turns: int, max_obs_tokens: int, max_total_len: int,
                     group_size: int) -> None:
  if max_turns < 0 or max_obs_tokens < 0:
    raise ValueError(f"run_tool_loop: max_turns ({max_turns}) and max_obs_tokens "
                     f"({max_obs_tokens}) must be >= 0")
  n = len(prompts)
  too_long = [i for i, p in enumerate(prompts) if len(p) >= max_total_len]
  if too_long:
    raise ValueError(f"run_tool_loop: prompt {too_long[0]} has {len(prompts[too_long[0]])} tokens, "
                     f"which leaves no room under max_total_len={max_total_len}")
  g = int(group_size)
  if g < 1 or n % g or any(prompts[i] != prompts[i - i % g] for i in range(n)):
    raise ValueError(f"run_tool_loop: group_size={group_size} needs the prompts in runs of "
                     f"{group_size} identical rows; got {n} prompts that are not")


def _sample_turn(policy, ctx, rows: _Rows, lim: _Limits, active: list, called: list, t: int,
                 key):
  """One generate call over the `active` rows (a `sampling.Generation`, rows in `active`'s
  order): re-prefilled contexts without a KV cache (`ctx` None); else turn 0 prefills each
  group's prompt once, later turns continue the previous turn's rows (`called`) with the
  observation each was given."""
  contexts = [rows.prompts[i] + rows.comp[i] for i in active]
  room = np.minimum([lim.max_total_len - len(c) for c in contexts], lim.per_turn)
  width = -(-max(len(c) for c in contexts) // lim.context_bucket) * lim.context_bucket
  kw = dict(greedy=lim.greedy, max_new_tokens=lim.per_turn, stop=lim.stops,
            max_new_tokens_per_row=room)
  g = lim.group_size
  if ctx is None:
    return policy.sample(contexts, key, batch_multiple=pow2_bucket(len(active), lim.min_batch),
                         prompt_length=width, **kw)
  if t == 0:
    return ctx.start(rows.prompts[::g], key, group_size=g, prompt_length=width,
                     batch_multiple=pow2_bucket(len(rows.prompts) // g,
                                                max(1, lim.min_batch // g)), **kw)
  slot = {i: j for j, i in enumerate(called)}
  return ctx.extend([slot[i] for i in active], [rows.obs_new[i] for i in active], key,
                    batch_multiple=pow2_bucket(len(active), lim.min_batch), **kw)


def _record_turn(tokenizer, rows: _Rows, lim: _Limits, active: list, gen, t: int) -> tuple:
  """Appends each active row's new tokens and its `Turn`, and finishes the rows that are done.
  Returns (the turn's decoded texts in `active`'s order, [(position in active, row)] of the
  rows that ask for a tool call)."""
  lengths = np.asarray(gen.lengths)
  toks = np.asarray(gen.tokens)
  new = [toks[j, :lengths[j]].tolist() for j in range(len(active))]
  turn_texts = tokenizer.batch_decode(new, skip_special_tokens=False)
  asking = []
  for j, i in enumerate(active):
    rows.comp[i] += new[j]
    rows.mask[i] += [1] * len(new[j])
    reason = gen.stopped_by[j]
    rows.turns[i].append(Turn(index=t, generated=len(new[j]), stopped_by=reason,
                              text=turn_texts[j]))
    finish = _turn_end(rows, lim, i, reason)
    if finish:
      rows.finish[i] = finish
    else:
      asking.append((j, i))
  return turn_texts, asking


def _turn_end(rows: _Rows, lim: _Limits, i: int, reason: str) -> str:
  """Why row i is done after a turn that ended by `reason` (FINISH_*), or '' when it asks for a
  tool call."""
  if reason != "stop":
    return FINISH_EOS if reason == "eos" else FINISH_LENGTH
  if rows.calls[i] >= lim.max_turns:
    return FINISH_MAX_TURNS
  if rows.length(i) >= lim.max_total_len:
    return FINISH_LENGTH
  return ""


def _serve_tool_calls(env, tokenizer, rows: _Rows, lim: _Limits, asking: list,
                      turn_texts: list) -> None:
  """Asks the environment for the tool calls of `asking` ([(position in the turn, row)]) in one
  call, and appends each observation (loss mask 0), truncated to max_obs_tokens and to the room
  under max_total_len; a None observation finishes its row."""
  called = [i for _, i in asking]
  completions = tokenizer.batch_decode([rows.comp[i] for i in called], skip_special_tokens=False)
  obs = [_as_observation(o, i)
         for o, i in zip(_call_env(env, called, [turn_texts[j] for j, _ in asking],
                                   completions), called)]
  bodies = _encode(tokenizer, [o.text for o in obs if o is not None])
  tails = _encode(tokenizer, [o.tail for o in obs if o is not None])
  k = 0
  for i, o in zip(called, obs):
    if o is None:
      rows.finish[i] = FINISH_NO_CALL
      continue
    body, tail = bodies[k], (tails[k] if o.tail else [])
    k += 1
    limit = min(lim.max_obs_tokens, lim.max_total_len - rows.length(i))
    ids, cut = truncate_observation(body, tail, limit)
    rows.comp[i] += ids
    rows.mask[i] += [0] * len(ids)
    rows.obs_new[i] = ids
    rows.calls[i] += 1
    turn = rows.turns[i][-1]
    turn.observation_tokens, turn.truncated, turn.info = len(ids), cut, dict(o.info)
    if rows.length(i) >= lim.max_total_len:
      rows.finish[i] = FINISH_LENGTH
