"""Prompt and tool protocol of "Learning When to Search", plus gold trajectories for SFT warm-up.

Protocol. The model first thinks in <think>…</think>. When its own knowledge suffices it writes
<reflect>…</reflect> then <answer>…</answer> (structure A). Otherwise it writes a keyword query in
<search>…</search>; generation stops at SEARCH_STOP, and the system appends the retrieved
documents as `observation_block(format_observation(hits))`, i.e.
"\\n\\n<information>Doc 1 (Title: …) text\\nDoc 2 (Title: …) text</information>\\n\\n". The model
then reflects in <reflect>…</reflect>, may search again, and finally answers (structure B).

The paper's own prompt wording was not found in the sources searched; PROMPT is written from the
protocol description above.
"""
from __future__ import annotations

import re
from typing import Callable, Optional

from rlrag_jax.methods.search import conciseness

TAGS = ("think", "reflect", "search", "information", "answer")
SEARCH_STOP = "</search>"
STOP_STRINGS = (SEARCH_STOP,)

PROMPT = (
    "Answer the question. First think step by step inside <think> and </think>. "
    "If your own knowledge is enough, check your reasoning inside <reflect> and </reflect>, "
    "then give the final answer inside <answer> and </answer>. "
    "If you need outside knowledge, write a short keyword query (keywords, not a question) "
    "inside <search> and </search>; the search results will be given to you inside "
    "<information> and </information>. After each result, reflect on it inside <reflect> and "
    "</reflect>, then either search again for what is still missing or give the final answer "
    "inside <answer> and </answer>. The final answer is a short phrase without explanation.\n"
    "Question: {question}\n")

_TAG_TOKEN = re.compile(r"</?(?:" + "|".join(TAGS) + r")>")


def build_prompt(question: str) -> str:
  """The instruction followed by the question; the completion starts right after it."""
  return PROMPT.format(question=str(question).strip())


def _hit_fields(hit, i: int):
  if isinstance(hit, (tuple, list)) and len(hit) == 2:
    return hit[0], hit[1]
  if isinstance(hit, dict) and "title" in hit and "text" in hit:
    return hit["title"], hit["text"]
  if hasattr(hit, "title") and hasattr(hit, "text"):
    return hit.title, hit.text
  raise TypeError(f"format_observation: hit {i} is {type(hit).__name__}; expected an object "
                  "with .title and .text, a dict with 'title'/'text', or a (title, text) pair")


def _clean(s) -> str:
  """One line, protocol tags removed, so a document cannot end the <information> block."""
  return " ".join(_TAG_TOKEN.sub(" ", str(s)).split())


def format_observation(hits) -> str:
  """'Doc 1 (Title: …) text\\nDoc 2 (Title: …) text' for retrieved hits, in rank order."""
  lines = []
  for i, hit in enumerate(hits):
    title, text = _hit_fields(hit, i)
    lines.append(f"Doc {i + 1} (Title: {_clean(title)}) {_clean(text)}")
  return "\n".join(lines)


def observation_block(observation: str) -> str:
  """What the system appends after a model turn that ended with SEARCH_STOP."""
  return f"\n\n<information>{observation}</information>\n\n"


def as_text(x) -> Optional[str]:
  """Model output as str: bytes are decoded (invalid UTF-8 replaced), None is ''; None when
  str() itself fails."""
  try:
    if isinstance(x, bytes):
      return x.decode("utf-8", errors="replace")
    return "" if x is None else str(x)
  except Exception:  # pylint: disable=broad-except
    return None


def extract_query(text) -> Optional[str]:
  """The query between the LAST <search> and the </search> after it; None if there is none.

  The text must still hold the stop string (SEARCH_STOP). Returns None, never raises, when the
  tags are missing, the query is blank, or the query holds another protocol tag — exactly the
  cases that `parsing.parse` does not count as a search call.
  """
  text = as_text(text)
  if text is None:
    return None
  start = text.rfind("<search>")
  if start < 0:
    return None
  start += len("<search>")
  end = text.find(SEARCH_STOP, start)
  if end < 0:
    return None
  query = text[start:end]
  if _TAG_TOKEN.search(query):
    return None
  query = query.strip()
  return query or None


def _substitute_refs(question: str, answers: list) -> str:
  """'#k' -> the answer of step k (1-based), when step k exists."""
  def sub(m):
    k = int(m.group(1))
    return str(answers[k - 1]) if 1 <= k <= len(answers) else m.group(0)
  return re.sub(r"#(\d+)", sub, str(question))


def gold_queries(example) -> list:
  """One concise keyword query per gold step (the question itself when there is no
  decomposition), '#k' references replaced by earlier sub-answers."""
  steps = list(example.decomposition) or [None]
  queries, sub_answers = [], []
  for i, step in enumerate(steps):
    question = example.question if step is None else _substitute_refs(step.question, sub_answers)
    query = conciseness.to_keywords(question)
    if not query and step is not None:
      titles = [c.title for c in map(example.context, step.gold_ids) if c is not None]
      query = conciseness.to_keywords(" ".join(titles))
    if not query:
      raise ValueError(f"gold_queries: example {example.id!r} step {i}: no concise query can be "
                       f"made from {question!r} or its gold context titles")
    queries.append(query)
    sub_answers.append(example.answers[0] if step is None else step.answer)
  return queries


def gold_trajectory(example, observations: Callable[[str], str]) -> str:
  """A structure-(B) completion: think, one search/information/reflect round per gold step,
  answer. `observations(query)` returns the observation text (e.g. format_observation of the
  retriever's hits); it is wrapped by observation_block exactly as the rollout does."""
  steps = list(example.decomposition)
  queries = gold_queries(example)
  sub_answers = [s.answer for s in steps] if steps else [example.answers[0]]
  parts = ["<think>I need to search.</think>"]
  for k, (query, sub_answer) in enumerate(zip(queries, sub_answers)):
    parts.append(f"\n<search>{query}{SEARCH_STOP}")
    parts.append(observation_block(str(observations(query))))
    nxt = "Done." if k == len(queries) - 1 else "Next step."
    parts.append(f"<reflect>Found {sub_answer}. {nxt}</reflect>")
  parts.append(f"\n<answer>{example.answers[0]}</answer>")
  return "".join(parts)


def gold_trajectory_direct(example) -> str:
  """A structure-(A) completion: think, reflect, answer, with no search."""
  answer = example.answers[0]
  return (f"<think>I know this.</think>\n<reflect>It is {answer}.</reflect>\n"
          f"<answer>{answer}</answer>")
