"""APEX-Searcher's execution agent: a plan's sub-questions answered in order (Algorithm 2 of the
paper's appendix B), then the final synthesis; batched over questions.

Per sub-question (`solve`):
  0. reference resolution: `#k` becomes the k-th earlier sub-answer;
  1. knowledge-sufficiency check: 'answer' -> answer from the known (sub-question, answer)
     pairs, no retrieval; 'retrieve' -> the loop below;
  2. up to `max_hops` hops: (a) from the second hop on, the continuation decision ('stop' ends
     the loop); (b) a query (the first hop's prompt asks for a query, later hops show the earlier
     queries and ask for a different one; a repeat is counted); (c) the top `k` passages for it,
     minus those this sub-question already retrieved; nothing new ends the loop;
  3. the sub-answer from the passages and the known pairs; the pair joins the known ones.
Then the final answer from the question and all known pairs.

`solve` is a generator: it yields `prompts.Ask` (answered with the model's text) and `Search`
(answered with a list of `retrieval.Hit`) and returns the trace. `run` drives many of them at
once, so that every round is one batched model call and one batched retrieval. With `gold`
(the example's decomposition steps) each Ask carries the oracle's output as its `target`, and
`oracle_outputs` answers with it: that is how SFT trajectories are made, through the very code
that runs at inference.

The oracle: 'answer' at the check when the step needs no passage (a reasoning step such as the
world's comparisons) or its answer is already among the known pairs; the first query is the
resolved sub-question, a later one its named entity (`entity_query`); 'stop' once a passage
that supports the step (its gold ids, or one containing its answer) was retrieved; the gold
sub-answers and final answer. A trajectory whose retrieval never reached the support of a step
that needs one is not kept (`Trace.supported`), as the paper keeps only correct trajectories.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable, Iterator, Optional, Sequence

from rlrag_jax.methods.apex import plans
from rlrag_jax.rollout import agents
from rlrag_jax.methods.apex.prompts import (Ask, normalized, parse_answer, parse_decision,
                                            parse_query, repeats)


@dataclasses.dataclass(frozen=True)
class Search:
  query: str


@dataclasses.dataclass
class Trace:
  """What one question's execution did. `calls` lists (Ask, output text) in order."""
  question: str
  plan: list
  answer: str = ""
  steps: list = dataclasses.field(default_factory=list)    # one dict per sub-question
  calls: list = dataclasses.field(default_factory=list)
  supported: bool = True        # oracle runs: every step needing a passage found its support

  @property
  def retrievals(self) -> int:
    return sum(len(s["queries"]) for s in self.steps)

  def counts(self) -> dict:
    return {"retrievals": self.retrievals,
            "repeated_queries": sum(s["repeated_queries"] for s in self.steps),
            "parse_fallbacks": sum(s["parse_fallbacks"] for s in self.steps),
            "skipped_retrieval": sum(s["decision"] == "answer" for s in self.steps),
            "calls": len(self.calls)}

  def to_dict(self) -> dict:
    return {"question": self.question, "plan": list(self.plan), "answer": self.answer,
            "steps": self.steps, **self.counts()}


_CAPS = re.compile(r"(?:[A-Z0-9][\w'-]*)(?:\s+(?:of|the|and|de|von|[A-Z0-9][\w'-]*))*"
                   r"(?<!\bof)(?<!\bthe)(?<!\band)")


def entity_query(question: str) -> str:
  """The oracle's later-hop query: the longest capitalised span of the sub-question after its
  first word (a name, a title); '' when there is none."""
  words = question.split(maxsplit=1)
  rest = words[1] if len(words) > 1 else ""
  spans = [m.group(0).strip(" ?.,") for m in _CAPS.finditer(rest)]
  spans = [s for s in spans if s]
  return max(spans, key=len) if spans else ""


def _supports(step, hits) -> bool:
  gold = {str(i) for i in getattr(step, "gold_ids", []) or []}
  ans = normalized(step.answer)
  return any(h.id in gold or (ans and f" {ans} " in f" {normalized(h.title + ' ' + h.text)} ")
             for h in hits)


def _needs_passage(step, knowledge) -> bool:
  if not (getattr(step, "gold_ids", None) or []):
    return False
  ans = normalized(step.answer)
  known = " ".join(normalized(f"{q} {a}") for q, a in knowledge)
  return not (ans and f" {ans} " in f" {known} ")


def clip(text: str, max_words: int) -> str:
  """`text` cut to its first `max_words` words (0: whole), '...' marking a cut."""
  words = str(text).split()
  if not max_words or len(words) <= max_words:
    return str(text)
  return " ".join(words[:max_words]) + " ..."


def solve(question: str, plan: Sequence[str], *, max_hops: int, gold: Optional[list] = None,
          gold_answer: Optional[str] = None, passage_words: int = 0) -> Iterator:
  """Executes `plan` for `question` (see the module docstring); returns a `Trace`. Passages are
  shown cut to `passage_words` words (0: whole)."""
  trace = Trace(question=question, plan=list(plan))
  knowledge, answers = [], []

  def ask(a: Ask):
    out = yield a
    trace.calls.append((a, out))
    return out

  for i, step in enumerate(plan):
    g = gold[i] if gold is not None and i < len(gold) else None
    q = plans.resolve(step, answers)
    rec = {"step": step, "resolved": q, "decision": "", "queries": [], "retrieved": [],
           "stopped_by": "", "answer": "", "repeated_queries": 0, "parse_fallbacks": 0}
    known = tuple(knowledge)
    need = g is not None and _needs_passage(g, knowledge)
    out = yield from ask(Ask("check", q, known,
                             target=None if g is None else ("retrieve" if need else "answer")))
    decision, ok = parse_decision("check", out)
    rec["decision"], rec["parse_fallbacks"] = decision, int(not ok)
    if decision == "answer":
      out = yield from ask(Ask("known_answer", q, known, target=g and g.answer))
    else:
      seen, passages, hits_all = set(), [], []
      rec["stopped_by"] = "max_hops"
      for hop in range(1, max_hops + 1):
        if hop > 1:
          found = g is not None and _supports(g, hits_all)
          out = yield from ask(Ask("continue", q, known, tuple(passages), hop=hop - 1,
                                   max_hops=max_hops,
                                   target=None if g is None else ("stop" if found else
                                                                  "continue")))
          cont, ok = parse_decision("continue", out)
          rec["parse_fallbacks"] += int(not ok)
          if cont == "stop":
            rec["stopped_by"] = "decision"
            break
        tried = tuple(rec["queries"])
        target = None
        if g is not None:
          target = q if hop == 1 else (entity_query(q) or q)
        out = yield from ask(Ask("query", q, known, tuple(passages), tried=tried,
                                 target=target))
        query, ok = parse_query(out, q)
        rec["parse_fallbacks"] += int(not ok)
        rec["repeated_queries"] += int(repeats(query, tried))
        rec["queries"].append(query)
        hits = yield Search(query)
        new = [h for h in hits if h.id not in seen]
        rec["retrieved"].append([h.id for h in new])
        if not new:
          rec["stopped_by"] = "nothing_new"
          break
        seen.update(h.id for h in new)
        hits_all += new
        passages += [(h.title, clip(h.text, passage_words)) for h in new]
      if g is not None and need and not _supports(g, hits_all):
        trace.supported = False
      out = yield from ask(Ask("sub_answer", q, known, tuple(passages), target=g and g.answer))
    answer = parse_answer(out)
    rec["answer"] = answer
    answers.append(answer)
    knowledge.append((q, answer))
    trace.steps.append(rec)
  out = yield from ask(Ask("synthesis", question, tuple(knowledge), target=gold_answer))
  trace.answer = parse_answer(out)
  return trace


def run(processes: Sequence[Iterator], generate: Callable, search: Callable) -> list:
  """Drives `solve` generators to the end (`rollout.agents.drive`): each round, every pending
  Ask goes to one `generate(asks) -> [text]` call and every pending Search to one
  `search(queries) -> [[Hit]]` call. Returns their results (Traces) in order."""
  return agents.drive(processes, {Ask: generate,
                                  Search: lambda reqs: search([r.query for r in reqs])})


def oracle_outputs(asks: Sequence[Ask]) -> list:
  """The `generate` of oracle runs: every Ask answered with its target."""
  missing = [a.kind for a in asks if a.target is None]
  if missing:
    raise ValueError(f"oracle_outputs: {len(missing)} asks have no target (kinds "
                     f"{sorted(set(missing))}); run solve with gold steps")
  return [a.target for a in asks]


def naive_rag(question: str, passage_words: int = 0) -> Iterator:
  """The naive-RAG baseline as a process: the question's own top-k passages, one answer."""
  trace = Trace(question=question, plan=[question])
  hits = yield Search(question)
  a = Ask("sub_answer", question,
          passages=tuple((h.title, clip(h.text, passage_words)) for h in hits))
  out = yield a
  trace.calls.append((a, out))
  trace.answer = parse_answer(out)
  trace.steps.append({"step": question, "resolved": question, "decision": "retrieve",
                      "queries": [question], "retrieved": [[h.id for h in hits]],
                      "stopped_by": "naive", "answer": trace.answer, "repeated_queries": 0,
                      "parse_fallbacks": 0})
  return trace
