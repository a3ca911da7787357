"""APEX-Searcher's execution-agent prompts and the parsers of their outputs.

One model plays every execution role (the paper's appendix E): the knowledge-sufficiency check,
the answer from accumulated knowledge, query generation (first and later hops), the
continuation decision, the sub-answer from retrieved passages, and the final synthesis. The
appendix describes each prompt but its text did not survive, so the instructions below are ours;
each says what the appendix says that prompt does.

A prompt is an `Ask`: its role (`kind`) and its sections (known facts, the question, earlier
queries, passages, the hop count); `text(style)` renders it. Style 'compact' (the from-scratch
CPU models) is the role tag and the sections; 'paper' puts the instruction first. With a chat
template the instruction is the system message (`chat_messages`).

Parsers never raise: a malformed decision takes the role's safe default (check: retrieve,
continue: stop), an empty query falls back to the sub-question itself, an empty answer is ''.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import re
from typing import Optional, Sequence

KINDS = ("check", "known_answer", "query", "continue", "sub_answer", "synthesis")
DECISIONS = {"check": ("retrieve", "answer"), "continue": ("stop", "continue")}  # default first

INSTRUCTIONS = {
    "check": "Decide whether the known facts already answer the question. Reply 'answer' if "
             "they do, or 'retrieve' if a search is needed.",
    "known_answer": "Answer the question from the known facts alone. Give your best answer "
                    "even if the facts are incomplete: only the answer (a name, a place, a "
                    "date or a number, or yes/no), never 'unknown'.",
    "query": "Write one search query that finds a passage answering the question. Think about "
             "what is missing and name it.",
    "query_next": "The earlier queries did not find the answer. Write a different search "
                  "query: other keywords, another angle, more or less specific. Do not repeat "
                  "an earlier query.",
    "continue": "Decide whether the passages found so far answer the question. Reply 'stop' if "
                "they do, or 'continue' to search again; searching ends after the last hop.",
    "sub_answer": "Answer the question from the passages and the known facts. Give only the "
                  "answer: a name, a place, a date or a number, or yes/no.",
    "synthesis": "Answer the main question from the answers to its sub-questions. Give only the "
                 "answer.",
}


@dataclasses.dataclass(frozen=True)
class Ask:
  """One call of the execution model: its role and what the prompt shows. `target` is the
  oracle's output for it (set only when building SFT trajectories)."""
  kind: str
  question: str
  knowledge: tuple = ()          # ((sub-question, answer), ...) answered so far
  passages: tuple = ()           # ((title, text), ...) retrieved for this sub-question
  tried: tuple = ()              # earlier queries for this sub-question
  hop: int = 0                   # continue: hops done so far
  max_hops: int = 0
  target: Optional[str] = None

  def instruction(self) -> str:
    if self.kind == "query" and self.tried:
      return INSTRUCTIONS["query_next"]
    return INSTRUCTIONS[self.kind]

  def body(self) -> str:
    lines = []
    if self.knowledge:
      lines.append("Known:")
      lines += [f"- {q} -> {a}" for q, a in self.knowledge]
    if self.passages:
      lines.append("Passages:")
      lines += [f"[{i}] {t}: {x}" if t else f"[{i}] {x}"
                for i, (t, x) in enumerate(self.passages, 1)]
    label = "Main question" if self.kind == "synthesis" else "Question"
    lines.append(f"{label}: {self.question}")
    if self.tried:
      lines.append("Tried: " + " | ".join(self.tried))
    if self.kind == "continue":
      lines.append(f"Hop {self.hop} of {self.max_hops}")
    return "\n".join(lines)

  def text(self, style: str = "compact") -> str:
    """The prompt as plain text, ending where the model's output starts."""
    cue = f"[{self.kind}]" if style == "compact" else self.instruction()
    return f"{cue}\n{self.body()}\nReply:"

  def chat_messages(self) -> list:
    return [{"role": "system", "content": self.instruction()},
            {"role": "user", "content": self.body()}]


_WORD = re.compile(r"[a-z]+")
_TOKEN = re.compile(r"[a-z0-9]+")
_PREFIX = re.compile(r"^\s*(?:final\s+)?(?:answer|query|search|reply)\s*:\s*", re.IGNORECASE)


def parse_decision(kind: str, text) -> tuple:
  """(decision, ok): the first word of `text` if it is one of the role's options, else the
  role's safe default with ok False."""
  options = DECISIONS[kind]
  m = _WORD.search(str(text or "").lower())
  word = m.group(0) if m else ""
  if word in options:
    return word, True
  return options[0], False


def first_line(text, max_words: int = 32) -> str:
  """The first non-empty line of `text` without a leading 'Answer:' / 'Query:' and quotes,
  at most `max_words` words; '' when there is none."""
  for line in str(text or "").splitlines():
    line = _PREFIX.sub("", line).strip().strip("\"'`").strip()
    if line:
      return " ".join(line.split()[:max_words])
  return ""


def parse_query(text, fallback: str) -> tuple:
  """(query, ok): the model's query, or `fallback` (the sub-question) when it wrote none."""
  q = first_line(text)
  return (q, True) if q else (fallback, False)


def parse_answer(text) -> str:
  return first_line(text)


def normalized(text: str) -> str:
  return " ".join(_TOKEN.findall(str(text).lower()))


def repeats(query: str, tried: Sequence[str]) -> bool:
  """True when `query` equals an earlier query up to case and punctuation."""
  n = normalized(query)
  return any(n == normalized(t) for t in tried)


# ------------------------------------------------ trajectory files (self_instruct.py writes them)
def ask_to_dict(ask) -> dict:
  d = dataclasses.asdict(ask)
  d.pop("target", None)
  return d


def ask_from_dict(d: dict):
  if d.get("kind") not in KINDS:
    raise ValueError(f"unknown kind {d.get('kind')!r}; expected one of {KINDS}")
  return Ask(kind=d["kind"], question=str(d["question"]),
             knowledge=tuple(tuple(map(str, kv)) for kv in d.get("knowledge", ())),
             passages=tuple(tuple(map(str, tp)) for tp in d.get("passages", ())),
             tried=tuple(map(str, d.get("tried", ()))), hop=int(d.get("hop", 0)),
             max_hops=int(d.get("max_hops", 0)))


def read_trajectories(path) -> dict:
  """{example id: [(Ask, output), ...]} from a file self_instruct.py wrote; errors name the
  line."""
  p = pathlib.Path(path)
  out = {}
  for n, line in enumerate(p.read_text().splitlines(), 1):
    if not line.strip():
      continue
    try:
      rec = json.loads(line)
      out[str(rec["id"])] = [(ask_from_dict(c["ask"]), str(c["output"])) for c in rec["calls"]]
    except (ValueError, KeyError, TypeError) as e:
      raise ValueError(f"{p}:{n}: {e}") from None
  return out
