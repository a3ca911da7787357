"""Parse ARENA's reply: <relevance>[ids]</relevance><analysis>…</analysis><answer>…</answer>.

`parse` never raises. It reports two things separately:

* `well_formed` (drives the format reward): the completion is the three parts in this order,
  with only whitespace before, between and after them; each of the six tags occurs exactly once;
  the analysis and the answer are not blank. Tags are case-sensitive and must be written exactly
  (`<answer>`, not `<Answer>` or `< answer >`). What the relevance part holds does not matter
  to the format: it is scored separately, by the relevance reward (the paper's rule: format =
  the three parts present and in order).
* the fields (drive the accuracy and relevance rewards): a part is read whenever its open and
  close tag each occur exactly once, the open tag comes first, the content holds none of the six
  tags and the part does not lie inside another part. So a completion with stray text around
  the parts, or with its parts out of order, still has its answer and ids read; a duplicated,
  nested or overlapping part is not read (a model must not be able to offer two answers and be
  scored on the better one, nor hide its answer inside its analysis).

Relevance ids are read in one of two modes (`relevance_parse`):

* 'strict' (both presets; the paper's evaluation): the content, stripped, must parse as a JSON
  list of integers ("[1, 3]", "[]"); anything else ("[2,,", "2", "(2)", "[[2]]", "[1.5]",
  "[true]") gives None, which scores relevance 0. Nothing is repaired.
* 'lenient' (ours, opt-in): any content made only of ASCII digits, whitespace, commas,
  semicolons and brackets "[]()" gives its integers ("1, 3", "[1][3]" and "(1; 3)" all give
  [1, 3]); anything else ("1 and 3", "none", "[1.5]", "[-1]") gives None.

In both, an id longer than nine digits makes the list unparseable (and keeps `int` away from
huge digit strings).

Callers pass the decoded completion text without special tokens (strip "<|im_end|>" and the
like first): anything after </answer> other than whitespace breaks the format.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Optional

PARTS = ("relevance", "analysis", "answer")
RELEVANCE_PARSERS = ("strict", "lenient")
TAGS = tuple(t for name in PARTS for t in (f"<{name}>", f"</{name}>"))
_MAX_ID_DIGITS = 9

_LENIENT_CHARS = re.compile(r"[0-9\s,;\[\]()]*", re.ASCII)
_INT = re.compile(r"[0-9]+", re.ASCII)


@dataclasses.dataclass(frozen=True)
class Parsed:
  """What `parse` read from one completion.

  Attributes:
    relevance_ids: integers in the relevance part, in written order (duplicates kept), or None
      when the part is missing, ambiguous or not a list of integers (in the parse mode).
    analysis: text of the analysis part (not stripped), or None when missing or ambiguous.
    answer: text of the answer part, stripped, or None when missing or ambiguous.
    well_formed: True when the completion follows the format exactly (see module docstring).
    problems: why it is not well formed, one short sentence each; empty when well formed.
  """
  relevance_ids: Optional[list]
  analysis: Optional[str]
  answer: Optional[str]
  well_formed: bool
  problems: tuple = ()


def parse_ids(content: Optional[str], mode: str = "strict") -> Optional[list]:
  """Reference ids from the relevance part's content (see the module docstring), or None."""
  if mode == "strict":
    return _strict_ids(content)
  if mode == "lenient":
    return _lenient_ids(content)
  raise ValueError(f"relevance_parse is {mode!r}; expected one of {RELEVANCE_PARSERS}")


def _strict_ids(content: Optional[str]) -> Optional[list]:
  if content is None:
    return None
  try:
    value = json.loads(content.strip())
  except ValueError:
    return None
  if not isinstance(value, list) or not all(type(v) is int for v in value):   # bool is not int
    return None
  if any(v < 0 or len(str(v)) > _MAX_ID_DIGITS for v in value):
    return None
  return value


def _lenient_ids(content: Optional[str]) -> Optional[list]:
  if content is None or _LENIENT_CHARS.fullmatch(content) is None:
    return None
  tokens = _INT.findall(content)
  if any(len(t) > _MAX_ID_DIGITS for t in tokens):
    return None
  return [int(t) for t in tokens]


def _raw_span(text: str, name: str):
  """(start, end) of a part whose open and close tag occur once each, in order; else a problem."""
  open_tag, close_tag = f"<{name}>", f"</{name}>"
  n_open, n_close = text.count(open_tag), text.count(close_tag)
  if n_open != 1 or n_close != 1:
    return None, f"expected {open_tag} and {close_tag} once each, found {n_open} and {n_close}"
  i, j = text.find(open_tag), text.find(close_tag)
  if j < i + len(open_tag):
    return None, f"{close_tag} comes before {open_tag}"
  return (i, j + len(close_tag)), None


def parse(completion, relevance_parse: str = "strict") -> Parsed:
  """Reads an ARENA completion; never raises, whatever the completion.

  Args:
    completion: the generated text (a str; anything else parses as a failure).
    relevance_parse: 'strict' (a JSON list of integers) or 'lenient' (see the module docstring).

  Returns:
    A `Parsed`; see the module docstring for the strict and lenient rules.
  """
  if relevance_parse not in RELEVANCE_PARSERS:     # a config error, not a model failure
    raise ValueError(f"relevance_parse is {relevance_parse!r}; expected one of "
                     f"{RELEVANCE_PARSERS}")
  try:
    return _parse(completion, relevance_parse)
  except Exception as e:  # pylint: disable=broad-except
    # Defence in depth: the rules above are written not to raise; a bug must not stop training.
    return Parsed(None, None, None, False, (f"parser error {type(e).__name__}: {e}",))


def _parse(completion, relevance_parse: str) -> Parsed:
  if not isinstance(completion, str):
    return Parsed(None, None, None, False,
                  (f"expected the completion as str, found {type(completion).__name__}",))
  problems = []
  raw = {}
  for name in PARTS:
    span, problem = _raw_span(completion, name)
    if problem:
      problems.append(f"<{name}>: {problem}")
    else:
      raw[name] = span
  spans = {}
  for name, (start, end) in raw.items():
    content = completion[start + len(name) + 2:end - len(name) - 3]
    nested = [t for t in TAGS if t in content]
    outer = [o for o, (s, e) in raw.items() if o != name and s < start and end <= e]
    if nested:
      problems.append(f"<{name}>: holds the tag {nested[0]} (nested or overlapping parts)")
    elif outer:
      problems.append(f"<{name}>: nested inside <{outer[0]}>")
    else:
      spans[name] = (start, end, content)

  rel = spans.get("relevance")
  relevance_ids = parse_ids(rel[2], relevance_parse) if rel else None
  analysis = spans["analysis"][2] if "analysis" in spans else None
  answer = spans["answer"][2].strip() if "answer" in spans else None

  if len(spans) == len(PARTS):
    bounds = [spans[name] for name in PARTS]
    gaps = [completion[:bounds[0][0]], completion[bounds[-1][1]:]]
    for (_, end, _), (start, _, _) in zip(bounds, bounds[1:]):
      if start < end:
        gaps = None
        break
      gaps.append(completion[end:start])
    if gaps is None:
      problems.append("the parts are not in the order relevance, analysis, answer")
    elif any(g.strip() for g in gaps):
      problems.append("text other than whitespace outside the three parts")
  if analysis is not None and not analysis.strip():
    problems.append("<analysis>: empty")
  if answer is not None and not answer:
    problems.append("<answer>: empty")
  return Parsed(relevance_ids, analysis, answer, not problems, tuple(problems))

