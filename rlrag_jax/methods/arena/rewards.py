"""ARENA's rule-based rewards: format, accuracy, relevance and the bonus for getting all three.

With the paper's defaults (weights 1, 1, 1 and a bonus of 10) a perfect completion scores
1 + 1 + 1 + 10 = 13. Each part is scored on its own, so a malformed completion loses the parts it
breaks and keeps the rest (see `parsing` for what is read from a malformed completion):

* format    1 when `parse(...).well_formed`, else 0.
* accuracy  `accuracy='em'` (the paper's): 1 when the <answer> text, normalised as in ARENA
            appendix D (lowercase, no punctuation, no articles, single spaces), equals a
            normalised alias, else 0. A missing, ambiguous or blank answer scores 0, as does one
            that normalises to "" (so "The" never matches an alias that also normalises to "").
            The ablations: 'f1' (the best token F1 over the aliases, in [0, 1]) and 'judge'
            (1 when `judge(answer, aliases)` says True; False and "not judged" (None) score 0).
* relevance 1 when the set of predicted ids equals the gold set; 0.5 when they share at least one
            id; 0 when they share none or the ids are unparseable. Duplicates do not matter (sets).
            With an empty gold set only the empty prediction "[]" scores 1. The ids are read with
            `relevance_parse` ('strict': a JSON list of integers, the paper's; 'lenient': ours).
* bonus     `bonus_value` when format, accuracy and relevance are all 1, else 0.
* total     w_format * format + w_accuracy * accuracy + w_relevance * relevance + bonus.
"""
from __future__ import annotations

import numbers
from typing import Optional, Sequence

import numpy as np

from rlrag_jax import metrics
from rlrag_jax.methods.arena import parsing
from rlrag_jax.methods.arena import prompts

KEYS = ("format", "accuracy", "relevance", "bonus", "total")
DEFAULT_WEIGHTS = dict(w_format=1.0, w_accuracy=1.0, w_relevance=1.0, bonus_value=10.0)


def format_score(parsed: parsing.Parsed) -> float:
  return 1.0 if parsed.well_formed else 0.0


ACCURACY_MODES = ("em", "f1", "judge")


def accuracy_score(answer: Optional[str], answers, mode: str = "em", judge=None) -> float:
  """EM (1.0 / 0.0), token F1, or the judge's verdict; 0.0 for None or blank answers."""
  if mode not in ACCURACY_MODES:
    raise ValueError(f"reward.accuracy is {mode!r}; expected one of {ACCURACY_MODES}")
  if answer is None or not metrics.normalize_answer(answer):
    return 0.0
  if mode == "em":
    return metrics.exact_match(answer, answers)
  if mode == "f1":
    return float(metrics.f1(answer, answers))
  if judge is None:
    raise ValueError("reward.accuracy is 'judge' but no judge is configured (set "
                     "reward.judge_url and reward.judge_model)")
  return 1.0 if judge(answer, [answers] if isinstance(answers, str) else list(answers)) is True \
      else 0.0


def relevance_score(predicted: Optional[Sequence[int]], gold: Sequence[int]) -> float:
  """1.0 for the same id set, 0.5 for any overlap, 0.0 for none or unparseable (None) ids."""
  if predicted is None:
    return 0.0
  pred, gold = set(predicted), set(gold)
  if pred == gold:
    return 1.0
  return 0.5 if pred & gold else 0.0


def _check_gold_ids(gold_ids) -> list:
  bad = [g for g in gold_ids if not isinstance(g, numbers.Integral) or isinstance(g, bool)]
  if bad:
    raise TypeError(f"arena.rewards: gold_ids must be reference numbers (ints 1..n), found "
                    f"{bad[0]!r} of type {type(bad[0]).__name__}; map context ids with "
                    f"prompts.reference_numbers(example).gold")
  return [int(g) for g in gold_ids]


def reward(completion: str, answers, gold_ids, *, w_format: float = 1.0, w_accuracy: float = 1.0,
           w_relevance: float = 1.0, bonus_value: float = 10.0, relevance_parse: str = "strict",
           accuracy: str = "em", judge=None) -> dict:
  """Scores one completion; never raises on the completion.

  Args:
    completion: generated text, special tokens stripped.
    answers: gold answer aliases (a list of str, or one str).
    gold_ids: gold reference numbers (1..n, as numbered in the prompt).
    w_format, w_accuracy, w_relevance: weights of the three part scores in the total.
    bonus_value: added to the total when format, accuracy and relevance are all 1.
    relevance_parse: 'strict' | 'lenient' reading of the relevance ids (see `parsing`).
    accuracy: 'em' | 'f1' | 'judge'; judge: `judge(answer, aliases) -> True | False | None`.

  Returns:
    dict with float values under "format", "accuracy", "relevance", "bonus" and "total".

  Raises:
    TypeError: gold_ids holds something other than ints (a caller bug, not a model failure).
  """
  gold = _check_gold_ids(gold_ids)
  parsed = parsing.parse(completion, relevance_parse)
  fmt = format_score(parsed)
  acc = accuracy_score(parsed.answer, answers, accuracy, judge)
  rel = relevance_score(parsed.relevance_ids, gold)
  bonus = float(bonus_value) if (fmt == 1.0 and acc == 1.0 and rel == 1.0) else 0.0
  total = w_format * fmt + w_accuracy * acc + w_relevance * rel + bonus
  return {"format": fmt, "accuracy": acc, "relevance": rel, "bonus": bonus, "total": float(total)}


def rewards(completions: Sequence[str], examples: Sequence, **weights) -> dict:
  """Scores a batch: completions[i] against examples[i]; returns float32 arrays of shape [B].

  Args:
    completions: B generated texts.
    examples: B `Example`s (repeat each example once per sample for GRPO groups); gold reference
      numbers come from `prompts.reference_numbers(example)`, so the prompt must have listed the
      example's contexts in their stored order.
    **weights: w_format, w_accuracy, w_relevance, bonus_value as in `reward`.

  Returns:
    dict KEYS -> np.ndarray [B] float32.
  """
  if len(completions) != len(examples):
    raise ValueError(f"arena.rewards: expected one example per completion, found "
                     f"{len(completions)} completions and {len(examples)} examples")
  out = {k: np.zeros((len(completions),), np.float32) for k in KEYS}   # each [B]
  for i, (completion, example) in enumerate(zip(completions, examples)):
    scores = reward(completion, example.answers, prompts.reference_numbers(example).gold, **weights)
    for k in KEYS:
      out[k][i] = scores[k]
  return out
