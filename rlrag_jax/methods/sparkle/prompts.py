"""SPARKLE's prompts (the proxy's three roles and the reader) and the oracle that writes SFT
targets on the embedded world.

'paper' prompts carry appendix A's instructions (Figures 4-8) with their inputs in the paper's
order; 'compact' prompts (the small from-scratch CPU models) keep the inputs and a short cue.

The oracle reads a question's gold decomposition (`Example.decomposition`, steps with `#k`
references to earlier answers, each with the gold documents that answer it) and its reasoning-
path triples (`Example.triples`, one per step that has gold documents, in step order):

  reader   at a state (context documents, thoughts so far) the next thought is, for the first
           step not yet stated whose references are stated: its fact, "From the context:
           <head; relation; answer>", when its gold documents are all in the context; else the
           need, "I need to find out: <head; relation; ?>" (a step without a path triple says
           its question instead). When every step with gold documents is stated the reader
           answers. A need the context does not meet is stated again (the reader cannot go on
           without it), so a declined retrieval costs a reasoning step. Thoughts name facts by
           their triple, one wording per fact: the decomposition's questions vary in wording,
           which no model could predict from what it sees.
  RD       "Yes" after a need thought, "No" after any other.
  QF       the chain of stated steps' path triples plus the open link <head; relation;
           [unknown]> of the needed step; the need; "head relation" as the query.
  KI       the candidate equal to the needed step's path triple, else the first candidate from
           one of the step's gold documents; none when no candidate comes from them.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

from rlrag_jax.data.schema import fill_references, step_references
from rlrag_jax.methods.sparkle import parsing
from rlrag_jax.retrieval.retriever import numbered_passages

STYLES = ("paper", "compact")

RD_INSTRUCTION = (
    "You are an intelligent assistant. Your job is to decide whether external information "
    "retrieval is required to continue solving the problem.\n\nYou will be given the following "
    "inputs:\n- Question: The original user query.\n- Previous Reasoning: A list of prior "
    "reasoning thoughts the model has generated.\n- Current Reasoning Step: The latest reasoning "
    "step to evaluate.\n- Retrieved Context: Text previously retrieved that may contain relevant "
    "information.\n\nYour task is to answer whether the current reasoning step requires external "
    "retrieval.\n\nOutput Format\nONLY output \"Yes (retrieval is required)\" or \"No (retrieval "
    "is not required)\" and do not include any other text.")
QF_INSTRUCTION = (
    "You are an intelligent reasoning assistant. Your task is to help bridge the information gap "
    "between a current reasoning trace (thought) and the full answer to a given question by "
    "generating a high-quality retrieval query.\n\nYou will follow these three steps:\n\n"
    "[Step 1: Generate Reasoning Chain]\nGiven the question and the corresponding thought, "
    "extract the information that is directly helpful for answering the question. Represent each "
    "piece of information as a structured knowledge triple in the format <head; relation; tail>. "
    "Output Format: <head1; relation1; tail1>, <head2; relation2; tail2>, ... "
    "<headN; relationN; tailN>\n\n[Step 2: Identify Knowledge Gaps]\nBased on the extracted "
    "reasoning chain, identify the next piece of information that is required to continue "
    "reasoning toward the answer to the question. This could be a missing fact, relation, or "
    "intermediate concept that, if known, would allow the reasoning to proceed.\nOutput Format: "
    "To continue answering the question, we need to know: [describe the next necessary piece of "
    "information]\n\n[Step 3: Formulate Retrieval Query]\nWrite a concise and effective natural "
    "language query that can help retrieve the specific information identified in Step 2. The "
    "query should be focused, contain the key entities and relations, and be suitable for a "
    "retrieval system.")
KI_INSTRUCTION = (
    "You are an intelligent reasoning assistant. Your task is to select the most useful knowledge "
    "triple from a list of candidates to help continue a reasoning process toward answering a "
    "given question.\n\nYou will be given:\n- A question\n- A current reasoning chain represented "
    "as a sequence of knowledge triples\n- A query, which may reflect an information need to "
    "guide the next reasoning step\n- A set of candidate triples\n\nYour goal: Select only one "
    "triple that is most useful for continuing the reasoning toward answering the question. This "
    "selected triple should logically extend the current reasoning chain and help bridge the gap "
    "toward the final answer.")
DIRECT_QF_INSTRUCTION = (
    "You are an intelligent reasoning assistant. Given the question and the reasoning thoughts "
    "so far, write a concise and effective natural language query that retrieves the next piece "
    "of information needed to answer the question.\nOutput Format: Retrieval Query: [the query]")
DIRECT_KI_INSTRUCTION = (
    "You are an intelligent reasoning assistant. Select the one retrieved document that is most "
    "useful for continuing the reasoning toward answering the question. Output its number, "
    "e.g. [2], only.")
READER_INSTRUCTION = (
    "Please answer the following question. You should think step-by-step to solve it. You should "
    "first output all your internal thinking steps. Each thought should be put inside <think> "
    "and </think> tags. After reasoning, you must put your final answer inside <answer> and "
    "</answer> without detailed instructions.\n\nYour output should look like:\n<think> [put "
    "your first thought here] </think>\n<think> [put your second thought here] </think>\n...\n"
    "<think> [put your final thought here] </think>\n<answer> [put your final answer (short "
    "phrase or keyword only) here] </answer>")
# w/o RD (sparkle.agent.rd_mode='reader'): the reader asks for retrieval with a special token
# (appendix D.2: "generating a special token (e.g., "<search>")"; the paper gives no wording).
# Inside the thought: the reader's calls stop at </think>.
SEARCH_TOKEN = "<search>"
READER_SEARCH_INSTRUCTION = (
    "If you need external information to continue, end that thought with the special token "
    "<search> inside its tags, e.g. <think> I need to find out who directed the film. <search> "
    "</think>, and retrieved documents will be added to the context.")
REASONING_READER_SEARCH_INSTRUCTION = (
    "If you need external information to continue, end that step's line with the special token "
    "<search>, and retrieved documents will be added to the context.")
REASONING_READER_INSTRUCTION = (
    "Please answer the following question. You should think step-by-step to solve it. Provide "
    "your final answer in the format \\boxed{YOUR_ANSWER}.")

NEED_PREFIX = "I need to find out:"
FACT_PREFIX = "From the context:"


def _check(style: str) -> None:
  if style not in STYLES:
    raise ValueError(f"config key 'data.prompt_style' must be one of {STYLES} for sparkle; got "
                     f"{style!r}")


context_text = numbered_passages     # (title, text) pairs -> "[k] title: text" lines


def _thoughts(thoughts: Sequence[str]) -> str:
  return "\n".join(f"- {t}" for t in thoughts) if thoughts else "(none)"


# --------------------------------------------------------------------------- the proxy's roles
def decision_text(question: str, docs: Sequence[tuple], previous: Sequence[str], current: str,
                  style: str, passage_words: int = 0) -> str:
  _check(style)
  body = (f"Retrieved Context: {context_text(docs, passage_words)}\nQuestion: {question}\n"
          f"Previous Reasoning: {_thoughts(previous)}\nCurrent Reasoning Step: {current}\n")
  if style == "compact":
    return body + "Retrieve?\n"
  return f"{RD_INSTRUCTION}\n\nInputs:\n{body}"


def formulation_text(question: str, thoughts: Sequence[str], style: str,
                     direct: bool = False) -> str:
  """The QF prompt; `direct` (the paper's Direct QF ablation) asks for the query alone."""
  _check(style)
  body = f"Question: {question}\nThoughts: {_thoughts(thoughts)}\n"
  if style == "compact":
    return body + ("Direct query:\n" if direct else "Query:\n")
  return f"{DIRECT_QF_INSTRUCTION if direct else QF_INSTRUCTION}\n\nInputs:\n{body}"


def document_selection_text(question: str, chain: Sequence, query: str, docs: Sequence[tuple],
                            style: str, passage_words: int = 0) -> str:
  """Direct KI (the paper's ablation): select one retrieved document, not a triple."""
  _check(style)
  links = ", ".join(parsing.triple_text(t) for t in chain) if chain else "(none)"
  body = (f"Candidate Documents:\n{context_text(docs, passage_words)}\nQuestion: {question}\n"
          f"Reasoning Chain: {links}\nQuery: {query}\n")
  if style == "compact":
    return body + "Select document:\n"
  return f"{DIRECT_KI_INSTRUCTION}\n\nInputs:\n{body}"


def candidates_text(candidates: Sequence) -> str:
  return "\n".join(f"[{i}] {parsing.triple_text(c)}" for i, c in enumerate(candidates, 1)) \
      if candidates else "(none)"


def integration_text(question: str, chain: Sequence, query: str, candidates: Sequence,
                     style: str) -> str:
  _check(style)
  links = ", ".join(parsing.triple_text(t) for t in chain) if chain else "(none)"
  body = (f"Candidate Triples:\n{candidates_text(candidates)}\nQuestion: {question}\n"
          f"Reasoning Chain: {links}\nQuery: {query}\n")
  if style == "compact":
    return body + "Select:\n"
  return f"{KI_INSTRUCTION}\n\nInputs:\n{body}"


# --------------------------------------------------------------------------- the reader
def reader_text(question: str, docs: Sequence[tuple], thoughts: Sequence[str], style: str,
                passage_words: int = 0, reasoning: bool = False, search: bool = False) -> str:
  """The reader's prompt followed by its thoughts so far; it writes the next one. A reasoning
  reader's thoughts are lines of free text. `search` (w/o RD, 'paper' style): the instruction
  offers the <search> token (the 'compact' CPU reader asks by its need thoughts)."""
  return (reader_request(question, docs, style, passage_words, reasoning, search)
          + reader_history(thoughts, reasoning))


def reader_request(question: str, docs: Sequence[tuple], style: str, passage_words: int = 0,
                   reasoning: bool = False, search: bool = False) -> str:
  """The reader's prompt without its thoughts (a chat template's user message)."""
  _check(style)
  body = f"Context: {context_text(docs, passage_words)}\nQuestion: {question}\n"
  if style == "compact":
    return body
  instruction = REASONING_READER_INSTRUCTION if reasoning else READER_INSTRUCTION
  if search:
    instruction += "\n" + (REASONING_READER_SEARCH_INSTRUCTION if reasoning
                           else READER_SEARCH_INSTRUCTION)
  return f"{instruction}\n\nInputs:\n{body}"


def reader_history(thoughts: Sequence[str], reasoning: bool = False) -> str:
  """The reader's thoughts so far as it wrote them (a chat template's assistant prefix)."""
  if reasoning:
    return "".join(f"{t}\n" for t in thoughts)
  return "".join(f"<think>{t}</think>\n" for t in thoughts)


def render_think(thought: str) -> str:
  return f"<think>{thought}</think>"


def render_answer(answer: str) -> str:
  return f"<answer>{answer}</answer>"


# --------------------------------------------------------------------------- the oracle
_refs = step_references
_fill = fill_references


@dataclasses.dataclass(frozen=True)
class Plan:
  """The oracle's view of one question: per decomposition step its filled question, answer,
  gold documents (corpus ids) and path triple (None for a step without gold documents)."""
  questions: tuple
  answers: tuple
  gold: tuple                 # tuple of tuples of corpus ids
  triples: tuple
  refs: tuple                 # per step, the 0-based steps it references
  final: str                  # the question's answer

  @classmethod
  def of(cls, decomposition: Sequence, path_triples: Sequence, answer: str,
         gold_of_step: Optional[Sequence] = None) -> "Plan":
    answers = [s.answer for s in decomposition]
    golds = [tuple(gold_of_step[i] if gold_of_step is not None else s.gold_ids)
             for i, s in enumerate(decomposition)]
    with_gold = [i for i, g in enumerate(golds) if g]
    path = list(path_triples)
    triples = [None] * len(decomposition)
    if len(path) == len(with_gold):
      for i, t in zip(with_gold, path):
        triples[i] = (t.head, t.relation, t.tail) if hasattr(t, "head") else tuple(t)
    return cls(tuple(_fill(s.question, answers) for s in decomposition), tuple(answers),
               tuple(golds), tuple(triples),
               tuple(tuple(sorted(r - 1 for r in _refs(s.question)
                                  if 0 < r <= len(decomposition)))
                     for s in decomposition), answer)

  def fact(self, i: int) -> str:
    t = self.triples[i]
    if t is not None:
      return f"{FACT_PREFIX} {parsing.triple_text((t[0], t[1], self.answers[i]))}"
    return f"{FACT_PREFIX} {self.questions[i]} {self.answers[i]}."

  def need(self, i: int) -> str:
    t = self.triples[i]
    if t is not None:
      return f"{NEED_PREFIX} {parsing.triple_text((t[0], t[1], '?'))}"
    return f"{NEED_PREFIX} {self.questions[i]}"

  def query(self, i: int) -> str:
    """The oracle's retrieval query for step i: the head and relation of its path triple
    (one wording per fact; the decomposition's questions vary in wording), else the step's
    question."""
    t = self.triples[i]
    if t is not None:
      return f"{t[0]} {t[1].replace('_', ' ')}"
    return self.questions[i]

  def stated(self, thoughts: Sequence[str]) -> set:
    said = set(thoughts)
    return {i for i in range(len(self.questions)) if self.gold[i] and self.fact(i) in said}

  def next_step(self, thoughts: Sequence[str]) -> Optional[int]:
    """The first step with gold documents not yet stated whose references are stated (a
    reference to a step without gold documents counts as stated)."""
    known = self.stated(thoughts)
    for i in range(len(self.questions)):
      if self.gold[i] and i not in known and all(
          r in known or not self.gold[r] for r in self.refs[i]):
        return i
    return None

  def thought(self, context: Sequence[str], thoughts: Sequence[str]) -> parsing.Thought:
    i = self.next_step(thoughts)
    if i is None:
      return parsing.Thought("answer", self.final)
    if set(self.gold[i]) <= set(context):
      return parsing.Thought("think", self.fact(i))
    return parsing.Thought("think", self.need(i))

  def needed(self, thoughts: Sequence[str]) -> Optional[int]:
    """The step the latest thought asks for, when it is a need."""
    if not thoughts or not str(thoughts[-1]).startswith(NEED_PREFIX):
      return None
    for i in range(len(self.questions)):
      if self.gold[i] and thoughts[-1] == self.need(i):
        return i
    return None

  def decision(self, thoughts: Sequence[str]) -> bool:
    return bool(thoughts) and str(thoughts[-1]).startswith(NEED_PREFIX)

  def formulation(self, thoughts: Sequence[str], direct: bool = False) -> Optional[str]:
    """The QF target after a need thought (None when the latest thought is not a need);
    `direct`: the query line alone (the Direct QF ablation)."""
    i = self.needed(thoughts)
    if i is None:
      return None
    if direct:
      return f"{parsing.QUERY} {self.query(i)}"
    known = sorted(self.stated(thoughts))
    chain = [self.triples[k] for k in known if self.triples[k] is not None]
    t = self.triples[i]
    if t is not None:
      chain.append((t[0], t[1], parsing.UNKNOWN))
    return parsing.render_formulation(chain, self.query(i) + "?", self.query(i))

  def document(self, thoughts: Sequence[str], doc_ids: Sequence[str]) -> Optional[int]:
    """Direct KI's target: the first retrieved document among the needed step's gold ones."""
    i = self.needed(thoughts)
    if i is None:
      return None
    for k, d in enumerate(doc_ids):
      if d in self.gold[i]:
        return k
    return None

  def selection(self, thoughts: Sequence[str], candidates: Sequence) -> Optional[int]:
    """The index of the KI target among `candidates` (objects with head/relation/tail and
    doc_id), or None when none comes from the needed step's gold documents."""
    i = self.needed(thoughts)
    if i is None:
      return None
    t = self.triples[i]
    for k, c in enumerate(candidates):
      if t is not None and (c.head, c.relation, c.tail) == tuple(t):
        return k
    for k, c in enumerate(candidates):
      if c.doc_id in self.gold[i]:
        return k
    return None
