"""Search-R1's outcome reward: the exact match of the extracted answer, nothing for the format.

`extract_answer` takes the content of the last complete <answer> ... </answer> in the
completion (the prompt is not part of it, so the template's example answer is never read);
`reward` is 1.0 when its normalised text equals a normalised gold answer (lowercase, no
punctuation or articles, `metrics.exact_match`), else 0.0, and 0.0 for any completion without
an answer. Neither raises on malformed output.
"""
from __future__ import annotations

import re
from typing import Optional

from rlrag_jax import metrics

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_SEARCH = re.compile(r"<search>(.*?)</search>\s*$", re.S)


def _text(x) -> str:
  if isinstance(x, bytes):
    return x.decode("utf-8", "replace")
  return "" if x is None else str(x)


def extract_answer(completion) -> Optional[str]:
  """The stripped content of the last <answer>...</answer>; None when there is none."""
  found = _ANSWER.findall(_text(completion))
  return found[-1].strip() if found else None


def extract_query(turn_text) -> Optional[str]:
  """The query of a turn that ends with '</search>' (the last <search> ... </search> at its end);
  None for a turn that ends otherwise or whose query is blank or holds a tag."""
  text = _text(turn_text)
  m = _SEARCH.search(text[text.rfind("<search>"):]) if "<search>" in text else None
  if m is None:
    return None
  q = " ".join(m.group(1).split())
  return q if q and "<" not in q else None


def reward(completion, answers) -> dict:
  """{'total', 'em', 'answered'}: total = EM of the extracted answer (0 without one)."""
  pred = extract_answer(completion)
  em = metrics.exact_match(pred, answers) if pred is not None else 0.0
  return {"total": em, "em": em, "answered": float(pred is not None)}
