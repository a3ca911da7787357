"""KL estimators against the exact KL on small categorical distributions, by sampling.

Notation: pi = softmax(theta) (the policy, whose logits we differentiate), pi_ref = softmax(phi)
(fixed), r(x) = pi_ref(x) / pi(x). Exact KL(pi || pi_ref) = sum_x pi(x) log(pi(x) / pi_ref(x)).
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlrag_jax import rl

K = 6          # categories
N = 200_000    # samples
Z = 6.0        # tolerance in standard errors


def _dists(seed=0, scale=1.5):
  rng = np.random.default_rng(seed)
  theta = jnp.asarray(rng.normal(size=K) * scale, jnp.float32)
  phi = jnp.asarray(rng.normal(size=K) * scale, jnp.float32)
  return theta, phi


def _exact_kl(theta, phi):
  """KL(softmax(theta) || softmax(phi)) by enumeration, in float64 numpy."""
  lp = np.asarray(jax.nn.log_softmax(theta.astype(jnp.float32)), np.float64)
  lq = np.asarray(jax.nn.log_softmax(phi.astype(jnp.float32)), np.float64)
  return float(np.sum(np.exp(lp) * (lp - lq)))


def _samples(theta, seed=1):
  """N draws from softmax(theta) (numpy, fixed seed)."""
  p = np.asarray(jax.nn.softmax(theta), np.float64)
  return jnp.asarray(np.random.default_rng(seed).choice(K, size=N, p=p / p.sum()), jnp.int32)


def _per_sample(theta, phi, xs, est):
  lp = jax.nn.log_softmax(theta)[xs]
  lq = jax.nn.log_softmax(phi)[xs]
  return np.asarray(rl.kl(lp, lq, est), np.float64)


@pytest.mark.parametrize("est", ["k1", "k3"])
def test_k1_k3_unbiased(est):
  theta, phi = _dists()
  exact = _exact_kl(theta, phi)
  v = _per_sample(theta, phi, _samples(theta), est)
  se = v.std() / np.sqrt(N)
  assert abs(v.mean() - exact) < Z * se, (est, v.mean(), exact, se)
  # The expectation by enumeration equals the KL itself.
  lp, lq = jax.nn.log_softmax(theta), jax.nn.log_softmax(phi)
  expectation = float(jnp.sum(jnp.exp(lp) * rl.kl(lp, lq, est)))
  assert expectation == pytest.approx(exact, rel=1e-5, abs=1e-6)


def test_k2_biased():
  theta, phi = _dists()
  exact = _exact_kl(theta, phi)
  v = _per_sample(theta, phi, _samples(theta), "k2")
  se = v.std() / np.sqrt(N)
  assert abs(v.mean() - exact) > 20 * se, (v.mean(), exact, se)
  lp, lq = jax.nn.log_softmax(theta), jax.nn.log_softmax(phi)
  expectation = float(jnp.sum(jnp.exp(lp) * rl.kl(lp, lq, "k2")))
  assert abs(expectation - exact) > 0.05 * exact
  assert abs(v.mean() - expectation) < Z * se
  # ... but close to the KL when the distributions are close (k2 is second-order accurate).
  theta2 = phi + 0.05 * jnp.asarray(np.random.default_rng(3).normal(size=K), jnp.float32)
  lp2 = jax.nn.log_softmax(theta2)
  near = float(jnp.sum(jnp.exp(lp2) * rl.kl(lp2, lq, "k2")))
  assert near == pytest.approx(_exact_kl(theta2, phi), rel=0.05)


def test_k3_nonnegative_and_accurate():
  big = np.linspace(-60.0, 60.0, 2001)
  tiny = np.concatenate([np.logspace(-12, -1, 200), -np.logspace(-12, -1, 200), [0.0]])
  log_r = np.concatenate([big, tiny]).astype(np.float32)
  rng = np.random.default_rng(0)
  logp = rng.uniform(-30, 0, size=log_r.shape).astype(np.float32)
  ref = logp + log_r
  ref_logp = ref.astype(np.float32)
  k3 = np.asarray(rl.kl(jnp.asarray(logp), jnp.asarray(ref_logp), "k3"))
  assert np.all(k3 >= 0.0), log_r[k3 < 0]
  # Against float64 on the log-ratio the float32 inputs actually encode.
  lr64 = ref_logp.astype(np.float64) - logp.astype(np.float64)
  want = np.expm1(lr64) - lr64
  finite = np.isfinite(want) & (np.abs(lr64) < 80)
  np.testing.assert_allclose(k3[finite], want[finite], rtol=2e-3, atol=1e-6)


def test_estimators_hand_values():
  logp = jnp.log(jnp.asarray([0.5]))
  ref = jnp.log(jnp.asarray([0.25]))
  # log r = log(0.5) = -0.693147...
  assert float(rl.kl(logp, ref, "k1")[0]) == pytest.approx(0.6931472, rel=1e-6)
  assert float(rl.kl(logp, ref, "k2")[0]) == pytest.approx(0.2402265, rel=1e-6)
  assert float(rl.kl(logp, ref, "k3")[0]) == pytest.approx(0.1931472, rel=1e-5)
  with pytest.raises(ValueError, match="k4"):
    rl.kl(logp, ref, "k4")
  assert set(rl.KL_ESTIMATORS) == {"k1", "k2", "k3"}


# --------------------------------------------------------------------------- gradients
@functools.partial(jax.jit, static_argnums=3)
def _sample_grads_jit(theta, phi, xs, est):
  def one(th, x):
    return rl.kl(jax.nn.log_softmax(th)[x], jax.nn.log_softmax(phi)[x], est)
  return jax.vmap(jax.grad(one), in_axes=(None, 0))(theta, xs)


def _sample_loss_grads(theta, phi, xs, est):
  """Gradient w.r.t. theta of each sample's estimator, the sample x held fixed: [N, K]."""
  return np.asarray(_sample_grads_jit(theta, phi, xs, est), np.float64)


def _expected_grad(theta, phi, est):
  """sum_x pi(x) grad_theta k(x; theta) by enumeration (x not differentiated)."""
  g = _sample_loss_grads(theta, phi, jnp.arange(K), est)                    # [K, K]
  pi = np.asarray(jax.nn.softmax(theta), np.float64)
  return pi @ g


def _kl_grad(theta, phi, reverse=False):
  def f(th):
    lp, lq = jax.nn.log_softmax(th), jax.nn.log_softmax(phi)
    if reverse:                                      # KL(pi_ref || pi)
      return jnp.sum(jnp.exp(lq) * (lq - lp))
    return jnp.sum(jnp.exp(lp) * (lp - lq))          # KL(pi || pi_ref)
  return np.asarray(jax.jit(jax.grad(f))(theta), np.float64)


def test_gradient_claims_monte_carlo():
  """What a KL estimator contributes when it is a loss term.

  Claim (precise form). Draw x_1..x_N ~ pi_theta once and hold them fixed, as a trainer does:
  L(theta) = (1/N) sum_i k(x_i; theta), with k evaluated at log pi_theta(x_i). Autodiff of L
  gives only the pathwise term: E[grad L] = E_{x~pi}[grad_theta k(x; theta)]. The gradient of
  the expectation E_{x~pi_theta}[k(x; theta)] would add the score-function term
  E[k(x) grad log pi(x)], which a fixed-sample loss never sees. With that:
    k2: E_{x~pi}[grad k2] = grad_theta KL(pi || pi_ref)   (exactly, not just near pi_ref)
    k3: E_{x~pi}[grad k3] = grad_theta KL(pi_ref || pi)   (the reverse KL) != grad KL(pi || pi_ref)
    k1: E_{x~pi}[grad k1] = E[grad log pi] = 0            (although k1 is unbiased for the value)
  Each is checked by Monte Carlo (jax.grad of L over the logits, tolerance from the spread of the
  per-sample gradients) and by enumeration.
  """
  theta, phi = _dists(seed=4)
  xs = _samples(theta, seed=5)
  forward = _kl_grad(theta, phi)
  reverse = _kl_grad(theta, phi, reverse=True)
  assert np.linalg.norm(forward - reverse) > 0.2 * np.linalg.norm(forward)   # distinct targets

  results = {}
  for est in ("k1", "k2", "k3"):
    loss = lambda th, est=est: jnp.mean(
        rl.kl(jax.nn.log_softmax(th)[xs], jax.nn.log_softmax(phi)[xs], est))
    g_mc = np.asarray(jax.jit(jax.grad(loss))(theta), np.float64)
    se = _sample_loss_grads(theta, phi, xs, est).std(axis=0) / np.sqrt(N)
    results[est] = (g_mc, se, _expected_grad(theta, phi, est))

  g, se, ex = results["k2"]
  np.testing.assert_array_less(np.abs(g - forward), Z * se + 1e-6)
  np.testing.assert_allclose(ex, forward, atol=1e-5)

  g, se, ex = results["k3"]
  np.testing.assert_array_less(np.abs(g - reverse), Z * se + 1e-6)
  np.testing.assert_allclose(ex, reverse, atol=1e-5)
  assert np.max(np.abs(g - forward) / (se + 1e-12)) > 20          # far from grad KL(pi||pi_ref)

  g, se, ex = results["k1"]
  np.testing.assert_array_less(np.abs(g), Z * se + 1e-6)
  np.testing.assert_allclose(ex, 0.0, atol=1e-6)
  assert np.max(np.abs(forward)) > 0.05
