"""Search-R1's prompt and the text the environment appends.

`TEMPLATE` is the instruction of the authors' released code (the 'base' prefix their data
scripts write before every question, which their paper's Table 1 prints), reproduced from
memory, its wording kept as released ("as many times as your want" included). Check it against
the repository before citing it as theirs.

Retrieved passages come back as one block, `\\n\\n<information>Doc 1(Title: T) text\\nDoc 2(...)
...</information>\\n\\n`: the authors' passage format ('Doc i(Title: T) text', no space before
the parenthesis; wiki-18's titles keep their double quotes, which our corpus loader strips and
`format_docs` puts back).
"""
from __future__ import annotations

import re

TEMPLATE = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first "
    "every time you get new information. After reasoning, if you find you lack some knowledge, "
    "you can call a search engine by <search> query </search> and it will return the top "
    "searched results between <information> and </information>. You can search as many times "
    "as your want. If you find no further external knowledge needed, you can directly provide "
    "the answer inside <answer> and </answer>, without detailed illustrations. For example, "
    "<answer> Beijing </answer>. Question: {question}\n")
# The from-scratch CPU model gains nothing from a fixed preamble (data.prompt_style 'compact').
COMPACT_TEMPLATE = "Question: {question}\n"

TAGS = ("<think>", "</think>", "<search>", "</search>", "<information>", "</information>",
        "<answer>", "</answer>")
SEARCH_STOP = "</search>"
ANSWER_STOP = "</answer>"
STOP_STRINGS = (SEARCH_STOP, ANSWER_STOP)     # a turn ends at either (and at EOS)
OBS_OPEN = "\n\n<information>"
OBS_CLOSE = "</information>\n\n"

_TAG_TOKEN = re.compile(r"</?(think|search|information|answer)>")


def prompt(question: str, style: str = "paper") -> str:
  q = " ".join(str(question).split())
  return (TEMPLATE if style == "paper" else COMPACT_TEMPLATE).format(question=q)


def _clean(s) -> str:
  """One line without protocol tags: a passage cannot close the <information> block."""
  return " ".join(_TAG_TOKEN.sub(" ", str(s)).split())


def format_docs(hits) -> str:
  """'Doc 1(Title: "T") text\\nDoc 2(Title: "T") text' for records with .title and .text."""
  return "\n".join(f'Doc {i + 1}(Title: "{_clean(h.title)}") {_clean(h.text)}'
                   for i, h in enumerate(hits))


def gold_queries(question: str, steps: list) -> list:
  """The searches of a demonstration: the gold steps' questions, or the question itself."""
  return [" ".join(str(s).split()) for s in steps if str(s).strip()] or \
      [" ".join(str(question).split())]


def gold_pieces(queries: list, answer: str, observe) -> list:
  """A demonstration in Search-R1's format as [(text, written_by_model)]: per query a think and
  a search, the environment's block for it (`observe(query)` -> docs text), then a think and
  the answer. The CPU default's SFT warm-up trains on these (the paper has no warm-up)."""
  pieces = []
  for q in queries:
    pieces += [(f"<think> I need to find {q}. </think>\n<search> {q} </search>", True),
               (OBS_OPEN + observe(q), False), (OBS_CLOSE, False)]
  pieces.append((f"<think> I found it. </think>\n<answer> {answer} </answer>", True))
  return pieces
