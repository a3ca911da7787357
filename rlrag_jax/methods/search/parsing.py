"""Parse a "Learning When to Search" completion into tagged segments and its structure.

The completion is the full sequence after the prompt: the model's text with the system's
<information> blocks in place. The scan is flat, left to right, over the five protocol tags:

  * an opening tag starts a segment; its closing tag ends it and emits (tag, content);
  * any other tag inside an open segment abandons that segment (an error) and is read afresh;
  * <information> is written by the system and is opaque: its content runs to the next
    </information>, whatever tags it holds;
  * a stray closing tag, an unclosed segment, or non-whitespace text outside segments is an error.

The two allowed structures (only whitespace between segments, no errors):

  A: think, reflect, answer
  B: think, then one or more rounds of search -> information -> reflect, then answer

and every search query and the answer must be non-blank. A blank <search> segment is not a
search call (the rollout's `prompts.extract_query` returns None for it), so `queries` and
`retrieval_count` leave it out. `parse` never raises.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Optional

from rlrag_jax.methods.search.prompts import TAGS, as_text

_TAG = re.compile(r"<(/?)(" + "|".join(TAGS) + r")>")
_INFO_CLOSE = "</information>"


@dataclasses.dataclass
class Parsed:
  segments: list                        # [(tag, content)] in order, content unstripped
  queries: list                         # stripped non-blank contents of <search> segments
  retrieval_count: int                  # search calls: len(queries)
  reflects: list                        # stripped contents of the <reflect> segments
  information: list                     # contents of the <information> segments
  answer: Optional[str]                 # stripped content of the last <answer>, None if none
  structure: Optional[str]              # 'A', 'B', or None (invalid)
  errors: list                          # why the scan or the structure is invalid

  @property
  def valid(self) -> bool:
    return self.structure is not None


def _scan(text: str):
  """(segments, errors) of the flat scan described in the module docstring."""
  segments, errors = [], []
  pos, open_tag, open_at = 0, None, 0

  def outside(upto: int):
    if text[pos:upto].strip():
      errors.append(f"text outside tags at char {pos}")

  while True:
    m = _TAG.search(text, pos)
    if m is None:
      break
    closing, tag = m.group(1) == "/", m.group(2)
    if open_tag is None:
      outside(m.start())
      if closing:
        errors.append(f"stray </{tag}> at char {m.start()}")
        pos = m.end()
        continue
      if tag == "information":
        end = text.find(_INFO_CLOSE, m.end())
        if end < 0:
          errors.append(f"unclosed <information> at char {m.start()}")
          segments.append((tag, text[m.end():]))
          return segments, errors
        segments.append((tag, text[m.end():end]))
        pos = end + len(_INFO_CLOSE)
        continue
      open_tag, open_at, pos = tag, m.end(), m.end()
      continue
    if closing and tag == open_tag:
      segments.append((tag, text[open_at:m.start()]))
      open_tag, pos = None, m.end()
      continue
    errors.append(f"<{open_tag}> at char {open_at} interrupted by {m.group(0)} at char "
                  f"{m.start()}")
    open_tag, pos = None, m.start()      # read this tag again, outside any segment
  if open_tag is not None:
    errors.append(f"unclosed <{open_tag}> at char {open_at}")
  else:
    outside(len(text))
  return segments, errors


def _structure(segments: list) -> tuple:
  """('A' | 'B' | None, error or None) for a clean list of segments."""
  tags = [t for t, _ in segments]
  if tags == ["think", "reflect", "answer"]:
    return "A", None
  rounds = tags[1:-1]
  if (len(tags) >= 5 and tags[0] == "think" and tags[-1] == "answer" and len(rounds) % 3 == 0
      and all(rounds[i:i + 3] == ["search", "information", "reflect"]
              for i in range(0, len(rounds), 3))):
    return "B", None
  return None, "tag order " + " ".join(tags) + " is neither A nor B"


def parse(completion) -> Parsed:
  """Segments, queries, retrieval count, reflect/answer and structure of a completion."""
  text = as_text(completion)
  if text is None:
    return Parsed([], [], 0, [], [], None, None, ["completion is not readable as text"])
  segments, errors = _scan(text)
  searches = [c.strip() for t, c in segments if t == "search"]
  queries = [q for q in searches if q]
  answers = [c.strip() for t, c in segments if t == "answer"]
  structure = None
  if not errors:
    structure, err = _structure(segments)
    if err:
      errors.append(err)
  if structure is not None:
    if len(queries) != len(searches):
      errors.append("blank search query")
    if not answers[-1]:
      errors.append("blank answer")
    if errors:
      structure = None
  return Parsed(
      segments=segments,
      queries=queries,
      retrieval_count=len(queries),
      reflects=[c.strip() for t, c in segments if t == "reflect"],
      information=[c for t, c in segments if t == "information"],
      answer=(answers[-1] or None) if answers else None,
      structure=structure,
      errors=errors)
