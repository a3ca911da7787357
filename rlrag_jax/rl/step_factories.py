"""The sharded, jitted update steps and forwards, built from a module, an optimizer and a
mesh: `make_policy_step` (GRPO / DAPO / Dr. GRPO, with `LossConfig`), `make_sft_step`,
`make_value_step` (the PPO critic), and the `make_logprob_fn` / `make_value_fn` forwards. Each
step is an `rl.update.UpdateStep`: one jit over a batch, or `accumulated` over token-budget
micro-batches; each forward an `rl.update.Forward`. The design choices are `rl.update`'s.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from rlrag_jax.models import sharding as shd
from rlrag_jax.rl.kl import KL_ESTIMATORS, kl as kl_fn
from rlrag_jax.rl.logprobs import DEFAULT_LOGITS_CHUNK
from rlrag_jax.rl.losses import AGGREGATIONS, aggregation_terms, ppo_token_loss, value_token_loss
from rlrag_jax.rl.optim_state import from_mapping, train_state_shardings
from rlrag_jax.rl.token_stats import compute_params, token_stats
from rlrag_jax.rl.update import loss_mask, make_forward, make_update_step, token_norms

Array = jax.Array


# ------------------------------------------------------------------------------------ loss config
@dataclasses.dataclass(frozen=True)
class LossConfig:
  """Policy-loss settings (config keys under `loss`)."""
  eps_low: float = 0.2
  eps_high: Optional[float] = None       # None: = eps_low (PPO); DAPO clip-higher: 0.28
  dual_clip: Optional[float] = None      # c > 1 caps the loss of A < 0 tokens at -A c
  aggregation: str = "sequence_mean"     # sequence_mean | token_mean | constant
  max_completion_len: Optional[int] = None   # the constant of 'constant' (Dr. GRPO)
  beta: float = 0.0                      # KL loss coefficient; 0: no ref_logp needed
  kl_estimator: str = "k3"
  temperature: float = 1.0               # the sampler's temperature
  compute_entropy: bool = True
  entropy_coef: float = 0.0              # > 0: minus this times the aggregated token entropy
                                         # joins the loss (an exploration bonus; needs
                                         # compute_entropy)

  def __post_init__(self):
    if self.aggregation not in AGGREGATIONS:
      raise ValueError(f"loss.aggregation is {self.aggregation!r}; expected one of "
                       f"{sorted(AGGREGATIONS)}")
    if self.kl_estimator not in KL_ESTIMATORS:
      raise ValueError(f"loss.kl_estimator is {self.kl_estimator!r}; expected one of "
                       f"{sorted(KL_ESTIMATORS)}")
    if self.aggregation == "constant" and not self.max_completion_len:
      raise ValueError("loss.aggregation='constant' needs loss.max_completion_len >= 1")
    if self.entropy_coef < 0 or (self.entropy_coef and not self.compute_entropy):
      raise ValueError(f"loss.entropy_coef is {self.entropy_coef}; expected >= 0, and "
                       "compute_entropy=True when it is > 0")

  @classmethod
  def from_config(cls, cfg) -> "LossConfig":
    return from_mapping(cls, cfg, "LossConfig (config key loss)")

  @classmethod
  def preset(cls, name: str, **overrides) -> "LossConfig":
    """'grpo' (eps 0.2, sequence_mean, beta 0.04, k3), 'dapo' (clip-higher 0.2/0.28, token_mean,
    no KL) or 'dr_grpo' (constant normaliser, no KL; pair with the 'dr_grpo' advantages)."""
    presets = {
        "grpo": dict(aggregation="sequence_mean", beta=0.04, kl_estimator="k3"),
        "dapo": dict(eps_low=0.2, eps_high=0.28, aggregation="token_mean", beta=0.0),
        "dr_grpo": dict(aggregation="constant", beta=0.0),
    }
    if name not in presets:
      raise ValueError(f"LossConfig.preset: {name!r} unknown; expected one of {sorted(presets)}")
    return cls(**{**presets[name], **overrides})


# ------------------------------------------------------------------------------------ policy
def make_policy_step(module, opt, mesh: Mesh, loss_cfg: LossConfig = LossConfig(), *,
                     micro_batches: int = 1, lr_schedule: Optional[Callable] = None,
                     logits_chunk: int = DEFAULT_LOGITS_CHUNK, head_backward: str = "auto",
                     rules=shd.RULES):
  """GRPO / DAPO / Dr. GRPO update: `state, metrics = step(state, batch, logits_start=0)`.

  batch: input_ids [B, T], attention_mask [B, T], loss_mask [B, T], advantages [B] or [B, T],
  old_logp [B, T] (optional: absent means on-policy, ratio 1), ref_logp [B, T] (required when
  loss_cfg.beta > 0; when present with beta = 0 it only feeds the 'kl' metric).
  B must split into `micro_batches` micro-batches, each a multiple of data x fsdp.
  logits_start (static int, `rl.packing.logits_start`): logits are computed for positions
  logits_start..T-2 only; no loss_mask token may sit at or before it. The ref_logp / old_logp
  entries are read at loss tokens only, so they may come from the same window.

  metrics: loss, pg_loss, kl (the configured estimator; with ref_logp also kl_k1, kl_k2, kl_k3,
  each estimator's token mean), clip_frac (+ _low / _high), dual_clip_frac, entropy,
  approx_kl_old (k3 between sampling and current policy), tokens, grad_norm, skipped, lr.
  """
  cfg = loss_cfg
  state_sh = train_state_shardings(module, opt, mesh, rules)

  norms_fn = token_norms(cfg.aggregation, cfg.max_completion_len)

  def mb_loss(params, mb, norms, start):
    out = token_stats(module, params, mb, mesh, rules, start, chunk=logits_chunk,
                       temperature=cfg.temperature, with_entropy=cfg.compute_entropy,
                       entropy_grad=cfg.entropy_coef > 0, head_backward=head_backward)
    logp, ent = out["lp"], out.get("ent")
    m = loss_mask(mb["loss_mask"])
    old = mb.get("old_logp")
    old = jax.lax.stop_gradient(logp) if old is None else old
    pg_tok, info = ppo_token_loss(logp, old, mb["advantages"], cfg.eps_low, cfg.eps_high,
                                  cfg.dual_clip)
    pg_num, _ = aggregation_terms(pg_tok, m, cfg.aggregation, cfg.max_completion_len)
    loss = pg_num / norms["den"]
    tsum = lambda x: jnp.sum(jax.lax.stop_gradient(x) * m)
    sums = {"pg_loss": jax.lax.stop_gradient(loss),
            "clip_frac_low": tsum(info["clipped_low"]),
            "clip_frac_high": tsum(info["clipped_high"]),
            "dual_clip_frac": tsum(info["dual_clipped"]),
            "approx_kl_old": tsum(kl_fn(logp, old, "k3"))}
    if ent is not None:
      sums["entropy"] = tsum(ent)
    if "ref_logp" in mb:
      kl_sums, kl_loss = _policy_kl(logp, mb["ref_logp"], m, norms, cfg, tsum)
      sums.update(kl_sums)
      if kl_loss is not None:
        loss = loss + kl_loss
    if cfg.entropy_coef:
      ent_num, _ = aggregation_terms(ent, m, cfg.aggregation, cfg.max_completion_len)
      loss = loss - cfg.entropy_coef * ent_num / norms["den"]
    return loss, sums

  required = ["input_ids", "attention_mask", "loss_mask", "advantages"]
  if cfg.beta:
    required.append("ref_logp")
  return make_update_step(mb_loss, norms_fn, _policy_metrics, opt, mesh, state_sh,
                           micro_batches, required, "make_policy_step", lr_schedule, rules)


def _policy_kl(logp, ref_logp, m, norms: dict, cfg: LossConfig, tsum: Callable) -> tuple:
  """(metric sums, loss term or None) of the KL to the reference policy: the configured
  estimator's token sum as 'kl', every estimator's as 'kl_<name>' (so runs trained with
  different estimators compare), and with beta > 0 its aggregated term beta x KL."""
  k = kl_fn(logp, ref_logp, cfg.kl_estimator)
  sums = {"kl": tsum(k)}
  for name in sorted(KL_ESTIMATORS):
    sums[f"kl_{name}"] = tsum(kl_fn(logp, ref_logp, name))
  if not cfg.beta:
    return sums, None
  kl_num, _ = aggregation_terms(k, m, cfg.aggregation, cfg.max_completion_len)
  return sums, cfg.beta * kl_num / norms["den"]


def _policy_metrics(sums: dict, norms: dict) -> dict:
  """make_policy_step's finalize: token sums -> token means; pg_loss is already a mean."""
  out = {k: (v if k == "pg_loss" else v / norms["tokens"]) for k, v in sums.items()}
  out["clip_frac"] = out["clip_frac_low"] + out["clip_frac_high"]
  out["tokens"] = norms["tokens"]
  return out


# ------------------------------------------------------------------------------------ SFT
def make_sft_step(module, opt, mesh: Mesh, *, aggregation: str = "token_mean",
                  max_len: Optional[int] = None, micro_batches: int = 1,
                  lr_schedule: Optional[Callable] = None,
                  logits_chunk: int = DEFAULT_LOGITS_CHUNK, head_backward: str = "auto",
                  rules=shd.RULES):
  """Masked cross-entropy update. batch: input_ids, attention_mask, loss_mask (1 on targets).
  `state, metrics = step(state, batch, logits_start=0)`, logits_start as in `make_policy_step`.

  metrics: loss, accuracy (greedy next-token hits on targets), tokens, grad_norm, skipped, lr.
  """
  state_sh = train_state_shardings(module, opt, mesh, rules)
  aggregation_terms(jnp.zeros((1, 1)), jnp.zeros((1, 1)), aggregation, max_len)  # validates

  norms_fn = token_norms(aggregation, max_len)

  def mb_loss(params, mb, norms, start):
    out = token_stats(module, params, mb, mesh, rules, start, chunk=logits_chunk,
                       with_hits=True, head_backward=head_backward)
    m = loss_mask(mb["loss_mask"])
    num, _ = aggregation_terms(-out["lp"], m, aggregation, max_len)
    return num / norms["den"], {"accuracy": jnp.sum(out["hit"] * m)}

  def finalize(sums, norms):
    return {"accuracy": sums["accuracy"] / norms["tokens"], "tokens": norms["tokens"]}

  return make_update_step(mb_loss, norms_fn, finalize, opt, mesh, state_sh, micro_batches,
                           ["input_ids", "attention_mask", "loss_mask"], "make_sft_step",
                           lr_schedule, rules)


# ------------------------------------------------------------------------------------ critic
def shift_values(values: Array) -> Array:
  """Critic outputs per position [B, T] -> aligned like logp: out[:, t] = V(ids[:, <t]), the
  value of the state in which token t was chosen; out[:, 0] = 0."""
  return jnp.pad(values[:, :-1], ((0, 0), (1, 0)))


def make_value_step(module, opt, mesh: Mesh, *, clip_eps: Optional[float] = 0.2,
                    aggregation: str = "token_mean", max_len: Optional[int] = None,
                    micro_batches: int = 1, lr_schedule: Optional[Callable] = None,
                    rules=shd.RULES):
  """PPO critic update (a ValueLM with its own optimizer, e.g. a larger lr).

  batch: input_ids, attention_mask, loss_mask [B, T], returns [B, T] (from `rl.gae`), and
  old_values [B, T] (the values GAE used; required when clip_eps is not None). Values are
  aligned as in `shift_values`.
  metrics: loss, vf_clip_frac, value_mean, tokens, grad_norm, skipped, lr.
  """
  state_sh = train_state_shardings(module, opt, mesh, rules)
  aggregation_terms(jnp.zeros((1, 1)), jnp.zeros((1, 1)), aggregation, max_len)  # validates

  norms_fn = token_norms(aggregation, max_len)

  def mb_loss(params, mb, norms, start):
    del start            # a scalar head per position: nothing to window
    raw, _ = module.apply({"params": compute_params(module, params, mesh, rules)},
                          mb["input_ids"], mb["attention_mask"])
    v = shift_values(raw)
    m = loss_mask(mb["loss_mask"])
    tok, clipped = value_token_loss(v, mb.get("old_values", v), mb["returns"], clip_eps)
    num, _ = aggregation_terms(tok, m, aggregation, max_len)
    return num / norms["den"], {"vf_clip_frac": jnp.sum(clipped * m),
                                "value_mean": jnp.sum(jax.lax.stop_gradient(v) * m)}

  def finalize(sums, norms):
    out = {k: v / norms["tokens"] for k, v in sums.items()}
    out["tokens"] = norms["tokens"]
    return out

  required = ["input_ids", "attention_mask", "loss_mask", "returns"]
  if clip_eps is not None:
    required.append("old_values")
  return make_update_step(mb_loss, norms_fn, finalize, opt, mesh, state_sh, micro_batches,
                           required, "make_value_step", lr_schedule, rules)


def make_logprob_fn(module, mesh: Mesh, *, temperature: float = 1.0, micro_batches: int = 1,
                    logits_chunk: int = DEFAULT_LOGITS_CHUNK, rules=shd.RULES):
  """Jitted `logp = fn(params, batch, logits_start=0)`: aligned per-token log-probs [B, T]
  (float32) for the old_logp / ref_logp batch entries; works for the policy and the reference
  params alike. With logits_start > 0, positions 0..logits_start hold 0."""
  def fn(params, batch, start):
    return jax.lax.stop_gradient(token_stats(module, params, batch, mesh, rules, start,
                                              chunk=logits_chunk, temperature=temperature)["lp"])
  return make_forward(fn, module, mesh, micro_batches, rules, "make_logprob_fn")


def make_value_fn(module, mesh: Mesh, *, micro_batches: int = 1, rules=shd.RULES):
  """Jitted `values = fn(params, batch)`: critic values [B, T] aligned as in `shift_values`
  (a logits_start argument is accepted and ignored)."""
  def fn(params, batch, start):
    del start
    raw, _ = module.apply({"params": compute_params(module, params, mesh, rules)},
                          batch["input_ids"], batch["attention_mask"])
    return shift_values(raw)
  return make_forward(fn, module, mesh, micro_batches, rules, "make_value_fn")
