"""Parse what SPARKLE's models write. Nothing here raises on model output: a malformed output is
reported as such (`well_formed=False`) with the safe default of its role.

The proxy's three roles (the paper's appendix A.1-A.3 formats):

  Retrieval Decision   "Yes (retrieval is required)" / "No (retrieval is not required)"
  Query Formulation    Reasoning Chain: <head; relation; tail>, <head; relation; [unknown]>
                       To continue answering the question, we need to know: <the gap>
                       Retrieval Query: <a concise query>
                       (Figure 5 labels no query: without "Retrieval Query:" the first
                       non-blank line after the need's is the query)
  Knowledge Integration  one candidate triple, written out ("<head; relation; tail>") or by its
                       number in the candidate list ("[3]")

The reader (appendix A.4): one `<think>…</think>` per call, or the final `<answer>…</answer>`;
a reasoning model instead writes free text split on newlines and answers in `\\boxed{…}`.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Optional, Sequence

YES = "Yes (retrieval is required)"
NO = "No (retrieval is not required)"
CHAIN = "Reasoning Chain:"
NEED = "To continue answering the question, we need to know:"
QUERY = "Retrieval Query:"
UNKNOWN = "[unknown]"

_TRIPLE = re.compile(r"<([^<>;]*);([^<>;]*);([^<>;]*)>")
_INDEX = re.compile(r"^\s*\[?\s*(\d+)\s*\]?")
_THINK = re.compile(r"<think>(.*?)</think>", re.S)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_WORD = re.compile(r"[a-z]+")
# A label before an unmarked query line ("Step 3: Formulate Retrieval Query:", "Query:").
_HEADER = re.compile(r"^\s*\[[^\]]*\]\s*$")        # "[Step 3: Formulate Retrieval Query]"
_STEP_LABEL = re.compile(r"^\s*(step\s*3\s*:\s*)?([\w ]*query\s*:\s*)?", re.I)


def _text(x) -> str:
  return x if isinstance(x, str) else ""


def _squash(s: str) -> str:
  return " ".join(s.split())


# --------------------------------------------------------------------------- Retrieval Decision
@dataclasses.dataclass(frozen=True)
class Decision:
  retrieve: bool
  well_formed: bool


def parse_decision(text, default: bool = False) -> Decision:
  """The first word decides ("yes" / "no", any case, punctuation ignored); anything else is
  malformed and takes `default`."""
  m = _WORD.search(_text(text).lower())
  if m is not None and m.group(0) in ("yes", "no"):
    return Decision(m.group(0) == "yes", True)
  return Decision(bool(default), False)


def render_decision(retrieve: bool) -> str:
  return YES if retrieve else NO


# --------------------------------------------------------------------------- triples
def triple_text(t) -> str:
  """`<head; relation; tail>` of a Triple or a (head, relation, tail) sequence."""
  h, r, tl = (t.head, t.relation, t.tail) if hasattr(t, "head") else tuple(t)
  return f"<{h}; {r}; {tl}>"


def parse_triples(text) -> tuple:
  """Every `<head; relation; tail>` in the text, as (head, relation, tail) with spaces
  squashed; parts may be blank."""
  return tuple(tuple(_squash(p) for p in m) for m in _TRIPLE.findall(_text(text)))


def _key(t: Sequence[str]) -> tuple:
  return tuple(_squash(p).lower().strip("\"'") for p in t)


# --------------------------------------------------------------------------- Query Formulation
@dataclasses.dataclass(frozen=True)
class Formulation:
  chain: tuple                # (head, relation, tail) triples of the reasoning chain
  need: str                   # the knowledge gap ("" when missing)
  query: str                  # the retrieval query (the fallback when missing)
  well_formed: bool           # a non-blank query after the "Retrieval Query:" marker


def _after(text: str, marker: str, stops: Sequence[str]) -> Optional[str]:
  i = text.lower().find(marker.lower())
  if i < 0:
    return None
  rest = text[i + len(marker):]
  cut = len(rest)
  for s in stops:
    j = rest.lower().find(s.lower())
    if 0 <= j < cut:
      cut = j
  return _squash(rest[:cut])


def parse_formulation(text, fallback: str) -> Formulation:
  """The chain (triples before the need), the need and the query. Without a query the
  formulation is malformed and the query is `fallback` (the caller passes the latest thought
  or the question)."""
  text = _text(text)
  head = text
  for marker in (NEED, QUERY):
    j = head.lower().find(marker.lower())
    if j >= 0:
      head = head[:j]
  chain = parse_triples(head)
  need = _after(text, NEED, (QUERY,)) or ""
  query = ""
  i = text.lower().find(QUERY.lower())
  if i >= 0:       # the query is the first non-blank line after the marker
    query = _squash(text[i + len(QUERY):].strip().split("\n", 1)[0])
  elif need:       # Figure 5 names no query label: the need's line, then the query's
    j = text.lower().find(NEED.lower()) + len(NEED)
    lines = [l for l in text[j:].split("\n") if l.strip()]
    need = _squash(lines[0]) if lines else ""
    rest = [_squash(_STEP_LABEL.sub("", l)) for l in lines[1:] if not _HEADER.match(l)]
    query = next((l for l in rest if l), "")
  if query:
    return Formulation(chain, need, query, True)
  return Formulation(chain, need, _squash(_text(fallback)), False)


def render_formulation(chain: Sequence, need: str, query: str) -> str:
  links = ", ".join(triple_text(t) for t in chain) if chain else "(none)"
  return f"{CHAIN} {links}\n{NEED} {need}\n{QUERY} {query}"


# --------------------------------------------------------------------------- Knowledge Integration
@dataclasses.dataclass(frozen=True)
class Selection:
  index: Optional[int]        # into the candidate list; None when nothing usable was selected
  well_formed: bool           # the output named a candidate (by its text or its number)


def parse_selection(text, candidates: Sequence, fallback: Optional[int] = 0) -> Selection:
  """The candidate the output names: the first written triple that matches a candidate (case
  and spacing ignored), else a leading number `k` or `[k]` (1-based). Otherwise malformed, and
  the selection is `fallback` (0: the retriever's best candidate; None: nothing) when there
  are candidates."""
  text = _text(text)
  keys = [_key(c if not hasattr(c, "head") else (c.head, c.relation, c.tail))
          for c in candidates]
  for t in parse_triples(text):
    k = _key(t)
    if k in keys:
      return Selection(keys.index(k), True)
  m = _INDEX.match(text)
  if m is not None and 1 <= int(m.group(1)) <= len(candidates):
    return Selection(int(m.group(1)) - 1, True)
  if not candidates or fallback is None:
    return Selection(None, False)
  return Selection(min(max(int(fallback), 0), len(candidates) - 1), False)


def parse_document(text, titles: Sequence[str], fallback: Optional[int] = 0) -> Selection:
  """Direct KI: the document the output names, by a leading number `k` / `[k]` (1-based) or by
  a title it starts with (case and spacing ignored); else `fallback` as in parse_selection."""
  text = _text(text)
  m = _INDEX.match(text)
  if m is not None and 1 <= int(m.group(1)) <= len(titles):
    return Selection(int(m.group(1)) - 1, True)
  head = _squash(text).lower()
  for k, t in sorted(enumerate(titles), key=lambda kt: -len(kt[1])):
    if t and head.startswith(_squash(t).lower()):
      return Selection(k, True)
  if not titles or fallback is None:
    return Selection(None, False)
  return Selection(min(max(int(fallback), 0), len(titles) - 1), False)


def render_selection(candidates: Sequence, index: int, by: str = "triple") -> str:
  """The KI output naming candidate `index`: its triple text, or `[k]` when by == 'index'."""
  if by == "index":
    return f"[{index + 1}]"
  return triple_text(candidates[index])


# --------------------------------------------------------------------------- the reader
@dataclasses.dataclass(frozen=True)
class Thought:
  kind: str                   # 'think' | 'answer' | 'malformed'
  text: str                   # the thought, or the answer


def parse_thought(text, reasoning: bool = False) -> Thought:
  """One reader call. Instruct style: an `<answer>` anywhere ends the reasoning (the paper's
  "r_t contains the answer"); else the first closed `<think>`; else malformed (the text kept,
  squashed, so it still shows in the history). Reasoning style: `\\boxed{…}` answers; else the
  first non-blank line is the thought."""
  text = _text(text)
  if reasoning:
    box = boxed(text)
    if box is not None:
      return Thought("answer", box)
    for line in text.splitlines():
      if line.strip():
        return Thought("think", _squash(line))
    return Thought("malformed", "")
  m = _ANSWER.search(text)
  if m is not None:
    return Thought("answer", _squash(m.group(1)))
  m = _THINK.search(text)
  if m is not None and m.group(1).strip():
    return Thought("think", _squash(m.group(1)))
  return Thought("malformed", _squash(text))


def boxed(text) -> Optional[str]:
  """The content of the last `\\boxed{…}` (nested braces allowed), or None."""
  text = _text(text)
  i = text.rfind("\\boxed{")
  if i < 0:
    return None
  depth, j = 1, i + len("\\boxed{")
  start = j
  while j < len(text):
    if text[j] == "{":
      depth += 1
    elif text[j] == "}":
      depth -= 1
      if depth == 0:
        return _squash(text[start:j])
    j += 1
  return None


def extract_answer(thoughts: Sequence[Thought]) -> str:
  """The final answer of a finished reasoning: the first answer thought; '' when the reader
  never answered (the step limit came first)."""
  for t in thoughts:
    if t.kind == "answer":
      return t.text
  return ""
