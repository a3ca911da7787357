"""Learning When to Search glue for the shared trainer: prompts, SFT targets, tool rollouts, rewards.

Rollouts. `rollout` runs `rollout.run_tool_loop` with a `SearchEnv`: when a turn ends at
'</search>', the query between the last <search> and </search> is embedded with the shared encoder
(MiniLM), the top `tool.top_k` passages come back from the Retriever as
`<information>Doc 1 (Title: …) …</information>` (loss mask 0, at most `tool.max_obs_tokens`
tokens, the closing tag always kept), and generation goes on; at most `tool.max_turns` searches
and `tool.max_total_len` prompt + completion tokens per episode. Every turn's query and
retrieved ids are in `Episode.info`.

Rewards. `reward(episode, step)` is `methods.search.reward` (format + search + answer) with the
stage chosen from the RL step the engine passes (1: the first): stage 2 from RL step
`reward.stage2_step` on (<= 0: stage 1 throughout), whatever the SFT warm-up's length. Query embeddings for r_s come from the same
encoder (cached, so the rollout's own embeddings are reused). Correctness: `reward.match`
('em' | 'f1' with `reward.f1_threshold`), or the shared LLM judge when `reward.judge_url` is set.

SFT mix (warm-up targets; see `sft_target_ids`):
  * structure B for every training example: think, one keyword search per gold step that reads a
    passage (reasoning-only steps, e.g. the world's final comparison, are not searched), the
    retriever's real top-k for that query as the observation, "Found <sub-answer>." reflections,
    answer. The observation tokens are masked out of the SFT loss as they are out of the RL loss.
  * steps the model "already knows" are not searched: a step whose fact occurs in at least
    `search.sft.known_min_seen` OTHER training examples (so the warm-up itself keeps showing the
    model that fact) is recalled in a reflection ("Known: X.") instead of searched; an example whose
    every step is known gets structure A (think, reflect, answer; no search). Facts are
    (head, relation) pairs from the world's question programs, else the gold queries. 0 turns
    this off (every step searched).
  A from-scratch model knows nothing but what training shows it, so this is the only honest
  notion of "its own knowledge" here; whether it really recalls those facts is what RL finds
  out (stage 1 rewards searching them anyway, stage 2 rewards skipping the search when the
  recalled answer is right). With an instruct LLM (':paper') SFT is off and the policy's own
  knowledge decides.

Reference pipelines (`rollout(..., pipeline=...)`, used by `baselines.py`):
  'no_retrieval' forces the opening "<think>I know this.</think>" and allows no search;
  'naive_rag' forces one search for the question itself with its top `search.eval.naive_k`
  passages, then lets the model reflect and answer, with no further search.
"""
from __future__ import annotations

import collections
import json
import logging
from typing import Optional, Sequence

import numpy as np

from rlrag_jax import judge as judge_lib
from rlrag_jax import metrics
from rlrag_jax.methods.search import parsing, prompts, rewards, settings
from rlrag_jax.retrieval import from_config
from rlrag_jax.retrieval.query_cache import QueryEmbeddings
from rlrag_jax.rollout import Observation, run_tool_loop, truncate_observation
from rlrag_jax.tasks import Episode, SingleStreamTask

log = logging.getLogger("rlrag_jax.search")

SPECIAL_TOKENS = ("<think>", "</think>", "<search>", "</search>", "<information>",
                  "</information>", "<reflect>", "</reflect>", "<answer>", "</answer>")
COMPACT_TEMPLATE = "Question: {question}\n"
PIPELINES = ("agent", "no_retrieval", "naive_rag")


class SearchEnv:
  """The rollout's tool: query of the turn -> top-k passages as an <information> block."""

  def __init__(self, task: "SearchTask", k: int):
    self.task = task
    self.k = int(k)

  def batch(self, rows, turn_texts, completions) -> list:
    del rows, turn_texts
    queries = [prompts.extract_query(c) for c in completions]
    asked = [q for q in queries if q]
    hits = iter(self.task.retrieve(asked, self.k))
    out = []
    for q in queries:
      if not q:
        out.append(None)            # '</search>' without a usable query ends the episode
        continue
      h = next(hits)
      out.append(Observation(prompts.OBS_OPEN + prompts.format_observation(h), tail=prompts.OBS_CLOSE,
                             info={"query": q, "ids": [x.id for x in h]}))
    return out


class SearchTask(SingleStreamTask):
  name = "search"
  # The paper's "Instruction for Judge LLM" (B.4), with yes/no read case-insensitively.
  judge_prompt = judge_lib.JudgePrompt(prompts.JUDGE_TEMPLATE)

  def __init__(self, config, *, encoder=None):
    """`encoder` (anything with .encode(texts, batch_size) -> unit rows, .dim, .id) replaces
    the packaged MiniLM, e.g. in tests."""
    self.config = config
    sel = self.select_data(config)
    self.train, self.eval = _split(sel, config.data)
    self.reward_cfg = settings.reward(config)
    self.settings = settings.search(config)
    self.stage2_step = int(self.reward_cfg.stage2_step)
    self.corpus = from_config.corpus_for(config, sel)
    self._known = _known_steps(self.train, int(self.settings.sft.known_min_seen))
    self.use_tokenizer(config, SPECIAL_TOKENS)
    self._drop_long_prompts(int(config.tool.max_prompt_len))
    self._gold = {}
    self._judge = _judge(self.reward_cfg)
    if self.reward_cfg.match == "judge" and self._judge is None:
      raise ValueError("config key 'reward.match' is 'judge' but 'reward.judge_url' is empty: "
                       "point it at an OpenAI-compatible endpoint, or set reward.match='em'")
    self.encoder, self.retriever, self._index_dir = from_config.retriever_for(
        config, self.corpus, encoder)
    self._embed = QueryEmbeddings(self.encoder)
    self.remote = bool(config.retrieval.url)    # retrieval as a service
    if self.train:
      n_known = sum(len(v) for v in self._known.values())
      n_steps = sum(len(prompts._searched_steps(e)) for e in self.train)  # pylint: disable=protected-access
      n_direct = sum(self.is_direct(e) for e in self.train)
      log.info("search: %d train / %d eval examples, %d passages; SFT targets recall %.1f%% of "
               "the gold steps, %.1f%% of the examples are structure A", len(self.train),
               len(self.eval), len(self.corpus), 100 * n_known / max(n_steps, 1),
               100 * n_direct / len(self.train))

  # ---------------------------------------------------------------- retrieval
  def embed(self, queries: Sequence[str]) -> np.ndarray:
    """Query embeddings [n, d] from the shared encoder (cached by query text)."""
    return self._embed(queries)

  def retrieve(self, queries: Sequence[str], k: int) -> list:
    """Per query a list of k `Hit`s. With `retrieval.url` set they come from that server (its
    ids, titles and texts); r_s still embeds the queries here (`embed`)."""
    if not queries:
      return []
    if self.remote:
      return self.retriever.search(list(queries), k)
    return self.retriever.search_embeddings(self.embed(list(queries)), k)

  # ---------------------------------------------------------------- prompts
  def prompt_text(self, ex) -> str:
    if self.config.data.prompt_style == "compact":
      return COMPACT_TEMPLATE.format(question=" ".join(str(ex.question).split()))
    return prompts.build_prompt(ex.question)

  def prompt_ids(self, ex) -> list:
    if self.use_chat:
      from rlrag_jax.models import encode_prompt
      return encode_prompt(self.tokenizer, [{"role": "user",
                                             "content": prompts.build_prompt(ex.question)}],
                           thinking=self.config.model.thinking)
    return self.tokenizer(self.prompt_text(ex), add_special_tokens=False)["input_ids"]

  def _drop_long_prompts(self, limit: int) -> None:
    """`tool.max_prompt_len` > 0: training examples whose prompt is longer are left out, counted
    and logged (the paper's max_prompt_length; its framework filters such prompts the same way).
    Evaluation examples are kept whole."""
    if limit <= 0 or not self.train:
      return
    keep = [ex for ex in self.train if len(self.prompt_ids(ex)) <= limit]
    if len(keep) < len(self.train):
      log.warning("search: %d of %d training prompts are longer than tool.max_prompt_len=%d "
                  "tokens and are left out", len(self.train) - len(keep), len(self.train), limit)
    if not keep:
      raise ValueError(f"search: every training prompt is longer than config key "
                       f"'tool.max_prompt_len' = {limit} tokens")
    self.train = keep

  # ---------------------------------------------------------------- SFT targets
  def known_steps(self, ex) -> frozenset:
    """Decomposition steps of `ex` its SFT target recalls instead of searching."""
    return self._known.get(ex.id, frozenset())

  def is_direct(self, ex) -> bool:
    """Whether the SFT target of `ex` is structure A (see the module docstring)."""
    steps = prompts._searched_steps(ex) if ex.decomposition else [0]  # pylint: disable=protected-access
    return set(steps) <= self.known_steps(ex)

  def sft_pieces(self, ex) -> list:
    """The gold completion of `ex` as [(text, written_by_model)] pieces."""
    if self.is_direct(ex):
      return prompts.gold_pieces(ex, lambda q: "", self.known_steps(ex))
    if ex.id not in self._gold:
      self._prepare_gold([ex] + [e for e in self.train if e.id not in self._gold])
    return self._gold[ex.id]

  def _prepare_gold(self, examples):
    """Gold structure-B pieces with real retrieval, for many examples at once (one batched
    encoder pass over their distinct queries)."""
    examples = [e for e in examples if not self.is_direct(e)]
    wanted = sorted({q for e in examples for q in prompts.gold_queries(e) if q})
    k = int(self.config.tool.top_k)
    if self.remote:      # the server's hits as they are (its index may change: no file cache)
      hits = dict(zip(wanted, self.retrieve(wanted, k))) if wanted else {}
      for e in examples:
        self._gold[e.id] = prompts.gold_pieces(e, lambda q: prompts.format_observation(hits[q]),
                                               self.known_steps(e))
      return
    cache = self._index_dir / f"gold_hits_top{k}.json"
    known = json.loads(cache.read_text()) if cache.exists() else {}
    todo = [q for q in wanted if q not in known]
    if todo:
      for q, h in zip(todo, self.retrieve(todo, k)):
        known[q] = [x.id for x in h]
      cache.write_text(json.dumps(known))
    hits = {q: [self.retriever.record_of(i) for i in known[q]] for q in wanted}
    for e in examples:
      self._gold[e.id] = prompts.gold_pieces(e, lambda q: prompts.format_observation(hits[q]),
                                             self.known_steps(e))

  def sft_target(self, ex) -> str:
    """The SFT target text (observations cut as the rollout cuts them)."""
    return self.tokenizer.decode(self._encode_pieces(self.sft_pieces(ex))[0])

  def _encode_pieces(self, pieces, max_obs_tokens: Optional[int] = None) -> tuple:
    """(ids, loss mask) of [(text, written_by_model)] pieces, tokenized piece by piece as the
    rollout does; a system piece followed by another one is an observation body + tail, cut
    to `max_obs_tokens` (default `tool.max_obs_tokens`) as the rollout cuts it."""
    enc = lambda text: self.tokenizer(text, add_special_tokens=False)["input_ids"]
    limit = int(self.config.tool.max_obs_tokens if max_obs_tokens is None else max_obs_tokens)
    ids, mask, i = [], [], 0
    while i < len(pieces):
      text, by_model = pieces[i]
      if by_model:
        t = enc(text)
      else:
        tail = pieces[i + 1][0] if i + 1 < len(pieces) and not pieces[i + 1][1] else ""
        t, _ = truncate_observation(enc(text), enc(tail) if tail else [], limit)
        i += 1 if tail else 0
      ids += t
      mask += [int(by_model)] * len(t)
      i += 1
    return ids, mask

  def sft_target_ids(self, ex) -> list:
    ids, _ = self._encode_pieces(self.sft_pieces(ex))
    return ids + self.eos()

  def sft_loss_mask(self, ex) -> list:
    """1 on the model's tokens; on the observations 0, or 1 with `search.sft.observation_loss` (the
    warm-up then also models the retrieved passages: language-model training on the corpus,
    which a from-scratch model otherwise never gets)."""
    _, mask = self._encode_pieces(self.sft_pieces(ex))
    if self.settings.sft.observation_loss:
      mask = [1] * len(mask)
    return mask + [1] * len(self.eos())

  # ---------------------------------------------------------------- rollouts
  def decode(self, ids: Sequence[int]) -> str:
    return self.tokenizer.decode(list(ids), skip_special_tokens=True).strip()

  def rollout(self, policy, examples, rng, *, group_size: int = 1, greedy: bool = False,
              pipeline: str = "agent") -> list:
    """Tool-loop episodes, group-major (example i's samples at [i*G, (i+1)*G))."""
    if pipeline not in PIPELINES:
      raise ValueError(f"SearchTask.rollout: pipeline {pipeline!r}; expected one of {PIPELINES}")
    tool = self.config.tool
    examples = list(examples)
    prefixes = self._prefixes(examples, pipeline)
    prompt_rows, prefix_rows = [], []
    for ex, pre in zip(examples, prefixes):
      p = self.prompt_ids(ex)
      prompt_rows += [p] * group_size
      prefix_rows += [pre] * group_size
    out = run_tool_loop(
        policy, [p + pre[0] for p, pre in zip(prompt_rows, prefix_rows)],
        SearchEnv(self, tool.top_k), rng=rng, tokenizer=self.tokenizer,
        max_turns=tool.max_turns if pipeline == "agent" else 0,
        max_obs_tokens=tool.max_obs_tokens, max_total_len=tool.max_total_len,
        stop=prompts.STOP_STRINGS, greedy=greedy, min_batch=tool.min_batch,
        context_bucket=tool.context_bucket, group_size=group_size,
        kv_reuse=bool(tool.kv_reuse))
    episodes = []
    for row, (p, pre) in enumerate(zip(prompt_rows, prefix_rows)):
      comp = pre[0] + out.completion_ids[row]
      mask = pre[1] + out.loss_mask[row]
      turns = out.turns[row]
      episodes.append(Episode(
          example=examples[row // group_size], prompt_ids=p, completion_ids=comp, loss_mask=mask,
          text=self.decode(comp),
          info={"pipeline": pipeline, "turns": turns, "finish": out.finish_reason[row],
                "tool_calls": out.num_tool_calls[row],
                # retrievals performed: the loop's observations plus naive RAG's forced one
                "retrievals": out.num_tool_calls[row] + (pipeline == "naive_rag"),
                "queries": [t.info["query"] for t in turns if "query" in t.info],
                "retrieved": [t.info["ids"] for t in turns if "ids" in t.info]}))
    return episodes

  def _prefixes(self, examples, pipeline) -> list:
    """Per example (ids, loss mask) forced at the start of the completion."""
    if pipeline == "agent":
      return [([], [])] * len(examples)
    if pipeline == "no_retrieval":
      pre = self._encode_pieces([(prompts.DIRECT_THINK, True)])
      return [(pre[0], [0] * len(pre[0]))] * len(examples)
    hits = self.retrieve([ex.question for ex in examples], int(self.settings.eval.naive_k))
    out = []
    for ex, h in zip(examples, hits):       # all k documents, within half the total budget
      ids, _ = self._encode_pieces(
          prompts.naive_rag_pieces(ex.question, prompts.format_observation(h)),
          max_obs_tokens=int(self.config.tool.max_total_len) // 2)
      out.append((ids, [0] * len(ids)))
    return out

  # ---------------------------------------------------------------- rewards and metrics
  def stage(self, step: int) -> int:
    """Reward stage at RL step `step` (1: the first; see the module docstring)."""
    return 2 if 0 < self.stage2_step <= int(step) else 1

  def _score(self, episode, stage: int, verdicts: Optional[list] = None,
             judge_fn=None) -> rewards.Score:
    """`judge_fn(question, prediction, answers)`: the judge, or a `judge.batched` stand-in."""
    r = self.reward_cfg
    judge = None
    if judge_fn is not None:
      question = episode.example.question

      def judge(pred, answers):        # the paper's judge sees normalised strings (B.4)
        v = judge_fn(question, metrics.normalize_answer(pred),
                     [metrics.normalize_answer(a) for a in answers])
        if verdicts is not None:
          verdicts.append(v)
        return v is True
    performed = episode.info.get("retrievals")       # retrievals the rollout actually ran
    return rewards.score(episode.text, episode.example.answers, queries_embeddings=self.embed,
                         stage=stage, beta=float(r.beta), match=r.match,
                         f1_threshold=float(r.f1_threshold), judge=judge,
                         max_query_words=int(r.max_query_words), retrieval_count=performed,
                         rs_form=r.rs_form, answer_form=r.answer_form,
                         use_search=bool(r.use_search), use_answer=bool(r.use_answer))

  def rewards(self, episodes, step: int = 0) -> list:
    """`reward` of each episode, the judge's questions asked concurrently (judge.batched)."""
    return judge_lib.batched(self._judge,
                             lambda j: [self._reward(ep, step, j) for ep in episodes])

  def _reward(self, episode, step: int, judge_fn) -> dict:
    stage = self.stage(step)
    verdicts = []
    out = self._score(episode, stage, verdicts, judge_fn).as_dict()
    out["stage"] = float(stage)
    if judge_fn is not None:         # "not judged" scores as wrong; its mean is the failure rate
      out["judge_failed"] = float(any(v is None for v in verdicts))
    return out

  def monitors(self) -> list:
    """The judge's failure monitor (its counts go into the step metrics as judge/...)."""
    return [self._judge.monitor] if self._judge is not None else []

  def eval_metrics(self, episodes) -> list:
    """em, f1, accuracy (the reward's correctness), rc (search calls), format (valid A or B),
    direct (share of structure A), both stages' total rewards, and the prediction; the judge's
    questions asked concurrently (judge.batched)."""
    return judge_lib.batched(self._judge,
                             lambda j: [self._eval_metrics(ep, j) for ep in episodes])

  def _eval_metrics(self, episode, judge_fn) -> dict:
    s = self._score(episode, 1, judge_fn=judge_fn)
    answer = s.parsed.answer or ""
    ex = episode.example
    return {"em": metrics.exact_match(answer, ex.answers), "f1": metrics.f1(answer, ex.answers),
            "accuracy": float(s.correct), "rc": float(s.retrieval_count),
            "format": float(s.parsed.valid), "direct": float(s.parsed.structure == "A"),
            "reward_stage1": s.total,
            "reward_stage2": self._score(episode, 2, judge_fn=judge_fn).total,
            "prediction": answer}

  # ---------------------------------------------------------------- tokenizer data, report
  def tokenizer_texts(self):
    """Texts a from-scratch tokenizer is trained on: passages, prompts and gold replies."""
    for i in range(0, len(self.corpus), 2):       # passages as observations show them
      yield prompts.observation_block(prompts.format_observation(self.corpus[i:i + 2]))
    for ex in list(self.train) + list(self.eval):
      yield self.prompt_text(ex)
    for ex in self.train:
      yield prompts.gold_trajectory(ex, lambda q: "", self.known_steps(ex))
      yield prompts.gold_trajectory_direct(ex)
    yield prompts.PROMPT

  def report(self, workdir, rlog, setup) -> None:
    """Accuracy-vs-RC curves across training and, with `search.eval.baselines`, the agent
    against the two reference pipelines on the final evaluation's examples, policy, batch size
    and seed (`setup`; see baselines.py)."""
    from rlrag_jax.methods.search import baselines
    baselines.write_report(self, workdir, rlog, setup)


# -------------------------------------------------------------------------------- helpers
def _split(sel, data_cfg) -> tuple:
  """(train, eval): with `data.train_frac` < 1 the eval examples are the held-out tail of the
  (seeded, shuffled) training selection, e.g. the paper's 80/20 split of 2Wiki train."""
  frac = float(getattr(data_cfg, "train_frac", 1.0) or 1.0)
  if frac >= 1.0:
    return list(sel.train), list(sel.eval)
  if not 0 < frac < 1:
    raise ValueError(f"config key 'data.train_frac' is {frac}; expected a fraction in (0, 1]")
  cut = int(round(len(sel.train) * frac))
  held = list(sel.train[cut:])
  if data_cfg.max_eval:
    held = held[:data_cfg.max_eval]
  return list(sel.train[:cut]), held


def _step_facts(ex) -> list:
  """Per decomposition step the fact it reads, or None: (head, relation) from a world question
  program, else ('query', gold query)."""
  program = (ex.meta or {}).get("program")
  if program and len(program) == len(ex.decomposition):
    keys = []
    for op in program:
      if op.get("op") != "hop":
        keys.append(None)
        continue
      head = str(op["head"])
      if head.startswith("#") and head[1:].isdigit():
        k = int(head[1:])
        head = ex.decomposition[k - 1].answer if 0 < k <= len(ex.decomposition) else head
      keys.append((head, op["relation"]))
    return keys
  try:
    return [("query", q) if q else None for q in prompts.gold_queries(ex)]
  except ValueError:
    return [None] * len(ex.decomposition)


def _known_steps(train, min_seen: int) -> dict:
  """{example id: steps whose fact occurs in >= min_seen OTHER training examples}."""
  if min_seen <= 0:
    return {}
  facts = {ex.id: _step_facts(ex) for ex in train}
  count = collections.Counter(f for fs in facts.values() for f in set(fs) if f is not None)
  out = {}
  for i, fs in facts.items():
    known = frozenset(k for k, f in enumerate(fs) if f is not None and count[f] - 1 >= min_seen)
    if known:
      out[i] = known
  return out


def _judge(reward_cfg):
  return judge_lib.from_config(reward_cfg, prompt=SearchTask.judge_prompt, where="reward")


def make_task(config) -> SearchTask:
  return SearchTask(config)
