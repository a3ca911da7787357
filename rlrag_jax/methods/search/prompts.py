"""Prompt and tool protocol of "Learning When to Search", plus gold trajectories for SFT warm-up.

Protocol. The model first thinks in <think>…</think>. When its own knowledge suffices it writes
<reflect>…</reflect> then <answer>…</answer> (structure A). Otherwise it writes a keyword query in
<search>…</search>; generation stops at SEARCH_STOP, and the system appends the retrieved
documents as `observation_block(format_observation(hits))`, i.e.
"\\n\\n<information>Doc 1 (Title: …) text\\nDoc 2 (Title: …) text</information>\\n\\n". The model
then reflects in <reflect>…</reflect>, may search again, and finally answers (structure B).

`PROMPT` is the paper's "Instruction for Trained RLM" (appendix B.4) word for word, followed by
the question on a line "Question: …" (the paper does not show where the question goes; that
line is ours). `JUDGE_TEMPLATE` is its "Instruction for Judge LLM" (B.4), with the normalised
prediction and gold answers filled in.
"""
from __future__ import annotations

import re
from typing import Callable, Optional

from rlrag_jax.methods.search import conciseness

TAGS = ("think", "reflect", "search", "information", "answer")
SEARCH_STOP = "</search>"
STOP_STRINGS = (SEARCH_STOP,)

PROMPT = (
    "Please answer the given question by following the structured reasoning protocol below:\n"
    "1. Always begin with `<think>...</think>` to provide a brief internal reasoning sketch. - "
    "This reasoning must primarily rely on your internal knowledge and reasoning abilities. - If "
    "your internal knowledge is sufficient to answer the question, do not assume the need for "
    "external tools.\n"
    "2. If your internal knowledge is sufficient to answer the question: - Provide a concise "
    "summary of your reasoning inside `<reflect>...</reflect>`. - Then give the final answer "
    "inside `<answer>...</answer>`. - Under no circumstances should you generate a `<search>` "
    "block if your internal knowledge is adequate.\n"
    "3. Only if your internal knowledge is genuinely insufficient to answer the question: - "
    "Generate a brief keyword-based search query inside `<search>...</search>`. The query should "
    "be as concise as possible but must include sufficient factual clues, such as names, dates, "
    "locations, key concepts, etc. - The query should be a brief description with multiple "
    "keywords instead of a natural language question.\n"
    "4. When the system returns information inside `<information>...</information>`: - If the "
    "information is reliable and sufficient, integrate it with your reasoning inside "
    "`<reflect>...</reflect>`. - Then provide the final concise answer inside "
    "`<answer>...</answer>`.\n"
    "5. If the retrieved information is insufficient or contradicts your internal knowledge: - "
    "Explain the issue within `<reflect>...</reflect>`. - If necessary, generate a revised "
    "`<search>` query.\n"
    "6. Final rule: - The final answer must be concise and clear, placed inside "
    "`<answer></answer>`. - Internal reasoning (in `<think>`) must always be the primary method; "
    "tool usage should be a last resort, not the default.\n"
    "Question: {question}\n")

JUDGE_TEMPLATE = (
    "You are an evaluation assistant. Your task is to determine whether the given prediction "
    "semantically matches any of the reference answers. This is a flexible match: even if the "
    "wording is different, if the meaning is the same, consider it a match. Prediction: {pred} "
    "Reference Answers: {gold} Please answer with a single word: - YES \u2192 if the prediction "
    "expresses the same meaning as any of the reference answers. - NO \u2192 otherwise. Only "
    "respond with YES or NO.")

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


OBS_OPEN = "\n\n<information>"
OBS_CLOSE = "</information>\n\n"


def observation_block(observation: str) -> str:
  """What the system appends after a model turn that ended with SEARCH_STOP."""
  return f"{OBS_OPEN}{observation}{OBS_CLOSE}"


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
  decomposition), '#k' references replaced by earlier sub-answers. A step that is not searched
  (see `_searched_steps`) gets '' when no concise query can be made from it."""
  steps = list(example.decomposition) or [None]
  searched = set(_searched_steps(example)) if example.decomposition else {0}
  queries, sub_answers = [], []
  for i, step in enumerate(steps):
    question = example.question if step is None else _substitute_refs(step.question, sub_answers)
    query = conciseness.to_keywords(question)
    if not query and step is not None:
      titles = [c.title for c in map(example.context, step.gold_ids) if c is not None]
      query = conciseness.to_keywords(" ".join(titles))
    if not query and i in searched:
      raise ValueError(f"gold_queries: example {example.id!r} step {i}: no concise query can be "
                       f"made from {question!r} or its gold context titles")
    queries.append(query)
    sub_answers.append(example.answers[0] if step is None else step.answer)
  return queries


def _searched_steps(example) -> list:
  """Indices of the decomposition steps that need a search: those with gold passages, or every
  step when none has any. A step without gold passages among steps that have them only
  reasons over earlier answers (the world's final comparison step), so it is not searched."""
  steps = list(example.decomposition)
  if any(s.gold_ids for s in steps):
    return [i for i, s in enumerate(steps) if s.gold_ids]
  return list(range(len(steps)))


def gold_pieces(example, observations: Callable[[str], str], known=()) -> list:
  """The gold completion as [(text, written_by_model)] pieces, in order.

  Structure B: think, one search/information/reflect round per searched gold step (see
  `_searched_steps`), answer. Steps in `known` (indices into the decomposition) are not
  searched: their answers are stated from memory ("Known: X.") in the think before the first
  search or in the reflect of the round before them. When every searched step is known the
  completion is structure A (`gold_trajectory_direct` with that chain).

  `observations(query)` returns the observation text (e.g. format_observation of the
  retriever's hits); it appears as two system pieces, OBS_OPEN + text and OBS_CLOSE, exactly
  as the rollout appends them, so that tokenizing piece by piece gives the rollout's tokens and
  the loss mask (0 on system pieces).
  """
  steps = list(example.decomposition)
  queries = gold_queries(example)
  keep = _searched_steps(example) if steps else [0]
  sub_answers = [s.answer for s in steps] if steps else [example.answers[0]]
  known = set(known)
  search = [k for k in keep if k not in known]
  if not search:          # every fact recalled; the final hop's answer is the answer itself
    chain = [sub_answers[k] for k in keep if k != len(steps) - 1]
    return [(gold_trajectory_direct(example, chain), True)]
  recalled = lambda ks: "".join(f"Known: {sub_answers[k]}. " for k in ks)
  before = [k for k in keep if k < search[0]]
  pieces = []
  text = f"<think>{recalled(before)}I need to search.</think>"
  for n, k in enumerate(search):
    text += f"\n<search>{queries[k]}{SEARCH_STOP}"
    pieces += [(text, True), (OBS_OPEN + str(observations(queries[k])), False),
               (OBS_CLOSE, False)]
    nxt = search[n + 1] if n + 1 < len(search) else len(steps) + 1
    after = [j for j in keep if k < j < nxt]
    done = "Done." if n == len(search) - 1 else "Next step."
    text = f"<reflect>Found {sub_answers[k]}. {recalled(after)}{done}</reflect>"
  pieces.append((text + f"\n<answer>{example.answers[0]}</answer>", True))
  return pieces


def gold_trajectory(example, observations: Callable[[str], str], known=()) -> str:
  """The gold completion as one string (see `gold_pieces`)."""
  return "".join(text for text, _ in gold_pieces(example, observations, known))


DIRECT_THINK = "<think>I know this.</think>"
SEARCH_THINK = "<think>I need to search.</think>"


def gold_trajectory_direct(example, chain=()) -> str:
  """A structure-(A) completion: think, reflect, answer, with no search. `chain`: intermediate
  answers recalled on the way ("Known: X." each)."""
  answer = example.answers[0]
  recalled = "".join(f"Known: {a}. " for a in chain)
  return (f"{DIRECT_THINK}\n<reflect>{recalled}It is {answer}.</reflect>\n"
          f"<answer>{answer}</answer>")


def naive_rag_pieces(question: str, observation: str) -> list:
  """The opening of a naive-RAG completion as [(text, written_by_model)] pieces (like
  `gold_pieces`): one search for the question itself and its observation; the model goes on
  with <reflect> and <answer>."""
  return [(f"{SEARCH_THINK}\n<search>{' '.join(str(question).split())}{SEARCH_STOP}", True),
          (OBS_OPEN + str(observation), False), (OBS_CLOSE, False)]
