"""Advantage estimators against plain numpy references; groups named by an index, as the
engine's group ids name them."""
import numpy as np
import pytest

from rlrag_jax import rl


def _np_group(rewards, g, scale_std, eps):
  out = []
  for grp in np.asarray(rewards, np.float64).reshape(-1, g):
    a = grp - grp.mean()
    if scale_std:
      a = a / ((grp.std(ddof=1) if g > 1 else 0.0) + eps)
    out.append(a)
  return np.concatenate(out)


@pytest.mark.parametrize("scale_std", [True, False])
def test_group_advantages(scale_std):
  rng = np.random.default_rng(0)
  r = np.concatenate([rng.normal(size=8), [1.0, 1.0, 1.0, 1.0], rng.integers(0, 2, 4)])
  got = np.asarray(rl.group_advantages(r, np.repeat(np.arange(4), 4), scale_std=scale_std))
  np.testing.assert_allclose(got, _np_group(r, 4, scale_std, 1e-4), rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(got[8:12], 0.0)     # a zero-spread group has no signal


def test_group_advantages_hand():
  # group [0, 1, 0, 1]: mean 0.5, sample std sqrt(1/3).
  got = np.asarray(rl.group_advantages(np.array([0.0, 1.0, 0.0, 1.0]), [0] * 4, eps=0.0))
  np.testing.assert_allclose(got, np.array([-1, 1, -1, 1]) * 0.5 / np.sqrt(1 / 3), rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(rl.group_advantages(np.array([3.0, 5.0]), [0, 1])),
                                0.0)
  with pytest.raises(ValueError, match="must both be \\[N\\]"):
    rl.group_advantages(np.zeros(8), [0] * 3)


def test_registry_and_rloo():
  r = np.array([1.0, 0.0, 0.0, 2.0, 5.0, 5.0])
  index = [0, 0, 0, 1, 1, 1]
  np.testing.assert_allclose(np.asarray(rl.ADVANTAGE_ESTIMATORS["rloo"](r, index)),
                             [1 - 0.0, 0 - 0.5, 0 - 0.5, 2 - 5, 5 - 3.5, 5 - 3.5], atol=1e-6)
  np.testing.assert_allclose(np.asarray(rl.ADVANTAGE_ESTIMATORS["dr_grpo"](r, index)),
                             _np_group(r, 3, False, 0.0), atol=1e-6)
  np.testing.assert_allclose(np.asarray(rl.ADVANTAGE_ESTIMATORS["grpo"](r, index)),
                             _np_group(r, 3, True, 1e-4), rtol=1e-5)
  # RLOO over groups of sizes 2, 1 and 3 interleaved: leave-one-out means by hand; alone -> 0.
  r = np.array([1.0, 7.0, 3.0, 0.0, 2.0, 4.0])
  got = np.asarray(rl.rloo_advantages(r, ["p", "q", "r", "p", "r", "r"]))
  np.testing.assert_allclose(got, [1 - 0, 0.0, 3 - 3, 0 - 1, 2 - 3.5, 4 - 2.5], atol=1e-6)


def test_equal_groups_give_the_fixed_size_float32_results_exactly():
  """Groups of one size named by ids reproduce, bit for bit, the reshape to [K, G] that the
  estimators did before they took ids (the shipped presets' shapes: 8 x 8, ARENA ':paper'
  256 x 7, the search agent's 32 x 32)."""
  import jax.numpy as jnp
  rng = np.random.default_rng(3)
  for k, g in ((8, 8), (256, 7), (32, 32), (4, 3)):
    r = rng.normal(size=k * g).astype(np.float32)
    index = np.repeat(np.arange(k), g)
    grid = jnp.asarray(r).reshape(k, g)
    c = grid - jnp.mean(grid, axis=1, keepdims=True)
    std = jnp.sqrt(jnp.sum(c * c, axis=1, keepdims=True) / (g - 1))
    np.testing.assert_array_equal(np.asarray(rl.group_advantages(r, index)),
                                  np.asarray((c / (std + 1e-4)).reshape(-1)))
    np.testing.assert_array_equal(np.asarray(rl.group_advantages(r, index, scale_std=False)),
                                  np.asarray(c.reshape(-1)))
    others = (jnp.sum(grid, axis=1, keepdims=True) - grid) / (g - 1)
    np.testing.assert_array_equal(np.asarray(rl.rloo_advantages(r, index)),
                                  np.asarray((grid - others).reshape(-1)))


def _np_gae(rewards, values, mask, gamma, lam):
  """Reference: compress each row to its policy tokens, run textbook GAE, scatter back."""
  adv = np.zeros_like(rewards, np.float64)
  for b in range(rewards.shape[0]):
    idx = np.nonzero(mask[b])[0]
    r, v = rewards[b, idx].astype(np.float64), values[b, idx].astype(np.float64)
    n = len(idx)
    a = np.zeros(n)
    for t in range(n):                     # the forward-sum definition, not a recursion
      for l in range(t, n):
        v_next = v[l + 1] if l + 1 < n else 0.0
        delta = r[l] + gamma * v_next - v[l]
        a[t] += (gamma * lam) ** (l - t) * delta
    adv[b, idx] = a
  return adv, (adv + values) * mask


def test_gae_against_reference():
  rng = np.random.default_rng(1)
  b, t = 3, 9
  mask = np.zeros((b, t), np.float32)
  mask[0, 3:] = 1                                   # prompt then completion
  mask[1, [2, 3, 6, 7, 8]] = 1                      # retrieved text at 4-5 is not the policy's
  mask[2, 8] = 1                                    # a single token
  rewards = rng.normal(size=(b, t)).astype(np.float32) * mask
  values = rng.normal(size=(b, t)).astype(np.float32)
  for gamma, lam in [(1.0, 0.95), (0.9, 0.5), (1.0, 1.0)]:
    adv, ret = rl.gae(rewards, values, mask, gamma, lam)
    want_adv, want_ret = _np_gae(rewards, values, mask, gamma, lam)
    np.testing.assert_allclose(np.asarray(adv), want_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ret), want_ret, rtol=1e-5, atol=1e-5)


def test_gae_lambda_one_is_return_minus_value():
  # gamma = lam = 1, reward only at the end: A_t = R - V_t on every policy token.
  mask = np.array([[0, 1, 1, 1]], np.float32)
  rewards = np.array([[0, 0, 0, 2.0]], np.float32)
  values = np.array([[9.0, 0.5, 1.0, 1.5]], np.float32)
  adv, ret = rl.gae(rewards, values, mask, 1.0, 1.0)
  np.testing.assert_allclose(np.asarray(adv), [[0, 1.5, 1.0, 0.5]], atol=1e-6)
  np.testing.assert_allclose(np.asarray(ret), [[0, 2.0, 2.0, 2.0]], atol=1e-6)


def test_masked_whiten():
  x = np.array([[1.0, 2.0, 100.0], [3.0, 4.0, -50.0]], np.float32)
  m = np.array([[1, 1, 0], [1, 1, 0]], np.float32)
  got = np.asarray(rl.masked_whiten(x, m))
  v = np.array([1.0, 2.0, 3.0, 4.0])
  want = (v - v.mean()) / np.sqrt(v.var() + 1e-8)
  np.testing.assert_allclose(got[m > 0], want, rtol=1e-5)
  np.testing.assert_array_equal(got[m == 0], 0.0)


def test_group_advantages_of_uneven_interleaved_groups_by_hand():
  # Groups of sizes 3, 1 and 2, interleaved: 'a' = [1, 2, 6], 'b' = [5], 'c' = [0, 4].
  r = np.array([1.0, 5.0, 0.0, 2.0, 4.0, 6.0], np.float32)
  keys = ["a", "b", "c", "a", "c", "a"]
  # a: mean 3, sample std sqrt((4 + 1 + 9) / 2) = sqrt(7); c: mean 2, std sqrt(8); b: alone -> 0.
  s7, s8 = np.sqrt(7.0), np.sqrt(8.0)
  want = [-2 / (s7 + 1e-4), 0.0, -2 / (s8 + 1e-4), -1 / (s7 + 1e-4), 2 / (s8 + 1e-4),
          3 / (s7 + 1e-4)]
  np.testing.assert_allclose(np.asarray(rl.group_advantages(r, keys)), want, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(rl.group_advantages(r, keys, scale_std=False)),
                             [-2, 0, -2, -1, 2, 3], atol=1e-6)
  # Equal consecutive groups under any names: the per-group reference.
  np.testing.assert_allclose(np.asarray(rl.group_advantages(r, [9, 9, 3, 3, 5, 5])),
                             _np_group(r, 2, True, 1e-4), rtol=1e-5)
