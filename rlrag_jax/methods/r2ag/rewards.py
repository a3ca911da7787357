"""Top-Survivor step reward (the paper's Eq. 5 and appendix B.2), a pure function of one
expansion step:

  R = alpha * R_MH + beta * R_JH + gamma * R_AP + R_f          (weighting 'eq5', the default)
  R =         R_MH +        R_JH +         R_AP + R_f          (weighting 'sum', Algorithm 1)

  R_MH  Multi-Hit@top-1: R_MH^b + ell * R_MH^p, each the number of gold documents this step's
        base (predicted) queries retrieved that were not retrieved before on the branch.
  R_JH  Joint-Hit: 1 when the stop signal is emitted and every gold document is retrieved.
  R_AP  Top-t/x AP: AP^b + AP^p, each over the documents of the first t queries of its list in
        order (t_base, t_pred), AP = (1/|g|) * sum_u P@u * rel(u), any gold hit counting
        (retrieved before or not).
  R_f   format: format_per_part for a well-formed base-Q part and for a well-formed
        predicted-Q part after the <think>, at most format_max in all.

One reading the paper leaves open, fixed here: a gold document hit by several queries of one
step counts once. In R_MH it goes to the first base query that hit it (a predicted query that
hits a document a base query also hit adds nothing); in AP its second and later ranks count as
misses, so AP stays within [0, 1].

The total is 0 when the <think> is missing, when the output was cut at the length limit, or
when stop comes before every gold document is retrieved (components are still reported, with
`zeroed` naming the rule: 1 no think, 2 truncated, 3 early stop).
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

from rlrag_jax.methods.r2ag.parsing import Step
from rlrag_jax.metrics import average_precision

WEIGHTINGS = ("eq5", "sum")
NO_THINK, TRUNCATED, EARLY_STOP = 1, 2, 3


@dataclasses.dataclass(frozen=True)
class RewardConfig:
  alpha: float = 0.2
  beta: float = 0.3
  gamma: float = 0.2
  ell: float = 1.25
  t_base: int = 4
  t_pred: int = 2
  format_per_part: float = 0.01
  format_max: float = 0.02
  weighting: str = "eq5"

  def __post_init__(self):
    if self.weighting not in WEIGHTINGS:
      raise ValueError(f"config key 'r2ag.reward.weighting' is {self.weighting!r}; expected one "
                       f"of {WEIGHTINGS}")

  @classmethod
  def from_config(cls, section) -> "RewardConfig":
    from rlrag_jax import config_base
    return config_base.section(cls, section, "r2ag.reward")


def _flat(per_query: Sequence[Sequence[str]]) -> list:
  return [d for docs in per_query for d in docs]


def step_reward(step: Step, base_hits: Sequence[Sequence[str]],
                pred_hits: Sequence[Sequence[str]], prior: Iterable[str], gold: Iterable[str],
                truncated: bool, cfg: RewardConfig) -> dict:
  """The step's reward components and 'total'.

  base_hits / pred_hits: per query of `step.base` / `step.predicted` (in order) the ids it
  retrieved (one id at top-1); empty when the step stopped. prior: ids retrieved earlier on the
  branch; gold: the question's gold ids.
  """
  prior, gold = set(prior), set(gold)
  counted = set(prior)
  new_b, new_p = [], []
  for out, hits in ((new_b, base_hits), (new_p, pred_hits)):
    for d in _flat(hits):
      if d in gold and d not in counted:
        out.append(d)
        counted.add(d)
  after = prior | set(_flat(base_hits)) | set(_flat(pred_hits))
  complete = gold <= after
  mh_b, mh_p = float(len(new_b)), float(len(new_p))
  mh = mh_b + cfg.ell * mh_p
  jh = float(step.stop and complete)
  ap_b = average_precision(_flat(base_hits[:cfg.t_base]), gold)
  ap_p = average_precision(_flat(pred_hits[:cfg.t_pred]), gold)
  ap = ap_b + ap_p
  fmt = 0.0
  if step.think:
    fmt = min(cfg.format_max, cfg.format_per_part * ((step.base_parts > 0) +
                                                     (step.predicted_parts > 0)))
  if cfg.weighting == "eq5":
    total = cfg.alpha * mh + cfg.beta * jh + cfg.gamma * ap + fmt
  else:
    total = mh + jh + ap + fmt
  zeroed = 0
  if not step.think:
    zeroed = NO_THINK
  elif truncated:
    zeroed = TRUNCATED
  elif step.stop and not complete:
    zeroed = EARLY_STOP
  if zeroed:
    total = 0.0
  return {"total": float(total), "mh_base": mh_b, "mh_pred": mh_p, "mh": mh, "jh": jh,
          "ap_base": ap_b, "ap_pred": ap_p, "ap": ap, "format": fmt,
          "new_gold": float(len(new_b) + len(new_p)), "complete": float(complete),
          "stop": float(step.stop), "queries": float(len(step.base) + len(step.predicted)),
          "zeroed": float(zeroed)}
