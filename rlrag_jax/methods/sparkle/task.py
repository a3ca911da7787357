"""SPARKLE glue for the shared trainer. `sparkle.role` picks the model being trained:

  proxy   the proxy model that plays the three agents: an SFT warm-up on the oracle's correct
          trajectories (one sample per decision: RD at every step, QF and KI at each retrieval),
          then PPO with a value model on binary tree rollouts (agent.py; `sparkle.rollout`
          'tree', or 'standard' for the paper's comparison), every decision trained with its
          Monte-Carlo return (the mean leaf reward below it). The frozen reader is the config's
          auxiliary model `models.reader` (or an OpenAI-compatible endpoint, `sparkle.reader.url`).
          Evaluated by the linear greedy loop of Algorithm 1 against the reader alone and naive
          RAG: F1, EM, recall of the final context, cumulative Recall@5 per retrieval step,
          retrievals, reasoning steps, latency.
  reader  the frozen reader of the CPU default: SFT on the oracle reader's next thought at
          states of oracle walks where retrievals sometimes fail or bring a distractor.
"""
from __future__ import annotations

import dataclasses
import logging
import pathlib
import random
import time

import numpy as np

from rlrag_jax import metrics
from rlrag_jax.methods.sparkle import agent as agent_lib
from rlrag_jax.methods.sparkle import parsing, prompts, readers, rewards, settings
from rlrag_jax.methods.sparkle.report import VARIANTS
from rlrag_jax.methods.sparkle.trajectory_io import read_trajectories
from rlrag_jax.methods.sparkle.triples import TripleStore, knowledge_graph
from rlrag_jax.retrieval.corpus_search import CorpusSearch
from rlrag_jax.rollout.single_turn import decode_keeping_tags
from rlrag_jax import tasks
from rlrag_jax.tasks import Episode, EvalRow, Group, RLTask, Task

ROLES = ("proxy", "reader")
ROLLOUTS = ("tree", "standard")
# sparkle.eval_on: what the trainer's evaluations read: the data.eval_mix questions ('eval') or
# the validation questions held out of the training ones ('valid', sparkle.valid_fraction > 0;
# the paper selects hyperparameters on its 1,500).
EVAL_ON = ("eval", "valid")


def split_validation(train: list, fraction: float, seed: int) -> tuple:
  """(train, valid): round(fraction x n) of the n training questions, drawn with `seed`, held
  out for validation; the rest, in their order, train. The paper: 1,500 of 9,000 (1/6)."""
  n_valid = int(round(float(fraction) * len(train)))
  if not n_valid:
    return list(train), []
  held = set(random.Random(seed).sample(range(len(train)), n_valid))
  return ([ex for i, ex in enumerate(train) if i not in held],
          [ex for i, ex in enumerate(train) if i in held])
log = logging.getLogger("rlrag_jax.sparkle")


def _plan(env: CorpusSearch, ex):
  """The oracle's plan of an example (step gold ids as corpus ids), or None without a
  decomposition with gold documents."""
  steps = list(getattr(ex, "decomposition", None) or ())
  if not steps or not any(s.gold_ids for s in steps):
    return None
  return prompts.Plan.of(steps, ex.triples, ex.answers[0] if ex.answers else "",
                         [env.ids(ex, s.gold_ids) for s in steps])


class ProxyTask(RLTask):
  name = "sparkle"

  def __init__(self, config, encoder=None):
    self.config = config
    self.settings = s = settings.parse(config)
    self.style = config.data.prompt_style
    if s.rollout not in ROLLOUTS:
      raise ValueError(f"config key 'sparkle.rollout' is {s.rollout!r}; expected one of "
                       f"{ROLLOUTS}")
    self.group_size = 1                      # one tree per question
    self.sibling_baselines = s.rollout == "tree"
    sel = tasks.select_data(config)
    self.train, self.eval = list(sel.train), list(sel.eval)
    # Validation questions leave the training ones before anything (the KG too) reads them.
    self.train, self.valid = split_validation(self.train, float(s.valid_fraction), config.seed)
    if s.eval_on not in EVAL_ON:
      raise ValueError(f"config key 'sparkle.eval_on' is {s.eval_on!r}; expected one of {EVAL_ON}")
    if s.eval_on == "valid":
      if not self.valid:
        raise ValueError("config key 'sparkle.eval_on' is 'valid' but 'sparkle.valid_fraction' "
                         f"= {s.valid_fraction} holds out no training question")
      self.eval = list(self.valid)
    self.env = CorpusSearch(config, sel, encoder)
    # Built from the corpus and the training questions only: no evaluation label reaches it.
    self.store = TripleStore(
        knowledge_graph(self.env, self.train, s.triples_file, s.kg_default),
        self.env.encoder, cache_dir=str(self.env.index_dir))
    self.agent_cfg = agent_lib.AgentConfig.from_config(s.agent, self.style)
    self.reward_cfg = s.reward
    self.depth = int(s.tree.depth)
    self.explore = s.rollout == "tree"
    self.max_new = {k: int(v) for k, v in dataclasses.asdict(s.max_new).items()}
    self.positions = int(config.model.max_position_embeddings)   # the policy's, once bound
    self.max_len = int(s.max_len)       # > 0: a proxy call's prompt + output cap (Table 6)
    self.reader = None
    self._sft = None
    self.sft_counts = {}
    self._baselines = {}
    self.last_forest = {}
    tasks.use_tokenizer(self, config, ())
    r = s.reader
    if r.url:
      self.reader = readers.EndpointReader(
          r.url, r.model, style=self.style, max_tokens=int(r.max_tokens),
          reasoning=self.agent_cfg.reasoning_reader, passage_words=self.agent_cfg.passage_words,
          search=self.agent_cfg.rd_mode == "reader", concurrency=r.concurrency, max_failure_rate=r.max_failure_rate,
          failure_window=r.failure_window, key_prefix="sparkle.reader.")

  def bind_models(self, models) -> None:
    unknown = sorted(set(models) - {"reader"})
    if unknown:
      raise ValueError(f"config section 'models' names {unknown}; sparkle takes only 'reader'")
    if "reader" in models and not self.settings.reader.url:
      self.reader = readers.LMReader(
          models["reader"], style=self.style, max_new_tokens=self.max_new["reader"],
          passage_words=self.agent_cfg.passage_words,
          reasoning=self.agent_cfg.reasoning_reader, search=self.agent_cfg.rd_mode == "reader",
          chat_template=bool(self.config.model.chat_template),
          thinking=bool(self.config.model.thinking))

  # ---------------------------------------------------------------- ids
  def gold(self, ex) -> tuple:
    return self.env.ids(ex, getattr(ex, "gold_ids", ()) or ())

  def encode(self, text: str) -> list:
    if self.use_chat:
      from rlrag_jax.models import encode_prompt
      return encode_prompt(self.tokenizer, [{"role": "user", "content": text}],
                           thinking=self.config.model.thinking)
    return self.tokenizer(text, add_special_tokens=False)["input_ids"]

  def target_ids(self, text: str) -> list:
    return self.tokenizer(text, add_special_tokens=False)["input_ids"] + tasks.eos(self.tokenizer)

  def role_prompt_ids(self, role: str, text: str) -> list:
    """A role's prompt ids, keeping the last tokens when the prompt and the role's longest
    output would not fit the model's positions or `sparkle.max_len` (the same ids are sampled
    and trained on)."""
    length = min(self.positions, self.max_len) if self.max_len > 0 else self.positions
    room = max(1, length - self.max_new[role])
    return self.encode(text)[-room:]

  def _read(self, requests, rows_per_call: int):
    if self.reader is None:
      raise ValueError("sparkle: no reader is bound: set config key 'models.reader.path' (a run "
                       "dir or HF checkpoint) or 'sparkle.reader.url' (an OpenAI-compatible "
                       "endpoint)")
    return self.reader(requests, rows_per_call=rows_per_call)

  def monitors(self) -> list:
    """The endpoint reader's failure monitor (step metrics reader/...); none for an LM reader."""
    return self.reader.monitors() if self.reader is not None else []

  def agent(self, policy, rng=None) -> agent_lib.Agent:
    """The agent with `policy` as the proxy (sampling at its temperature unless greedy)."""
    import jax
    self.positions = int(policy.config.max_position_embeddings)
    box = {"rng": rng if rng is not None else jax.random.PRNGKey(0)}

    def propose(role, texts, greedy):
      box["rng"], sub = jax.random.split(box["rng"])
      n_new = self.max_new[role]
      ids = [self.role_prompt_ids(role, t) for t in texts]
      rows, _ = policy.sample_chunked(ids, sub, greedy=greedy, max_new_tokens=n_new)
      return [(decode_keeping_tags(self.tokenizer, comp), tuple(comp), stop == "length")
              for comp, stop in rows]

    def read(requests):    # an in-process reader samples the policy's rows_per_call at a time
      return self._read(requests, policy.rows_per_call)

    return agent_lib.Agent(self.agent_cfg, propose=propose, read=read,
                           search=self.env.search, embed=self.env.embed, store=self.store,
                           docs=self.env.pairs, encode_forced=self.target_ids)

  # ---------------------------------------------------------------- rewards
  def score_state(self, ex, st: agent_lib.State) -> dict:
    texts = [f"{t}: {x}" for t, x in self.env.pairs(st.context)]
    return rewards.system_reward(context_ids=st.context, context_texts=texts,
                                 gold_ids=self.gold(ex), prediction=st.prediction,
                                 answers=ex.answers, cfg=self.reward_cfg)

  # ---------------------------------------------------------------- SFT: oracle trajectories
  def _build_sft(self) -> dict:
    """{example id: [(prompt ids, target ids, None)]} from the oracle's trajectories, walked
    for every training example in lockstep (one batched retrieval per round). Only correct
    trajectories are kept (the paper keeps those that reach the right answer): one whose
    retrieval misses the needed document among the candidates is dropped, and counted."""
    cfg = self.agent_cfg
    walks = {}
    for ex in self.train:
      plan = _plan(self.env, ex)
      if plan is not None:
        walks[str(ex.id)] = dict(ex=ex, plan=plan, ctx=[], thoughts=[], samples=[], ok=None,
                                 retrievals=0)
    probe = self._probe_agent()
    for _ in range(cfg.max_steps):
      open_ = [w for w in walks.values() if w["ok"] is None]
      if not open_:
        break
      need = []
      for w in open_:
        t = w["plan"].thought(w["ctx"], w["thoughts"])
        if t.kind == "answer":
          w["ok"] = True
          continue
        w["thoughts"].append(t.text)
        st = agent_lib.State(question=w["ex"].question, tree=0, context=tuple(w["ctx"]),
                             thoughts=tuple(w["thoughts"]))
        yes = w["plan"].decision(w["thoughts"])
        if cfg.rd_mode == "agent":
          w["samples"].append((probe.rd_prompt(st), parsing.render_decision(yes)))
        if yes:
          if w["retrievals"] >= cfg.max_retrievals:
            w["ok"] = False
            continue
          w["retrievals"] += 1
          need.append((w, st))
      if need:
        queries = []
        for w, st in need:
          form = w["plan"].formulation(w["thoughts"], direct=cfg.qf_mode == "direct")
          w["form"] = parsing.parse_formulation(form, "")
          w["samples"].append((probe.qf_prompt(st), form))
          queries.append(w["form"].query)
        hits = self.env.search(queries, cfg.top_docs)
        vecs = self.env.embed(queries)
        for k, (w, st) in enumerate(need):
          if cfg.ki_mode == "all":         # w/o KI: the retrieved documents join as they are
            add = hits[k][:cfg.all_docs or cfg.top_docs]
            if not set(w["plan"].gold[w["plan"].needed(w["thoughts"])]) & set(add):
              w["ok"] = False
          elif cfg.ki_mode == "document":
            docs = list(dict.fromkeys(hits[k]))
            pick = w["plan"].document(w["thoughts"], docs)
            if pick is not None:
              w["samples"].append((probe.ki_prompt(st, w["form"].chain, w["form"].query, docs),
                                   f"[{pick + 1}]"))
            add = [docs[pick]] if pick is not None else []
            w["ok"] = False if pick is None else None
          else:
            cands = self.store.candidates(vecs[k], hits[k], cfg.top_triples)
            pick = w["plan"].selection(w["thoughts"], cands)
            if pick is not None:
              w["samples"].append((probe.ki_prompt(st, w["form"].chain, w["form"].query,
                                                   cands),
                                   parsing.render_selection(cands, pick, cfg.ki_output)))
            add = [cands[pick].doc_id] if pick is not None else []
            w["ok"] = False if pick is None else None
          w["ctx"] += [d for d in add if d not in w["ctx"]]
    out, counts = {}, {"examples": len(self.train), "oracle": len(walks), "kept": 0}
    for key, w in walks.items():
      if w["ok"]:
        out[key] = [(self.encode(p), self.target_ids(t), None) for p, t in w["samples"]]
        counts["kept"] += 1
    counts["samples"] = sum(len(v) for v in out.values())
    self.sft_counts = counts
    log.info("sparkle SFT: %(kept)d of %(oracle)d oracle trajectories correct "
             "(%(samples)d samples; %(examples)d training examples)", counts)
    return out

  def _probe_agent(self) -> agent_lib.Agent:
    """An agent used only for its prompt builders."""
    return agent_lib.Agent(self.agent_cfg, propose=None, read=None, search=None, embed=None,
                           store=None, docs=self.env.pairs, encode_forced=None)

  def sft_samples(self, ex) -> list:
    """The oracle's correct trajectory on the world; with `sparkle.sft_trajectories`, the
    correct trajectories a stronger proxy wrote (trajectories.py)."""
    if self._sft is None:
      path = self.settings.sft_trajectories
      if path:
        got = read_trajectories(path)
        self._sft = {k: [(self.role_prompt_ids(role, p), self.target_ids(t), None)
                         for role, p, t in v] for k, v in got.items()}
        self.sft_counts = {"examples": len(self.train), "oracle": len(got), "kept": len(got),
                           "samples": sum(len(v) for v in got.values())}
      else:
        self._sft = self._build_sft()
    return self._sft.get(str(ex.id), [])

  def prompt_ids(self, ex) -> list:
    """The retrieval decision's prompt at the question's root state."""
    st = agent_lib.State(question=ex.question, tree=0)
    return self.encode(self._probe_agent().rd_prompt(st))

  def tokenizer_texts(self):
    yield prompts.RD_INSTRUCTION
    yield prompts.QF_INSTRUCTION
    yield prompts.KI_INSTRUCTION
    yield parsing.YES + " " + parsing.NO + " " + parsing.CHAIN + " " + parsing.NEED + " " + \
        parsing.QUERY + " " + parsing.UNKNOWN
    yield prompts.decision_text("", [], [], "", self.style)
    yield prompts.formulation_text("", [], self.style)
    yield prompts.integration_text("", [], "", [], self.style)
    for r in self.env.records:
      yield f"{r.title}: {r.text}"
      for t in r.triples:
        yield parsing.triple_text(t)
    for ex in list(self.train) + list(self.eval):
      yield ex.question
      plan = _plan(self.env, ex)
      if plan is not None:
        for i in range(len(plan.questions)):
          yield plan.need(i) + " " + plan.fact(i)

  # ---------------------------------------------------------------- RL: tree rollouts
  def collect(self, policy, examples, rng, *, group_size, want, step):
    """One tree (or one standard rollout) per question; one episode per proxy decision with
    its Monte-Carlo return, a Group per decision (its sibling branches: the decisions of one
    parent node), each with the draw's forest statistics as its `metrics` (leaf reward, F1 and
    recall, leaves and pruned nodes per question, retrievals). (The engine pads the count,
    which varies, to a bucket of bounded shapes.)"""
    examples = list(examples)
    ag = self.agent(policy, rng)

    def reward(states):
      return [self.score_state(examples[s.tree], s)["total"] for s in states]

    forest = ag.tree([ex.question for ex in examples], depth=self.depth, reward=reward,
                     explore=self.explore)
    leaves = forest.leaves()
    per_leaf = [self.score_state(examples[l.tree], l.state) for l in leaves]
    stats = {"leaf_reward": float(np.mean([l.reward for l in leaves])),
             "leaf_f1": float(np.mean([r["f1"] for r in per_leaf])),
             "leaf_recall": float(np.mean([r["recall"] for r in per_leaf])),
             "leaves": float(len(leaves)) / len(examples),
             "pruned": float(forest.counts()["pruned"]) / len(examples),
             "retrievals": float(np.mean([l.state.retrievals for l in leaves]))}
    # The share of the proxy's calls the step trains on (pruned branches' excluded) that hit
    # their role's token cap without a stop: reward/truncated_decision_rate,
    # ..._formulation_rate, ..._selection_rate (logged, in no reward).
    stats.update(agent_lib.truncation_rates(agent_lib.truncation_counts(
        [smp for d in forest.decisions() for smp in d.sample or ()])))
    self.last_forest = dict(stats, nodes=forest.counts()["nodes"])
    runs = []        # [parent, episodes, rewards]: runs of one parent node, in the forest's order
    for d in forest.decisions():
      for smp in d.sample or ():
        comp = list(smp.completion)
        if not runs or runs[-1][0] != d.group:
          runs.append([d.group, [], []])
        runs[-1][1].append(Episode(example=examples[d.tree],
                                   prompt_ids=self.role_prompt_ids(smp.role, smp.prompt),
                                   completion_ids=comp, loss_mask=[1] * len(comp), text="",
                                   info={"role": smp.role, "forced": smp.forced},
                                   baseline=float(d.base)))
        runs[-1][2].append({"total": float(d.ret), **{f"is_{r}": float(smp.role == r)
                                                        for r in agent_lib.ROLES}})
    if not runs:        # every question answered before any decision: nothing to learn
      st = agent_lib.State(question=examples[0].question, tree=0)
      comp = self.target_ids(parsing.NO)
      runs.append([None, [Episode(example=examples[0],     # a loss mask of zeros: trains nothing
                                  prompt_ids=self.encode(self._probe_agent().rd_prompt(st)),
                                  completion_ids=comp, loss_mask=[0] * len(comp), text="",
                                  info={"role": "rd"}, baseline=0.0)],
                   [{"total": 0.0, **{f"is_{r}": 0.0 for r in agent_lib.ROLES}}]])
    return [Group(eps, rewards_, stats) for _, eps, rewards_ in runs]

  def rollout(self, policy, examples, rng, *, group_size=1, greedy=False):
    """The linear loop (one episode per question: its final state), for
    experiments.headroom / grad_noise; the trainer's RL loop uses `collect`."""
    examples = list(examples)
    states = self.agent(policy, rng).run([ex.question for ex in examples], greedy=greedy)
    return [Episode(example=ex, prompt_ids=self.prompt_ids(ex), completion_ids=[],
                    loss_mask=[], text=st.prediction, info={"state": st})
            for ex, st in zip(examples, states)]

  def rewards(self, episodes, step: int = 0) -> list:
    """The system reward of each `rollout` episode's final state."""
    return [self.score_state(ep.example, ep.info["state"]) for ep in episodes]

  # ---------------------------------------------------------------- evaluation
  def evaluate(self, policy, examples, rng) -> list:
    """The linear greedy loop of Algorithm 1 (with `sparkle.eval.baselines`, the reader alone
    and naive RAG too): per question `row_metrics`, the loop's prediction."""
    examples = list(examples)
    return [EvalRow(ex, runs[""]["state"].prediction, self.row_metrics(ex, runs))
            for ex, runs in zip(examples, self.eval_runs(policy, examples, rng))]

  def eval_runs(self, policy, examples, rng) -> list:
    """Per question {variant prefix: {'state': final State, 'seconds': per question}}."""
    examples = list(examples)
    questions = [ex.question for ex in examples]
    ag = self.agent(policy, rng)
    runs, seconds = {}, {}
    t0 = time.perf_counter()
    made = []                           # per question, the proxy calls it made
    runs[""] = ag.run(questions, greedy=True, samples=made)
    seconds[""] = (time.perf_counter() - t0) / max(1, len(examples))
    if self.settings.eval.baselines:
      key = tuple(str(ex.id) for ex in examples)
      if key not in self._baselines:
        base = {}
        t0 = time.perf_counter()
        base["llm_"] = (ag.run(questions, retrieve=False), None)
        base["llm_"] = (base["llm_"][0], (time.perf_counter() - t0) / max(1, len(examples)))
        k = int(self.settings.eval.naive_k)
        t0 = time.perf_counter()
        ctx = self.env.search(questions, k)
        states = ag.run(questions, retrieve=False, contexts=ctx)
        states = [dataclasses.replace(s, retrieved=(tuple(c),), retrievals=1)
                  for s, c in zip(states, ctx)]
        base["naive_"] = (states, (time.perf_counter() - t0) / max(1, len(examples)))
        self._baselines[key] = base
      for p, (states, secs) in self._baselines[key].items():
        runs[p], seconds[p] = states, secs
    return [{p: {"state": runs[p][k], "seconds": seconds[p],
                 **({"calls": agent_lib.truncation_counts(made[k])} if p == "" else {})}
             for p in runs}
            for k in range(len(examples))]

  def row_metrics(self, ex, runs) -> dict:
    """F1, EM, recall, reward, retrievals, steps, answered and latency per variant, cumulative
    Recall@k per retrieval step, and the main loop's malformed outputs per role."""
    steps = int(self.settings.eval.recall_steps)
    m = {}
    gold = set(self.gold(ex))
    for p, r in runs.items():
      st = r["state"]
      sc = self.score_state(ex, st)
      m.update({f"{p}f1": sc["f1"], f"{p}em": sc["em"], f"{p}recall": sc["recall"],
                f"{p}reward": sc["total"], f"{p}retrievals": float(st.retrievals),
                f"{p}steps": float(st.steps), f"{p}answered": float(st.answer is not None),
                f"{p}latency_s": float(r["seconds"])})
      if gold:
        seen = set()
        for t in range(steps):        # cumulative Recall@k over the first t+1 retrievals
          if t < len(st.retrieved):
            seen |= set(st.retrieved[t])
          m[f"{p}recall@{self.agent_cfg.recall_k}_step{t + 1}"] = len(seen & gold) / len(gold)
      if p == "":
        for role in ("rd", "qf", "ki", "reader"):
          m[f"malformed_{role}"] = float(st.malformed.count(role))
        # the proxy's calls and those cut at their token cap (the report's rates: sums' ratio)
        m.update(r.get("calls", {}))
    return m

  def report(self, workdir, rlog, setup) -> None:
    from rlrag_jax.methods.sparkle import report
    report.write(self, pathlib.Path(workdir))


class ReaderTask(Task):
  """The frozen reader of the CPU default: SFT on the oracle reader's next thought."""
  name = "sparkle"

  def __init__(self, config, encoder=None):
    self.config = config
    self.settings = s = settings.parse(config)
    self.style = config.data.prompt_style
    sel = tasks.select_data(config)
    self.env = CorpusSearch(config, sel, encoder)
    self.train = [ex for ex in sel.train if _plan(self.env, ex) is not None]
    self.eval = [ex for ex in sel.eval if _plan(self.env, ex) is not None]
    left = len(sel.train) + len(sel.eval) - len(self.train) - len(self.eval)
    if left:
      log.info("sparkle reader: %d of %d examples left out (no gold decomposition to walk)",
               left, len(sel.train) + len(sel.eval))
    if not self.train:
      raise ValueError("sparkle reader: no training example has a gold decomposition with gold "
                       f"documents (config key 'data.mix' = {tuple(config.data.mix)}); use "
                       "datasets that give one (the world, 2Wiki, MuSiQue)")
    self.agent_cfg = agent_lib.AgentConfig.from_config(s.agent, self.style)
    self.max_new = int(s.max_new.reader)
    self.p_retrieve = float(s.reader_sft.retrieve_prob)
    self.p_distractor = float(s.reader_sft.distractor_prob)
    near = self.env.search([ex.question for ex in self.train], 8)
    self._near = {str(ex.id): n for ex, n in zip(self.train, near)}
    from rlrag_jax.data.tokenizer import DEFAULT_TAGS
    tasks.use_tokenizer(self, config, DEFAULT_TAGS, chat=False)

  def prompt_ids_at(self, question, ctx, thoughts) -> list:
    text = prompts.reader_text(question, self.env.pairs(ctx), thoughts, self.style,
                               self.agent_cfg.passage_words)
    return self.tokenizer(text, add_special_tokens=False)["input_ids"]

  def target_ids(self, t: parsing.Thought) -> list:
    text = prompts.render_answer(t.text) if t.kind == "answer" else prompts.render_think(t.text)
    return self.tokenizer(text, add_special_tokens=False)["input_ids"] + tasks.eos(self.tokenizer)

  def walk(self, ex, rng: random.Random) -> list:
    """[(context, thoughts, next thought)] along one noisy oracle walk: a need is met with
    probability retrieve_prob (else stated again; met at the third try), and a retrieval
    brings a distractor instead of, or besides, the gold document with distractor_prob."""
    plan = _plan(self.env, ex)
    gold = set(g for gs in plan.gold for g in gs)
    noise = [d for d in self._near.get(str(ex.id), []) if d not in gold]
    ctx, thoughts, out, tries = [], [], [], 0
    for _ in range(self.agent_cfg.max_steps):
      t = plan.thought(ctx, thoughts)
      out.append((tuple(ctx), tuple(thoughts), t))
      if t.kind == "answer":
        break
      thoughts.append(t.text)
      i = plan.needed(thoughts)
      if i is None:
        continue
      if noise and rng.random() < self.p_distractor:
        d = noise.pop(0)
        if d not in ctx:
          ctx.append(d)
      tries += 1
      if rng.random() < self.p_retrieve or tries >= 3:
        ctx += [g for g in plan.gold[i] if g not in ctx]
        tries = 0
    return out

  def sft_samples(self, ex) -> list:
    rng = random.Random(f"{self.config.seed}/{ex.id}")
    return [(self.prompt_ids_at(ex.question, c, th), self.target_ids(t), None)
            for c, th, t in self.walk(ex, rng)]

  def tokenizer_texts(self):
    yield prompts.READER_INSTRUCTION
    yield prompts.reader_text("", [], [], self.style)
    for r in self.env.records:
      yield f"{r.title}: {r.text}"
    for ex in list(self.train) + list(self.eval):
      yield ex.question
      plan = _plan(self.env, ex)
      for i in range(len(plan.questions)):
        yield plan.need(i) + " " + plan.fact(i)
      yield prompts.render_answer(plan.final)

  def evaluate(self, policy, examples, rng) -> list:
    """The reader under a perfect proxy: every need is met with its gold documents. Reports
    the final answer and how often each thought equals the oracle's at that state."""
    examples = list(examples)
    from rlrag_jax.sampling import normalize_stops
    pol = dataclasses.replace(policy, stop=tuple(normalize_stops(readers.STOPS,
                                                                 self.tokenizer)))
    plans = [_plan(self.env, ex) for ex in examples]
    ctx = [[] for _ in examples]
    thoughts = [[] for _ in examples]
    answer = [None] * len(examples)
    agree = [[] for _ in examples]
    room = int(pol.config.max_position_embeddings) - self.max_new
    for _ in range(self.agent_cfg.max_steps):
      open_ = [k for k in range(len(examples)) if answer[k] is None]
      if not open_:
        break
      ids = [self.prompt_ids_at(examples[k].question, ctx[k], thoughts[k])[-room:]
             for k in open_]
      rows, rng = pol.sample_chunked(ids, rng, greedy=True, max_new_tokens=self.max_new)
      for k, (comp, _) in zip(open_, rows):
        t = parsing.parse_thought(decode_keeping_tags(self.tokenizer, comp))
        want = plans[k].thought(ctx[k], thoughts[k])
        agree[k].append(float((t.kind, t.text) == (want.kind, want.text)))
        if t.kind == "answer":
          answer[k] = t.text
          continue
        thoughts[k].append(t.text)
        i = plans[k].needed(thoughts[k])
        if i is not None:
          ctx[k] += [g for g in plans[k].gold[i] if g not in ctx[k]]
    rows = []
    for k, ex in enumerate(examples):
      text = answer[k] or ""
      rows.append(EvalRow(ex, text, {
          "em": metrics.exact_match(text, ex.answers), "f1": metrics.f1(text, ex.answers),
          "thought_match": float(np.mean(agree[k] or [0.0])), "steps": float(len(agree[k]))}))
    return rows


def make_task(config):
  role = config.sparkle.role
  if role == "proxy":
    return ProxyTask(config)
  if role == "reader":
    return ReaderTask(config)
  raise ValueError(f"config key 'sparkle.role' is {role!r}; expected one of {ROLES}")
