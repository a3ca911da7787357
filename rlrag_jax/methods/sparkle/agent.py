"""SPARKLE's inference loop (the paper's Algorithm 1), one reasoning step at a time for a batch of
trajectories, and the binary tree rollout built on it (§3.1).

A trajectory's `State` holds its context (documents added, in order), the reader's thoughts, and
counters. One `Agent.step` is: the Retrieval Decision (forced by the tree, or sampled / greedy
from the proxy), then for a "Yes" the Query Formulation (reasoning chain, need, query), the
retrieval of the top `top_docs` documents, the `top_triples` candidate triples of those documents
(`triples.TripleStore`) and the Knowledge Integration (one triple: its source document joins the
context), then the reader's next thought. Every proxy call is batched over the trajectories of
the step, one call per role. A "Yes" whose selected document is already in the context (or that
selected nothing) leaves the context unchanged: the step is marked `redundant` and the reader is
not called for it (the tree prunes such a branch: its "No" sibling reasons identically).

The models are behind two callables, so the loop is testable without them:

  propose(role, prompts: [str], greedy) -> [(text, completion ids, truncated)]   the proxy
  read(requests: [(question, [(title, text)], [thought])]) -> [text]              the reader
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

from rlrag_jax.methods.sparkle import parsing, prompts
from rlrag_jax.rollout import tree as tree_lib

ROLES = ("rd", "qf", "ki")
RD_MODES = ("agent", "reader")
QF_MODES = ("chain", "direct", "rd")
KI_MODES = ("triple", "document", "all")
KI_FALLBACKS = ("top", "none")          # sparkle.agent.ki_fallback: the best candidate, or nothing
KI_OUTPUTS = ("triple", "index")        # sparkle.agent.ki_output (parsing.render_selection)


@dataclasses.dataclass(frozen=True)
class AgentConfig:
  top_docs: int = 10            # documents retrieved per query (paper: 10)
  top_triples: int = 20         # candidate triples kept (paper: 20)
  max_steps: int = 10           # reader calls per question
  max_retrievals: int = 5       # retrievals per question
  recall_k: int = 5             # cumulative Recall@k per step counts each query's top k
  rd_default: bool = False      # a malformed decision: no retrieval
  ki_fallback: Optional[int] = 0  # a malformed selection: the best candidate (None: nothing)
  ki_output: str = "triple"     # the KI target names the triple ('triple') or its number
  reasoning_reader: bool = False
  style: str = "compact"
  passage_words: int = 0
  # The paper's agent ablations (Table 4):
  rd_mode: str = "agent"        # 'reader': w/o RD, the reader's own thought asks for a search
  qf_mode: str = "chain"        # 'direct': no reasoning chain; 'rd': w/o QF, RD writes it
  ki_mode: str = "triple"       # 'document': direct KI selects a document; 'all': w/o KI
  all_docs: int = 0             # 'all': documents appended per retrieval (0: top_docs)

  def __post_init__(self):
    for key, allowed in (("rd_mode", RD_MODES), ("qf_mode", QF_MODES), ("ki_mode", KI_MODES),
                         ("ki_output", KI_OUTPUTS)):
      if getattr(self, key) not in allowed:
        raise ValueError(f"config key 'sparkle.agent.{key}' is {getattr(self, key)!r}; expected "
                         f"one of {allowed}")

  @classmethod
  def from_config(cls, section, style: str) -> "AgentConfig":
    """From config section `sparkle.agent` as parsed by `settings.parse` (configs/sparkle.py
    declares every key)."""
    if section.ki_fallback not in KI_FALLBACKS:
      raise ValueError(f"config key 'sparkle.agent.ki_fallback' is {section.ki_fallback!r}; "
                       f"expected one of {KI_FALLBACKS}")
    return cls(top_docs=int(section.top_docs), top_triples=int(section.top_triples),
               max_steps=int(section.max_steps), max_retrievals=int(section.max_retrievals),
               recall_k=int(section.recall_k), rd_default=bool(section.rd_default),
               ki_fallback=0 if section.ki_fallback == "top" else None,
               ki_output=str(section.ki_output),
               reasoning_reader=bool(section.reasoning_reader), style=style,
               passage_words=int(section.passage_words), rd_mode=str(section.rd_mode),
               qf_mode=str(section.qf_mode), ki_mode=str(section.ki_mode),
               all_docs=int(section.all_docs))


@dataclasses.dataclass(frozen=True)
class State:
  question: str
  tree: int                       # which question of the batch
  context: tuple = ()             # document ids, in the order they joined
  thoughts: tuple = ()            # the reader's thoughts so far (answers excluded)
  answer: Optional[str] = None    # the reader's answer, once given
  steps: int = 0                  # reader calls
  retrievals: int = 0
  retrieved: tuple = ()           # per retrieval, the ids of the query's top `recall_k`
  queries: tuple = ()
  chain: tuple = ()               # the latest reasoning chain
  malformed: tuple = ()           # roles whose output was malformed, in order
  redundant: bool = False         # this step's retrieval changed nothing (the reader skipped)
  done: bool = False

  @property
  def prediction(self) -> str:
    return self.answer or ""


@dataclasses.dataclass(frozen=True)
class Sample:
  """One proxy decision to train on: its role, prompt text and completion ids (sampled, or the
  forced decision's tokens)."""
  role: str
  prompt: str
  completion: tuple
  forced: bool = False
  text: str = ""              # the completion's text
  truncated: bool = False     # it hit its role's token cap (sparkle.max_new) without a stop


# The proxy's roles by the names its truncation counts take (`truncation_counts`).
CALL_NAMES = {"rd": "decision", "qf": "formulation", "ki": "selection"}


def truncation_counts(samples: Sequence[Sample]) -> dict:
  """Per role, the proxy's own calls ('decisions', 'formulations', 'selections') and those whose
  generation hit the role's token cap without a stop ('truncated_decisions', ...). A forced
  decision (the tree's branch: the rollout wrote it, the proxy generated nothing) is no call."""
  out = {}
  for role, name in CALL_NAMES.items():
    made = [s for s in samples if s.role == role and not s.forced]
    out[f"{name}s"] = float(len(made))
    out[f"truncated_{name}s"] = float(sum(bool(s.truncated) for s in made))
  return out


def truncation_rates(counts: dict) -> dict:
  """'truncated_decision_rate', '..._formulation_rate', '..._selection_rate' from summed (or
  mean) `truncation_counts`: truncated calls over calls, 0.0 where the role made none."""
  out = {}
  for name in CALL_NAMES.values():
    n = float(counts.get(f"{name}s", 0.0))
    out[f"truncated_{name}_rate"] = float(counts.get(f"truncated_{name}s", 0.0)) / n if n else 0.0
  return out


class Agent:

  def __init__(self, cfg: AgentConfig, *, propose: Callable, read: Callable,
               search: Callable, embed: Callable, store, docs: Callable,
               encode_forced: Callable):
    """search(queries, k) -> [[doc id]]; embed(queries) -> [n, d] unit rows; store: a
    TripleStore; docs(ids) -> [(title, text)]; encode_forced(text) -> completion ids of a
    forced decision (its tokens and end of sequence)."""
    self.cfg = cfg
    self.propose, self.read_fn, self.search, self.embed = propose, read, search, embed
    self.store, self.docs, self.encode_forced = store, docs, encode_forced

  # ------------------------------------------------------------------------ prompts
  def rd_prompt(self, s: State) -> str:
    prev, cur = s.thoughts[:-1], (s.thoughts[-1] if s.thoughts else "")
    return prompts.decision_text(s.question, self.docs(s.context), prev, cur, self.cfg.style,
                                 self.cfg.passage_words)

  def qf_prompt(self, s: State) -> str:
    if self.cfg.qf_mode == "rd":     # w/o QF: the RD agent, having said "Yes", writes it
      return self.rd_prompt(s) + parsing.YES + "\n"
    return prompts.formulation_text(s.question, s.thoughts, self.cfg.style,
                                    direct=self.cfg.qf_mode == "direct")

  def ki_prompt(self, s: State, chain, query, cands) -> str:
    if self.cfg.ki_mode == "document":
      return prompts.document_selection_text(s.question, chain, query, self.docs(cands),
                                             self.cfg.style, self.cfg.passage_words)
    return prompts.integration_text(s.question, chain, query, cands, self.cfg.style)

  def wants_search(self, s: State) -> bool:
    """w/o RD: the reader's latest thought asks for a search (a need, or a <search> tag)."""
    t = s.thoughts[-1] if s.thoughts else ""
    return t.startswith(prompts.NEED_PREFIX) or "<search>" in t

  # ------------------------------------------------------------------------ the reader
  def start(self, questions: Sequence[str], contexts: Optional[Sequence] = None) -> list:
    """Initial states after the reader's first thought; the context is empty (the paper's
    c_0) unless `contexts` gives one per question (naive RAG)."""
    ctx = [()] * len(questions) if contexts is None else [tuple(c) for c in contexts]
    return self.read([State(question=q, tree=i, context=c)
                      for i, (q, c) in enumerate(zip(questions, ctx))])

  def read(self, states: Sequence[State]) -> list:
    """The reader's next thought for every open state, in one batched call."""
    states = list(states)
    todo = [i for i, s in enumerate(states) if not s.done]
    if not todo:
      return states
    texts = self.read_fn([(states[i].question, self.docs(states[i].context),
                           list(states[i].thoughts)) for i in todo])
    for i, text in zip(todo, texts):
      s = states[i]
      t = parsing.parse_thought(text, reasoning=self.cfg.reasoning_reader)
      steps = s.steps + 1
      if t.kind == "answer":
        states[i] = dataclasses.replace(s, answer=t.text, steps=steps, done=True)
        continue
      mal = s.malformed + (("reader",) if t.kind == "malformed" else ())
      states[i] = dataclasses.replace(s, thoughts=s.thoughts + (t.text,), steps=steps,
                                      malformed=mal, done=steps >= self.cfg.max_steps)
    return states

  # ------------------------------------------------------------------------ one step
  def can_retrieve(self, s: State) -> bool:
    return not s.done and s.retrievals < self.cfg.max_retrievals

  def step(self, states: Sequence[State], actions: Sequence[Optional[bool]], *,
           greedy: bool = False) -> tuple:
    """Advances every open state one reasoning step. `actions[i]`: True / False forces the
    decision (the tree's branches), None lets the proxy decide. Returns (states, samples), the
    samples of state i being the proxy decisions it made (RD, then QF and KI on a "Yes")."""
    cfg = self.cfg
    states = [dataclasses.replace(s, redundant=False) if s.redundant else s for s in states]
    samples = [[] for _ in states]
    decide = [i for i, s in enumerate(states) if self.can_retrieve(s) and actions[i] is None]
    yes = set()
    if cfg.rd_mode == "reader":      # no RD agent: the reader's thought decides
      yes = {i for i in decide if self.wants_search(states[i])}
      decide = []
    if decide:
      outs = self.propose("rd", [self.rd_prompt(states[i]) for i in decide], greedy)
      for i, (text, ids, cut) in zip(decide, outs):
        d = parsing.parse_decision(text, default=cfg.rd_default)
        samples[i].append(Sample("rd", self.rd_prompt(states[i]), tuple(ids), text=text,
                                 truncated=bool(cut)))
        if not d.well_formed:
          states[i] = dataclasses.replace(states[i], malformed=states[i].malformed + ("rd",))
        if d.retrieve:
          yes.add(i)
    for i, a in enumerate(actions):
      if a is not None and self.can_retrieve(states[i]):
        text = parsing.render_decision(bool(a))
        samples[i].append(Sample("rd", self.rd_prompt(states[i]),
                                 tuple(self.encode_forced(text)), forced=True, text=text))
        if a:
          yes.add(i)
    yes = sorted(yes)
    redundant = set()
    if yes:
      outs = self.propose("qf", [self.qf_prompt(states[i]) for i in yes], greedy)
      forms = {}
      for i, (text, ids, cut) in zip(yes, outs):
        s = states[i]
        fallback = s.thoughts[-1] if s.thoughts else s.question
        f = parsing.parse_formulation(text, fallback)
        forms[i] = f
        samples[i].append(Sample("qf", self.qf_prompt(s), tuple(ids), text=text,
                                 truncated=bool(cut)))
        if not f.well_formed:
          states[i] = dataclasses.replace(s, malformed=s.malformed + ("qf",))
      queries = [forms[i].query for i in yes]
      hits = self.search(queries, cfg.top_docs)
      if cfg.ki_mode == "triple":
        vecs = self.embed(queries)
        cands = {i: self.store.candidates(vecs[k], hits[k], cfg.top_triples)
                 for k, i in enumerate(yes)}
      else:                          # documents are the candidates
        cands = {i: list(dict.fromkeys(hits[k])) for k, i in enumerate(yes)}
      added = {}
      if cfg.ki_mode == "all":       # w/o KI: every retrieved document joins the context
        for i in yes:
          added[i] = cands[i][:cfg.all_docs or cfg.top_docs]
      ask = [i for i in yes if cands[i] and cfg.ki_mode != "all"]
      if ask:
        kp = {i: self.ki_prompt(states[i], forms[i].chain, forms[i].query, cands[i])
              for i in ask}
        outs = self.propose("ki", [kp[i] for i in ask], greedy)
        for i, (text, ids, cut) in zip(ask, outs):
          if cfg.ki_mode == "document":
            sel = parsing.parse_document(text, [t for t, _ in self.docs(cands[i])],
                                         fallback=cfg.ki_fallback)
            doc = cands[i][sel.index] if sel.index is not None else None
          else:
            sel = parsing.parse_selection(text, cands[i], fallback=cfg.ki_fallback)
            doc = cands[i][sel.index].doc_id if sel.index is not None else None
          samples[i].append(Sample("ki", kp[i], tuple(ids), text=text, truncated=bool(cut)))
          added[i] = [doc] if doc is not None else []
          if not sel.well_formed:
            states[i] = dataclasses.replace(states[i], malformed=states[i].malformed + ("ki",))
      for k, i in enumerate(yes):
        s = states[i]
        fresh = tuple(d for d in dict.fromkeys(added.get(i, ())) if d not in s.context)
        new = bool(fresh)
        states[i] = dataclasses.replace(
            s, context=s.context + fresh, retrievals=s.retrievals + 1,
            retrieved=s.retrieved + (tuple(hits[k][:cfg.recall_k]),),
            queries=s.queries + (forms[i].query,), chain=forms[i].chain, redundant=not new)
        if not new:
          redundant.add(i)
    forced_yes = {i for i, a in enumerate(actions) if a}
    skip = redundant & forced_yes          # pruned by the tree: no reader call
    read = [i for i in range(len(states)) if i not in skip]
    done = self.read([states[i] for i in read])
    for i, s in zip(read, done):
      states[i] = s
    return states, samples

  # ------------------------------------------------------------------------ whole runs
  def run(self, questions: Sequence[str], *, greedy: bool = True,
          contexts: Optional[Sequence] = None, retrieve: bool = True,
          samples: Optional[list] = None) -> list:
    """Linear inference (no branching) until every question is answered or out of steps.
    retrieve=False never retrieves (no proxy call): the reader alone, or naive RAG with
    `contexts`. A `samples` list receives, per question, the proxy decisions it made."""
    states = self.start(questions, contexts)
    if samples is not None:
      samples[:] = [[] for _ in questions]
    while any(not s.done for s in states):
      open_ = [i for i, s in enumerate(states) if not s.done]
      if retrieve:
        new, made = self.step([states[i] for i in open_], [None] * len(open_), greedy=greedy)
        if samples is not None:
          for i, m in zip(open_, made):
            samples[i].extend(m)
      else:
        new = self.read([states[i] for i in open_])
      for i, s in zip(open_, new):
        states[i] = s
    return states

  def tree(self, questions: Sequence[str], *, depth: int, reward: Callable,
           explore: bool = True) -> tree_lib.Forest:
    """The binary tree rollout: for the first `depth` reasoning steps both decisions are taken
    (explore=True; False gives the standard rollout, one sampled path), then each path goes on
    with sampled decisions. A forced "Yes" that changed nothing is pruned. `reward(states)`
    scores the leaves' final states."""
    roots = self.start(questions)

    def branch(node):
      s = node.state
      if explore and self.can_retrieve(s) and self.cfg.rd_mode == "agent":
        return [True, False]
      return [None]

    def step(nodes, actions):
      new, samples = self.step([n.state for n in nodes], list(actions), greedy=False)
      return [tree_lib.Step(state=s, sample=smp, done=s.done) for s, smp in zip(new, samples)]

    def prune(parent, child):
      return child.action is True and child.state.redundant

    return tree_lib.expand(roots, step=step, branch=branch, prune=prune, max_depth=depth,
                           reward=lambda leaves: reward([n.state for n in leaves]),
                           max_steps=self.cfg.max_steps + 1)
