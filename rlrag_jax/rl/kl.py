"""Per-token KL estimators of KL(pi || pi_ref) from samples x ~ pi (Schulman's k1, k2, k3).

With r = pi_ref(x) / pi(x), so log r = ref_logp - logp:
  k1 = -log r                unbiased; its sampled gradient has mean 0 (useless as a loss term)
  k2 = 0.5 (log r)^2         biased;   E_pi[grad k2] = grad KL(pi || pi_ref)
  k3 = r - 1 - log r  >= 0   unbiased; E_pi[grad k3] = grad KL(pi_ref || pi), the reverse KL
The gradient statements are about differentiating the sampled value with the samples held fixed
(what a loss term does); tests/rl/test_kl.py checks each claim by Monte Carlo.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def kl_k1(logp: Array, ref_logp: Array) -> Array:
  return logp - ref_logp


def kl_k2(logp: Array, ref_logp: Array) -> Array:
  log_r = ref_logp - logp
  return 0.5 * jnp.square(log_r)


def kl_k3(logp: Array, ref_logp: Array) -> Array:
  # expm1(y) - y instead of exp(y) - 1 - y: exact-enough near y = 0 and never rounds below 0.
  log_r = ref_logp - logp
  return jnp.expm1(log_r) - log_r


KL_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def kl(logp: Array, ref_logp: Array, estimator: str) -> Array:
  """Per-token KL estimate, same shape as `logp`; `estimator` is one of KL_ESTIMATORS."""
  if estimator not in KL_ESTIMATORS:
    raise ValueError(f"rl.kl: estimator {estimator!r} is unknown; expected one of "
                     f"{sorted(KL_ESTIMATORS)}")
  return KL_ESTIMATORS[estimator](logp.astype(jnp.float32), ref_logp.astype(jnp.float32))
