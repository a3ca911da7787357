"""Gold structured targets for the SFT warm-up (ARENA's SFT-reasoning baseline).

`gold_completion` writes "<relevance>[gold numbers]</relevance>", a short analysis with one
sentence per reasoning step citing its reference, then "So the answer is X.", and
"<answer>X</answer>" with X the canonical answer (answers[0]). The steps come from the best
annotation the example has, in this order:

1. `example.decomposition` (MuSiQue): "Who directed Inception? [2] says Christopher Nolan." or,
   for the "entity >> relation" form, "[2] says the director of Inception is Christopher Nolan."
   ("[2] says X shares border with Y." when the relation ends in a preposition); "#k" in a
   sub-question is replaced by the k-th step's answer.
2. `example.triples` (2Wiki evidences): "[2] says the director of Inception is Christopher Nolan.",
   citing the gold context titled like the triple's head (else one whose text holds the tail).
3. `example.meta["supporting_facts"]` (HotpotQA): pairs (context id or title, sentence index),
   "[2] says: <that sentence>".
4. otherwise the first sentence of each gold context, "[2] says: <sentence>".

A step with no citable reference is written without "[k] says". Sentences are cut at
`max_fact_chars`, so targets stay short for the tiny CPU default.
"""
from __future__ import annotations

import re
from typing import Optional

from rlrag_jax.methods.arena import parsing
from rlrag_jax.methods.arena import prompts

_HASH_REF = re.compile(r"#(\d+)")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def _untag(s: str) -> str:
  """Removes the six ARENA tags (repeatedly, so removal cannot splice a new tag together)."""
  s = str(s)
  while any(t in s for t in parsing.TAGS):
    for t in parsing.TAGS:
      s = s.replace(t, "")
  return s


def _clip(s: str, n: int) -> str:
  s = " ".join(str(s).split())
  if len(s) <= n:
    return s
  cut = s[:n].rsplit(" ", 1)[0] or s[:n]
  return cut.rstrip(" ,;:") + " …"


def _cite(nums) -> str:
  nums = sorted({n for n in nums if n is not None})
  return "".join(f"[{n}]" for n in nums)


def _says(cite: str, clause: str) -> str:
  return f"{cite} says {clause}" if cite else clause[:1].upper() + clause[1:]


_PREPOSITIONS = ("with", "in", "of", "to", "by", "for", "on", "at", "from", "as")


def _relation_clause(entity: str, relation: str, value: str) -> str:
  """"the director of X is Y"; "X shares border with Y" when the relation ends in a preposition."""
  relation = " ".join(relation.replace("_", " ").split())
  entity = entity.strip()
  if relation.rsplit(" ", 1)[-1].lower() in _PREPOSITIONS:
    return f"{entity} {relation} {value}."
  return f"the {relation} of {entity} is {value}."


def _as_question(q: str) -> str:
  q = q.strip()
  q = q[:1].upper() + q[1:]
  return q if q.endswith(("?", ".", "!")) else q + "?"


def _decomposition_steps(example, numbering, max_chars: int) -> list:
  out, answers = [], []
  for step in example.decomposition:
    if not str(step.answer).strip():
      return []                                       # an unanswered step: use another annotation
    question = _HASH_REF.sub(
        lambda m: answers[int(m.group(1)) - 1] if 0 < int(m.group(1)) <= len(answers)
        else m.group(0), str(step.question))
    answers.append(str(step.answer))
    cite = _cite(numbering.number(g) for g in step.gold_ids)
    if ">>" in question:
      entity, relation = question.split(">>", 1)
      sentence = _says(cite, _relation_clause(entity, relation, step.answer))
    else:
      q = _as_question(question)
      sentence = f"{q} {cite} says {step.answer}." if cite else f"{q} {step.answer}."
    out.append(_clip(sentence, max_chars))
  return out


def _triple_steps(example, numbering, max_chars: int) -> list:
  gold = [example.context(g) for g in example.gold_ids]
  gold = [c for c in gold if c is not None]
  out = []
  for t in example.triples:
    head, relation, tail = str(t.head), str(t.relation), str(t.tail)
    ctx = next((c for c in gold if c.title.casefold() == head.casefold()), None)
    if ctx is None:
      ctx = next((c for c in gold if tail and tail.casefold() in c.text.casefold()), None)
    cite = _cite([numbering.number(ctx.id)]) if ctx is not None else ""
    out.append(_clip(_says(cite, _relation_clause(head, relation, tail)), max_chars))
  return out


def _sentences(ctx) -> list:
  if ctx.sentences:
    return [str(s) for s in ctx.sentences]
  return [s for s in _SENTENCE_END.split(ctx.text.strip()) if s]


def _fact_steps(example, numbering, max_chars: int) -> list:
  facts = example.meta.get("supporting_facts") if isinstance(example.meta, dict) else None
  out = []
  for fact in facts or []:
    try:
      key, idx = fact[0], int(fact[1])
    except (TypeError, ValueError, IndexError, KeyError):
      continue
    ctx = example.context(key) or next((c for c in example.contexts if c.title == key), None)
    if ctx is None:
      continue
    sents = _sentences(ctx)
    if 0 <= idx < len(sents):
      out.append(_clip(f"{_cite([numbering.number(ctx.id)])} says: {sents[idx].strip()}",
                       max_chars))
  return out


def _first_sentence_steps(example, numbering, max_chars: int) -> list:
  out = []
  for n in numbering.gold:
    ctx = example.contexts[n - 1]
    sents = _sentences(ctx)
    if sents:
      out.append(_clip(f"[{n}] says: {sents[0].strip()}", max_chars))
  return out


def _chain_steps(example, numbering, max_chars: int) -> list:
  """Terse steps, one per decomposition step: "[3] Rilcor Wyrhalyss." (cite + sub-answer).

  The bridge entities alone carry the reasoning chain; a tiny model trained from scratch learns
  this in far fewer tokens than full sentences (the CPU default uses it)."""
  out = []
  for step in example.decomposition:
    if not str(step.answer).strip():
      return []
    cite = _cite(numbering.number(g) for g in step.gold_ids)
    out.append(_clip(f"{cite} {step.answer}." if cite else f"{step.answer}.", max_chars))
  return out


STYLES = ("full", "chain")


def analysis_steps(example, numbering: Optional[prompts.Numbering] = None,
                   max_fact_chars: int = 160, style: str = "full") -> list:
  """The reasoning sentences of the gold analysis (without the final "So the answer is").

  style: 'full' (sentences, the default) or 'chain' (cite + sub-answer per step, falling back to
  'full' when the example has no decomposition)."""
  if style not in STYLES:
    raise ValueError(f"analysis style {style!r}; expected one of {STYLES}")
  numbering = numbering or prompts.reference_numbers(example)
  builders = (_decomposition_steps, _triple_steps, _fact_steps, _first_sentence_steps)
  if style == "chain":
    builders = (_chain_steps,) + builders
  for build in builders:
    steps = build(example, numbering, max_fact_chars)
    if steps:
      return steps
  return []


def gold_completion(example, numbering: Optional[prompts.Numbering] = None,
                    max_fact_chars: int = 160, style: str = "full") -> str:
  """The gold structured reply for an Example.

  Args:
    example: an `Example` with answers (answers[0], which must not be blank) and gold_ids.
    numbering: `prompts.reference_numbers(example)`; computed when None.
    max_fact_chars: cut each analysis sentence to about this many characters.
    style: 'full' or 'chain' (see `analysis_steps`).

  Returns:
    "<relevance>[..]</relevance>\\n<analysis>..</analysis>\\n<answer>..</answer>".
  """
  numbering = numbering or prompts.reference_numbers(example)
  answer = " ".join(_untag(example.answers[0] if example.answers else "").split())
  steps = analysis_steps(example, numbering, max_fact_chars, style)
  analysis = _untag(" ".join(steps + [f"So the answer is {answer}."]))
  ids = ", ".join(str(n) for n in numbering.gold)
  return (f"<relevance>[{ids}]</relevance>\n<analysis>{analysis}</analysis>\n"
          f"<answer>{answer}</answer>")


def sft_pair(example, max_chars: Optional[int] = None, max_fact_chars: int = 160) -> tuple:
  """(prompt, target) for SFT of a base LM: `prompts.prompt_for` and `gold_completion`."""
  numbering = prompts.reference_numbers(example)
  return (prompts.prompt_for(example, max_chars),
          gold_completion(example, numbering, max_fact_chars))
