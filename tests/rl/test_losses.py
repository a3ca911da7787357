"""Policy / value / SFT losses and aggregation modes against hand-computed values."""
import jax.numpy as jnp
import numpy as np
import pytest

from rlrag_jax import rl

# Two sequences plus a padding row. Ratios r = exp(logp - old_logp) are set directly.
RATIO = np.array([[1.0, 1.5, 0.5],
                  [0.7, 1.3, 2.0],
                  [3.0, 3.0, 3.0]], np.float32)
ADV = np.array([1.0, -1.0, 5.0], np.float32)
MASK = np.array([[1, 1, 1],
                 [1, 1, 0],
                 [0, 0, 0]], np.float32)
LOGP = np.log(RATIO)
OLD = np.zeros_like(LOGP)

# Per-token losses worked out by hand (rows 0 and 1; row 2 is masked out).
#   A = +1: max(-r, -clip(r))      A = -1: max(r, clip(r))
PPO_02 = [[-1.0, -1.2, -0.5], [0.8, 1.3, 2.0]]         # eps 0.2
CLIP_HIGHER = [[-1.0, -1.28, -0.5], [0.8, 1.3, 2.0]]   # eps_low 0.2, eps_high 0.28
DUAL_15 = [[-1.0, -1.2, -0.5], [0.8, 1.3, 1.5]]        # eps 0.2, dual clip c = 1.5


@pytest.mark.parametrize("kw,want", [
    (dict(eps_low=0.2), PPO_02),
    (dict(eps_low=0.2, eps_high=0.28), CLIP_HIGHER),
    (dict(eps_low=0.2, dual_clip=1.5), DUAL_15),
])
def test_token_losses(kw, want):
  tok, info = rl.ppo_token_loss(LOGP, OLD, ADV, **kw)
  np.testing.assert_allclose(np.asarray(tok)[:2], want, rtol=1e-6, atol=1e-6)
  # Clipping is active at (row 0, r = 1.5, A > 0) and (row 1, r = 0.7, A < 0) only.
  np.testing.assert_array_equal(np.asarray(info["clipped_high"])[:2], [[0, 1, 0], [0, 0, 0]])
  np.testing.assert_array_equal(np.asarray(info["clipped_low"])[:2], [[0, 0, 0], [1, 0, 0]])
  dual = [[0, 0, 0], [0, 0, 1]] if "dual_clip" in kw else [[0, 0, 0], [0, 0, 0]]
  np.testing.assert_array_equal(np.asarray(info["dual_clipped"])[:2], dual)


def test_token_advantages_broadcast():
  per_token = np.repeat(ADV[:, None], 3, axis=1)
  a, _ = rl.ppo_token_loss(LOGP, OLD, ADV)
  b, _ = rl.ppo_token_loss(LOGP, OLD, per_token)
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# PPO_02 over MASK: row 0 sums to -2.7 over 3 tokens, row 1 to 2.1 over 2 tokens.
@pytest.mark.parametrize("mode,max_len,want", [
    ("token_mean", None, (-2.7 + 2.1) / 5),           # -0.12
    ("sequence_mean", None, (-2.7 / 3 + 2.1 / 2) / 2),  # 0.075
    ("constant", 4, (-2.7 + 2.1) / (2 * 4)),          # -0.075
])
def test_aggregation_modes(mode, max_len, want):
  loss, metrics = rl.policy_loss(LOGP, OLD, ADV, MASK, eps_low=0.2, aggregation=mode,
                                 max_len=max_len)
  assert float(loss) == pytest.approx(want, abs=1e-6)
  assert float(metrics["clip_frac"]) == pytest.approx(2 / 5)
  num, den = rl.aggregation_terms(jnp.asarray(PPO_02 + [[9.0, 9.0, 9.0]]), MASK, mode, max_len)
  assert float(num / den) == pytest.approx(want, abs=1e-6)
  assert set(rl.AGGREGATIONS) == {"sequence_mean", "token_mean", "constant"}


def test_aggregation_errors():
  with pytest.raises(ValueError, match="max_completion_len"):
    rl.aggregate(jnp.ones((1, 2)), jnp.ones((1, 2)), "constant")
  with pytest.raises(ValueError, match="loss.aggregation"):
    rl.aggregate(jnp.ones((1, 2)), jnp.ones((1, 2)), "mean")
  assert float(rl.aggregate(jnp.ones((1, 2)), jnp.zeros((1, 2)), "token_mean")) == 0.0


def test_kl_loss_term():
  ref = LOGP - 0.5                       # k1 = logp - ref = 0.5 on every token
  loss, metrics = rl.policy_loss(LOGP, OLD, ADV, MASK, aggregation="token_mean", ref_logp=ref,
                                 beta=0.1, kl_estimator="k1")
  assert float(loss) == pytest.approx(-0.12 + 0.1 * 0.5, abs=1e-6)
  assert float(metrics["kl"]) == pytest.approx(0.5, abs=1e-6)
  with pytest.raises(ValueError, match="ref_logp"):
    rl.policy_loss(LOGP, OLD, ADV, MASK, beta=0.1)


def test_kl_penalty_rewards():
  mask = np.array([[0, 1, 1, 0], [1, 1, 1, 1]], np.float32)
  logp = np.array([[0.0, -1.0, -2.0, 0.0], [-1.0, -1.0, -1.0, -1.0]], np.float32)
  ref = logp - np.array([[0.0, 0.1, 0.2, 0.0], [0.0, 0.0, 0.0, 0.4]], np.float32)
  got = rl.kl_penalty_rewards(np.array([1.0, -2.0]), logp, ref, mask, beta=0.5, estimator="k1")
  want = [[0.0, -0.05, 1.0 - 0.1, 0.0], [0.0, 0.0, 0.0, -2.0 - 0.2]]
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-6)


def test_value_loss_hand():
  values = np.array([[1.0, 2.0, 0.0]], np.float32)
  old = np.array([[0.5, 2.5, 0.0]], np.float32)
  returns = np.array([[2.0, 2.0, 1.0]], np.float32)
  mask = np.ones((1, 3), np.float32)
  # t0: V_clip = 0.7 -> 0.5 * 1.69; t1: V_clip = 2.3 -> 0.5 * 0.09; t2: 0.5 * 1.
  loss, metrics = rl.value_loss(values, old, returns, mask, clip_eps=0.2)
  assert float(loss) == pytest.approx((0.845 + 0.045 + 0.5) / 3, abs=1e-6)
  assert float(metrics["vf_clip_frac"]) == pytest.approx(2 / 3)
  plain, _ = rl.value_loss(values, old, returns, mask, clip_eps=None)
  assert float(plain) == pytest.approx((0.5 + 0.0 + 0.5) / 3, abs=1e-6)


def test_sft_loss():
  logp = np.log(np.array([[1.0, 0.5, 0.25, 0.1]], np.float32))
  mask = np.array([[0, 1, 1, 0]], np.float32)
  assert float(rl.sft_loss(logp, mask)) == pytest.approx((np.log(2) + np.log(4)) / 2, rel=1e-6)
