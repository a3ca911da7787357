"""`CachedContexts`: rows of growing contexts whose KV cache persists from one generate call to
the next, so that continuing a row prefills only its new tokens.

A multi-turn rollout (generate, append an observation, generate again) or a tree rollout (every
child continues its parent's context) re-prefills the whole context at each call when it goes
through `generate_with_params`. Here the cache of the last call is kept on device:

  gen = ctx.start(prompts, rng, group_size=G, ...)      # rows of the first call
  gen = ctx.extend(parents, chunks, rng, ...)           # row j continues row parents[j] of the
                                                        # previous call with chunks[j] appended
  ctx.prime(prompts)                                    # or: cache prompts, generate nothing

`parents` may skip rows (finished episodes) and repeat them (tree branches fork a prefix: the
rows are copied inside the jitted call, never recomputed). Rows always refer to the LAST call, so
a tree rollout makes one call per level over all the nodes it continues (a node reached by forced
tokens only keeps its parent's row and passes the forced tokens as its chunk next time).

Each call first re-lays the kept cache out for the chosen rows (real slots packed in order, to a
bucketed width), prefills the chunks (each row's last generated token, which a call never writes
into the cache, then the new tokens), and runs the same decode loop as `generate_with_params`.
Outputs equal those of re-prefilling the whole contexts up to float reordering.

Shapes, so that a rollout compiles few programs: a call's chunk width is a power of two
(>= `chunk_bucket`), its cache width a multiple of `length_bucket`, its batch the caller's
`batch_multiple`.

`prefill_tokens` counts the real tokens prefilled over the object's life (the figure that KV reuse
cuts); `prefill_slots` the padded slots the prefills computed.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from rlrag_jax.models.decoder import init_cache
from rlrag_jax.sampling import sampler as S
from rlrag_jax.sampling import stop as stop_lib


class CachedContexts:
  """Rows of contexts continued across generate calls over one (config, params) pair."""

  def __init__(self, config, params, *, temperature: float = 1.0, top_k: int = 0,
               top_p: float = 1.0, eos_ids=(), pad_id: int = 0, tokenizer=None,
               chunk_bucket: int = 16, length_bucket: int = 64, packed_decode: bool = True):
    self.config, self.params = config, params
    self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
    self.eos_ids = ((int(eos_ids),) if isinstance(eos_ids, (int, np.integer))
                    else tuple(int(e) for e in eos_ids or ()))
    self.eos = S._eos_array(self.eos_ids)
    self.pad_id, self.tokenizer = int(pad_id), tokenizer
    self.chunk_bucket, self.packed_decode = int(chunk_bucket), packed_decode
    self.length_bucket = int(length_bucket)
    self.cache = None
    self.rows = 0              # rows of the last call (its cache may hold padding rows too)
    self.cached = None         # [rows] real slots of each row in the cache
    self.pending = None        # per row: its generated tokens not yet in the cache (0 or 1)
    self.prefill_tokens = 0
    self.prefill_slots = 0
    self.calls = 0

  # ------------------------------------------------------------------ helpers
  def _settings(self, greedy, stop, max_new_tokens):
    temp = 0.0 if greedy else self.temperature
    mode = S.sampling_mode(temp, self.top_k, self.top_p, self.config.vocab_size)
    table, valid = stop_lib.stop_table(stop_lib.normalize_stops(stop, self.tokenizer))
    return mode, np.float32(temp if temp > 0 else 1.0), table, valid, S.bucket_length(
        max_new_tokens)

  @staticmethod
  def _row_max(b: int, padded: int, max_new_tokens: int, per_row) -> np.ndarray:
    row_max = np.full((padded,), max_new_tokens, np.int32)
    row_max[b:] = 0
    if per_row is not None:
      per_row = np.asarray(per_row).reshape(-1)
      if per_row.shape[0] != b or np.any(per_row < 0):
        raise ValueError(f"max_new_tokens_per_row: need {b} values >= 0; got {per_row.tolist()}")
      row_max[:b] = np.minimum(row_max[:b], per_row)
    return row_max

  def _record(self, gen, rows: int, cached: np.ndarray):
    """After a call: the last generated token of each row is pending, the rest is cached."""
    lengths = np.asarray(gen.lengths)
    self.rows = rows
    self.cached = cached + np.maximum(lengths - 1, 0)
    self.pending = [[int(gen.tokens[j, n - 1])] if n > 0 else [] for j, n in enumerate(lengths)]
    self.calls += 1

  # ------------------------------------------------------------------ calls
  def start(self, prompts: Sequence[Sequence[int]], rng, *, max_new_tokens: int,
            greedy: bool = False, stop=(), max_new_tokens_per_row=None, group_size: int = 1,
            batch_multiple: int = 1, prompt_length: Optional[int] = None):
    """The first call: `prompts` (distinct; each sampled `group_size` times, rows prompt-major)
    prefilled once each. -> `Generation` of len(prompts) * group_size rows."""
    gen, self.cache = S.generate_with_params(
        self.config, self.params, [list(p) for p in prompts], max_new_tokens=max_new_tokens,
        temperature=0.0 if greedy else self.temperature, top_k=self.top_k, top_p=self.top_p,
        stop=stop, rng=rng, eos_ids=self.eos_ids,
        max_new_tokens_per_row=max_new_tokens_per_row, pad_id=self.pad_id,
        tokenizer=self.tokenizer, batch_multiple=batch_multiple, prompt_length=prompt_length,
        group_size=group_size, packed_decode=self.packed_decode, keep_cache=True)
    lens = np.repeat([len(p) for p in prompts], group_size)
    self.prefill_tokens += int(sum(len(p) for p in prompts))
    width = prompt_length or S.bucket_length(max(len(p) for p in prompts))
    self.prefill_slots += self.cache["mask"].shape[0] // group_size * int(width)
    self._record(gen, len(lens), lens.astype(np.int64))
    return gen

  def prime(self, prompts: Sequence[Sequence[int]], *, prompt_length: Optional[int] = None):
    """Caches `prompts` without generating (e.g. the roots of a tree whose first children are
    forced actions): every token but the last is prefilled, the last is fed by the next
    `extend`. Each prompt needs >= 2 tokens."""
    prompts = [[int(t) for t in p] for p in prompts]
    short = [i for i, p in enumerate(prompts) if len(p) < 2]
    if not prompts or short:
      raise ValueError(f"CachedContexts.prime: every prompt needs >= 2 tokens (prompt "
                       f"{short[0] if short else '-'} has fewer), and there must be one")
    ids, mask = S.left_pad([p[:-1] for p in prompts], self.pad_id, length=prompt_length)
    cache = init_cache(self.config, ids.shape[0], ids.shape[1])
    _, self.cache = S.prefill(self.config, self.params, ids, mask, cache, empty_cache=True)
    self.rows = len(prompts)
    self.cached = np.asarray([len(p) - 1 for p in prompts], np.int64)
    self.pending = [[p[-1]] for p in prompts]
    self.prefill_tokens += int(self.cached.sum())
    self.prefill_slots += int(ids.size)
    self.calls += 1

  def extend(self, parents: Sequence[int], chunks: Sequence[Sequence[int]], rng, *,
             max_new_tokens: int, greedy: bool = False, stop=(), max_new_tokens_per_row=None,
             batch_multiple: int = 1):
    """Row j continues row `parents[j]` of the previous call with `chunks[j]` appended (may be
    empty when that row has a pending token). -> `Generation` of len(parents) rows."""
    if self.cache is None:
      raise RuntimeError("CachedContexts.extend: call start() or prime() first")
    parents = [int(p) for p in parents]
    if not parents:
      raise ValueError("CachedContexts.extend: no rows to continue")
    bad = [p for p in parents if not 0 <= p < self.rows]
    if bad:
      raise ValueError(f"CachedContexts.extend: parent rows {bad} out of range: the previous call "
                       f"had {self.rows} rows")
    if len(chunks) != len(parents):
      raise ValueError(f"CachedContexts.extend: {len(chunks)} chunks for {len(parents)} rows")
    feed = [self.pending[p] + [int(t) for t in c] for p, c in zip(parents, chunks)]
    empty = [j for j, f in enumerate(feed) if not f]
    if empty:
      raise ValueError(f"CachedContexts.extend: row {empty[0]} has nothing to feed (no pending "
                       "token and an empty chunk)")
    b = len(parents)
    padded = -(-b // batch_multiple) * batch_multiple
    rows = np.asarray(parents + [parents[0]] * (padded - b), np.int32)
    width = S.pow2_bucket(max(len(f) for f in feed), self.chunk_bucket)
    ids, mask = S.left_pad(feed + [[self.pad_id]] * (padded - b), self.pad_id, length=width)
    mask[b:] = False                          # padding rows: copies of row 0, never sampled
    mode, temp, table, valid, n = self._settings(greedy, stop, max_new_tokens)
    cached = self.cached[np.asarray(parents)]
    length = -(-(int(cached.max()) + width + n) // self.length_bucket) * self.length_bucket
    out, self.cache = S._extend_jit(
        self.params, self.cache, rows, ids, mask, S._as_key(rng),
        self._row_max(b, padded, max_new_tokens, max_new_tokens_per_row), temp,
        np.float32(self.top_p), self.eos, table, valid, np.int32(self.pad_id),
        config=self.config, mode=mode, max_new=n, length=length,
        packed_decode=self.packed_decode)
    gen = S.to_generation(out, b, max_new_tokens)
    self.prefill_tokens += int(sum(len(f) for f in feed))
    self.prefill_slots += padded * width
    self._record(gen, b, cached + np.asarray([len(f) for f in feed]))
    return gen
