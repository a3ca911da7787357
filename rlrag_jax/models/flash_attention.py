"""Causal grouped-query attention of the cache-free forward (updates, log-probs) as Pallas
(Triton) kernels: forward, and a backward of two kernels, none of which writes a score.

  attend(q, k, v, key_mask, block_q=64, block_k=64) -> out [B, T, H, D]
  attend_cached(q, k, v, key_mask, start, ...)     -> out [B, T, H, D], forward only: T new
            tokens at cache slots start.. over a cache k / v [B, S, K, D] (the sampler's
            prefill onto a cached prefix)

q [B, T, H, D], k / v [B, T, K, D] (H = K x G), key_mask [B, T] bool: query t may attend key s
when s <= t and key_mask[b, s] (the mask `models.decoder.Backbone` builds without a cache). A
query with no such key (a left-padding slot, never read) gets zeros and passes no gradient, as
in `decoder.attend_blocked`, whose math this is:

  forward   a program per (row, query head, block of `block_q` queries) walks the key blocks up
            to its diagonal under an online softmax, writing the output and each query's
            log-sum-exp (float32);
  backward  dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dO * O)), dQ = dS K, dK = dS^T Q
            (scaled by 1/sqrt(D) where S is), with P = exp(S - lse) recomputed block by block:
            one kernel per (row, KV head, key block) accumulates dK and dV over the G query
            heads and the query blocks at or below the diagonal, one per (row, query head,
            query block) accumulates dQ over the key blocks.

XLA's unfused form of the same attention reads and writes 34x (0.5B update) to 157x (7B) the
bytes these kernels move (bench.memory --parts attention). Off a GPU the kernels run in Pallas'
interpreter (slow; for tests). Compiled for an H100 on a CPU host and checked against the dense
attention in the interpreter (tests/models/test_flash_attention.py); not yet run on a GPU, so
`model.attention` stays 'xla' by default.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

MIN_TILE = 16            # Triton's dot: every tile dimension at least 16
_NEG = np.float32(np.finfo(np.float32).min)
_HI = jax.lax.Precision.HIGHEST


def dot_f32(a, b, contract):
  """A kernel's tile product over dims `contract`, accumulated in float32."""
  return jax.lax.dot_general(a, b, (contract, ((), ())), preferred_element_type=jnp.float32,
                             precision=_HI)


def _scores(q, kb, qpos, kpos, kmask, t_len, scale):
  """Scaled scores of a query tile against a key tile and where they are allowed."""
  s = dot_f32(q, kb, ((1,), (1,))) * scale
  ok = (kpos[None, :] <= qpos[:, None]) & kmask[None, :] & (kpos[None, :] < t_len)
  return s, ok


def _load_rows(plt, ref, pos, t_len):
  """ref [block, D] rows at positions `pos`, zeros past the sequence's end."""
  return plt.load(ref, mask=(pos < t_len)[:, None], other=0)


def _key_block(k_ref, v_ref, m_ref, b, kh, k0, bk, t_len):
  """Row b's keys and values of KV head kh at positions k0 + [0, bk), and their key mask."""
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import triton as plt
  kpos = k0 + jnp.arange(bk)
  kb = _load_rows(plt, k_ref.at[b, pl.ds(k0, bk), kh, :], kpos, t_len)
  vb = _load_rows(plt, v_ref.at[b, pl.ds(k0, bk), kh, :], kpos, t_len)
  km = plt.load(m_ref.at[b, pl.ds(k0, bk)], mask=kpos < t_len, other=0) != 0
  return kpos, kb, vb, km


def _query_block(q_ref, do_ref, lse_ref, dl_ref, b, h, q0, bq, t_len):
  """Row b's queries of head h at q0 + [0, bq) with their output gradient, log-sum-exp and
  rowsum(dO * O)."""
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import triton as plt
  qpos = q0 + jnp.arange(bq)
  q = _load_rows(plt, q_ref.at[b, pl.ds(q0, bq), h, :], qpos, t_len)
  do = _load_rows(plt, do_ref.at[b, pl.ds(q0, bq), h, :], qpos, t_len)
  lse = plt.load(lse_ref.at[b, h, pl.ds(q0, bq)], mask=qpos < t_len, other=0)
  dl = plt.load(dl_ref.at[b, h, pl.ds(q0, bq)], mask=qpos < t_len, other=0)
  return qpos, q, do, lse, dl


def _online_rows(q, q_first, k_ref, v_ref, m_ref, b, kh, *, bk, s_len, scale):
  """Query tile q at key positions q_first + [0, bq) against row b's keys of KV head kh, block by block up
  to the diagonal (keys s <= qpos, s < s_len, in the key mask) under an online softmax ->
  (output [bq, D] f32, zeros for a query with no key; log-sum-exp [bq], 0 there)."""
  from jax.experimental import pallas as pl

  def step(j, carry):
    mx, l, acc = carry
    kpos, kb, vb, km = _key_block(k_ref, v_ref, m_ref, b, kh, j * bk, bk, s_len)
    s, ok = _scores(q, kb, qpos, kpos, km, s_len, scale)
    s = jnp.where(ok, s, _NEG)
    m_new = jnp.maximum(mx, jnp.max(s, axis=1))
    p = jnp.where(ok, jnp.exp(s - m_new[:, None]), 0.0)
    corr = jnp.exp(mx - m_new)
    l = l * corr + jnp.sum(p, axis=1)
    acc = acc * corr[:, None] + dot_f32(p.astype(vb.dtype), vb, ((1,), (0,)))
    return m_new, l, acc

  bq = q.shape[0]
  qpos = q_first + jnp.arange(bq)
  last = jnp.minimum(pl.cdiv(q_first + bq, bk), pl.cdiv(s_len, bk))  # blocks up to the diagonal
  init = (jnp.full((bq,), _NEG, jnp.float32), jnp.zeros((bq,), jnp.float32),
          jnp.zeros((bq, q.shape[1]), jnp.float32))
  mx, l, acc = jax.lax.fori_loop(0, last, step, init)
  live = l > 0
  out = jnp.where(live[:, None], acc / jnp.where(live, l, 1.0)[:, None], 0.0)
  lse = jnp.where(live, mx + jnp.log(jnp.where(live, l, 1.0)), 0.0)
  return out, lse


def _fwd_kernel(q_ref, k_ref, v_ref, m_ref, o_ref, lse_ref, *, bq, bk, groups, t_len, scale):
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import triton as plt
  b, h, i = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  q0 = i * bq
  qpos = q0 + jnp.arange(bq)
  q = _load_rows(plt, q_ref.at[b, pl.ds(q0, bq), h, :], qpos, t_len)
  out, lse = _online_rows(q, q0, k_ref, v_ref, m_ref, b, h // groups, bk=bk, s_len=t_len,
                          scale=scale)
  rows = qpos < t_len
  plt.store(o_ref.at[b, pl.ds(q0, bq), h, :], out.astype(o_ref.dtype), mask=rows[:, None])
  plt.store(lse_ref.at[b, h, pl.ds(q0, bq)], lse, mask=rows)


def _cached_kernel(q_ref, k_ref, v_ref, m_ref, start_ref, o_ref, *, bq, bk, groups, t_len,
                   s_len, scale):
  """`attend_cached`'s forward: query row t of the T new ones sits at cache slot start + t."""
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import triton as plt
  b, h, i = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  q0 = i * bq
  rows = q0 + jnp.arange(bq)
  q = _load_rows(plt, q_ref.at[b, pl.ds(q0, bq), h, :], rows, t_len)
  out, _ = _online_rows(q, start_ref[0] + q0, k_ref, v_ref, m_ref, b, h // groups, bk=bk,
                        s_len=s_len, scale=scale)
  plt.store(o_ref.at[b, pl.ds(q0, bq), h, :], out.astype(o_ref.dtype),
            mask=(rows < t_len)[:, None])


def _dkdv_kernel(q_ref, k_ref, v_ref, m_ref, do_ref, lse_ref, dl_ref, dk_ref, dv_ref, *, bq, bk,
                 groups, t_len, scale):
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import triton as plt
  b, kh, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  k0 = j * bk
  kpos, kb, vb, km = _key_block(k_ref, v_ref, m_ref, b, kh, k0, bk, t_len)
  first = k0 // bq                                   # query blocks at or below the diagonal
  n_q = pl.cdiv(t_len, bq)

  def step(n, carry):
    dk, dv = carry
    g, i = n // (n_q - first), first + n % (n_q - first)
    qpos, q, do, lse, dl = _query_block(q_ref, do_ref, lse_ref, dl_ref, b, kh * groups + g,
                                        i * bq, bq, t_len)
    s, ok = _scores(q, kb, qpos, kpos, km, t_len, scale)
    p = jnp.where(ok, jnp.exp(s - lse[:, None]), 0.0)                       # [bq, bk]
    dv = dv + dot_f32(p.astype(do.dtype), do, ((0,), (0,)))
    dp = dot_f32(do, vb, ((1,), (1,)))
    ds = (p * (dp - dl[:, None]) * scale).astype(q.dtype)
    dk = dk + dot_f32(ds, q, ((0,), (0,)))
    return dk, dv

  zeros = jnp.zeros((bk, kb.shape[1]), jnp.float32)
  dk, dv = jax.lax.fori_loop(0, groups * (n_q - first), step, (zeros, zeros))
  rows = (kpos < t_len)[:, None]
  plt.store(dk_ref.at[b, pl.ds(k0, bk), kh, :], dk.astype(dk_ref.dtype), mask=rows)
  plt.store(dv_ref.at[b, pl.ds(k0, bk), kh, :], dv.astype(dv_ref.dtype), mask=rows)


def _dq_kernel(q_ref, k_ref, v_ref, m_ref, do_ref, lse_ref, dl_ref, dq_ref, *, bq, bk, groups,
               t_len, scale):
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import triton as plt
  b, h, i = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  kh = h // groups
  q0 = i * bq
  qpos, q, do, lse, dl = _query_block(q_ref, do_ref, lse_ref, dl_ref, b, h, q0, bq, t_len)

  def step(j, dq):
    kpos, kb, vb, km = _key_block(k_ref, v_ref, m_ref, b, kh, j * bk, bk, t_len)
    s, ok = _scores(q, kb, qpos, kpos, km, t_len, scale)
    p = jnp.where(ok, jnp.exp(s - lse[:, None]), 0.0)
    dp = dot_f32(do, vb, ((1,), (1,)))
    ds = (p * (dp - dl[:, None]) * scale).astype(kb.dtype)
    return dq + dot_f32(ds, kb, ((1,), (0,)))

  last = jnp.minimum(pl.cdiv(q0 + bq, bk), pl.cdiv(t_len, bk))
  dq = jax.lax.fori_loop(0, last, step, jnp.zeros((bq, q.shape[1]), jnp.float32))
  plt.store(dq_ref.at[b, pl.ds(q0, bq), h, :], dq.astype(dq_ref.dtype),
            mask=(qpos < t_len)[:, None])


def refuse_tpu(setting: str) -> None:
  """The Pallas kernels here and in `sampling.cache_attention` are Triton (GPU) kernels."""
  if jax.default_backend() == "tpu":
    raise ValueError(f"{setting}='pallas' is a Triton (GPU) kernel; on TPU use "
                     f"{setting}='xla'")


def lowered_where_compiled(call, *args):
  """`call(interpret, *args)` lowered where the program is compiled: the Triton kernel for a
  GPU (also when a CPU host compiles for one), Pallas' interpreter for a CPU run."""
  return jax.lax.platform_dependent(*args, cpu=functools.partial(call, True),
                                    default=functools.partial(call, False))


def _check(q, k, bq, bk):
  refuse_tpu("model.attention")
  d = q.shape[-1]
  if d & (d - 1) or d < MIN_TILE:
    raise ValueError(f"attention 'pallas': head_dim {d} must be a power of two >= {MIN_TILE} "
                     "(a Triton tile); model.attention='xla' takes any")
  for name, blk in (("block_q", bq), ("block_k", bk)):
    if blk & (blk - 1) or blk < MIN_TILE:
      raise ValueError(f"attention 'pallas': {name} {blk} must be a power of two >= {MIN_TILE}")
  if q.shape[2] % k.shape[2]:
    raise ValueError(f"attention 'pallas': {q.shape[2]} query heads over {k.shape[2]} KV heads")


def _call(kernel, grid, outs, args, **kw):
  """pallas_call with whole-array refs, `lowered_where_compiled`."""
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import triton as plt
  whole = pl.BlockSpec(memory_space=pl.ANY)

  def call(interpret, *a):
    return pl.pallas_call(
        functools.partial(kernel, **kw), out_shape=outs, grid=grid,
        in_specs=[whole] * len(a), out_specs=jax.tree_util.tree_map(lambda _: whole, outs),
        compiler_params=plt.CompilerParams(num_warps=4, num_stages=2),
        interpret=interpret, name=kernel.__name__.strip("_"))(*a)

  return lowered_where_compiled(call, *args)


def _forward(q, k, v, key_mask, bq, bk):
  b, t, h, d = q.shape
  groups = h // k.shape[2]
  kw = dict(bq=bq, bk=bk, groups=groups, t_len=t, scale=1.0 / math.sqrt(d))
  outs = (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, h, t), jnp.float32))
  return _call(_fwd_kernel, (b, h, _cdiv(t, bq)), outs,
               (q, k, v, key_mask.astype(jnp.int8)), **kw)


def _cdiv(a: int, b: int) -> int:
  return -(-a // b)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _attend(q, k, v, key_mask, bq, bk):
  return _forward(q, k, v, key_mask, bq, bk)[0]


def _attend_fwd(q, k, v, key_mask, bq, bk):
  out, lse = _forward(q, k, v, key_mask, bq, bk)
  return out, (q, k, v, key_mask, out, lse)


def _attend_bwd(bq, bk, res, g):
  q, k, v, key_mask, out, lse = res
  b, t, h, d = q.shape
  kv = k.shape[2]
  do = g.astype(q.dtype)
  delta = jnp.einsum("bthd,bthd->bht", do.astype(jnp.float32), out.astype(jnp.float32))
  kw = dict(bq=bq, bk=bk, groups=h // kv, t_len=t, scale=1.0 / math.sqrt(d))
  mask = key_mask.astype(jnp.int8)
  args = (q, k, v, mask, do, lse, delta)
  dk, dv = _call(_dkdv_kernel, (b, kv, _cdiv(t, bk)),
                 (jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)),
                 args, **kw)
  dq = _call(_dq_kernel, (b, h, _cdiv(t, bq)), jax.ShapeDtypeStruct(q.shape, q.dtype), args,
             **kw)
  return dq, dk, dv, None


_attend.defvjp(_attend_fwd, _attend_bwd)


def attend(q, k, v, key_mask, *, block_q: int = 64, block_k: int = 64):
  """Causal attention of q [B,T,H,D] over k / v [B,T,K,D] with key_mask [B,T] (module doc)."""
  _check(q, k, block_q, block_k)
  return _attend(q, k, v, key_mask, block_q, block_k)


def attend_cached(q, k, v, key_mask, start, *, block_q: int = 64, block_k: int = 64):
  """A prefill onto a KV cache that already holds `start` slots (forward only, no gradient):
  q [B,T,H,D] are the new tokens, at cache slots start .. start+T-1; k / v [B,S,K,D] the cache
  with them written; key_mask [B,S]. Query t attends slot s when s <= start + t and
  key_mask[b, s]; a query with no such slot gets zeros. `start` is a traced int32 scalar."""
  _check(q, k, block_q, block_k)
  b, t, h, d = q.shape
  s = k.shape[1]
  kw = dict(bq=block_q, bk=block_k, groups=h // k.shape[2], t_len=t, s_len=s,
            scale=1.0 / math.sqrt(d))
  return _call(_cached_kernel, (b, h, _cdiv(t, block_q)), jax.ShapeDtypeStruct(q.shape, q.dtype),
               (q, k, v, key_mask.astype(jnp.int8), jnp.reshape(start, (1,)).astype(jnp.int32)),
               **kw)
