"""KV reuse across calls (`sampling.CachedContexts`, `run_tool_loop(kv_reuse=True)`): the same
tokens and log-probs as re-prefilling the whole contexts, far fewer prefilled tokens."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlrag_jax.bench import trained_tiny
from rlrag_jax.bench.rollout import FixedEnv, IdTokenizer
from rlrag_jax.rollout import run_tool_loop
from rlrag_jax.rollout.policy import Policy
from rlrag_jax.sampling import CachedContexts, generate_with_params
from rlrag_jax.sampling.sampler import relayout_cache

VOCAB, STOP_EVERY = 256, 8
STOPS = [[s] for s in range(STOP_EVERY, VOCAB, STOP_EVERY)]


@pytest.fixture(scope="module")
def trained():
  """x[t+1] = x[t-1], learnt in a few seconds: the next token needs the cached previous one."""
  cfg, params, loss = trained_tiny.train(vocab=VOCAB, steps=300, length=128, batch_size=16,
                                         lr=1e-2, num_layers=1)
  assert loss < 0.2, loss
  return cfg, params


def _prompts(lengths, seed=0):
  rng = np.random.default_rng(seed)
  return [[int(t) + (int(t) % STOP_EVERY == 0) for t in rng.integers(3, VOCAB - 1, n)]
          for n in lengths]


def test_the_trained_model_follows_its_rule(trained):
  cfg, params = trained
  prompts = _prompts([20, 45, 70])
  gen = generate_with_params(cfg, params, prompts, max_new_tokens=6, temperature=0.0, rng=0)
  for p, toks in zip(prompts, gen.tokens):
    assert toks.tolist() == [p[-2], p[-1]] * 3


def test_relayout_packs_real_slots_in_order_and_forks_rows():
  """A cache with holes: each chosen row's real slots move, in order, to end at the write index
  (the longest row's count); a repeated row is an exact copy."""
  s, length = 6, 8
  mask = jnp.asarray([[0, 1, 0, 1, 1, 0], [1, 1, 0, 0, 0, 1]], bool)
  k = jnp.arange(2 * s, dtype=jnp.float32).reshape(2, s, 1, 1) + 100
  cache = {"layers": ({"k": k, "v": -k},), "mask": mask, "index": jnp.int32(6)}
  out = relayout_cache(cache, jnp.asarray([1, 0, 1]), length)
  assert int(out["index"]) == 3                          # both rows hold 3 real slots
  want_k = [[106, 107, 111], [101, 103, 104], [106, 107, 111]]
  for r in range(3):
    got = np.asarray(out["layers"][0]["k"])[r, :3, 0, 0]
    assert got.tolist() == want_k[r]
    assert np.asarray(out["layers"][0]["v"])[r, :3, 0, 0].tolist() == [-x for x in want_k[r]]
    assert np.asarray(out["mask"])[r].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]
  short = {"layers": ({"k": k, "v": k},), "mask": mask.at[0, 1].set(False), "index": 6}
  out = relayout_cache(short, jnp.asarray([0, 1]), length)
  assert int(out["index"]) == 3                          # row 0 (2 real) is left-padded
  assert np.asarray(out["mask"])[0].tolist() == [0, 1, 1, 0, 0, 0, 0, 0]
  assert np.asarray(out["layers"][0]["k"])[0, 1:3, 0, 0].tolist() == [103, 104]


@pytest.mark.parametrize("greedy", [True, False])
def test_extend_equals_generating_from_the_whole_context(trained, greedy):
  """start -> extend with rows skipped, forked and given chunks of different lengths: the tokens
  and model log-probs of every call equal a fresh generate over each full context."""
  cfg, params = trained
  ctx = CachedContexts(cfg, params, temperature=1.0, eos_ids=(), chunk_bucket=16)
  prompts = _prompts([30, 55, 12], seed=1)
  contexts = [list(p) for p in prompts]
  gen = ctx.start(prompts, jax.random.PRNGKey(0), max_new_tokens=9, greedy=greedy, stop=STOPS)
  parents_seq = [[2, 0, 0, 1], [3, 1, 1], [0, 2, 1, 2, 0]]
  fed = sum(map(len, prompts))
  rng = np.random.default_rng(2)
  for call, parents in enumerate(parents_seq):
    for j, c in enumerate(contexts):
      contexts[j] = c + gen.tokens[j, :gen.lengths[j]].tolist()
    chunks = [_prompts([int(rng.integers(0, 21))], seed=10 * call + j)[0]
              for j in range(len(parents))]
    chunks[0] = chunks[0] or [5]
    contexts = [contexts[p] + ch for p, ch in zip(parents, chunks)]
    key = jax.random.PRNGKey(call + 1)
    gen = ctx.extend(parents, chunks, key, max_new_tokens=9, greedy=greedy, stop=STOPS)
    fed += len(parents) + sum(map(len, chunks))      # each row's pending token, then its chunk
    ref = generate_with_params(cfg, params, contexts, max_new_tokens=9,
                               temperature=0.0 if greedy else 1.0, rng=key, stop=STOPS,
                               eos_ids=())
    np.testing.assert_array_equal(gen.tokens, ref.tokens)
    np.testing.assert_array_equal(gen.lengths, ref.lengths)
    np.testing.assert_allclose(gen.model_logprobs, ref.model_logprobs, atol=2e-4)
    # the host's count of cached slots is the cache's own
    real = np.asarray(ctx.cache["mask"]).sum(1)[:len(parents)]
    np.testing.assert_array_equal(real, [len(c) + n - 1 for c, n in zip(contexts, gen.lengths)])
  assert ctx.prefill_tokens == fed


def test_prime_then_forked_branches_equal_whole_contexts(trained):
  """Tree roots cached without generating, then forked into forced branches: each branch's
  continuation equals generating from its whole context; the roots were prefilled once."""
  cfg, params = trained
  roots = _prompts([33, 17], seed=4)
  ctx = CachedContexts(cfg, params, eos_ids=())
  ctx.prime(roots)
  assert ctx.prefill_tokens == 33 + 17 - 2
  parents, forced = [0, 0, 1, 1], [[11], [13, 21], [11], [13, 21]]
  gen = ctx.extend(parents, forced, 0, max_new_tokens=5, greedy=True)
  whole = [roots[p] + f for p, f in zip(parents, forced)]
  ref = generate_with_params(cfg, params, whole, max_new_tokens=5, temperature=0.0, rng=0,
                             eos_ids=())
  np.testing.assert_array_equal(gen.tokens, ref.tokens)
  np.testing.assert_allclose(gen.model_logprobs, ref.model_logprobs, atol=2e-4)
  assert ctx.prefill_tokens == 48 + 4 + 6        # roots once; per branch its pending + forced
  with pytest.raises(ValueError, match=">= 2 tokens"):
    ctx.prime([[5]])


def test_extend_rejects_bad_rows(trained):
  cfg, params = trained
  ctx = CachedContexts(cfg, params, eos_ids=())
  with pytest.raises(RuntimeError, match="start"):
    ctx.extend([0], [[3]], 0, max_new_tokens=2)
  ctx.start(_prompts([5, 6]), 0, max_new_tokens=2)
  with pytest.raises(ValueError, match=r"parent rows \[2\]"):
    ctx.extend([2], [[3]], 0, max_new_tokens=2)
  with pytest.raises(ValueError, match="1 chunks for 2 rows"):
    ctx.extend([0, 1], [[3]], 0, max_new_tokens=2)


class CountingPolicy(Policy):
  """A Policy that counts the prompt tokens it is asked to prefill on the re-prefill path."""
  prefilled = 0

  def sample(self, prompt_ids, rng, **kw):
    self.prefilled += sum(len(p) for p in prompt_ids)
    return super().sample(prompt_ids, rng, **kw)


@pytest.mark.parametrize("greedy", [True, False])
def test_tool_loop_with_kv_reuse_equals_reprefill(trained, greedy):
  """Groups of 4 identical prompts, up to 3 tool calls: kv_reuse gives the same completions, loss
  masks, turns and finish reasons as the re-prefill path, and prefills no whole context."""
  cfg, params = trained
  g, obs = 4, FixedEnv(12)
  tok = IdTokenizer(VOCAB, STOP_EVERY)
  call = tok([obs.text])["input_ids"][0][-1]   # the model repeats the observation's last two
  # tokens, so a turn after an observation ends at `call`; prompts ending in it call at once
  prompts = [p for p in _prompts([40, 21, 66], seed=3) for _ in range(g)]
  prompts = [p + [call] if r // g != 1 else p for r, p in enumerate(prompts)]
  out, policies = {}, {}
  for kv in (False, True):
    policies[kv] = CountingPolicy(cfg, params, max_new_tokens=10, eos_ids=(), pad_id=0)
    out[kv] = run_tool_loop(policies[kv], prompts, obs, rng=jax.random.PRNGKey(4),
                            tokenizer=tok, max_turns=3, max_obs_tokens=12, max_total_len=200,
                            stop=[[call]], greedy=greedy, group_size=g, kv_reuse=kv,
                            min_batch=4, context_bucket=16)
  a, b = out[False], out[True]
  assert a.completion_ids == b.completion_ids and a.loss_mask == b.loss_mask
  assert a.finish_reason == b.finish_reason and a.num_tool_calls == b.num_tool_calls
  assert [[t.generated for t in r] for r in a.turns] == [[t.generated for t in r] for r in b.turns]
  assert policies[True].prefilled == 0                   # no re-prefill at all
  assert policies[False].prefilled > 0
  if greedy:   # the model used its context: x[t+1] = x[t-1] on (nearly) every policy token
    assert a.num_tool_calls == [3] * 4 + [0] * 4 + [3] * 4
    held = [(p + c)[len(p) + k] == (p + c)[len(p) + k - 2]
            for p, c, mask in zip(prompts, a.completion_ids, a.loss_mask)
            for k, m in enumerate(mask) if m]
    assert np.mean(held) > 0.9, np.mean(held)


def test_tool_loop_group_size_needs_identical_runs(trained):
  cfg, params = trained
  pol = Policy(cfg, params, max_new_tokens=4, eos_ids=())
  with pytest.raises(ValueError, match="runs of 2 identical rows"):
    run_tool_loop(pol, _prompts([5, 6]), FixedEnv(3), rng=jax.random.PRNGKey(0),
                  tokenizer=IdTokenizer(VOCAB, STOP_EVERY), max_turns=1, max_obs_tokens=3,
                  max_total_len=50, group_size=2)
