"""SPARKLE's system-level reward of one finished trajectory (the paper's §3.2):

  R = α · Recall(c_T) + (1 − α) · F1(y)          weighting 'paper' (α = 0.3 in the paper)
  R = (1 − α) · Recall(c_T) + α · F1(y)          weighting 'code': the authors' released code
                                                 weights the two terms the other way round

Recall(c_T) is the fraction of the question's gold documents in the final context. A dataset
without gold documents (NQ) uses answer-string recall instead: 1 when a normalised answer alias
occurs in the normalised text of the final context, else 0 (`recall_kind` says which was used).
F1 is the token F1 of the extracted answer; a reasoning that never answered scores F1 0.
`system_reward` is pure and never raises.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from rlrag_jax import metrics

WEIGHTINGS = ("paper", "code")


@dataclasses.dataclass(frozen=True)
class RewardConfig:
  alpha: float = 0.3
  weighting: str = "paper"

  def __post_init__(self):
    if self.weighting not in WEIGHTINGS:
      raise ValueError(f"sparkle.reward.weighting must be one of {WEIGHTINGS}; got "
                       f"{self.weighting!r}")
    if not 0.0 <= float(self.alpha) <= 1.0:
      raise ValueError(f"sparkle.reward.alpha must lie in [0, 1]; got {self.alpha}")


def context_recall(context_ids: Sequence, gold_ids: Sequence) -> float:
  gold = set(map(str, gold_ids))
  if not gold:
    return 0.0
  return len(gold & set(map(str, context_ids))) / len(gold)


def answer_recall(context_texts: Sequence[str], answers) -> float:
  """1.0 when some normalised alias is a whole-word substring of the normalised context."""
  text = f" {metrics.normalize_answer(' '.join(map(str, context_texts)))} "
  for a in ([answers] if isinstance(answers, str) else list(answers)):
    a = metrics.normalize_answer(a)
    if a and f" {a} " in text:
      return 1.0
  return 0.0


def system_reward(*, context_ids: Sequence, context_texts: Sequence[str], gold_ids: Sequence,
                  prediction, answers, cfg: RewardConfig) -> dict:
  """{'total', 'recall', 'f1', 'em', 'recall_kind'} of one final context and answer."""
  prediction = prediction if isinstance(prediction, str) else ""
  if gold_ids:
    r, kind = context_recall(context_ids, gold_ids), "gold"
  else:
    r, kind = answer_recall(context_texts, answers), "answer"
  f = metrics.f1(prediction, answers) if prediction else 0.0
  em = metrics.exact_match(prediction, answers) if prediction else 0.0
  a = float(cfg.alpha)
  total = a * r + (1 - a) * f if cfg.weighting == "paper" else (1 - a) * r + a * f
  return {"total": float(total), "recall": float(r), "f1": float(f), "em": float(em),
          "recall_kind": kind}
