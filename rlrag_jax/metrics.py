"""Answer and retrieval metrics shared by every method.

Answer normalisation follows ARENA appendix D: lowercase; underscores to spaces; strip
punctuation; drop the articles a/an/the; collapse whitespace. Scores are the best over aliases.
"""
from __future__ import annotations

import collections
import re
import string
from typing import Iterable, Sequence

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
  s = str(s).lower().replace("_", " ")
  s = "".join(ch for ch in s if ch not in _PUNCT)
  s = _ARTICLES.sub(" ", s)
  return " ".join(s.split())


def _aliases(answers) -> list:
  return [answers] if isinstance(answers, str) else list(answers)


def exact_match(pred: str, answers) -> float:
  """1.0 when the normalised prediction equals any normalised alias, else 0.0."""
  p = normalize_answer(pred)
  return float(any(p == normalize_answer(a) for a in _aliases(answers)))


def _f1_one(pred: str, gold: str) -> float:
  p, g = normalize_answer(pred).split(), normalize_answer(gold).split()
  if not p or not g:
    return float(p == g)
  common = collections.Counter(p) & collections.Counter(g)
  same = sum(common.values())
  if same == 0:
    return 0.0
  precision, recall = same / len(p), same / len(g)
  return 2 * precision * recall / (precision + recall)


def f1(pred: str, answers) -> float:
  """Token F1 of the normalised strings, best over aliases."""
  return max((_f1_one(pred, a) for a in _aliases(answers)), default=0.0)


def recall_at_k(retrieved: Sequence, gold: Iterable, k: int) -> float:
  """Fraction of gold ids found in the first k retrieved ids (0.0 when gold is empty)."""
  gold = set(gold)
  if not gold:
    return 0.0
  return len(gold & set(list(retrieved)[:k])) / len(gold)


def full_recall_at_k(retrieved: Sequence, gold: Iterable, k: int) -> float:
  """1.0 when every gold id is in the first k retrieved ids."""
  gold = set(gold)
  return float(bool(gold) and gold <= set(list(retrieved)[:k]))


def average_precision(retrieved: Sequence, gold: Iterable) -> float:
  """Average precision of a ranked list against a gold set, normalised by |gold|."""
  gold = set(gold)
  if not gold:
    return 0.0
  hits, total = 0, 0.0
  seen = set()
  for rank, rid in enumerate(retrieved, start=1):
    if rid in gold and rid not in seen:
      hits += 1
      total += hits / rank
    seen.add(rid)
  return total / len(gold)
