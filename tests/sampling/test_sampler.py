"""The jitted sampler against `transformers` (greedy tokens, log-probs under the same warpers) and
against hand-computed expectations (stops, EOS, per-row limits, determinism, distributions)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                     TopPLogitsWarper)

from rlrag_jax.models import init_cache
from rlrag_jax.sampling import sampler
from rlrag_jax.sampling import (SamplingMode, bucket_length, decode, generate,
                                generate_with_params, left_pad, prefill, sample_logits)

N = 12


def _prompts(lengths, vocab, seed=0):
  rng = np.random.default_rng(seed)
  return [rng.integers(3, vocab, n).tolist() for n in lengths]


def _hf_greedy(ref, prompt, n, eos=2):
  """transformers greedy continuation of one unpadded prompt: `generate`, cut after its first
  EOS; with eos=None, n full forward passes (no cache, no EOS) taking the argmax each time."""
  with torch.no_grad():
    if eos is None:
      seq = list(prompt)
      for _ in range(n):
        seq.append(int(ref(torch.tensor([seq])).logits[0, -1].argmax()))
      return seq[len(prompt):]
    ids = torch.tensor([prompt])
    out = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                       eos_token_id=eos, pad_token_id=0)[0, len(prompt):].tolist()
  return out[:out.index(eos) + 1] if eos in out else out


def _hf_logits(ref, prompt, cont):
  """Full-forward logits [len(cont), V] that predict each continuation token."""
  with torch.no_grad():
    logits = ref(torch.tensor([prompt + cont])).logits[0]
  return logits[len(prompt) - 1:len(prompt) - 1 + len(cont)].float()


def _first_end(seq, stops):
  """Hand-computed length after which a row with tokens `seq` stops (len(seq) if never)."""
  for end in range(1, len(seq) + 1):
    if any(end >= len(s) and tuple(seq[end - len(s):end]) == tuple(s) for s in stops):
      return end
  return len(seq)


# --------------------------------------------------------------------------- vs transformers
def test_greedy_matches_transformers(tiny):
  lm, ref, _ = tiny
  prompts = _prompts([2, 11, 17], lm.config.vocab_size)
  gen = generate(lm, prompts, max_new_tokens=N, temperature=0.0, rng=jax.random.PRNGKey(0))
  assert gen.tokens.shape == (3, N) and gen.tokens.dtype == np.int32
  for i, p in enumerate(prompts):
    want = _hf_greedy(ref, p, N)
    assert gen.token_lists()[i] == want, f"row {i} (prompt length {len(p)})"
    assert gen.lengths[i] == len(want)
    assert gen.stopped_by[i] == ("eos" if want[-1] == 2 else "length")
  np.testing.assert_array_equal(gen.logprobs, 0.0)   # greedy: a point mass


@pytest.mark.parametrize("model_type,temperature,top_k,top_p", [
    ("qwen2", 0.7, 0, 1.0), ("qwen2", 1.0, 20, 1.0), ("qwen2", 1.3, 0, 0.85),
    ("qwen2", 0.9, 30, 0.8), ("llama", 0.9, 30, 0.8), ("qwen3", 0.9, 30, 0.8)])
def test_logprobs_match_full_forward(tiny_models, model_type, temperature, top_k, top_p):
  """`logprobs` = log-softmax of the transformers-warped logits of a full forward pass (no cache);
  `model_logprobs` = plain log-softmax, checked against both our and the transformers forward."""
  lm, ref, _ = tiny_models[model_type]
  prompts = _prompts([4, 9, 13], lm.config.vocab_size, seed=1)
  gen = generate(lm, prompts, max_new_tokens=10, temperature=temperature, top_k=top_k,
                 top_p=top_p, eos_ids=(), rng=jax.random.PRNGKey(3))
  assert gen.stopped_by == ["length"] * 3
  warpers = [TemperatureLogitsWarper(temperature)]
  if top_k:
    warpers.append(TopKLogitsWarper(top_k))
  if top_p < 1:
    warpers.append(TopPLogitsWarper(top_p))
  for i, p in enumerate(prompts):
    cont = gen.token_lists()[i]
    full = np.asarray(lm.logits(np.asarray([p + cont])))[0]
    ours = torch.tensor(full[len(p) - 1:len(p) - 1 + len(cont)])  # [n, V], no KV cache
    warped = ours.clone()
    for w in warpers:
      warped = w(None, warped)
    idx = torch.tensor(cont)[:, None]
    want_lp = torch.log_softmax(warped, -1).gather(1, idx)[:, 0].numpy()
    assert np.all(np.isfinite(want_lp)), f"row {i}: sampled a token outside the warped support"
    np.testing.assert_allclose(gen.logprobs[i], want_lp, atol=1e-5, rtol=0)
    want_model = torch.log_softmax(ours, -1).gather(1, idx)[:, 0].numpy()
    np.testing.assert_allclose(gen.model_logprobs[i], want_model, atol=1e-5, rtol=0)
    hf = torch.log_softmax(_hf_logits(ref, p, cont), -1).gather(1, idx)[:, 0].numpy()
    np.testing.assert_allclose(gen.model_logprobs[i], hf, atol=5e-5, rtol=0)


def test_topk1_equals_greedy(tiny_qwen):
  lm, ref, _ = tiny_qwen
  prompts = _prompts([3, 8], lm.config.vocab_size, seed=2)
  greedy = generate(lm, prompts, max_new_tokens=N, temperature=0.0, rng=jax.random.PRNGKey(0))
  top1 = generate(lm, prompts, max_new_tokens=N, temperature=1.0, top_k=1,
                  rng=jax.random.PRNGKey(5))
  np.testing.assert_array_equal(top1.tokens, greedy.tokens)
  np.testing.assert_array_equal(top1.logprobs, 0.0)
  np.testing.assert_allclose(top1.model_logprobs, greedy.model_logprobs, atol=1e-6)


# --------------------------------------------------------------------------- determinism
def test_same_key_same_output_different_key_different(tiny_qwen):
  lm, _, _ = tiny_qwen
  prompts = _prompts([6, 3, 10], lm.config.vocab_size, seed=4)
  kw = dict(max_new_tokens=10, temperature=1.0, top_p=0.95, eos_ids=())
  a = generate(lm, prompts, rng=jax.random.PRNGKey(7), **kw)
  b = generate(lm, prompts, rng=jax.random.PRNGKey(7), **kw)
  c = generate(lm, prompts, rng=jax.random.PRNGKey(8), **kw)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(a.logprobs, b.logprobs)
  assert not np.array_equal(a.tokens, c.tokens)


# --------------------------------------------------------------------------- ending rows
def test_stop_sequence_ends_rows_independently(tiny_qwen):
  lm, ref, _ = tiny_qwen
  prompts = _prompts([5, 9], lm.config.vocab_size, seed=5)
  r0, r1 = (_hf_greedy(ref, p, N, eos=None) for p in prompts)
  # A 2-token stop made of tokens row 0 emits early and row 1 never emits.
  stop = next(tuple(r0[s:s + 2]) for s in range(N - 2) if _first_end(r1, [r0[s:s + 2]]) == N)
  gen = generate(lm, prompts, max_new_tokens=N, temperature=0.0, stop=[list(stop)], eos_ids=(),
                 rng=jax.random.PRNGKey(0))
  n0 = _first_end(r0, [stop])
  assert n0 < N
  assert gen.token_lists() == [r0[:n0], r1]
  assert gen.stopped_by == ["stop", "length"]
  np.testing.assert_array_equal(gen.lengths, [n0, N])
  np.testing.assert_array_equal(gen.mask[0], [1] * n0 + [0] * (N - n0))
  np.testing.assert_array_equal(gen.tokens[0, n0:], 0)               # pad_id after the end
  np.testing.assert_array_equal(gen.logprobs[0, n0:], 0.0)


def test_eos_ends_rows_independently(tiny_qwen):
  lm, ref, _ = tiny_qwen
  prompts = _prompts([5, 9], lm.config.vocab_size, seed=5)
  r0, r1 = (_hf_greedy(ref, p, N, eos=None) for p in prompts)
  eos = next(t for t in r0[1:] if t not in r1)
  gen = generate(lm, prompts, max_new_tokens=N, temperature=0.0, eos_ids=[eos], pad_id=1,
                 rng=jax.random.PRNGKey(0))
  n0 = r0.index(eos) + 1
  assert gen.token_lists() == [r0[:n0], r1]
  assert gen.stopped_by == ["eos", "length"]
  np.testing.assert_array_equal(gen.tokens[0, n0:], 1)


def test_string_stop_is_encoded_with_the_tokenizer(tiny_qwen):
  lm, ref, _ = tiny_qwen
  prompts = _prompts([5, 9], lm.config.vocab_size, seed=5)
  r0, r1 = (_hf_greedy(ref, p, N, eos=None) for p in prompts)
  tok = lm.tokenizer
  # A stretch of row 0 whose text round-trips through the tokenizer and which row 1 lacks.
  for s in range(N - 2):
    text = tok.decode(r0[s:s + 2])
    if tok.encode(text, add_special_tokens=False) == r0[s:s + 2] and \
        _first_end(r1, [r0[s:s + 2]]) == N:
      break
  else:
    pytest.fail("no round-tripping stop string in row 0's greedy continuation")
  gen = generate(lm, prompts, max_new_tokens=N, temperature=0.0, stop=[text], eos_ids=(),
                 rng=jax.random.PRNGKey(0))
  n0 = _first_end(r0, [r0[s:s + 2]])
  assert gen.token_lists() == [r0[:n0], r1]
  assert gen.stopped_by == ["stop", "length"]


def test_per_row_max_new_tokens(tiny_qwen):
  lm, ref, _ = tiny_qwen
  prompts = _prompts([4, 7, 2], lm.config.vocab_size, seed=6)
  gen = generate(lm, prompts, max_new_tokens=N, temperature=0.0, eos_ids=(),
                 max_new_tokens_per_row=[3, 0, 20], rng=jax.random.PRNGKey(0))
  want = [_hf_greedy(ref, p, N, eos=None) for p in prompts]
  assert gen.token_lists() == [want[0][:3], [], want[2]]
  np.testing.assert_array_equal(gen.lengths, [3, 0, N])
  assert gen.stopped_by == ["length"] * 3
  np.testing.assert_array_equal(gen.mask.sum(1), [3, 0, N])


# --------------------------------------------------------------------------- inputs & blocks
def test_array_prompts_with_lengths_and_batch_padding(tiny_qwen):
  lm, _, _ = tiny_qwen
  prompts = _prompts([3, 7, 5], lm.config.vocab_size, seed=7)
  arr = np.zeros((3, 9), np.int64)
  for i, p in enumerate(prompts):
    arr[i, :len(p)] = p
  kw = dict(max_new_tokens=6, temperature=0.0, rng=jax.random.PRNGKey(0))
  a = generate(lm, prompts, **kw)
  b = generate(lm, arr, prompt_lengths=[3, 7, 5], batch_multiple=4, **kw)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_allclose(a.model_logprobs, b.model_logprobs, atol=1e-5)
  assert b.tokens.shape == (3, 6)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_group_shared_prefill_matches_per_sample_prefill(tiny_qwen, temperature):
  # G samples of each prompt from one prefill (KV rows forked) against G prefills of copies.
  lm, _, _ = tiny_qwen
  prompts = _prompts([6, 3, 9], lm.config.vocab_size, seed=11)
  kw = dict(max_new_tokens=8, temperature=temperature, rng=jax.random.PRNGKey(5), eos_ids=(2,))
  shared = generate_with_params(lm.config, lm.params, prompts, group_size=4, **kw)
  copies = generate_with_params(lm.config, lm.params, [p for p in prompts for _ in range(4)],
                                **kw)
  assert shared.tokens.shape == copies.tokens.shape == (12, 8)
  np.testing.assert_array_equal(shared.tokens, copies.tokens)
  np.testing.assert_array_equal(shared.lengths, copies.lengths)
  np.testing.assert_allclose(shared.model_logprobs, copies.model_logprobs, atol=1e-5)
  if temperature > 0:        # the G samples of one prompt differ (different rows, one key)
    assert len({tuple(r) for r in shared.tokens[:4]}) > 1
  # Dummy padding prompts fork too, and their rows are dropped.
  padded = generate_with_params(lm.config, lm.params, prompts, group_size=4, batch_multiple=4,
                                **kw)
  np.testing.assert_array_equal(padded.tokens, shared.tokens)
  with pytest.raises(ValueError, match="group_size must be a positive integer"):
    generate_with_params(lm.config, lm.params, prompts, group_size=0, **kw)


def test_prefill_and_decode_blocks_match_generate(tiny_qwen):
  lm, ref, _ = tiny_qwen
  cfg = lm.config
  prompts = _prompts([6, 2], cfg.vocab_size, seed=8)
  ids, mask = left_pad(prompts)
  cache = init_cache(cfg, 2, ids.shape[1] + 8)
  logits, cache = prefill(cfg, lm.params, ids, mask, cache)
  toks = []
  for _ in range(5):
    tok = jnp.argmax(logits, -1).astype(jnp.int32)
    toks.append(np.asarray(tok))
    logits, cache = decode(cfg, lm.params, tok, jnp.ones((2,), bool), cache)
  toks = np.stack(toks, 1)
  for i, p in enumerate(prompts):
    assert toks[i].tolist() == _hf_greedy(ref, p, 5, eos=None)
  for packed in (True, False):   # the loop's packed decode step and DecoderLM.apply
    gen = generate_with_params(cfg, lm.params, prompts, max_new_tokens=5, temperature=0.0,
                               eos_ids=(), rng=0, packed_decode=packed)
    np.testing.assert_array_equal(gen.tokens, toks)


def test_bucket_length_and_left_pad():
  assert [bucket_length(n) for n in (1, 16, 17, 33, 100, 129, 1000)] == \
      [16, 16, 32, 48, 112, 144, 1024]
  for n in range(1, 3000, 7):
    b = bucket_length(n)
    assert n <= b <= max(n + 15, n * 1.125) and b % 16 == 0
  ids, mask = left_pad([[5, 6], [7]], pad_id=9)
  assert ids.shape == (2, 16)
  assert ids[0, -2:].tolist() == [5, 6] and ids[1, -1] == 7 and ids[1, 0] == 9
  assert mask.sum(1).tolist() == [2, 1]


def test_bad_inputs_raise_clear_errors(tiny_qwen):
  lm, _, _ = tiny_qwen
  with pytest.raises(ValueError, match="prompt 1 is empty"):
    generate(lm, [[3, 4], []], max_new_tokens=2, rng=0)
  with pytest.raises(ValueError, match="temperature"):
    generate(lm, [[3]], max_new_tokens=2, temperature=-1, rng=0)
  with pytest.raises(ValueError, match="top_p"):
    generate(lm, [[3]], max_new_tokens=2, top_p=0, rng=0)
  with pytest.raises(ValueError, match="max_new_tokens_per_row has 1 entries for 2"):
    generate(lm, [[3], [4]], max_new_tokens=2, max_new_tokens_per_row=[1], rng=0)


# --------------------------------------------------------------------------- the draw itself
# vocab 40: one-level draw; 300: two-level (blocked, padded to 384) draw.
@pytest.mark.parametrize("vocab,top_k,top_p", [
    (40, 0, 1.0), (40, 8, 0.6), (300, 0, 1.0), (300, 0, 0.7), (300, 5, 1.0)])
def test_draw_frequencies_match_the_warped_distribution(vocab, top_k, top_p):
  rng = np.random.default_rng(vocab + top_k)
  logits = np.full((vocab,), -6.0, np.float32)
  hot = rng.choice(vocab, 12, replace=False)
  logits[hot] = rng.normal(0, 1.0, 12).astype(np.float32)
  temperature = 0.8
  # Hand-computed warped distribution: temperature, top-k, then top-p (numpy sort).
  z = logits.astype(np.float64) / temperature
  order = np.argsort(-z, kind="stable")
  keep = np.zeros(vocab, bool)
  keep[order[:top_k or vocab]] = True
  pz = np.where(keep, np.exp(z - z.max()), 0)
  pz /= pz.sum()
  if top_p < 1:
    sorted_p = pz[order]
    ahead = np.cumsum(sorted_p) - sorted_p
    keep2 = np.zeros(vocab, bool)
    keep2[order[ahead < top_p]] = True
    pz = np.where(keep & keep2, pz, 0)
    pz /= pz.sum()
  mode = SamplingMode(False, top_k, top_p < 1)
  n = 20000
  keys = jax.random.split(jax.random.PRNGKey(0), n // 100)
  batch = jnp.broadcast_to(jnp.asarray(logits), (100, vocab))
  draw = jax.jit(jax.vmap(lambda k: sample_logits(batch, k, temperature, top_p, mode=mode)))
  tok, lp, _ = draw(keys)
  tok = np.asarray(tok).reshape(-1)
  freq = np.bincount(tok, minlength=vocab) / tok.size
  assert freq[pz == 0].sum() == 0, "drew a token outside the warped support"
  np.testing.assert_allclose(freq, pz, atol=0.012)
  np.testing.assert_allclose(np.asarray(lp).reshape(-1), np.log(pz[tok]), atol=1e-5)


# --------------------------------------------------------------------------- top-p, no top-k
def _nucleus_reference(z, top_p):
  """numpy, float64: keep z >= the logit of the first token (sorted descending) at which the
  mass so far reaches top_p (the mass ahead of each kept token < top_p; ties kept together)."""
  z = np.asarray(z, np.float64)
  e = np.exp(z - z.max())
  order = np.argsort(-z, kind="stable")
  cum = np.cumsum(e[order])
  i = int(np.argmax(cum >= top_p * e.sum()))
  return z >= z[order[i]]


def _top_p_for(z, n):
  """A top_p whose nucleus ends at sorted position n, half a token's mass from either edge."""
  z = np.asarray(z, np.float64)
  e = np.sort(np.exp(z - z.max()))[::-1]
  cum = np.cumsum(e)
  return float((cum[n - 1] + 0.5 * e[n]) / cum[-1])


def _rows():
  """Logit rows whose nucleus lies within the 256 candidates or not, with and without ties."""
  rng = np.random.default_rng(7)
  v = 5000
  peaked = rng.normal(0, 4, v)
  flat = rng.normal(0, 0.1, v)
  integer = np.round(rng.normal(0, 2, v))              # ties everywhere, also at the 256th
  hot = np.full(v, -10.0)
  hot[rng.choice(v, 60, replace=False)] = rng.choice([3.0, 2.0, 1.0], 60)   # tied candidates
  rows = [(peaked, 1), (peaked, 10), (peaked, 120), (flat, 3000), (integer, 40),
          (integer, 2000), (hot, 5), (hot, 30), (hot, 59)]
  return [(r.astype(np.float32), _top_p_for(r.astype(np.float32), n)) for r, n in rows]


def test_top_p_keeps_exactly_the_nucleus_of_a_numpy_reference():
  """Row by row and as one batch (some rows' nucleus within the candidates, some not: the
  batch falls back for those only), the kept set equals the reference's, ties included."""
  rows = _rows()
  mask = jax.jit(sampler._nucleus_mask)
  for z, p in rows:
    zj = jnp.asarray(z)[None]
    keep = np.asarray(mask(zj, jnp.exp(zj - zj.max()), jnp.float32(p)))[0]
    assert np.array_equal(keep, _nucleus_reference(z, p)), (p, keep.sum())
  zs = jnp.asarray(np.stack([z for z, _ in rows]))
  ps = jnp.asarray([[p] for _, p in rows], jnp.float32)
  keep = np.asarray(mask(zs, jnp.exp(zs - zs.max(-1, keepdims=True)), ps))
  want = np.stack([_nucleus_reference(z, p) for z, p in rows])
  assert np.array_equal(keep, want)


def test_top_p_candidates_decide_small_nuclei_and_defer_the_rest():
  """The one-pass candidate threshold is found (and is the bisection's) where the nucleus lies
  above the 256th largest logit, deferred where it reaches past it or ties with it."""
  rows = _rows()
  zs = jnp.asarray(np.stack([z for z, _ in rows]))
  m = zs.max(-1, keepdims=True)
  e = jnp.exp(zs - m)
  target = jnp.asarray([[p] for _, p in rows], jnp.float32) * e.sum(-1, keepdims=True)
  thr, found = sampler._nucleus_candidates(zs, target, m)
  bis = sampler._nucleus_bisect(zs, e, target)
  found = np.asarray(found)
  assert found.tolist() == [True, True, True, False, True, False, True, True, True]
  assert np.array_equal(np.asarray(thr)[found], np.asarray(bis)[found])
  small = jnp.asarray(rows[-1][0][:200])[None]     # vocab <= 256: every logit a candidate
  tgt = 0.5 * jnp.exp(small - small.max()).sum(-1, keepdims=True)
  assert bool(sampler._nucleus_candidates(small, tgt, small.max(-1, keepdims=True))[1][0])


def test_top_p_draws_stay_in_the_nucleus_with_its_renormalised_logprobs():
  """sample_logits with top_p alone: every draw in the reference nucleus, its log-prob the
  nucleus-renormalised one (a peaked row decided by the candidates, a flat one by the
  bisection)."""
  rows = _rows()
  mode = SamplingMode(False, 0, True)
  for z, p in (rows[1], rows[3], rows[7]):
    keep = _nucleus_reference(z, p)
    zz = z.astype(np.float64)
    lp_ref = zz - zz.max() - np.log(np.exp(zz[keep] - zz.max()).sum())
    batch = jnp.broadcast_to(jnp.asarray(z), (64, z.size))
    tok, lp, _ = sample_logits(batch, jax.random.PRNGKey(1), 1.0, p, mode=mode)
    tok = np.asarray(tok)
    assert keep[tok].all()
    np.testing.assert_allclose(np.asarray(lp), lp_ref[tok], atol=2e-5)
