"""APEX-Searcher glue for the shared trainer. `apex.role` picks the model being trained:

  planner   question -> numbered plan of sub-questions (plans.py); SFT on gold plans, then GRPO
            rewarded by SEPR (sepr.py), one batched encoder call per training batch.
  executor  every execution role of one model (prompts.py), SFT on oracle trajectories made by
            running Algorithm 2 (executor.py) with the gold decomposition and the real
            retriever; evaluated by executing the gold plans. SFT only, as in the paper.

The plan -> execute pipeline that composes a planner run and an executor run is pipeline.py.
"""
from __future__ import annotations

import logging
from typing import Sequence

from rlrag_jax import metrics
from rlrag_jax.methods.apex import executor, plans, prompts, rewrite, sepr, settings
from rlrag_jax.retrieval import from_config
from rlrag_jax.retrieval.query_cache import QueryEmbeddings
from rlrag_jax.rollout.single_turn import decode_keeping_tags, single_turn
from rlrag_jax import tasks
from rlrag_jax.tasks import EvalRow, SingleStreamTask, Task

ROLES = ("planner", "executor")
PLAN_CUE = "Plan:\n"
log = logging.getLogger("rlrag_jax.apex")


class PlannerTask(SingleStreamTask):
  """The planning agent: one single-turn rollout per question, SEPR against the gold plan."""
  name = "apex"

  def __init__(self, config, encoder=None):
    self.config = config
    self.settings = a = settings.planner(config)
    self.max_steps = int(a.max_steps)
    if self.max_steps < 1:
      raise ValueError(f"config key 'apex.max_steps' is {self.max_steps}; expected >= 1")
    sel = self.select_data(config)
    self.train = [ex for ex in sel.train if _gold_fits(ex, self.max_steps)]
    self.eval = [ex for ex in sel.eval if _gold_fits(ex, self.max_steps)]
    dropped = len(sel.train) + len(sel.eval) - len(self.train) - len(self.eval)
    if dropped:
      log.warning("apex: %d examples have no decomposition or more than apex.max_steps=%d gold "
                  "steps and are left out", dropped, self.max_steps)
    if not self.train:
      raise ValueError("apex planner: no training example has a gold decomposition of at most "
                       f"apex.max_steps={self.max_steps} steps")
    self.corpus = sel.corpus
    self.gold_plans = rewrite.read_plans(a.gold_plans) if a.gold_plans else {}
    self.rewrite_symbolic = bool(a.rewrite_symbolic)   # counts: rewrite.py's CLI
    self._encoder = encoder
    self._scorer = None
    self.threshold = float(a.sepr_threshold)
    self.use_tokenizer(config, ())

  # ---------------------------------------------------------------- prompts
  def prompt_text(self, ex) -> str:
    return planner_prompt_text(ex.question, self.max_steps, self.config.data.prompt_style)

  def prompt_ids(self, ex) -> list:
    return planner_prompt_ids(self.tokenizer, ex.question, self.max_steps,
                              self.config.data.prompt_style, self.use_chat,
                              thinking=self.config.model.thinking)

  def gold(self, ex) -> list:
    """The gold plan: `apex.gold_plans`'s entry for the example, else its decomposition with
    MuSiQue's symbolic steps rewritten (apex.rewrite_symbolic)."""
    if str(ex.id) in self.gold_plans:
      return list(self.gold_plans[str(ex.id)])
    steps = plans.gold_steps(ex)
    return rewrite.rewrite_plan(steps)[0] if self.rewrite_symbolic else steps

  def sft_target(self, ex) -> str:
    return plans.render(self.gold(ex))

  def sft_target_ids(self, ex) -> list:
    return self.tokenizer(self.sft_target(ex), add_special_tokens=False)["input_ids"] + self.eos()

  def tokenizer_texts(self):
    for ex in list(self.train) + list(self.eval):
      yield self.prompt_text(ex)
      yield self.sft_target(ex)

  # ---------------------------------------------------------------- rollouts and rewards
  def decode(self, ids: Sequence[int]) -> str:
    return decode_keeping_tags(self.tokenizer, ids)

  def rollout(self, policy, examples, rng, *, group_size=1, greedy=False):
    return single_turn(policy, examples, self.prompt_ids, self.decode, rng,
                       group_size=group_size, greedy=greedy)

  @property
  def scorer(self) -> sepr.SEPRScorer:
    if self._scorer is None:
      if self._encoder is None:
        from rlrag_jax.retrieval.encoder import Encoder
        path = self.settings.encoder_path or None
        self._encoder = Encoder.from_pretrained(path, max_length=64)
      self._scorer = sepr.SEPRScorer(self._encoder, self.threshold)
    return self._scorer

  def score(self, episodes) -> list:
    """Per episode: SEPR of its parsed plan against the gold plan, with the parse details."""
    parsed = [plans.parse(ep.text, ep.example.question, self.max_steps) for ep in episodes]
    golds = [self.gold(ep.example) for ep in episodes]
    # A plan that does not parse scores 0: its fallback (the question as one step) is what the
    # pipeline would run, but rewarding it teaches the planner to write no plan at all (a 2-hop
    # question is often within the threshold of its first sub-question).
    values = self.scorer([[] if p.fallback else list(p.steps) for p in parsed], golds)
    out = []
    for p, g, v in zip(parsed, golds, values):
      out.append({"total": float(v), "sepr": float(v), "fallback": float(p.fallback),
                  "plan_steps": float(len(p.steps)),
                  "step_error": float(len(p.steps) - len(g)),
                  "exact": float(not p.fallback and list(p.steps) == list(g))})
    return out

  def rewards(self, episodes, step: int = 0) -> list:
    return self.score(episodes)

  def eval_metrics(self, episodes) -> list:
    out = []
    for ep, s in zip(episodes, self.score(episodes)):
      out.append({"sepr": s["sepr"], "fallback": s["fallback"], "plan_steps": s["plan_steps"],
                  "step_abs_error": abs(s["step_error"]), "exact": s["exact"],
                  "prediction": ep.text})
    return out


def gold_plan(ex) -> list:
  """The executor's gold plan: the decomposition's sub-questions with MuSiQue's symbolic steps
  rewritten as questions (rewrite.py); the question itself without a decomposition."""
  return rewrite.rewrite_plan(plans.gold_steps(ex))[0]


def planner_prompt_text(question: str, max_steps: int, style: str) -> str:
  if style == "compact":
    return f"Question: {question}\n{PLAN_CUE}"
  return f"{plans.instruction(max_steps)}\n\nQuestion: {question}\n{PLAN_CUE}"


def planner_prompt_ids(tokenizer, question: str, max_steps: int, style: str,
                       use_chat: bool, thinking: bool = False) -> list:
  if use_chat:
    from rlrag_jax.models import encode_prompt
    return encode_prompt(tokenizer, [
        {"role": "system", "content": plans.instruction(max_steps)},
        {"role": "user", "content": f"Question: {question}"}], thinking=thinking)
  return tokenizer(planner_prompt_text(question, max_steps, style),
                   add_special_tokens=False)["input_ids"]


class ExecutorTask(Task):
  """The execution agent: SFT on oracle trajectories of Algorithm 2; held-out EM/F1 of executing
  the gold plans (the executor alone; the planner's plans are pipeline.py's). SFT only, the
  paper's design: a plain `Task`."""
  name = "apex"

  def __init__(self, config, encoder=None):
    self.config = config
    self.settings = a = settings.executor(config)
    self.max_steps, self.max_hops, self.top_k = int(a.max_steps), int(a.max_hops), int(a.top_k)
    self.passage_words = int(a.max_passage_words)
    self.truncated_prompts = 0
    for key, v in (("max_steps", self.max_steps), ("max_hops", self.max_hops),
                   ("top_k", self.top_k)):
      if v < 1:
        raise ValueError(f"config key 'apex.{key}' is {v}; expected >= 1")
    self.style = config.data.prompt_style
    sel = tasks.select_data(config)
    self.train = [ex for ex in sel.train if _gold_fits(ex, self.max_steps)]
    self.eval = list(sel.eval)
    if not self.train:
      log.warning("apex executor: no training example has a gold decomposition of at most "
                  "apex.max_steps=%d steps", self.max_steps)
    self.corpus = from_config.corpus_for(config, sel)
    self.encoder, self.retriever, _ = from_config.retriever_for(config, self.corpus, encoder)
    self._embed = QueryEmbeddings(self.encoder)
    self.remote = bool(config.retrieval.url)    # retrieval as a service
    self._traces = self._calls = None
    self.kept = self.dropped = 0
    tasks.use_tokenizer(self, config, ())

  # ---------------------------------------------------------------- retrieval
  def search(self, queries: Sequence[str]) -> list:
    """Per query its top `apex.top_k` Hits (query embeddings cached by text); with
    `retrieval.url` set, the server's Hits (its ids, titles and texts)."""
    if not queries:
      return []
    if self.remote:
      return self.retriever.search(list(queries), self.top_k)
    return self.retriever.search_embeddings(self._embed(queries), self.top_k)

  # ---------------------------------------------------------------- prompts and SFT data
  def ask_ids(self, ask: prompts.Ask) -> list:
    if self.use_chat:
      from rlrag_jax.models import encode_prompt
      return encode_prompt(self.tokenizer, ask.chat_messages(),
                           thinking=self.config.model.thinking)
    return self.tokenizer(ask.text(self.style), add_special_tokens=False)["input_ids"]

  def target_ids(self, text: str) -> list:
    ids = self.tokenizer(text if self.use_chat else " " + text,
                         add_special_tokens=False)["input_ids"]
    return ids + tasks.eos(self.tokenizer)

  def oracle_traces(self) -> dict:
    """{example id: Trace} of the kept oracle trajectories over the training examples
    (computed once: one batched retrieval per round)."""
    if self._traces is None:
      procs = [executor.solve(ex.question, gold_plan(ex), max_hops=self.max_hops,
                              gold=list(ex.decomposition), gold_answer=ex.answers[0],
                              passage_words=self.passage_words)
               for ex in self.train]
      traces = executor.run(procs, executor.oracle_outputs, self.search)
      self._traces = {str(ex.id): t for ex, t in zip(self.train, traces) if t.supported}
      self.kept, self.dropped = len(self._traces), len(traces) - len(self._traces)
      kinds = {}
      for t in self._traces.values():
        for a, _ in t.calls:
          kinds[a.kind] = kinds.get(a.kind, 0) + 1
      log.info("apex executor: %d oracle trajectories kept, %d dropped (retrieval missed a "
               "step's support within apex.max_hops=%d); SFT samples by role: %s", self.kept,
               self.dropped, self.max_hops, kinds)
      if not self._traces:
        raise ValueError("apex executor: no oracle trajectory found the support of every step; "
                         "raise apex.max_hops or apex.top_k")
    return self._traces

  def sft_calls(self) -> dict:
    """{example id: [(Ask, output), ...]}: the trajectories SFT trains on, from
    `apex.trajectories` (self_instruct.py's file) when set, else the oracle's."""
    if self._calls is None:
      path = self.settings.trajectories
      if path:
        self._calls = prompts.read_trajectories(path)
        log.info("apex executor: %d trajectories from %s", len(self._calls), path)
      else:
        self._calls = {k: t.calls for k, t in self.oracle_traces().items()}
    return self._calls

  def sft_samples(self, ex) -> list:
    calls = self.sft_calls().get(str(ex.id), [])
    return [(self.ask_ids(a), self.target_ids(out), None) for a, out in calls]

  def tokenizer_texts(self):
    for kind in prompts.KINDS:
      yield prompts.Ask(kind, "").text(self.style)
    yield prompts.INSTRUCTIONS["query_next"]
    for r in self.corpus:
      yield f"{r.title}: {r.text}"
    for ex in list(self.train) + list(self.eval):
      yield ex.question
      for st, q in zip(ex.decomposition, gold_plan(ex)):
        yield f"{q} -> {st.answer}"

  # ---------------------------------------------------------------- execution
  def generate_fn(self, policy, rng=None, greedy: bool = True):
    """`generate(asks) -> texts` for executor.run: one batched model call per round."""
    import jax
    state = {"rng": rng if rng is not None else jax.random.PRNGKey(0)}
    limit = {"check": 8, "continue": 8, "query": int(self.settings.max_query_tokens)}

    longest = max(*limit.values(), int(self.settings.max_answer_tokens))

    room = int(policy.config.max_position_embeddings) - longest

    def generate(asks):
      ids = [self.ask_ids(a) for a in asks]
      long = [i for i, x in enumerate(ids) if len(x) > room]
      if long:                      # a guard: keep the prompt's end (question, cue)
        if not self.truncated_prompts:
          log.warning("apex executor: prompts longer than the model's %d positions keep their "
                      "last %d tokens (lower apex.max_passage_words)",
                      policy.config.max_position_embeddings, room)
        self.truncated_prompts += len(long)
        for i in long:
          ids[i] = ids[i][-room:]
      # One token budget for every role (rows stop at their own): rounds differ in batch size
      # and prompt length, and sample_chunked keeps their shapes to a few compiled programs.
      per_row = [limit.get(a.kind, int(self.settings.max_answer_tokens)) for a in asks]
      rows, state["rng"] = policy.sample_chunked(ids, state["rng"], greedy=greedy,
                                                 max_new_tokens=longest,
                                                 max_new_tokens_per_row=per_row)
      return [decode_keeping_tags(self.tokenizer, comp) for comp, _ in rows]
    return generate

  def execute(self, policy, examples, plan_lists, rng=None) -> list:
    """Traces of executing `plan_lists[i]` for `examples[i]` (greedy)."""
    procs = [executor.solve(ex.question, p, max_hops=self.max_hops,
                            passage_words=self.passage_words)
             for ex, p in zip(examples, plan_lists)]
    return executor.run(procs, self.generate_fn(policy, rng), self.search)

  def naive_rag(self, policy, examples, rng=None) -> list:
    """Traces of the naive-RAG baseline: the question's top-k passages, one answer."""
    procs = [executor.naive_rag(ex.question, self.passage_words) for ex in examples]
    return executor.run(procs, self.generate_fn(policy, rng), self.search)

  def evaluate(self, policy, examples, rng) -> list:
    """Executing the gold plans (greedy): per example EM / F1 of the answer and the trace's
    counts (retrievals, skipped retrievals, repeated queries, parse fallbacks, calls)."""
    examples = list(examples)
    traces = self.execute(policy, examples, [gold_plan(ex) for ex in examples], rng)
    return [EvalRow(ex, t.answer, trace_metrics(ex, t)) for ex, t in zip(examples, traces)]


def trace_metrics(ex, trace) -> dict:
  """EM and F1 of an executed trace's answer, with the trace's counts."""
  t = trace.to_dict()
  return {"em": metrics.exact_match(trace.answer, ex.answers),
          "f1": metrics.f1(trace.answer, ex.answers),
          **{k: float(t[k]) for k in ("retrievals", "skipped_retrieval", "repeated_queries",
                                      "parse_fallbacks", "calls")}}


def _gold_fits(ex, max_steps: int) -> bool:
  steps = getattr(ex, "decomposition", None) or []
  return 0 < len(steps) <= max_steps


def make_task(config):
  role = config.apex.role
  if role == "planner":
    return PlannerTask(config)
  if role == "executor":
    return ExecutorTask(config)
  raise ValueError(f"config key 'apex.role' is {role!r}; expected one of {ROLES}")
