"""Parse one expansion step of the steering model:

  <think> reasoning </think>
  <base-Q> query </base-Q> ...           (or <base-Q>stop retrieval</base-Q>)
  <predicted-Q> query </predicted-Q> ... (or <predicted-Q>none</predicted-Q>)

A base-Q or predicted-Q part counts as well formed when it is closed, non-blank and comes after
a closed <think>…</think> (the paper rewards a part "conditioned on the preceding <think>").
Parts before the think, unclosed parts and blank parts are not queries. The stop signal is a
base-Q that reads "stop retrieval" (any case, surrounding punctuation ignored); a predicted-Q
that reads "none" is a well-formed "no prediction". `parse` never raises.
"""
from __future__ import annotations

import dataclasses
import re

_PART = re.compile(r"<(base-Q|predicted-Q)>(.*?)</\1>", re.S)
_THINK = re.compile(r"<think>(.*?)</think>", re.S)
STOP = "stop retrieval"
NONE = "none"


@dataclasses.dataclass(frozen=True)
class Step:
  think: bool                 # a closed <think>…</think> is present
  base: tuple                 # base queries in order (stop and blanks left out)
  predicted: tuple            # predicted queries in order ("none" and blanks left out)
  stop: bool                  # a base-Q reads "stop retrieval"
  base_parts: int             # well-formed base-Q parts (stop included)
  predicted_parts: int        # well-formed predicted-Q parts ("none" included)

  @property
  def queries(self) -> tuple:
    return self.base + self.predicted


def _norm(s: str) -> str:
  return re.sub(r"[\s\"'.!]+", " ", s).strip().lower()


def parse(text) -> Step:
  text = text if isinstance(text, str) else ""
  m = _THINK.search(text)
  if m is None:
    return Step(False, (), (), False, 0, 0)
  base, pred, stop, nb, np_ = [], [], False, 0, 0
  for kind, body in _PART.findall(text[m.end():]):
    q = " ".join(body.split())
    if not q:
      continue
    if kind == "base-Q":
      nb += 1
      if _norm(q) == STOP:
        stop = True
      else:
        base.append(q)
    else:
      np_ += 1
      if _norm(q) != NONE:
        pred.append(q)
  return Step(True, tuple(base), tuple(pred), stop, nb, np_)


def render(think: str, base, predicted=(), stop: bool = False) -> str:
  """The output format, for oracle SFT targets: stop writes the stop signal and "none"."""
  parts = [f"<think>{think}</think>"]
  if stop:
    parts += [f"<base-Q>{STOP}</base-Q>", f"<predicted-Q>{NONE}</predicted-Q>"]
  else:
    parts += [f"<base-Q>{q}</base-Q>" for q in base]
    parts += [f"<predicted-Q>{q}</predicted-Q>" for q in predicted] or \
             [f"<predicted-Q>{NONE}</predicted-Q>"]
  return "".join(parts)
