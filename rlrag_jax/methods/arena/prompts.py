"""ARENA's generator prompt: a question over references numbered [1]..[n], structured reply.

The model is asked for three parts and nothing else:
`<relevance>[ids]</relevance><analysis>step-by-step reasoning</analysis><answer>short</answer>`.
The wording below is ours, written from the paper's description of its structured protocol
(ARENA, Ren et al. 2025, arXiv:2505.13258, Table 1); the stored copies of the paper that we could
search did not include the text of Table 1.

References are numbered in the order given; for an `Example` that is the order of
`example.contexts`, and `reference_numbers` maps context ids to those numbers.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

INSTRUCTION = (
    "Answer the question using the numbered references below. Reply with exactly three parts, "
    "in this order, and nothing else:\n"
    "<relevance>the numbers of the references needed to answer the question, as a list such as "
    "[1, 3]</relevance>\n"
    "<analysis>your step-by-step reasoning over those references, citing them by number"
    "</analysis>\n"
    "<answer>the final answer only, as short as possible (a name, a date, a number, yes or no)"
    "</answer>")
RESPONSE_CUE = "Response:\n"


@dataclasses.dataclass(frozen=True)
class Numbering:
  """Reference numbers of one example's contexts.

  Attributes:
    ids: context id of reference k at ids[k - 1] (the order of example.contexts).
    gold: gold reference numbers, ascending; gold ids absent from the contexts are left out.
    missing: gold ids that are not among the contexts (e.g. a retriever missed them).
  """
  ids: tuple
  gold: tuple
  missing: tuple = ()

  def number(self, cid: str) -> Optional[int]:
    """1-based reference number of a context id (its first occurrence), or None."""
    try:
      return self.ids.index(cid) + 1
    except ValueError:
      return None


def reference_numbers(example) -> Numbering:
  """Numbers an Example's contexts 1..n in their order and maps its gold_ids to those numbers."""
  ids = tuple(c.id for c in example.contexts)
  first = {}
  for k, cid in enumerate(ids, start=1):
    first.setdefault(cid, k)
  gold = sorted({first[g] for g in example.gold_ids if g in first})
  missing = tuple(g for g in example.gold_ids if g not in first)
  return Numbering(ids=ids, gold=tuple(gold), missing=missing)


def passages_of(example) -> list:
  """(title, text) pairs of an Example's contexts, in order."""
  return [(c.title, c.text) for c in example.contexts]


def _as_pair(p, k: int):
  if hasattr(p, "title") and hasattr(p, "text"):
    return p.title, p.text
  if isinstance(p, (tuple, list)) and len(p) == 2:
    return p[0], p[1]
  raise ValueError(f"arena.prompts: passages[{k}] should be a (title, text) pair or have "
                   f".title and .text, found {type(p).__name__}: {p!r:.80}")


def _one_line(s, max_chars: Optional[int]) -> str:
  s = " ".join(str(s or "").split())
  if max_chars is not None and len(s) > max_chars:
    s = s[:max_chars].rstrip() + " …"
  return s


def format_references(passages: Sequence, max_chars: Optional[int] = None) -> str:
  """One line per reference: "[k] title: text" (text whitespace collapsed, cut at max_chars)."""
  lines = []
  for k, p in enumerate(passages, start=1):
    title, text = _as_pair(p, k - 1)
    title, text = _one_line(title, None), _one_line(text, max_chars)
    lines.append(f"[{k}] {title}: {text}" if title else f"[{k}] {text}")
  return "\n".join(lines)


def _body(question: str, passages: Sequence, max_chars: Optional[int]) -> str:
  return (f"References:\n{format_references(passages, max_chars)}\n\n"
          f"Question: {_one_line(question, None)}")


def build_prompt(question: str, passages: Sequence, max_chars: Optional[int] = None) -> str:
  """Plain-text prompt for a base LM; the completion starts right after it.

  Args:
    question: the question.
    passages: (title, text) pairs (or objects with .title/.text) in reference order, numbered 1..n.
    max_chars: cut each passage's text to this many characters (None: keep it whole).

  Returns:
    INSTRUCTION, the numbered references, the question, then RESPONSE_CUE on its own line.
  """
  return f"{INSTRUCTION}\n\n{_body(question, passages, max_chars)}\n\n{RESPONSE_CUE}"


def build_messages(question: str, passages: Sequence, max_chars: Optional[int] = None,
                   system: bool = True) -> list:
  """Chat messages for an instruct model (pass them to the tokenizer's chat template).

  Args:
    question, passages, max_chars: as in `build_prompt`.
    system: put INSTRUCTION in a system message; False folds it into the user message, for chat
      templates without a system role.

  Returns:
    [{"role": "system", ...}, {"role": "user", ...}], or a single user message.
  """
  body = _body(question, passages, max_chars)
  if system:
    return [{"role": "system", "content": INSTRUCTION}, {"role": "user", "content": body}]
  return [{"role": "user", "content": f"{INSTRUCTION}\n\n{body}"}]


def prompt_for(example, max_chars: Optional[int] = None) -> str:
  """`build_prompt` over an Example's question and contexts."""
  return build_prompt(example.question, passages_of(example), max_chars)


def messages_for(example, max_chars: Optional[int] = None, system: bool = True) -> list:
  """`build_messages` over an Example's question and contexts."""
  return build_messages(example.question, passages_of(example), max_chars, system)
