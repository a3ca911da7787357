"""The decode step's attention over the KV cache (rlrag_jax.sampling.cache_attention): the Pallas
kernel (in Pallas' interpreter on CPU) and the XLA path against a float64 reference, the
kernel's GPU lowering, and the sampler with either."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlrag_jax.models import init_cache
from rlrag_jax.models.config import ModelConfig
from rlrag_jax.models.decoder import DecoderLM, init_params
from rlrag_jax.sampling import cache_attention, fast_decode, prefill, sampler

NEG = np.finfo(np.float32).min


def _reference(q, ck, cv, mask, scale):
  """Softmax attention in float64 numpy: q [B,H,D], caches [B,S,K,D], mask [B,S] -> [B,K,G,D]."""
  q, ck, cv = (np.asarray(x, np.float64) for x in (q, ck, cv))
  b, h, d = q.shape
  kh = ck.shape[2]
  qg = q.reshape(b, kh, h // kh, d)
  s = np.einsum("bkgd,bskd->bkgs", qg, ck) * scale
  s = np.where(mask[:, None, None, :], s, -np.inf)
  empty = (~mask).all(axis=1)                       # a row with no slot: uniform over S
  s = np.where(empty[:, None, None, None], 0.0, s)
  p = np.exp(s - s.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  return np.einsum("bkgs,bskd->bkgd", p, cv)


def _inputs(b, s, kh, g, d, dtype, seed=0):
  rs = np.random.RandomState(seed)
  q, ck, cv = (jnp.asarray(rs.randn(*shape), jnp.float32).astype(dtype)
               for shape in ((b, kh * g, d), (b, s, kh, d), (b, s, kh, d)))
  mask = np.ones((b, s), bool)
  mask[1, :s // 2 + 3] = False      # left padding past the first key block
  if b > 2:
    mask[2, s - 5:] = False         # free slots at the end
  if b > 3:
    mask[3] = False                 # a row with no slot: both give the mean of its values
  bias = jnp.asarray(np.where(mask, 0.0, NEG), jnp.float32)
  return q, ck, cv, mask, bias


@pytest.mark.parametrize("kh,g,s,block,splits", [
    (2, 7, 40, 16, 1), (1, 4, 64, 32, 1), (4, 1, 33, 16, 1), (2, 16, 50, 128, 1),
    (2, 7, 40, 16, 2), (1, 4, 100, 16, 4), (2, 3, 81, 16, 6), (4, 1, 33, 16, None)])
def test_both_implementations_match_a_float64_reference(kh, g, s, block, splits):
  """Grouped queries padded to the kernel's 16-row tile (g 7, 4, 3, 1) or not (16), a cache
  length that is not a multiple of the key block (a masked tail), left padding, an empty row;
  in one pass or split into ranges of blocks (100 slots in 7 blocks as 4 ranges of 2: the last
  range short; 81 in 6 as 6; None: as many as auto_splits gives), one range all left padding."""
  q, ck, cv, mask, bias = _inputs(4, s, kh, g, 16, jnp.float32)
  scale = 1 / math.sqrt(16)
  want = _reference(q, ck, cv, mask, scale)
  xla = cache_attention.attend(q, ck, cv, bias, scale, "xla")
  pal = cache_attention.attend(q, ck, cv, bias, scale, "pallas", block=block, splits=splits)
  assert xla.shape == pal.shape == (4, kh, g, 16) and pal.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(xla), want, atol=2e-6, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(pal), want, atol=2e-6, rtol=1e-5)


def test_split_count_fills_the_gpu_and_stays_within_the_blocks():
  """auto_splits: the fewest ranges reaching MIN_PROGRAMS programs, one range a block at most,
  a single pass once rows x KV heads reach it; a count past the blocks is cut to the blocks,
  one below 1 refused."""
  n = cache_attention.MIN_PROGRAMS
  assert cache_attention.auto_splits(n // 2, 2, 512, 128) == 1          # batch 128 x 2 heads
  assert cache_attention.auto_splits(8, 2, 4096, 128) == -(-n // 16)     # 16 programs a range
  assert cache_attention.auto_splits(8, 2, 300, 128) == 3               # only 3 blocks
  assert cache_attention.auto_splits(1, 1, 10, 16) == 1
  q, ck, cv, _, bias = _inputs(2, 40, 2, 2, 16, jnp.float32)
  three = cache_attention.attend(q, ck, cv, bias, 0.3, "pallas", block=16, splits=3)
  nine = cache_attention.attend(q, ck, cv, bias, 0.3, "pallas", block=16, splits=9)
  assert np.array_equal(np.asarray(nine), np.asarray(three))
  with pytest.raises(ValueError, match="splits 0 must be >= 1"):
    cache_attention.attend(q, ck, cv, bias, 0.3, "pallas", block=16, splits=0)


def test_bfloat16_cache_within_rounding():
  q, ck, cv, mask, bias = _inputs(3, 48, 2, 7, 32, jnp.bfloat16, seed=1)
  want = _reference(q, ck, cv, mask, 1 / math.sqrt(32))
  for splits in (1, 3):
    pal = cache_attention.attend(q, ck, cv, bias, 1 / math.sqrt(32), "pallas", block=16,
                                 splits=splits)
    assert pal.dtype == jnp.bfloat16
    # probabilities cast to bf16 before the value sum, the output rounded to bf16
    np.testing.assert_allclose(np.asarray(pal, np.float64), want, atol=2e-2, rtol=2e-2)


def test_gpu_lowering_is_one_triton_kernel_and_cpu_the_interpreter():
  """Lowered for CUDA (no GPU or plugin needed) the kernel is a Triton custom call with no loop
  around it; lowered for CPU it is Pallas' interpreter (a loop over the grid)."""
  q = jax.ShapeDtypeStruct((8, 14, 64), jnp.bfloat16)
  c = jax.ShapeDtypeStruct((8, 300, 2, 64), jnp.bfloat16)
  bias = jax.ShapeDtypeStruct((8, 300), jnp.float32)
  f = jax.jit(lambda q, k, v, b: cache_attention.attend(q, k, v, b, 0.125, "pallas"))
  gpu = f.trace(q, c, c, bias).lower(lowering_platforms=("cuda",)).as_text()
  cpu = f.trace(q, c, c, bias).lower(lowering_platforms=("cpu",)).as_text()
  assert gpu.count("__gpu$xla.gpu.triton") == 1 and "stablehlo.while" not in gpu
  assert "triton" not in cpu and "stablehlo.while" in cpu
  # 8 rows x 2 KV heads: the cache's 3 blocks as 3 ranges, a grid of 48 programs
  assert "decode_cache_attention_split" in gpu
  big = jax.ShapeDtypeStruct((128, 14, 64), jnp.bfloat16)
  cb = jax.ShapeDtypeStruct((128, 300, 2, 64), jnp.bfloat16)
  one = f.trace(big, cb, cb, jax.ShapeDtypeStruct((128, 300), jnp.float32))
  text = one.lower(lowering_platforms=("cuda",)).as_text()
  assert text.count("__gpu$xla.gpu.triton") == 1 and "decode_cache_attention_split" not in text


def test_shapes_the_kernel_cannot_tile_are_refused():
  q, ck, cv, _, bias = _inputs(2, 20, 2, 2, 8, jnp.float32)
  with pytest.raises(ValueError, match="head_dim 8 must be a power of two >= 16"):
    cache_attention.attend(q, ck, cv, bias, 0.3, "pallas")
  q, ck, cv, _, bias = _inputs(2, 20, 2, 2, 16, jnp.float32)
  with pytest.raises(ValueError, match="block 24 must be a power of two"):
    cache_attention.attend(q, ck, cv, bias, 0.3, "pallas", block=24)
  with pytest.raises(ValueError, match="decode attention 'flash': expected one of"):
    cache_attention.attend(q, ck, cv, bias, 0.3, "flash")


def _tiny(decode_attention):
  return ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=16, attention_bias=True,
                     decode_attention=decode_attention)


def test_decode_step_and_greedy_sampling_equal_with_either_attention():
  """The sampler's decode step with the kernel gives the XLA path's logits (float32) and the
  same greedy continuations."""
  cfg_x, cfg_p = _tiny("xla"), _tiny("pallas")
  params = init_params(DecoderLM(cfg_x), jax.random.PRNGKey(3))
  rng = np.random.default_rng(3)
  ids = jnp.asarray(rng.integers(3, 97, (3, 7)), jnp.int32)
  mask = jnp.asarray([[0, 0, 1, 1, 1, 1, 1], [1] * 7, [0, 0, 0, 0, 0, 1, 1]], jnp.bool_)
  _, cache = prefill(cfg_x, params, ids, mask, init_cache(cfg_x, 3, 12))
  tok, active = jnp.asarray([5, 7, 11], jnp.int32), jnp.asarray([True, True, False])
  outs = [fast_decode.decode_step(c, fast_decode.pack_params(c, params), tok, active,
                                  jax.tree_util.tree_map(jnp.copy, cache))
          for c in (cfg_x, cfg_p)]
  (lx, cx), (lp, cp) = outs
  np.testing.assert_allclose(np.asarray(lp), np.asarray(lx), atol=1e-5, rtol=1e-5)
  assert np.array_equal(np.asarray(cx["mask"]), np.asarray(cp["mask"]))
  for a, b in zip(jax.tree_util.tree_leaves(cx["layers"]), jax.tree_util.tree_leaves(cp["layers"])):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5, rtol=1e-5)
  prompts = [list(map(int, rng.integers(3, 97, n))) for n in (3, 6, 5)]
  gen = [sampler.generate_with_params(c, params, prompts, max_new_tokens=6, temperature=0.0,
                                      eos_ids=(), rng=0) for c in (cfg_x, cfg_p)]
  assert np.array_equal(np.asarray(gen[0].tokens), np.asarray(gen[1].tokens))


# --------------------------------------------------------------------------- bounded reads
def _filled(b, s, kh, g, d, dtype, filled, seed=2):
  """Inputs whose slots [filled, S) are free: zero K/V, masked (the sampler's layout)."""
  q, ck, cv, mask, _ = _inputs(b, s, kh, g, d, dtype, seed=seed)
  mask = mask.copy()
  mask[:, filled:] = False
  ck, cv = ck.at[:, filled:].set(0), cv.at[:, filled:].set(0)
  return q, ck, cv, mask, jnp.asarray(np.where(mask, 0.0, NEG), jnp.float32)


def test_read_buckets_are_few_block_multiples_ending_at_the_cache():
  assert cache_attention.read_buckets(300, most=1) == (300,)      # MAX_BUCKETS' default: off
  assert cache_attention.read_buckets(100) == (100,)
  assert cache_attention.read_buckets(300) == (128, 256, 300)
  assert cache_attention.read_buckets(640) == (128, 256, 384, 512, 640)
  big = cache_attention.read_buckets(4096 + 40)
  assert len(big) <= 8 and big[-1] == 4136
  assert all(n % 128 == 0 for n in big[:-1]) and big[0] == 640


@pytest.mark.parametrize("filled", [1, 5, 127, 128, 129, 200, 256, 299, 300])
def test_xla_read_up_to_the_filled_length_equals_the_full_cache(filled):
  """The bucketed prefix read against the whole cache's (float32: within a few ulp, XLA's sum
  order depends on the reduced length) and against the float64 reference; one switch. Rows
  with a slot only: one with none (never in the sampler, whose rows hold their prompt) averages
  the values it reads, so over fewer slots."""
  q, ck, cv, mask, bias = _filled(4, 300, 2, 3, 16, jnp.float32, filled)
  scale = 0.25
  f = jax.jit(lambda q, k, v, b, n: cache_attention.attend(q, k, v, b, scale, "xla", length=n,
                                                          buckets=8))
  full = np.asarray(cache_attention.attend(q, ck, cv, bias, scale, "xla"))
  part = np.asarray(f(q, ck, cv, bias, jnp.int32(filled)))
  live = mask.any(axis=1)
  assert live.sum() >= 2
  np.testing.assert_allclose(part[live], full[live], rtol=2e-6, atol=1e-7)
  np.testing.assert_allclose(part[live], _reference(q, ck, cv, mask, scale)[live], atol=2e-6,
                             rtol=1e-5)
  hlo = f.lower(q, ck, cv, bias, jnp.int32(filled)).as_text()
  assert hlo.count("stablehlo.case") == 1


def test_xla_bounded_read_in_bfloat16_within_rounding():
  q, ck, cv, mask, bias = _filled(3, 300, 2, 7, 32, jnp.bfloat16, 140, seed=4)
  full = cache_attention.attend(q, ck, cv, bias, 0.2, "xla")
  part = cache_attention.attend(q, ck, cv, bias, 0.2, "xla", length=jnp.int32(140), buckets=8)
  assert part.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(part, np.float32), np.asarray(full, np.float32),
                             atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("filled,splits", [(1, 1), (37, 1), (48, 1), (70, 1), (37, 3), (70, 4),
                                           (100, None)])
def test_pallas_reads_blocks_up_to_the_filled_length(filled, splits):
  """The kernel stopped at ceil(filled / block) blocks: in one pass bit for bit the full
  pass's output (the skipped blocks add exact zeros), split into ranges within rounding."""
  q, ck, cv, mask, bias = _filled(4, 100, 2, 7, 16, jnp.float32, filled)
  kw = dict(block=16, splits=splits)
  full = np.asarray(cache_attention.attend(q, ck, cv, bias, 0.25, "pallas", **kw))
  part = np.asarray(cache_attention.attend(q, ck, cv, bias, 0.25, "pallas",
                                           length=jnp.int32(filled), **kw))
  live = mask.any(axis=1)           # a row with no slot: see the 'xla' test above
  if splits == 1:
    assert np.array_equal(part[live], full[live])
  np.testing.assert_allclose(part[live], full[live], rtol=2e-6, atol=1e-7)


def test_read_slots_cuts_the_read_at_trace_time():
  q, ck, cv, mask, bias = _filled(3, 300, 2, 2, 16, jnp.float32, 160)
  full = np.asarray(cache_attention.attend(q, ck, cv, bias, 0.3, "xla"))
  cut = np.asarray(cache_attention.attend(q, ck, cv, bias, 0.3, "xla", read_slots=160,
                                          buckets=8))
  np.testing.assert_allclose(cut, full, rtol=2e-6, atol=1e-7)
  with pytest.raises(ValueError, match="read_slots 301 outside"):
    cache_attention.attend(q, ck, cv, bias, 0.3, "xla", read_slots=301)


def test_greedy_tokens_unchanged_by_the_bounded_read(monkeypatch):
  """A cache of 136 slots (2 read buckets with MAX_BUCKETS 8): greedy continuations and the
  logits of every step as with the whole cache read (the default, MAX_BUCKETS 1)."""
  cfg = _tiny("xla")
  params = init_params(DecoderLM(cfg), jax.random.PRNGKey(5))
  rng = np.random.default_rng(5)
  prompts = [list(map(int, rng.integers(3, 97, n))) for n in (3, 16, 9)]
  run = lambda: sampler.generate_with_params(cfg, params, prompts, max_new_tokens=120,
                                             temperature=0.0, eos_ids=(), rng=0)
  assert cache_attention.MAX_BUCKETS == 1
  full = run()
  monkeypatch.setattr(cache_attention, "MAX_BUCKETS", 8)
  jax.clear_caches()
  assert cache_attention.read_buckets(136) == (128, 136)
  bounded = run()
  jax.clear_caches()
  assert np.array_equal(bounded.tokens, full.tokens)
  np.testing.assert_allclose(bounded.model_logprobs, full.model_logprobs, atol=1e-5)


@pytest.mark.parametrize("splits", [1, 3])
def test_pallas_skips_rows_not_live(splits):
  """Rows not live get zeros without a block read; the live rows are unchanged."""
  q, ck, cv, mask, bias = _filled(4, 100, 2, 7, 16, jnp.float32, 70)
  live = jnp.asarray([True, False, True, False])
  kw = dict(block=16, splits=splits, length=jnp.int32(70))
  every = np.asarray(cache_attention.attend(q, ck, cv, bias, 0.25, "pallas", **kw))
  some = np.asarray(cache_attention.attend(q, ck, cv, bias, 0.25, "pallas", live=live, **kw))
  assert np.array_equal(some[[0, 2]], every[[0, 2]]) and not some[[1, 3]].any()


def test_sampler_greedy_tokens_with_the_kernel_skipping_finished_rows():
  """Rows that end early (EOS, short per-row limits): the kernel path, which skips their cache
  once finished, gives the XLA path's greedy tokens."""
  cfg_x, cfg_p = _tiny("xla"), _tiny("pallas")
  params = init_params(DecoderLM(cfg_x), jax.random.PRNGKey(4))
  rng = np.random.default_rng(4)
  prompts = [list(map(int, rng.integers(3, 97, n))) for n in (3, 6, 5, 2)]
  gen = [sampler.generate_with_params(c, params, prompts, max_new_tokens=10, temperature=0.0,
                                      eos_ids=(), max_new_tokens_per_row=[2, 10, 5, 1], rng=0)
         for c in (cfg_x, cfg_p)]
  assert np.array_equal(gen[0].tokens, gen[1].tokens)
  assert gen[0].lengths.tolist() == [2, 10, 5, 1]
