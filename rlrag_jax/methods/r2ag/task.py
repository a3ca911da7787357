"""R2AG glue for the shared trainer. `r2ag.role` picks the model being trained:

  steering   the retrieval-steering model: an optional SFT warm-up on oracle expansion steps
             (prompts.oracle_step), then DAPO over the RR-Forest (forest.py): each RL step expands
             `rl.prompts_per_step` trees of the current forest level with `rl.group_size`
             rollouts, every query retrieving its top-1 document, rewarded per step by
             Top-Survivor (rewards.py). Evaluated by expanding a retrieval tree per held-out
             question (inference.py) and answering from its documents with the frozen generator
             (config `models.generator`): retrieval and QA metrics for the main setting and the
             variants (base queries only, top-2, single-step retrieval).
  generator  the frozen generator of the CPU default: SFT on (documents, question) -> answer,
             the documents being the gold ones among retrieved distractors.
"""
from __future__ import annotations

import dataclasses
import logging
import pathlib
import random
import time
from typing import Sequence

import numpy as np

from rlrag_jax import metrics
from rlrag_jax.methods.r2ag import forest as forest_lib
from rlrag_jax.methods.r2ag import inference, parsing, prompts, rewards, settings
from rlrag_jax.retrieval.corpus_search import CorpusSearch
from rlrag_jax.rollout.single_turn import completion_ids, decode_keeping_tags
from rlrag_jax import tasks
from rlrag_jax.tasks import Episode, EvalRow, Group, RLTask, Task

ROLES = ("steering", "generator")
SPECIAL_TOKENS = ("<think>", "</think>", "<base-Q>", "</base-Q>", "<predicted-Q>",
                  "</predicted-Q>")
log = logging.getLogger("rlrag_jax.r2ag")


def _generate(policy, tokenizer, prompt_ids: list, rng, *, greedy: bool, max_new: int) -> tuple:
  """(texts, truncated flags) of one sample per prompt (prompts keep their last tokens when
  longer than the model's positions allow)."""
  room = int(policy.config.max_position_embeddings) - max_new
  rows, _ = policy.sample_chunked([p[-room:] for p in prompt_ids], rng, greedy=greedy,
                                  max_new_tokens=max_new)
  return ([decode_keeping_tags(tokenizer, comp) for comp, _ in rows],
          [stopped == "length" for _, stopped in rows])


def _with_gold(sel_examples) -> list:
  return [ex for ex in sel_examples if getattr(ex, "gold_ids", None)]


class SteeringTask(RLTask):
  name = "r2ag"
  # Appendix G.2's LLM accuracy: with eval.judge_url set, evaluations gain a 'judge' column
  # (the main tree's generator answer judged against the gold answers); off by default.
  judge_prompt = prompts.judge_prompt()

  def __init__(self, config, encoder=None):
    self.config = config
    self.settings = r = settings.steering(config)
    self.style = config.data.prompt_style
    self.passage_words = int(r.passage_words)
    self.train_top_k = int(r.train_top_k)
    self.reward_cfg = r.reward
    self.eval_cfg = r.eval
    self.t_base_by_dataset = parse_t_by_dataset(r.eval.t_base_by_dataset)
    sel = tasks.select_data(config)
    self.train, self.eval = _with_gold(sel.train), _with_gold(sel.eval)
    self.validation = _with_gold(sel.val)        # data.val_mix: the validation forests' questions
    left = (len(sel.train) + len(sel.eval) + len(sel.val) - len(self.train) - len(self.eval)
            - len(self.validation))
    if left:
      log.warning("r2ag: %d examples have no gold documents and are left out", left)
    if not self.train:
      raise ValueError("r2ag: no training example has gold documents (Example.gold_ids)")
    self.corpus = CorpusSearch(config, sel, encoder)
    self.forest = forest_lib.Forest(len(self.train), r.forest,
                                    seed=config.seed)
    self.generator = None
    tasks.use_tokenizer(self, config, SPECIAL_TOKENS)

  def bind_models(self, models) -> None:
    unknown = sorted(set(models) - {"generator"})
    if unknown:
      raise ValueError(f"config section 'models' names {unknown}; r2ag takes only 'generator'")
    self.generator = models.get("generator")

  # ---------------------------------------------------------------- gold and prompts
  def gold(self, ex) -> tuple:
    return self.corpus.ids(ex, ex.gold_ids)

  def decomposition(self, ex) -> list:
    """The gold decomposition with its step gold ids as corpus ids."""
    return [dataclasses.replace(s, gold_ids=list(self.corpus.ids(ex, s.gold_ids)))
            for s in ex.decomposition]

  def prompt_at(self, question: str, context: Sequence[str]) -> list:
    return prompts.steering_ids(self.tokenizer, question, self.corpus.pairs(context), self.style,
                                self.use_chat, self.passage_words,
                                thinking=self.config.model.thinking)

  def prompt_ids(self, ex) -> list:
    return self.prompt_at(ex.question, ())

  def target_ids(self, text: str) -> list:
    return self.tokenizer(text, add_special_tokens=False)["input_ids"] + tasks.eos(self.tokenizer)

  def oracle(self, ex, context) -> str:
    return prompts.oracle_step(self.decomposition(ex), self.gold(ex), context,
                               predicted=bool(self.settings.oracle_predicted))

  def sft_samples(self, ex) -> list:
    """One sample per state of the oracle's chain (empty context ... all gold: stop)."""
    decomp, gold = self.decomposition(ex), self.gold(ex)
    if not decomp or not any(s.gold_ids for s in decomp):
      return []
    return [(self.prompt_at(ex.question, ctx), self.target_ids(self.oracle(ex, ctx)), None)
            for ctx in prompts.oracle_contexts(decomp, gold)]

  def tokenizer_texts(self):
    yield prompts.TOKENIZER_TEXT       # not the prompt: see its comment
    yield prompts.prompt_text("", [], self.style)
    yield prompts.GENERATOR_INSTRUCTION
    for r in self.corpus.records:
      yield f"{r.title}: {r.text}"
    for ex in list(self.train) + list(self.eval):
      yield ex.question
      for ctx in prompts.oracle_contexts(self.decomposition(ex), self.gold(ex)):
        yield self.oracle(ex, ctx)

  # ---------------------------------------------------------------- rewards
  def score(self, episodes) -> list:
    """Top-Survivor reward of each episode (one expansion step); one batched retrieval."""
    steps = [parsing.parse(ep.text) for ep in episodes]
    queries, spans = [], []
    for s in steps:
      qs = [] if s.stop else list(s.base) + list(s.predicted)
      spans.append((len(queries), len(s.base) if not s.stop else 0, len(qs)))
      queries += qs
    hits = self.corpus.search(queries, self.train_top_k)
    out = []
    for ep, s, (start, nb, n) in zip(episodes, steps, spans):
      base_hits, pred_hits = hits[start:start + nb], hits[start + nb:start + n]
      ep.info["hits"] = (base_hits, pred_hits)
      out.append(rewards.step_reward(
          s, base_hits, pred_hits, ep.info.get("context", ()), self.gold(ep.example),
          bool(ep.info.get("truncated", False)), self.reward_cfg))
    return out

  def rewards(self, episodes, step: int = 0) -> list:
    """`score` (for experiments.headroom / grad_noise beside `rollout`)."""
    return self.score(episodes)

  # ---------------------------------------------------------------- training rollouts
  def rollout(self, policy, examples, rng, *, group_size=1, greedy=False):
    """Root expansions of `examples` (experiments.headroom / grad_noise; the trainer's RL
    loop uses `collect`)."""
    items = [forest_lib.Item(-1, 0, (), 0) for _ in examples]
    return self._sample(policy, list(examples), items, rng, group_size, greedy)

  def _sample(self, policy, examples, items, rng, g, greedy=False) -> list:
    prompt_list = [self.prompt_at(ex.question, it.context) for ex, it in zip(examples, items)]
    gen = policy.sample(prompt_list, rng, greedy=greedy, group_size=g) if g > 1 else \
        policy.sample(prompt_list, rng, greedy=greedy)
    episodes = []
    for row in range(len(prompt_list) * g):
      k = row // g
      comp = completion_ids(gen, row)
      episodes.append(Episode(
          example=examples[k], prompt_ids=prompt_list[k], completion_ids=comp,
          loss_mask=[1] * len(comp), text=decode_keeping_tags(self.tokenizer, comp),
          info={"context": tuple(items[k].context), "item": k,
                "truncated": gen.stopped_by[row] == "length"}))
    return episodes

  def _expand(self, policy, items, rng, g) -> list:
    """Samples, scores and grows the forest for `items`; a Group per item (its forest level
    in `metrics['iteration']`)."""
    examples = [self.train[self.forest.example_of(it)] for it in items]
    episodes = self._sample(policy, examples, items, rng, g)
    scores = self.score(episodes)
    groups = []
    for k, it in enumerate(items):
      eps, scs = episodes[k * g:(k + 1) * g], scores[k * g:(k + 1) * g]
      gold = set(self.gold(examples[k]))
      outcomes = []
      for ep, sc in zip(eps, scs):
        step = parsing.parse(ep.text)
        base_hits, pred_hits = ep.info["hits"]
        counted, verts = set(it.context), []
        for kind, qs, hs in (("base", step.base, base_hits), ("pred", step.predicted,
                                                              pred_hits)):
          for q, h in zip(qs, hs):
            for d in h:
              new = d in gold and d not in counted
              counted.add(d)
              verts.append((q, d, kind, new))
        # counted holds the item's context: gold only under 'gold', so & gold keeps it whole
        ctx = counted & gold if self.forest.cfg.carry == "gold" else counted
        outcomes.append(forest_lib.Outcome(verts, tuple(sorted(ctx)), finished=bool(
            step.stop and gold <= set(it.context)), found=len(ctx & gold)))
      self.forest.expand(it, outcomes)
      groups.append(Group(eps, scs, {"iteration": float(it.iteration)}))
    return groups

  def collect(self, policy, examples, rng, *, group_size, want, step):
    """`want` expansions of the forest's next items, a Group each (the trainer's `examples`
    are not used: the forest draws its own questions). The engine drops the groups whose
    rewards do not vary (Algorithm 1) and, with `rl.dynamic_max_tries` > 1, calls again for
    replacements."""
    return self._expand(policy, self.forest.take(want), rng, group_size)

  # ---------------------------------------------------------------- state (the forest)
  def state_dict(self) -> dict:
    return {"forest": self.forest.state_dict()}

  def load_state_dict(self, state) -> None:
    self.forest.load_state_dict(state["forest"])   # a checkpoint's old "groups" count: unused

  # ---------------------------------------------------------------- evaluation
  def variants(self) -> dict:
    """{metric prefix: TreeConfig}: '' the main setting, 'base_' without predicted queries,
    'top2_' two documents per query."""
    e = self.eval_cfg
    common = dict(t_base=int(e.t_base), t_pred=int(e.t_pred),
                  max_iterations=int(e.max_iterations), max_branches=int(e.max_branches))
    out = {"": inference.TreeConfig(top_k=int(e.top_k), use_predicted=True, **common)}
    if e.base_only:
      out["base_"] = inference.TreeConfig(top_k=int(e.top_k), use_predicted=False, **common)
    for k in e.other_top_k:
      out[f"top{int(k)}_"] = inference.TreeConfig(top_k=int(k), use_predicted=True, **common)
    return out

  def evaluate(self, policy, examples, rng) -> list:
    """A retrieval tree per question for each variant, the generator's answers from their
    documents, and the retrieval / QA metrics (`row_metrics`)."""
    examples = list(examples)
    return [EvalRow(ex, info[""]["answer"], self.row_metrics(ex, info))
            for ex, info in zip(examples, self.eval_runs(policy, examples, rng))]

  def eval_runs(self, policy, examples, rng) -> list:
    """Per example {variant prefix: its tree's docs, iterations, calls, timings and answer,
    'outputs': the main tree's steering outputs}."""
    import jax
    e = self.eval_cfg
    temp = float(e.temperature)
    pol = dataclasses.replace(policy, temperature=temp, top_p=float(e.top_p)) \
        if temp > 0 else policy
    max_new = int(policy.max_new_tokens)
    state = {"rng": rng}

    def steer(reqs):
      state["rng"], sub = jax.random.split(state["rng"])
      ids = [self.prompt_at(q, ctx) for q, ctx in reqs]
      return _generate(pol, self.tokenizer, ids, sub, greedy=temp <= 0, max_new=max_new)[0]

    questions = [ex.question for ex in examples]
    runs = {}
    for prefix, cfg in self.variants().items():
      t_bases = [self.t_base_by_dataset.get(getattr(ex, "source", "") or "", cfg.t_base)
                 for ex in examples]
      runs[prefix] = inference.expand(questions, steer, self.corpus.search, cfg, t_bases)
    sr_k = int(e.sr_k)
    if sr_k:
      t0 = time.perf_counter()
      docs = self.corpus.search(questions, sr_k)
      each = (time.perf_counter() - t0) / max(1, len(questions))
      runs["sr_"] = [inference.TreeResult(docs=list(d), search_s=each) for d in docs]
    answers = {p: self.answer(examples, [r.docs for r in res], jax.random.fold_in(rng, i),
                              policy.rows_per_call)
               for i, (p, res) in enumerate(runs.items())}
    out = []
    for k in range(len(examples)):
      info = {p: {"docs": runs[p][k].docs, "iterations": runs[p][k].iterations,
                  "calls": runs[p][k].calls, "steer_s": runs[p][k].steer_s,
                  "search_s": runs[p][k].search_s, "answer": answers[p][0][k],
                  "answer_s": answers[p][1]} for p in runs}
      info["outputs"] = runs[""][k].outputs
      out.append(info)
    return out

  def answer(self, examples, doc_lists, rng, rows_per_call: int) -> tuple:
    """(answers, seconds per question) of the frozen generator from each question's documents
    (the first `r2ag.eval.generator_max_docs`), `rows_per_call` prompts a sampler call ('' answers
    without a bound generator)."""
    if self.generator is None:
      return [""] * len(examples), 0.0
    from rlrag_jax.rollout.policy import Policy
    lm = self.generator
    tok = lm.tokenizer
    e = self.eval_cfg
    limit = int(e.generator_max_docs)
    use_chat = bool(self.config.model.chat_template and getattr(tok, "chat_template", None))
    thinking = bool(e.generator_thinking)
    ids = [prompts.generator_ids(tok, ex.question, self.corpus.pairs(d[:limit]), self.style,
                                 use_chat, self.passage_words, thinking=thinking)
           for ex, d in zip(examples, doc_lists)]
    eos = tuple(lm.config.eos_token_id or ()) or (tok.eos_token_id,)
    pol = Policy(lm.config, lm.params, max_new_tokens=int(e.answer_tokens),
                 eos_ids=eos, pad_id=tok.pad_token_id or 0, rows_per_call=rows_per_call)
    t0 = time.perf_counter()
    texts, _ = _generate(pol, tok, ids, rng, greedy=True, max_new=pol.max_new_tokens)
    return [t.strip() for t in texts], (time.perf_counter() - t0) / max(1, len(examples))

  def row_metrics(self, ex, info) -> dict:
    """One question's metrics from its `eval_runs` entry."""
    gold = self.gold(ex)
    m = {}
    for p, r in info.items():
      if p == "outputs":
        continue
      m.update({f"{p}{k}": v for k, v in retrieval_metrics(r["docs"], gold).items()})
      m.update({f"{p}latency_retrieval_s": r["steer_s"] + r["search_s"],
                f"{p}latency_generation_s": r["answer_s"]})
      if p != "sr_":
        m[f"{p}iterations"] = float(r["iterations"])
      if self.generator is not None:
        m[f"{p}em"] = metrics.exact_match(r["answer"], ex.answers)
        m[f"{p}f1"] = metrics.f1(r["answer"], ex.answers)
    m.update(later_step_counts(info.get("outputs", ()), gold))
    return m

  def report(self, workdir, rlog, setup) -> None:
    from rlrag_jax.methods.r2ag import report
    report.write(self, pathlib.Path(workdir))


def parse_t_by_dataset(entries) -> dict:
  """`r2ag.eval.t_base_by_dataset` entries 'dataset:t' -> {dataset: t}; errors name the key."""
  out = {}
  for e in entries:
    name, _, t = str(e).partition(":")
    if not name or not t.strip().isdigit():
      raise ValueError(f"config key 'r2ag.eval.t_base_by_dataset' entry {e!r}: expected "
                       "'dataset:t' with t a whole number, e.g. 'hotpotqa:1'")
    out[name.strip()] = int(t)
  return out


def retrieval_metrics(docs: Sequence[str], gold: Sequence[str]) -> dict:
  """One question's retrieval columns of the report from its retrieved `docs` (in the order they
  were first retrieved) and its gold ids: recall (the share of gold found), full_recall (1 when
  all were), at_k (documents retrieved) and map (`metrics.average_precision`)."""
  found = len(set(docs) & set(gold))
  return {"recall": found / max(1, len(gold)), "full_recall": float(found == len(gold)),
          "at_k": float(len(docs)), "map": metrics.average_precision(docs, gold)}


def later_step_counts(outputs, gold) -> dict:
  """Counts over a question's steering outputs after the first round (the main tree's
  `(round, branch docs, text)`): the steps, those whose branch holds a non-gold document
  ("noisy"), the stops before every gold document is on the branch ("premature"), and the
  premature stops at noisy steps. Training contexts carry only gold documents
  (r2ag.forest.carry 'gold', the paper's) and the SFT oracle's too; these say how the
  steering model does where inference puts documents it was never trained beside."""
  gold = set(gold)
  c = {"later_steps": 0.0, "later_noisy": 0.0, "later_premature_stops": 0.0,
       "later_noisy_premature_stops": 0.0}
  for rnd, docs, text in outputs:
    if rnd < 1:
      continue
    noisy = bool(set(docs) - gold)
    premature = parsing.parse(text).stop and not gold <= set(docs)
    c["later_steps"] += 1
    c["later_noisy"] += noisy
    c["later_premature_stops"] += premature
    c["later_noisy_premature_stops"] += premature and noisy
  return c


class GeneratorTask(Task):
  """The frozen generator of the CPU default: SFT on gold documents among distractors."""
  name = "r2ag"

  def __init__(self, config, encoder=None):
    self.config = config
    self.settings = r = settings.generator(config)
    self.style = config.data.prompt_style
    self.passage_words = int(r.passage_words)
    self.distractors = int(r.generator_distractors)
    sel = tasks.select_data(config)
    self.train, self.eval = _with_gold(sel.train), _with_gold(sel.eval)
    self.corpus = CorpusSearch(config, sel, encoder)
    exs = list(self.train) + list(self.eval)
    near = self.corpus.search([ex.question for ex in exs], self.distractors + 4) \
        if self.distractors else [[] for _ in exs]
    self._docs = {}
    for ex, cand in zip(exs, near):
      gold = list(self.corpus.ids(ex, ex.gold_ids))
      rng = random.Random(f"{config.seed}/{ex.id}")
      noise = [d for d in cand if d not in gold][:rng.randint(0, self.distractors)]
      docs = gold + noise
      rng.shuffle(docs)
      self._docs[str(ex.id)] = docs
    tasks.use_tokenizer(self, config, ())

  def docs(self, ex) -> list:
    return self._docs[str(ex.id)]

  def prompt_ids(self, ex) -> list:
    return prompts.generator_ids(self.tokenizer, ex.question, self.corpus.pairs(self.docs(ex)),
                                 self.style, self.use_chat, self.passage_words,
                                 thinking=self.config.model.thinking)

  def sft_target_ids(self, ex) -> list:
    text = ex.answers[0] if self.use_chat else " " + ex.answers[0]
    return self.tokenizer(text, add_special_tokens=False)["input_ids"] + tasks.eos(self.tokenizer)

  def sft_samples(self, ex) -> list:
    """One sample: (documents, question) -> the gold answer."""
    return [(self.prompt_ids(ex), self.sft_target_ids(ex), None)]

  def tokenizer_texts(self):
    yield prompts.generator_text("", [], self.style)
    for r in self.corpus.records:
      yield f"{r.title}: {r.text}"
    for ex in list(self.train) + list(self.eval):
      yield f"{ex.question} {ex.answers[0]}"

  def evaluate(self, policy, examples, rng) -> list:
    """The greedy answer from the example's documents: EM and F1."""
    from rlrag_jax.rollout.single_turn import single_turn
    eps = single_turn(policy, examples, self.prompt_ids,
                      lambda ids: decode_keeping_tags(self.tokenizer, ids), rng,
                      group_size=1, greedy=True)
    return [EvalRow(ep.example, ep.text, {"em": metrics.exact_match(ep.text, ep.example.answers),
                                          "f1": metrics.f1(ep.text, ep.example.answers)})
            for ep in eps]


def make_task(config):
  role = config.r2ag.role
  if role == "steering":
    return SteeringTask(config)
  if role == "generator":
    return GeneratorTask(config)
  raise ValueError(f"config key 'r2ag.role' is {role!r}; expected one of {ROLES}")
