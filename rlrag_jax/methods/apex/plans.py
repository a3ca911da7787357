"""APEX-Searcher plans: the planner's prompt, its output format, parsing with a safe fallback,
gold plans from decompositions, and `#k` reference resolution.

A plan is an ordered list of sub-questions; a later one may name an earlier answer as `#k`
(1-based). The planner writes one sub-question per line, numbered:

  1. Who directed The Glass Harbour?
  2. In which city was #1 born?

The paper's planner prompt did not survive in its text (section 2.2.2 introduces it, the figure
is lost), so PLANNER_INSTRUCTION is ours; it states the same constraints the section names: a
bounded number of steps and `#n` references to earlier answers.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Sequence

PLANNER_INSTRUCTION = (
    "Break the question into the sub-questions that must be answered, in order, to answer it. "
    "Write one sub-question per line as '1. ...', '2. ...', at most {max_steps} lines. A "
    "sub-question that needs the answer of an earlier one refers to it as #1, #2, ... instead "
    "of guessing it. A question that needs no decomposition is one line: the question itself.")

_NUMBERED = re.compile(r"^\s*(?:step\s*)?(\d{1,2})\s*[.):]\s*(.+?)\s*$", re.IGNORECASE)
_REF = re.compile(r"#(\d+)")


@dataclasses.dataclass(frozen=True)
class Plan:
  """A parsed plan. `fallback` is True when the text held no usable plan and the plan is the
  question itself (the paper: "if decomposition fails, ... a single-step task"); `reason` says
  why, for counting."""
  steps: tuple
  fallback: bool = False
  reason: str = ""


def instruction(max_steps: int) -> str:
  return PLANNER_INSTRUCTION.format(max_steps=int(max_steps))


def render(steps: Sequence[str]) -> str:
  """The planner's output format for `steps` (SFT targets, gold plans shown in reports)."""
  return "\n".join(f"{i}. {s.strip()}" for i, s in enumerate(steps, 1))


def parse(text, question: str, max_steps: int) -> Plan:
  """The sub-questions of a planner output; never raises.

  Lines numbered 1, 2, 3, ... in order are the steps (other lines are ignored). The plan falls
  back to the single step `question` when there is no numbered line, the numbering skips or
  repeats, there are more than `max_steps` steps, a step is empty, or a step refers to itself,
  a later step or a step that does not exist (#0, #k >= its own number).
  """
  def fail(reason):
    return Plan((str(question),), True, reason)

  if not isinstance(text, str):
    return fail("not text")
  steps = []
  for line in text.splitlines():
    m = _NUMBERED.match(line)
    if not m:
      continue
    number, body = int(m.group(1)), m.group(2).strip()
    if number != len(steps) + 1:
      return fail(f"numbering: found {number} where {len(steps) + 1} was due")
    if not body:
      return fail(f"step {number} is empty")
    for ref in _REF.findall(body):
      if not 1 <= int(ref) < number:
        return fail(f"step {number} refers to #{ref}")
    steps.append(body)
  if not steps:
    return fail("no numbered step")
  if len(steps) > max_steps:
    return fail(f"{len(steps)} steps, more than {max_steps}")
  return Plan(tuple(steps))


def gold_steps(example) -> list:
  """The gold plan: the decomposition's sub-questions (`#k` references kept); the question
  itself when the example has no decomposition."""
  steps = [s.question.strip() for s in getattr(example, "decomposition", []) or []]
  return steps or [example.question]


def references(step: str) -> list:
  """The earlier steps a sub-question refers to (1-based numbers, in order of appearance)."""
  return [int(r) for r in _REF.findall(step)]


def resolve(step: str, answers: Sequence[str]) -> str:
  """`#k` replaced by the k-th earlier answer (the executor's reference resolution); a
  reference with no answer yet is left as written."""
  def sub(m):
    k = int(m.group(1))
    return answers[k - 1] if 1 <= k <= len(answers) and answers[k - 1] else m.group(0)
  return _REF.sub(sub, step)
