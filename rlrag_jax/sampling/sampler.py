"""Jitted KV-cache sampling: one prefill, then a compiled decode loop that ends rows independently.

Layers, from low to high:

  * `sample_logits(logits, rng, ...)`: one draw per row from temperature / top-k / top-p logits,
    with the log-prob of the draw under the sampling distribution and under the raw model.
  * `prefill(config, params, ids, mask, cache)` and `decode(config, params, tokens, active, cache)`:
    jitted single calls over an explicit cache (the cache argument is donated).
  * `generate_with_params(config, params, prompt_ids, ...)`: the whole continuation of a batch in
    ONE compiled call (prefill + `lax.while_loop` decode), for callers that hold params apart from
    an `LM` (the RL trainer).
  * `generate(lm, prompt_ids, ...)`: the same for an `LM`, with its tokenizer and EOS defaults.

Why `lax.while_loop` and not `lax.scan`: on CPU both lower to the same XLA While with the same
per-iteration cost (the body is the decode step; the loop overhead is microseconds), but the while
loop exits as soon as every row has hit EOS / a stop / its own length limit, which saves whole
decode steps whenever rows finish early. `bench/sampling.py --loop scan` measures the fixed-trip
variant for comparison.

Inside the loop the decode step is `fast_decode.decode_step` (the same math as `DecoderLM` with
q/k/v and gate/up packed into single matmuls and a transpose-free attention over the cache);
`packed_decode=False` uses `DecoderLM.apply` instead.

Conventions. Prompts are left-padded to a bucketed length (see `bucket_length`) so that similar
batches share one compiled program; every row writes into the same cache slot each step and
`cache['mask']` marks its real tokens. Rows that are done keep computing (their outputs are
masked; see `_sample_loop` for what they cost); their new slots are masked out of the cache.
The decode step's attention reads the cache only up to its filled length
(`sampling.cache_attention`). Randomness: step `i` uses
`jax.random.fold_in(rng, i)`, so the output is a function of the key (and the batch). With
`temperature == 0` decoding is greedy and `logprobs` are 0 (the sampling distribution is a point
mass); `model_logprobs` are always the unmodified model's log-probs (temperature 1, no truncation).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from rlrag_jax.models.config import ModelConfig
from rlrag_jax.models.decoder import DecoderLM, init_cache
from rlrag_jax.sampling import fast_decode
from rlrag_jax.sampling import stop as stop_lib

STOP_NONE, STOP_EOS, STOP_STOP, STOP_LENGTH = 0, 1, 2, 3
_REASONS = {STOP_NONE: "none", STOP_EOS: "eos", STOP_STOP: "stop", STOP_LENGTH: "length"}
_BLOCK = 128          # block width of the two-level inverse-CDF draw over the vocab
_NUCLEUS_ITERS = 32   # bisection steps of the full-vocab top-p threshold (f32 converges by then)
_NUCLEUS_CANDIDATES = 256   # largest logits the full-vocab top-p threshold is first sought in


# --------------------------------------------------------------------------- results
@dataclasses.dataclass
class Generation:
  """One sampled continuation per row (host numpy arrays; N = max_new_tokens).

  tokens [B, N] int32: generated ids, `pad_id` after each row's end.
  logprobs [B, N] f32: log-prob of each token under the sampling distribution (0 when greedy).
  model_logprobs [B, N] f32: log-prob under the unmodified model (temperature 1, no truncation).
  lengths [B] int32: tokens generated, including the EOS / stop tokens.
  mask [B, N] int32: 1 on generated tokens up to and including the stop, else 0.
  stopped_by: per row 'eos', 'stop' or 'length'.
  """
  tokens: np.ndarray
  logprobs: np.ndarray
  model_logprobs: np.ndarray
  lengths: np.ndarray
  mask: np.ndarray
  stopped_by: list

  def token_lists(self) -> list:
    """The generated ids of each row, without padding."""
    return [self.tokens[i, :n].tolist() for i, n in enumerate(self.lengths)]

  def texts(self, tokenizer, skip_special_tokens: bool = False) -> list:
    return [tokenizer.decode(t, skip_special_tokens=skip_special_tokens)
            for t in self.token_lists()]


class SamplingMode(NamedTuple):
  """The static (compile-time) part of the sampling settings."""
  greedy: bool = True
  top_k: int = 0            # 0: no top-k
  use_top_p: bool = False   # top_p < 1


def sampling_mode(temperature: float, top_k: int, top_p: float, vocab_size: int) -> SamplingMode:
  """Validates the settings and splits off their static part."""
  if not (temperature >= 0 and math.isfinite(temperature)):
    raise ValueError(f"temperature must be a finite number >= 0; got {temperature}")
  if int(top_k) != top_k or top_k < 0:
    raise ValueError(f"top_k must be an integer >= 0 (0 disables it); got {top_k}")
  if not 0 < top_p <= 1:
    raise ValueError(f"top_p must be in (0, 1] (1 disables it); got {top_p}")
  if temperature == 0:
    return SamplingMode(True, 0, False)
  k = int(top_k)
  return SamplingMode(False, 0 if k >= vocab_size else k, top_p < 1)


# --------------------------------------------------------------------------- one draw per row
def _first_argmax(x):
  """x [B, V] -> index of the first maximum [B] (cheaper on XLA CPU than a variadic argmax)."""
  m = jnp.max(x, axis=-1, keepdims=True)
  iota = jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
  idx = jnp.min(jnp.where(x == m, iota, x.shape[-1]), axis=-1)
  return jnp.minimum(idx, x.shape[-1] - 1)


def _pick(w, target):
  """w [B, n] >= 0, target [B] in [0, sum w) -> (index [B] with w > 0, residual [B])."""
  c = jnp.cumsum(w, axis=-1)
  idx = jnp.sum((c <= target[:, None]).astype(jnp.int32), axis=-1)
  iota = jax.lax.broadcasted_iota(jnp.int32, w.shape, 1)
  last_nonzero = jnp.max(jnp.where(w > 0, iota, 0), axis=-1)
  idx = jnp.minimum(idx, last_nonzero)            # float round-off past the end
  prev = jnp.where(idx > 0, jnp.take_along_axis(c, jnp.maximum(idx - 1, 0)[:, None], -1)[:, 0], 0)
  return idx, target - prev


def _draw(e, u):
  """Inverse-CDF draw: e [B, V] unnormalised weights >= 0, u [B] uniform [0, 1) -> index [B].

  Two levels (blocks of `_BLOCK`, then inside the chosen block) so that the pass over the vocab is
  a plain reduction, not a long cumulative sum.
  """
  b, v = e.shape
  target = u * jnp.sum(e, axis=-1)
  if v <= 2 * _BLOCK:
    return _pick(e, target)[0]
  nb = -(-v // _BLOCK)
  if nb * _BLOCK != v:
    e = jnp.pad(e, ((0, 0), (0, nb * _BLOCK - v)))
  eb = e.reshape(b, nb, _BLOCK)
  j, rest = _pick(jnp.sum(eb, axis=-1), target)                 # block [B]
  inner = jnp.take_along_axis(eb, j[:, None, None], axis=1)[:, 0]  # [B, BLOCK]
  i, _ = _pick(inner, rest)
  return j * _BLOCK + i


def _nucleus_sorted(vals, top_p):
  """vals [B, k] sorted descending -> vals with tokens outside the top-p nucleus set to -inf."""
  p = jax.nn.softmax(vals, axis=-1)
  before = jnp.cumsum(p, axis=-1) - p          # mass strictly ahead of each token
  return jnp.where(before < top_p, vals, -jnp.inf)


def _nucleus_candidates(z, target, m):
  """The top-p threshold from the `_NUCLEUS_CANDIDATES` largest logits (one `lax.top_k` pass over
  the vocab). z [B, V], target [B, 1] (top_p x the mass), m [B, 1] = max z -> (thr [B, 1],
  found [B] bool: thr is exact; where False the nucleus reaches past the candidates).

  Exactness: let c_1 >= ... >= c_K be the K largest logits. For c_j > c_K every token with
  z >= c_j is a candidate (one outside has z <= c_K), so the candidates' mass at or above c_j
  is mass(z >= c_j) itself. The threshold thr = max{t in z : mass(z >= t) >= target} is then
  the largest such c_j whose mass reaches the target; if none does, thr <= c_K and the tokens
  tied with c_K outside the candidates leave it unknown (found False).
  """
  v = z.shape[-1]
  k = min(_NUCLEUS_CANDIDATES, v)
  vals, _ = jax.lax.top_k(z, k)                                            # [B, k] descending
  ev = jnp.exp(vals - m)
  ahead = vals[:, None, :] >= vals[:, :, None]                             # [B, j, i]
  mass = jnp.sum(jnp.where(ahead, ev[:, None, :], 0.0), axis=-1)           # mass(z >= c_j)
  # the smallest as a min, not vals[:, -1:]: XLA:CPU turns a slice of top_k into a full sort
  known = (vals > jnp.min(vals, axis=-1, keepdims=True)) | (k == v)
  ok = known & (mass >= target)
  thr = jnp.max(jnp.where(ok, vals, -jnp.inf), axis=-1, keepdims=True)
  return thr, jnp.any(ok, axis=-1)


def _nucleus_bisect(z, e, target):
  """The threshold by bisection over the logit range, snapped to the nearest logit at or above
  it: `_NUCLEUS_ITERS` masked passes over the vocab (float32 has converged by then: the
  interval, under 101 wide, ends below 3e-8, under half an ulp of any logit beyond 0.5 in
  magnitude; the snap makes it exact where distinct logits differ by more)."""
  m = jnp.max(z, axis=-1, keepdims=True)
  lo = jnp.maximum(jnp.min(z, axis=-1, keepdims=True), m - 100.0)   # mass(z >= lo) >= target
  hi = m + 1.0                                                      # mass(z >= hi) = 0

  def body(_, c):
    lo, hi = c
    mid = 0.5 * (lo + hi)
    mass = jnp.sum(jnp.where(z >= mid, e, 0.0), axis=-1, keepdims=True)
    ok = mass >= target
    return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

  lo, _ = jax.lax.fori_loop(0, _NUCLEUS_ITERS, body, (lo, hi))
  return jnp.min(jnp.where(z >= lo, z, jnp.inf), axis=-1, keepdims=True)


def _nucleus_mask(z, e, top_p):
  """Full-vocab top-p without a sort. z [B, V] logits, e = exp(z - max z) -> keep [B, V] bool.

  Keeps the smallest set of most likely tokens whose mass reaches top_p, every token tied with
  the last one included: z >= thr, thr = max{t in z : mass(z >= t) >= top_p x mass} (the
  sort-based rule "drop a token when the mass ahead of it is >= top_p", ties kept together).
  The threshold comes from the largest `_NUCLEUS_CANDIDATES` logits (`_nucleus_candidates`: one
  top_k pass, exact whenever the nucleus lies within them); only when some row's nucleus is
  larger (a flat distribution) does the batch fall back to the bisection (32 masked passes
  over the vocab, `_nucleus_bisect`), chosen by `lax.cond`, so a step pays it only then.
  """
  target = top_p * jnp.sum(e, axis=-1, keepdims=True)          # [B, 1]
  m = jnp.max(z, axis=-1, keepdims=True)
  thr, found = _nucleus_candidates(z, target, m)
  thr = jax.lax.cond(jnp.all(found), lambda: thr,
                     lambda: jnp.where(found[:, None], thr, _nucleus_bisect(z, e, target)))
  return z >= thr


def sample_logits(logits, rng, temperature=1.0, top_p=1.0, *, mode: SamplingMode):
  """One draw per row. logits [B, V] -> (tokens [B] int32, logprobs [B], model_logprobs [B]).

  `mode` is static (see `sampling_mode`); `temperature` and `top_p` may be traced scalars.
  Order of the transforms as in `transformers`: temperature, then top-k, then top-p.
  """
  logits = logits.astype(jnp.float32)
  b = logits.shape[0]
  m0 = jnp.max(logits, axis=-1)
  lse = m0 + jnp.log(jnp.sum(jnp.exp(logits - m0[:, None]), axis=-1))   # [B]
  if mode.greedy:
    tok = _first_argmax(logits)
    lp = jnp.zeros((b,), jnp.float32)
  else:
    u = jax.random.uniform(rng, (b,), jnp.float32)
    z = logits / jnp.asarray(temperature, jnp.float32)
    if mode.top_k:
      vals, idx = jax.lax.top_k(z, mode.top_k)                   # [B, k] descending
      if mode.use_top_p:
        vals = _nucleus_sorted(vals, top_p)
      # the largest as a max, not vals[:, :1]: XLA:CPU turns a slice of top_k into a full sort
      # of the vocab (5.8 s a draw at 64 x 151,936, against 0.05 s)
      top = jnp.max(vals, axis=-1, keepdims=True)
      e = jnp.exp(vals - top)
      j = _draw(e, u)
      tok = jnp.take_along_axis(idx, j[:, None], -1)[:, 0]
      lp = (jnp.take_along_axis(vals, j[:, None], -1)[:, 0] - top[:, 0]
            - jnp.log(jnp.sum(e, axis=-1)))
    else:
      m = jnp.max(z, axis=-1, keepdims=True)
      e = jnp.exp(z - m)
      if mode.use_top_p:
        e = jnp.where(_nucleus_mask(z, e, top_p), e, 0.0)
      tok = _draw(e, u)
      lp = (jnp.take_along_axis(z, tok[:, None], -1)[:, 0] - m[:, 0]
            - jnp.log(jnp.sum(e, axis=-1)))
  tok = tok.astype(jnp.int32)
  model_lp = jnp.take_along_axis(logits, tok[:, None], -1)[:, 0] - lse
  return tok, lp, model_lp


# --------------------------------------------------------------------------- model calls
def _last_logits(module: DecoderLM, ids, mask, cache, empty_cache: bool = False):
  """Like DecoderLM.__call__ but projects only the last position onto the vocab."""
  h, cache = module.model(ids, mask, None, cache, empty_cache)
  h = h[:, -1:]
  logits = module.model.attend(h) if module.config.tie_word_embeddings else module.lm_head(h)
  return logits[:, 0].astype(jnp.float32), cache


def _prefill_impl(config, params, ids, mask, cache, empty_cache: bool = False):
  """empty_cache (static): `cache` is fresh from `init_cache` (with `model.attention='pallas'`
  the prefill's attention is then the flash kernel over the prompt alone)."""
  return DecoderLM(config).apply({"params": params}, ids, mask, cache, empty_cache,
                                 method=_last_logits)


def _decode_impl(config, params, tokens, active, cache):
  return DecoderLM(config).apply({"params": params}, tokens[:, None], active[:, None], cache,
                                 method=_last_logits)


@functools.partial(jax.jit, static_argnums=0, static_argnames="empty_cache", donate_argnums=4)
def prefill(config: ModelConfig, params, ids, mask, cache, *, empty_cache: bool = False):
  """ids/mask [B, T] (left padded) written at cache['index'] -> (last logits [B, V] f32, cache).
  empty_cache=True promises a fresh `init_cache` (index 0): with `model.attention='pallas'`
  the attention is then the flash kernel over the prompt (results are wrong if it is not)."""
  return _prefill_impl(config, params, ids, mask.astype(jnp.bool_), cache, empty_cache)


@functools.partial(jax.jit, static_argnums=0, donate_argnums=4)
def decode(config: ModelConfig, params, tokens, active, cache):
  """One token per row. tokens [B], active [B] bool (False: the slot is masked out of the cache)
  -> (logits [B, V] f32 for the next token, cache)."""
  return _decode_impl(config, params, tokens.astype(jnp.int32), active.astype(jnp.bool_), cache)


# --------------------------------------------------------------------------- the fused loop
class _LoopInputs(NamedTuple):
  """The traced constants of one sampling loop (see `_sample_loop`)."""
  rng: jax.Array
  row_max: jax.Array        # [B] int32, per-row token limits
  temperature: jax.Array
  top_p: jax.Array
  eos_ids: jax.Array        # [n_eos] int32, -1 padded
  stop_table: jax.Array     # [n_stops, width] int32 (stop_lib.stop_table)
  stop_valid: jax.Array
  pad_id: jax.Array


def _decode_fn(config: ModelConfig, params, packed_decode: bool):
  """(tokens [B], active [B], cache) -> (logits [B, V], cache): the loop's decode step. Inactive
  rows are finished (their logits unused), so the packed step skips their cache read where its
  attention can ('pallas'; `fast_decode.decode_step`'s skip_inactive)."""
  if packed_decode:
    packed = fast_decode.pack_params(config, params)
    return lambda tok, active, cache: fast_decode.decode_step(config, packed, tok, active, cache,
                                                              skip_inactive=True)
  return lambda tok, active, cache: _decode_impl(config, params, tok, active, cache)


def _initial_state(b: int, n: int, width: int, row_max, pad_id) -> dict:
  """The loop's per-row record: outputs [B, N], done / count / reason [B], stop window."""
  return {
      "tokens": jnp.full((b, n), pad_id, jnp.int32),
      "logprobs": jnp.zeros((b, n), jnp.float32),
      "model_logprobs": jnp.zeros((b, n), jnp.float32),
      "mask": jnp.zeros((b, n), jnp.bool_),
      "done": row_max <= 0,
      "count": jnp.zeros((b,), jnp.int32),
      "reason": jnp.where(row_max <= 0, STOP_LENGTH, STOP_NONE).astype(jnp.int32),
      "window": jnp.full((b, width), -1, jnp.int32),
  }


def _end_reason(tok, st, inp: _LoopInputs, count, width: int):
  """Why each row ends at this token (STOP_*; STOP_NONE: it goes on) and the new stop window."""
  window = st["window"]
  hit_eos = jnp.any(tok[:, None] == inp.eos_ids[None], axis=-1) if inp.eos_ids.shape[0] else False
  if width:
    window = jnp.concatenate([window[:, 1:], tok[:, None]], axis=1)
    hit_stop = stop_lib.ends_with_stop(window, inp.stop_table, inp.stop_valid)
  else:
    hit_stop = False
  reason = jnp.where(hit_eos, STOP_EOS,
                     jnp.where(hit_stop, STOP_STOP,
                               jnp.where(count >= inp.row_max, STOP_LENGTH, STOP_NONE)))
  return reason, window


def _sample_and_record(i, logits, st, inp: _LoopInputs, mode: SamplingMode):
  """Step i: draws a token per row from `logits`, records it for rows not done, ends rows."""
  tok, lp, mlp = sample_logits(logits, jax.random.fold_in(inp.rng, i), inp.temperature,
                               inp.top_p, mode=mode)
  active = ~st["done"]
  tok = jnp.where(active, tok, inp.pad_id)
  count = st["count"] + active.astype(jnp.int32)
  reason, window = _end_reason(tok, st, inp, count, st["window"].shape[1])
  reason = jnp.where(active, reason, st["reason"]).astype(jnp.int32)
  col = lambda buf, x: jax.lax.dynamic_update_slice(buf, x[:, None].astype(buf.dtype), (0, i))
  return dict(st, window=window, reason=reason, count=count,
              done=st["done"] | (active & (reason != STOP_NONE)),
              tokens=col(st["tokens"], tok),
              logprobs=col(st["logprobs"], jnp.where(active, lp, 0.0)),
              model_logprobs=col(st["model_logprobs"], jnp.where(active, mlp, 0.0)),
              mask=col(st["mask"], active))


def _sample_loop(params, logits, cache, rng, row_max, temperature, top_p, eos_ids, stop_table,
                 stop_valid, pad_id, *, config: ModelConfig, mode: SamplingMode, max_new: int,
                 early_exit: bool, packed_decode: bool):
  """From the logits after a prefill: sample and decode up to `max_new` tokens per row.

  Returns (outputs, cache). A row's final token (the one that ended it) is never written into the
  cache, so afterwards the cache holds every token of each row except its last: a later call
  that continues the row (`extend_generate`) feeds that token first.

  Finished rows stay in the batch (static shapes, one program) and run every step to the end:
  their share of the matmuls (small: the step streams the weights once for all rows) and, with
  'xla' decode attention, their cache read ('pallas' skips it); their outputs are masked.
  """
  inp = _LoopInputs(rng, row_max, temperature, top_p, eos_ids, stop_table, stop_valid, pad_id)
  n = max_new
  decode_fn = _decode_fn(config, params, packed_decode)
  st = _initial_state(logits.shape[0], n, stop_table.shape[1], row_max, pad_id)

  def decode_next(i, st, logits, cache):
    tok = jax.lax.dynamic_slice_in_dim(st["tokens"], i, 1, axis=1)[:, 0]
    active = jax.lax.dynamic_slice_in_dim(st["mask"], i, 1, axis=1)[:, 0] & ~st["done"]
    return decode_fn(tok, active, cache)

  # One traced copy of the sampling code: each iteration samples from the carried logits, then
  # runs the decode step for the next token (skipped, via lax.cond, after the last one).
  def body(carry):
    i, logits, cache, st = carry
    st = _sample_and_record(i, logits, st, inp, mode)
    go_on = (i + 1 < n) & ~jnp.all(st["done"])
    logits, cache = jax.lax.cond(go_on, lambda: decode_next(i, st, logits, cache),
                                 lambda: (logits, cache))
    return i + 1, logits, cache, st

  def body_fixed(i, carry):   # every step, no early exit (and one unused last decode)
    _, logits, cache, st = carry
    st = _sample_and_record(i, logits, st, inp, mode)
    logits, cache = decode_next(i, st, logits, cache)
    return i + 1, logits, cache, st

  carry = (jnp.int32(0), logits, cache, st)
  if early_exit:
    cond = lambda c: (c[0] < n) & ~jnp.all(c[3]["done"])
    _, _, cache, st = jax.lax.while_loop(cond, body, carry)
  else:
    _, _, cache, st = jax.lax.fori_loop(0, n, body_fixed, carry)
  return ({k: st[k] for k in ("tokens", "logprobs", "model_logprobs", "mask", "count", "reason")},
          cache)


_LOOP_STATICS = ("config", "mode", "max_new", "early_exit", "packed_decode")


@functools.partial(jax.jit, static_argnames=_LOOP_STATICS + ("group", "keep_cache"))
def _generate_jit(params, ids, mask, rng, row_max, temperature, top_p, eos_ids, stop_table,
                  stop_valid, pad_id, *, config: ModelConfig, mode: SamplingMode, max_new: int,
                  early_exit: bool = True, packed_decode: bool = True, group: int = 1,
                  keep_cache: bool = False):
  unique, p = ids.shape
  cache = init_cache(config, unique, p + max_new)
  logits, cache = _prefill_impl(config, params, ids, mask, cache, empty_cache=True)
  if group > 1:      # one prefill per distinct prompt; its rows forked to the group's samples
    fork = lambda x: jnp.repeat(x, group, axis=0) if x.ndim else x
    cache = jax.tree_util.tree_map(fork, cache)
    logits = fork(logits)
  out, cache = _sample_loop(params, logits, cache, rng, row_max, temperature, top_p, eos_ids,
                            stop_table, stop_valid, pad_id, config=config, mode=mode,
                            max_new=max_new, early_exit=early_exit, packed_decode=packed_decode)
  return (out, cache) if keep_cache else out


def relayout_cache(cache, rows, length: int):
  """Cache rows `rows` [B'] (repeats fork a row) with each row's real slots packed, in order, to
  end at slot `used` = the most real slots of any selected row (shorter rows left-padded), in a
  cache of `length` slots whose write index is `used`. Nothing is recomputed: a slot's K/V carry
  RoPE positions counted over real tokens only, so moving slots leaves them valid."""
  mask = cache["mask"][rows]                                    # [B', S]
  s = mask.shape[1]
  real = jnp.sum(mask.astype(jnp.int32), axis=1)                # [B']
  used = jnp.max(real)
  order = jnp.argsort(~mask, axis=1, stable=True)               # real slots first, in order
  src = jnp.arange(length)[None, :] - (used - real)[:, None]    # [B', length]
  valid = (src >= 0) & (src < real[:, None])
  idx = jnp.take_along_axis(order, jnp.clip(src, 0, s - 1), axis=1)

  def move(x):                                                  # [B, S, K, D]
    x = x[rows]
    return jnp.take_along_axis(x, idx[:, :, None, None], axis=1)
  layers = tuple({k: move(v) for k, v in layer.items()} for layer in cache["layers"])
  return {"layers": layers, "mask": valid, "index": used.astype(jnp.int32)}


@functools.partial(jax.jit, static_argnames=_LOOP_STATICS + ("length",))
def _extend_jit(params, cache, rows, ids, mask, rng, row_max, temperature, top_p, eos_ids,
                stop_table, stop_valid, pad_id, *, config: ModelConfig, mode: SamplingMode,
                max_new: int, length: int, early_exit: bool = True, packed_decode: bool = True):
  cache = relayout_cache(cache, rows, length)
  logits, cache = _prefill_impl(config, params, ids, mask, cache)
  return _sample_loop(params, logits, cache, rng, row_max, temperature, top_p, eos_ids,
                      stop_table, stop_valid, pad_id, config=config, mode=mode, max_new=max_new,
                      early_exit=early_exit, packed_decode=packed_decode)


# --------------------------------------------------------------------------- host-side helpers
def bucket_length(n: int, minimum: int = 16) -> int:
  """Rounds a length up to a multiple of max(minimum, 2**(floor(log2 n) - 3)): at most 12.5%
  padding past 128 and 8 buckets per octave, so varying prompt lengths compile few programs."""
  n = max(int(n), 1)
  if n <= minimum:
    return minimum
  step = max(minimum, 1 << max(0, n.bit_length() - 4))
  return -(-n // step) * step


def pow2_bucket(n: int, minimum: int = 1) -> int:
  """The smallest power of two >= n, and >= minimum (batch and chunk buckets)."""
  return max(int(minimum), 1 << max(0, int(n) - 1).bit_length())


def left_pad(prompt_ids, pad_id: int = 0, prompt_lengths=None, length: Optional[int] = None):
  """Prompts -> (ids [B, P] int32, mask [B, P] bool) left-padded to P (default: bucketed max).

  `prompt_ids` is a list of token-id lists / 1-D arrays, or a 2-D array [B, T]; with
  `prompt_lengths` [B], row i of a 2-D array holds its prompt in its first lengths[i] columns
  (right padding, the layout of concatenated contexts).
  """
  if isinstance(prompt_ids, (np.ndarray, jax.Array)) and np.ndim(prompt_ids) == 2:
    arr = np.asarray(prompt_ids)
    lens = (np.full(arr.shape[0], arr.shape[1]) if prompt_lengths is None
            else np.asarray(prompt_lengths).reshape(-1))
    if lens.shape[0] != arr.shape[0]:
      raise ValueError(f"prompt_lengths has {lens.shape[0]} entries for {arr.shape[0]} prompts")
    if np.any(lens > arr.shape[1]):
      raise ValueError(f"prompt_lengths {lens.tolist()} exceed the prompt array width "
                       f"{arr.shape[1]}")
    rows = [arr[i, :int(l)] for i, l in enumerate(lens)]
  else:
    if prompt_lengths is not None:
      raise ValueError("prompt_lengths is only meaningful with a 2-D prompt array")
    if isinstance(prompt_ids, (str, bytes)) or not hasattr(prompt_ids, "__len__"):
      raise TypeError(f"prompt_ids must be a list of token-id lists or a 2-D array; got "
                      f"{type(prompt_ids).__name__}")
    rows = [np.asarray(r).reshape(-1) for r in prompt_ids]
  if not rows:
    raise ValueError("prompt_ids is empty: need at least one prompt")
  for i, r in enumerate(rows):
    if r.size == 0:
      raise ValueError(f"prompt {i} is empty: every row needs at least one token")
    if not np.issubdtype(r.dtype, np.integer):
      raise TypeError(f"prompt {i} holds {r.dtype} values; expected integer token ids")
  longest = max(r.size for r in rows)
  p = bucket_length(longest) if length is None else int(length)
  if p < longest:
    raise ValueError(f"pad length {p} is shorter than the longest prompt ({longest})")
  ids = np.full((len(rows), p), pad_id, np.int32)
  mask = np.zeros((len(rows), p), np.bool_)
  for i, r in enumerate(rows):
    ids[i, p - r.size:] = r
    mask[i, p - r.size:] = True
  return ids, mask


def _as_key(rng):
  if isinstance(rng, (int, np.integer)):
    return jax.random.PRNGKey(int(rng))
  if rng is None:
    raise ValueError("rng is required: pass a jax.random.PRNGKey (or an int seed)")
  return rng


def _eos_array(eos_ids) -> np.ndarray:
  if eos_ids is None:
    eos_ids = ()
  if isinstance(eos_ids, (int, np.integer)):
    eos_ids = (int(eos_ids),)
  eos = sorted({int(e) for e in eos_ids})
  # Padded to a multiple of 4 with -1 (never a token) to share compiled programs.
  n = -(-len(eos) // 4) * 4
  return np.asarray(eos + [-1] * (n - len(eos)), np.int32)


def default_eos_ids(config: ModelConfig, tokenizer=None) -> tuple:
  """config.eos_token_id, else the tokenizer's eos_token_id, else ()."""
  if config.eos_token_id:
    return tuple(config.eos_token_id)
  eos = getattr(tokenizer, "eos_token_id", None)
  return () if eos is None else (int(eos),)


def generate_with_params(config: ModelConfig, params, prompt_ids, *, max_new_tokens: int,
                         temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                         stop=(), rng=None, eos_ids=None, max_new_tokens_per_row=None,
                         pad_id: int = 0, tokenizer=None, prompt_lengths=None,
                         batch_multiple: int = 1, early_exit: bool = True,
                         packed_decode: bool = True,
                         prompt_length: Optional[int] = None, group_size: int = 1,
                         keep_cache: bool = False):
  """Samples one continuation per prompt for a (config, params) pair; see `generate`.

  Extra options: `tokenizer` encodes string stops and supplies the EOS default when `eos_ids` is
  None; `prompt_lengths` goes with a 2-D prompt array (see `left_pad`); `batch_multiple` pads the
  batch with dummy rows to a multiple (fewer compiled programs when the batch size varies, as in
  the multi-turn loop); `early_exit=False` runs all max_new_tokens steps (benchmarking);
  `prompt_length` left-pads the prompts to that width instead of the bucketed longest (callers
  with a coarser bucket of their own, such as the multi-turn loop, compile fewer programs);
  `group_size=G` samples G continuations of each prompt from ONE prefill of it (its KV rows
  forked), rows prompt-major: prompt i's samples at [i*G, (i+1)*G); `keep_cache=True` returns
  (Generation, cache) with the KV cache of every row but its last token (see
  `sampling.CachedContexts`, which continues rows from it).
  """
  if int(group_size) != group_size or group_size < 1:
    raise ValueError(f"group_size must be a positive integer; got {group_size}")
  group_size = int(group_size)
  if int(max_new_tokens) != max_new_tokens or max_new_tokens < 1:
    raise ValueError(f"max_new_tokens must be a positive integer; got {max_new_tokens}")
  max_new_tokens = int(max_new_tokens)
  mode = sampling_mode(temperature, top_k, top_p, config.vocab_size)
  ids, mask = left_pad(prompt_ids, pad_id, prompt_lengths, prompt_length)
  unique = ids.shape[0]
  b = unique * group_size
  row_max = np.full((b,), max_new_tokens, np.int32)
  if max_new_tokens_per_row is not None:
    per_row = np.asarray(max_new_tokens_per_row).reshape(-1)
    if per_row.shape[0] != b:
      raise ValueError(f"max_new_tokens_per_row has {per_row.shape[0]} entries for {b} prompts")
    if np.any(per_row < 0):
      raise ValueError(f"max_new_tokens_per_row must be >= 0; got {per_row.tolist()}")
    row_max = np.minimum(row_max, per_row.astype(np.int32))
  if batch_multiple > 1 and unique % batch_multiple:
    extra = batch_multiple - unique % batch_multiple      # dummy prompts (their G rows unused)
    ids = np.concatenate([ids, np.full((extra, ids.shape[1]), pad_id, np.int32)])
    dummy_mask = np.zeros((extra, ids.shape[1]), np.bool_)
    dummy_mask[:, -1] = True
    mask = np.concatenate([mask, dummy_mask])
    row_max = np.concatenate([row_max, np.zeros((extra * group_size,), np.int32)])
  eos = _eos_array(default_eos_ids(config, tokenizer) if eos_ids is None else eos_ids)
  table, valid = stop_lib.stop_table(stop_lib.normalize_stops(stop, tokenizer))
  out = _generate_jit(params, ids, mask, _as_key(rng), row_max,
                      np.float32(temperature if temperature > 0 else 1.0), np.float32(top_p),
                      eos, table, valid, np.int32(pad_id), config=config, mode=mode,
                      max_new=bucket_length(max_new_tokens), early_exit=early_exit,
                      packed_decode=packed_decode, group=group_size, keep_cache=keep_cache)
  if keep_cache:
    out, cache = out
    return to_generation(out, b, max_new_tokens), cache
  return to_generation(out, b, max_new_tokens)


def to_generation(out, rows: int, max_new_tokens: int) -> Generation:
  """The jitted loop's outputs (device) -> a host `Generation` of the first `rows` rows."""
  out = jax.device_get(out)
  b, n = rows, max_new_tokens
  return Generation(
      tokens=out["tokens"][:b, :n],
      logprobs=out["logprobs"][:b, :n],
      model_logprobs=out["model_logprobs"][:b, :n],
      lengths=out["count"][:b].astype(np.int32),
      mask=out["mask"][:b, :n].astype(np.int32),
      stopped_by=[_REASONS[int(r)] for r in out["reason"][:b]],
  )


def generate(lm, prompt_ids, *, max_new_tokens: int, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0, stop=(), rng=None, eos_ids=None, max_new_tokens_per_row=None,
             pad_id: int = 0, **kwargs) -> Generation:
  """Samples one continuation per prompt with an `LM` in one compiled call.

  Args:
    lm: an `rlrag_jax.models.LM` (config, params, tokenizer).
    prompt_ids: list of token-id lists (any lengths >= 1), or a 2-D array [B, T] (then optionally
      `prompt_lengths=` [B]: row i's prompt is its first lengths[i] ids).
    max_new_tokens: N, the width of the outputs and the default per-row limit.
    temperature: 0 for greedy decoding; top_k: 0 disables; top_p: 1 disables.
    stop: stop sequences: strings (encoded with lm.tokenizer; see `rlrag_jax.sampling.stop` for
      the alternatives matched) and/or token-id sequences. A row ends after the last token of any.
    rng: a `jax.random.PRNGKey` (or an int seed); same key, same output.
    eos_ids: token ids that end a row; None: config.eos_token_id, else the tokenizer's EOS.
    max_new_tokens_per_row: [B] per-row limits (capped at max_new_tokens).
    pad_id: fills the prompt padding and the outputs after each row's end.
    **kwargs: see `generate_with_params` (prompt_lengths, batch_multiple, early_exit).
  """
  return generate_with_params(
      lm.config, lm.params, prompt_ids, max_new_tokens=max_new_tokens, temperature=temperature,
      top_k=top_k, top_p=top_p, stop=stop, rng=rng, eos_ids=eos_ids,
      max_new_tokens_per_row=max_new_tokens_per_row, pad_id=pad_id,
      tokenizer=kwargs.pop("tokenizer", lm.tokenizer), **kwargs)
