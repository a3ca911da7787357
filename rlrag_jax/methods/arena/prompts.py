"""ARENA's generator prompt: a question over references numbered from 1, structured reply.

`INSTRUCTION` and `USER_TEMPLATE` are the paper's Table 1 (ARENA, Ren et al. 2025,
arXiv:2505.13258), word for word: the instruction names the three parts the reply must hold, and
the user turn is `<question>…</question>` then `<references>…</references>` with the references
numbered from 1 ("[1] title: text", one per line; the paper says "references starting with
numbers" and shows no separator, so the line layout is ours). This is the `paper` prompt style;
the trainer's `compact` style (references, question and a cue, no instruction) is ours, for
models trained from scratch.

References are numbered in the order given; for an `Example` that is the order of
`example.contexts`, and `reference_numbers` maps context ids to those numbers.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

INSTRUCTION = (
    "A conversation between User and Assistant. The user asks a question and gives some "
    "references. The assistant should answer the question based on the references.\n"
    "User's input will always contain:\n"
    "<question>[ the question to answer ]</question>\n"
    "<references>[ references starting with numbers ]</references>\n"
    "Assistant's response must contain EXACTLY three sections:\n"
    "<relevance> [list ONLY reference numbers that provide useful information in square "
    "brackets, e.g. [1,5]]</relevance>\n"
    "<analysis>[ combine information from relevant references to build the answer. Explicitly "
    "mention which references support each claim ]</analysis>\n"
    "<answer>[ answer with ONLY a short phrase or single word. no explanations ]</answer>")
USER_TEMPLATE = "<question>{question}</question>\n<references>{references}</references>"
# The SFT-direct baseline's instruction (appendix E: question and all paragraphs in, a short
# answer out, no reasoning or evidence selection). The paper gives no text; this one is ours.
DIRECT_INSTRUCTION = ("Answer the question based on the references. Reply with ONLY the answer, "
                      "a short phrase or a single word, and no explanation.")


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
  return USER_TEMPLATE.format(question=_one_line(question, None),
                              references="\n" + format_references(passages, max_chars) + "\n")


def build_prompt(question: str, passages: Sequence, max_chars: Optional[int] = None,
                 instruction: str = INSTRUCTION) -> str:
  """Plain-text prompt for a model without a chat template (Table 1 laid out as a transcript).

  Args:
    question: the question.
    passages: (title, text) pairs (or objects with .title/.text) in reference order, numbered 1..n.
    max_chars: cut each passage's text to this many characters (None: keep it whole).

  Returns:
    INSTRUCTION, "User:" and the user turn, then "Assistant:" on its own line.
  """
  return f"{instruction}\nUser:\n{_body(question, passages, max_chars)}\nAssistant:\n"


def build_messages(question: str, passages: Sequence, max_chars: Optional[int] = None,
                   system: bool = True, instruction: str = INSTRUCTION) -> list:
  """Chat messages for an instruct model (pass them to the tokenizer's chat template).

  Args:
    question, passages, max_chars: as in `build_prompt`.
    system: put the instruction in a system message; False folds it into the user message, for
      chat templates without a system role.
    instruction: INSTRUCTION (Table 1), or DIRECT_INSTRUCTION for the SFT-direct baseline.

  Returns:
    [{"role": "system", ...}, {"role": "user", ...}], or a single user message.
  """
  body = _body(question, passages, max_chars)
  if system:
    return [{"role": "system", "content": instruction}, {"role": "user", "content": body}]
  return [{"role": "user", "content": f"{instruction}\n\n{body}"}]


def prompt_for(example, max_chars: Optional[int] = None, instruction: str = INSTRUCTION) -> str:
  """`build_prompt` over an Example's question and contexts."""
  return build_prompt(example.question, passages_of(example), max_chars, instruction)


def messages_for(example, max_chars: Optional[int] = None, system: bool = True,
                 instruction: str = INSTRUCTION) -> list:
  """`build_messages` over an Example's question and contexts."""
  return build_messages(example.question, passages_of(example), max_chars, system, instruction)


# The paper's LLM-as-a-Judge prompt (its Table 6, asked at temperature 0; appendix D.3), word
# for word. The gold aliases fill its "correct answer list" joined by " | " (the paper shows no
# list syntax); the model's response is the <answer> text.
JUDGE_TEMPLATE = (
    "*************Consider a knowledge Q&A RAG task to test the capability of a testing model, "
    "the correct answer list is:*************\n{gold}\n"
    "*************Here is the model's response:*************\n{pred}\n"
    "*************Please check if the model's answer is correct. As long as the model's answer "
    "hits any item (or synonym) in the correct answer list, it can be considered correct. You "
    "only need to answer \"yes\" or \"no\".*************")
