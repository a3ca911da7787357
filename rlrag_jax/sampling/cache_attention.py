"""The decode step's attention: one new query per row over that row's KV cache, grouped-query.

  attend(q, ck, cv, key_bias, scale, impl, length=None) -> [B, K, G, D]

q [B, H, D] (H = K x G query heads), ck / cv [B, S, K, D] (the cache layout of
`models.decoder.init_cache`), key_bias [B, S] float32 (0 where a slot may be attended, the
float32 minimum where not; see `fast_decode.decode_step`). Two implementations, same math:

  'xla'     an elementwise product + reduction over the cache (what XLA:CPU fuses into one
            pass per reduction; the CPU defaults' committed numbers were decoded with it). On
            XLA:GPU it is five kernels a layer: the f32 scores [B, S, K, G] are written once and
            read three times (max, sum, normalise) and the bf16 probabilities once more
            (docs/results/memory: 1.89x the decode step's ideal bytes at batch 256, 512 cached).
  'pallas'  one Pallas (Triton) kernel a layer: a program per (row, KV head) streams its cache
            in blocks of `block` slots under an online softmax (running max and sum), so the
            cache is read once and no score array reaches memory. The G query heads of a KV
            head are one [G', D] tile (G' = G padded to a power of two, at least 16, the
            smallest tile Triton's dot takes). On a CPU backend the same kernel runs in Pallas'
            interpreter (slow; for tests).

            A grid of B x K programs underfills a GPU when B x K is small (a tree's few
            branches, a tool loop's turn): below `MIN_PROGRAMS` programs the cache is split
            into `splits` ranges of blocks (flash-decoding), a program per (row, KV head,
            range) writes its unnormalised sum with its running max and sum, and XLA combines
            the ranges (`splits`: None picks the fewest ranges that reach MIN_PROGRAMS; a count
            is cut to one range a block; 1 is the single pass above).

Reads bounded to the filled length. The sampler's cache holds S = prompt + max_new slots, and
every row writes the same slot each step, so at step i only the first `length` = index + 1 slots
can hold a key (the rest are free and masked); reading all S cost 1.5-2x the live KV at the
sampler's shapes. With `length` (a traced int32 scalar, the filled length):

  'xla'     with `buckets` > 1 (`MAX_BUCKETS` by default, which is 1: off, see below) reads a
            static prefix of the cache, the smallest of at most `buckets` lengths (multiples
            of `BLOCK`, see `read_buckets`) that covers `length`, picked by `lax.switch`: one
            compiled program whatever the lengths (each branch the same fused attention over
            its prefix), at most one bucket past the filled length. Buckets rather than a
            `while` over blocks under an online softmax: they keep XLA's fused reductions and
            one program. The prefix's sums equal the full cache's up to float32 rounding
            (XLA's reduction order depends on the reduced length: a few ulp, not bitwise).
            Why it is off: XLA does not read a prefix in place. XLA:GPU copies it out first
            (a `wrapped_slice` kernel a cache: read and written once more), XLA:CPU writes it
            as float32 before the dot-like fusion reads it, and a GPU conditional reads its
            branch index on the host every layer. Plans of the 0.5B step, batch 256, 512 of
            1,024 slots filled (`bench.memory --cached 512 --cache-slots 1024`): 8.45 GB a
            step with the prefix against 7.72 GB reading all 1,024 slots (XLA:GPU), 19.6
            against 14.0 GB (XLA:CPU). Until XLA fuses the cut, 'pallas' is the bounded read;
            the full read also keeps the CPU defaults' committed numbers bit for bit.
  'pallas'  loops over the blocks up to ceil(length / block) (a dynamic trip count; the split
            form shares those blocks between its ranges): blocks past the filled length add
            nothing to the online softmax (alpha 1, p 0), so the output equals the full pass
            bit for bit in the single pass.

Finished rows. The sampler's batch keeps its shape to the end (static shapes: one program),
so a finished row still runs the whole step: its share of the matmuls (which stream the
weights once for all rows, so a row costs little at decode's batch sizes) and, by default, its
cache read. `live` [B] bool (the sampler passes its unfinished rows) lets 'pallas' skip a dead
row's cache altogether (its program loops over no block and writes zeros); 'xla' reads every
row's prefix (one bucket for the batch) and ignores it.

`length=None` reads the whole cache (as before). `read_slots` (static) instead bounds the read
at trace time (used by `bench.memory`'s plan, which cannot see a traced length): 'xla' cuts
its bucket, 'pallas' loops to it (the plan still charges the kernel its whole cache operand).

The kernel is written for GPUs; it has been compiled for an H100 (bench.memory --gpu h100) and
checked against 'xla' in the interpreter (tests/sampling/test_cache_attention.py), but it has
not yet run on a GPU: `bench.accelerator` times both on one when a session is lent a GPU.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from rlrag_jax.models import flash_attention as fa

IMPLS = ("xla", "pallas")
MIN_TILE = fa.MIN_TILE   # Triton's dot: every tile dimension at least 16
MIN_PROGRAMS = 256       # ~2 programs per SM of an H100 (132 SMs): fewer leave SMs idle
BLOCK = 128              # cache slots a kernel step reads; the 'xla' read buckets' unit
MAX_BUCKETS = 1          # 'xla': most prefix lengths (switch branches) a cache is read in;
                         # 1: the whole cache (module doc: XLA copies a prefix out)


def attend(q, ck, cv, key_bias, scale, impl: str = "xla", *, block: int = BLOCK,
           splits: int | None = None, length=None, read_slots: int | None = None, live=None,
           buckets: int | None = None):
  """Attention of each row's query heads over its cache: [B, K, G, D] in q's dtype.

  length: traced int32 scalar, slots [length, S) hold no key of any row (module doc); None: all
  may. read_slots: a static bound of the same (the read is cut at trace time). live: [B] bool
  or None; 'pallas' gives rows not live zeros without reading their cache. buckets: 'xla''s
  most prefix lengths (None: MAX_BUCKETS)."""
  buckets = MAX_BUCKETS if buckets is None else buckets
  if read_slots is not None:
    if not 0 < read_slots <= ck.shape[1]:
      raise ValueError(f"decode attention: read_slots {read_slots} outside (0, {ck.shape[1]}]")
    n = next(n for n in read_buckets(ck.shape[1], most=buckets) if n >= read_slots)
    if impl == "pallas" and length is None:
      length = jnp.int32(read_slots)
    if impl == "xla":
      # The barrier stands for the switch's branch boundary: without it XLA fuses the cast of
      # the whole cache into its in-place update, ahead of the cut.
      ck, cv = jax.lax.optimization_barrier((ck, cv))
      ck, cv, key_bias = ck[:, :n], cv[:, :n], key_bias[:, :n]
      length = None                                       # no switch: the prefix is known
  if impl == "xla":
    if length is None:
      return _attend_xla(q, ck, cv, key_bias, scale)
    return _attend_xla_bounded(q, ck, cv, key_bias, scale, length, buckets)
  if impl == "pallas":
    return attend_pallas(q, ck, cv, key_bias, scale, block=block, splits=splits, length=length,
                         live=live)
  raise ValueError(f"decode attention {impl!r}: expected one of {IMPLS}")


def read_buckets(slots: int, block: int = BLOCK, most: int = 8) -> tuple:
  """The prefix lengths 'xla' reads a cache of `slots` in: multiples of a step (one block, or
  more to stay within `most` lengths), the last the whole cache."""
  step = max(block, -(-slots // (most * block)) * block)
  return tuple(min(slots, n) for n in range(step, slots + step, step))


def _attend_xla_bounded(q, ck, cv, key_bias, scale, length, buckets: int):
  """`_attend_xla` over the shortest bucket prefix that holds the first `length` slots."""
  lens = read_buckets(ck.shape[1], most=buckets)
  if len(lens) == 1:
    return _attend_xla(q, ck, cv, key_bias, scale)
  which = jnp.clip((jnp.asarray(length, jnp.int32) - 1) // lens[0], 0, len(lens) - 1)
  branches = [functools.partial(lambda n, *a: _attend_xla(a[0], a[1][:, :n], a[2][:, :n],
                                                          a[3][:, :n], scale), n)
              for n in lens]
  return jax.lax.switch(which, branches, q, ck, cv, key_bias)


def _attend_xla(q, ck, cv, key_bias, scale):
  b, h, d = q.shape
  kh = ck.shape[2]
  dt = q.dtype
  qg = q.reshape(b, 1, kh, h // kh, d).astype(jnp.float32)
  scores = jnp.sum(qg * ck[:, :, :, None, :].astype(jnp.float32), axis=-1) * scale  # [B,S,K,G]
  scores = scores + key_bias[:, :, None, None]
  probs = jax.nn.softmax(scores, axis=1).astype(dt)
  return jnp.sum(probs[..., None] * cv[:, :, :, None, :].astype(dt), axis=1)   # [B, K, G, D]


def _pow2_at_least(n: int, floor: int) -> int:
  return max(floor, 1 << max(0, int(n) - 1).bit_length())


def auto_splits(rows: int, kv_heads: int, slots: int, block: int) -> int:
  """The fewest cache ranges whose programs (rows x KV heads x ranges) reach MIN_PROGRAMS, at
  most one range a block."""
  need = -(-MIN_PROGRAMS // max(1, rows * kv_heads))
  return max(1, min(need, -(-slots // block)))


def _online_softmax(q, k_ref, v_ref, bias_ref, b, h, first, last, *, block, slots, scale):
  """Running max m [G'], sum l [G'] and unnormalised output acc [G', D] (f32) of query tile q
  over cache blocks first .. last-1 of row b, KV head h."""
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import triton as plt
  g = q.shape[0]
  neg = np.float32(np.finfo(np.float32).min)

  def step(i, carry):
    m, l, acc = carry
    start = i * block
    ok = start + jnp.arange(block) < slots
    kb = plt.load(k_ref.at[b, pl.ds(start, block), h, :], mask=ok[:, None], other=0)
    vb = plt.load(v_ref.at[b, pl.ds(start, block), h, :], mask=ok[:, None], other=0)
    bias = plt.load(bias_ref.at[b, pl.ds(start, block)], mask=ok, other=0)
    s = fa.dot_f32(q, kb, ((1,), (1,))) * scale + bias[None, :]
    s = jnp.where(ok[None, :], s, -jnp.inf)    # past the cache's end: no slot at all
    m_new = jnp.maximum(m, jnp.max(s, axis=1))
    # A block of masked slots only (left padding) gives p = 1 while m is the float32 minimum;
    # the first real slot makes alpha = exp(min - real) = 0 and wipes them.
    alpha = jnp.exp(m - m_new)
    p = jnp.exp(s - m_new[:, None])
    l = l * alpha + jnp.sum(p, axis=1)
    return m_new, l, acc * alpha[:, None] + fa.dot_f32(p.astype(vb.dtype), vb, ((1,), (0,)))

  init = (jnp.full((g,), neg, jnp.float32), jnp.zeros((g,), jnp.float32),
          jnp.zeros((g, q.shape[1]), jnp.float32))
  return jax.lax.fori_loop(first, last, step, init)


def _live_blocks(len_ref, b, *, block: int, slots: int):
  """Blocks holding row b's first len_ref[b] slots (the filled length; 0 for a row not live),
  at most the cache's."""
  from jax.experimental import pallas as pl
  return jnp.minimum(pl.cdiv(len_ref[b], block), pl.cdiv(slots, block))


def _kernel(q_ref, k_ref, v_ref, bias_ref, len_ref, o_ref, *, block: int, slots: int,
            scale: float):
  """One program: row b, KV head h. q_ref [G', D]; k_ref / v_ref the whole [B, S, K, D] caches
  (read block by block up to the row's filled length len_ref[b], the tail masked); bias_ref the
  whole [B, S]; o_ref [G', D] (zeros for a row of no block: l = 0)."""
  from jax.experimental import pallas as pl
  b, h = pl.program_id(0), pl.program_id(1)
  live = _live_blocks(len_ref, b, block=block, slots=slots)
  _, l, acc = _online_softmax(q_ref[...], k_ref, v_ref, bias_ref, b, h, 0, live, block=block,
                              slots=slots, scale=scale)
  o_ref[...] = (acc / jnp.where(l > 0, l, 1.0)[:, None]).astype(o_ref.dtype)


def _split_kernel(q_ref, k_ref, v_ref, bias_ref, len_ref, acc_ref, m_ref, l_ref, *,
                  block: int, slots: int, scale: float, splits: int):
  """One program: row b, KV head h, cache blocks [r * per, (r + 1) * per), the blocks up to the
  filled length shared between the `splits` ranges. Writes the range's unnormalised output
  acc_ref [G', D] and its running max m_ref / sum l_ref [G'] (f32); a range past the filled
  length writes m = float32 minimum, l = 0, acc = 0."""
  from jax.experimental import pallas as pl
  b, h, r = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  live = _live_blocks(len_ref, b, block=block, slots=slots)
  per = pl.cdiv(live, splits)
  first = r * per
  last = jnp.minimum(first + per, live)
  m, l, acc = _online_softmax(q_ref[...], k_ref, v_ref, bias_ref, b, h, first, last,
                              block=block, slots=slots, scale=scale)
  acc_ref[...], m_ref[...], l_ref[...] = acc, m, l


def _combine(acc, m, l):
  """Ranges' partials acc [B, K, R, G', D], m / l [B, K, R, G'] -> [B, K, G', D] f32. Each
  range is weighted by exp(its max - the overall max); a range of masked slots only (max the
  float32 minimum) weighs 0 beside any real slot, and a row with no slot at all averages its
  masked slots as the single pass does; a row of no block (not live) gets zeros."""
  top = jnp.max(m, axis=2, keepdims=True)
  w = jnp.exp(m - top)                                              # [B, K, R, G']
  den = jnp.sum(w * l, axis=2)
  return jnp.sum(w[..., None] * acc, axis=2) / jnp.where(den > 0, den, 1.0)[..., None]


def _check(q, ck, block: int, splits) -> None:
  """Refuses what the kernel cannot tile or run (TPU, head_dim, block, splits)."""
  d, dk = q.shape[-1], ck.shape[-1]
  fa.refuse_tpu("model.decode_attention")
  if dk != d or d & (d - 1) or d < MIN_TILE:
    raise ValueError(f"decode attention 'pallas': head_dim {d} must be a power of two >= "
                     f"{MIN_TILE} (a Triton tile); model.decode_attention='xla' takes any")
  if block & (block - 1) or block < MIN_TILE:
    raise ValueError(f"decode attention 'pallas': block {block} must be a power of two >= "
                     f"{MIN_TILE}")
  if splits is not None and int(splits) < 1:
    raise ValueError(f"decode attention 'pallas': splits {splits} must be >= 1 (None: "
                     f"auto_splits)")


def attend_pallas(q, ck, cv, key_bias, scale, *, block: int = BLOCK,
                  splits: int | None = None, length=None, live=None):
  """The 'pallas' implementation (module doc)."""
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import triton as plt
  b, h, d = q.shape
  _, slots, kh, _ = ck.shape
  _check(q, ck, block, splits)
  g = h // kh
  gp = _pow2_at_least(g, MIN_TILE)
  qg = q.reshape(b, kh, g, d)
  if gp != g:
    qg = jnp.pad(qg, ((0, 0), (0, 0), (0, gp - g), (0, 0)))
  blocks = -(-slots // block)
  # at most one range a block (a fixed count meets caches of any length)
  splits = auto_splits(b, kh, slots, block) if splits is None else min(int(splits), blocks)
  whole = pl.BlockSpec(memory_space=pl.ANY)
  params = plt.CompilerParams(num_warps=4, num_stages=2)
  kw = dict(block=block, slots=slots, scale=float(scale))
  bias = key_bias.astype(jnp.float32)
  filled = jnp.broadcast_to(jnp.asarray(slots if length is None else length, jnp.int32), (b,))
  if live is not None:
    filled = jnp.where(live, filled, 0)                              # [B], read as len_ref[b]

  if splits == 1:
    def call(interpret, *args):
      return pl.pallas_call(
          functools.partial(_kernel, **kw),
          out_shape=jax.ShapeDtypeStruct((b, kh, gp, d), q.dtype),
          grid=(b, kh),
          in_specs=[pl.BlockSpec((None, None, gp, d), lambda i, j: (i, j, 0, 0)), whole, whole,
                    whole, whole],
          out_specs=pl.BlockSpec((None, None, gp, d), lambda i, j: (i, j, 0, 0)),
          compiler_params=params, interpret=interpret, name="decode_cache_attention")(*args)
    return fa.lowered_where_compiled(call, qg, ck, cv, bias, filled)[:, :, :g]

  tile = pl.BlockSpec((None, None, None, gp, d), lambda i, j, r: (i, j, r, 0, 0))
  row = pl.BlockSpec((None, None, None, gp), lambda i, j, r: (i, j, r, 0))

  def call_split(interpret, *args):
    return pl.pallas_call(
        functools.partial(_split_kernel, splits=splits, **kw),
        out_shape=(jax.ShapeDtypeStruct((b, kh, splits, gp, d), jnp.float32),
                   jax.ShapeDtypeStruct((b, kh, splits, gp), jnp.float32),
                   jax.ShapeDtypeStruct((b, kh, splits, gp), jnp.float32)),
        grid=(b, kh, splits),
        in_specs=[pl.BlockSpec((None, None, gp, d), lambda i, j, r: (i, j, 0, 0)), whole, whole,
                  whole, whole],
        out_specs=(tile, row, row),
        compiler_params=params, interpret=interpret, name="decode_cache_attention_split")(*args)

  acc, m, l = fa.lowered_where_compiled(call_split, qg, ck, cv, bias, filled)
  return _combine(acc, m, l)[:, :, :g].astype(q.dtype)
