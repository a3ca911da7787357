"""Search-R1 on the shared engine: the released prompt, a tool-loop rollout that searches a
corpus, the exact-match reward, and an evaluation report beside the published rows.

Rollout. `rollout.run_tool_loop` with `_Env`: a turn ends at '</search>', '</answer>' or EOS;
after '</search>' the query is embedded (the shared encoder; or sent to the `retrieval.url`
server, Search-R1's own retrieval protocol) and the top `tool.top_k` passages come back as `\\n\\n<information>Doc 1(Title: ...) ...</information>\\n\\n` (loss mask 0: the
retrieved tokens are masked out of the loss, at most `tool.max_obs_tokens` tokens, the closing
tag kept); at most `tool.max_turns` searches and `tool.max_total_len` tokens an episode; an
answer, EOS or a blank query ends it.

Reward. `rewards.reward`: EM of the last <answer> (1 or 0), no format term.

Data. `data.source` 'world': the embedded world (train / dev / its passages). 'files': training
on the `data.mix` entries (the paper: NQ + HotpotQA train merged, shuffled); a missing training
file leaves `train` empty with a warning naming it, so that evaluating a checkpoint needs only
the evaluation files and a training run stops at the trainer's "no training examples" (never
trains on part of the mix). Evaluation on the `data.eval_mix` entries one by one, each cut to a
seeded draw of `search_r1.eval_per_dataset` (0: all); a missing file is recorded with the
loader's reason (which names RLRAG_DATA_DIR or data.dir) and listed by `eval_report`, not
dropped silently. Train and evaluation questions must not overlap (`data.check_overlap`).

SFT. The paper has none. The CPU default's from-scratch model gets a warm-up on demonstrations
in the same format (`prompts.gold_pieces`: one search per gold decomposition step, the real
retrieval as the observation, masked), so that RL starts from a policy that searches.
"""
from __future__ import annotations

import logging
import random
from typing import Optional, Sequence

from rlrag_jax import metrics
from rlrag_jax.data import loaders, schema, sources
from rlrag_jax.methods.search_r1 import prompts, report, rewards, settings
from rlrag_jax.retrieval import from_config
from rlrag_jax.retrieval.query_cache import QueryEmbeddings
from rlrag_jax.rollout import Observation, run_tool_loop, truncate_observation
from rlrag_jax.tasks import Episode, SingleStreamTask

log = logging.getLogger("rlrag_jax.search_r1")


class _Env:
  """The tool: a turn's query -> the top-k passages as one <information> block."""

  def __init__(self, task: "SearchR1Task"):
    self.task = task

  def batch(self, rows, turn_texts, completions) -> list:
    del rows, turn_texts
    queries = [rewards.extract_query(c) for c in completions]
    hits = iter(self.task.retrieve([q for q in queries if q]))
    out = []
    for q in queries:
      if q is None:                   # an answer, or a search without a usable query: done
        out.append(None)
        continue
      h = next(hits)
      out.append(Observation(prompts.OBS_OPEN + prompts.format_docs(h), tail=prompts.OBS_CLOSE,
                             info={"query": q, "ids": [x.id for x in h]}))
    return out


class SearchR1Task(SingleStreamTask):
  name = "search_r1"

  def __init__(self, config, *, encoder=None):
    """`encoder` (.encode_queries / .encode_passages(texts, batch_size) -> unit rows, .dim,
    .id) replaces the one `retrieval.encoder_path` names, e.g. in tests."""
    self.config = config
    self.tool = settings.tool(config)
    self.settings = settings.search_r1(config)
    sel, self.datasets, self.missing = _select(config, self.settings.eval_per_dataset)
    self.train, self.eval = list(sel.train), list(sel.eval)
    # With retrieval.url the server holds the corpus: nothing local to pool or index (the
    # passages a from-scratch tokenizer reads are the world's, where there is one).
    self.remote = bool(config.retrieval.url)
    self.corpus = list(sel.corpus) if self.remote else from_config.corpus_for(config, sel)
    self.use_tokenizer(config, prompts.TAGS)
    self.encoder, self.retriever, self.index_dir = from_config.retriever_for(
        config, self.corpus, encoder)
    self._embed = QueryEmbeddings(self.encoder)
    self._gold = {}
    log.info("search_r1: %d train / %d eval examples (%s), passages from %s%s",
             len(self.train), len(self.eval), ", ".join(self.datasets) or "none",
             config.retrieval.url if self.remote else f"{len(self.corpus)} local passages",
             f"; missing: {', '.join(self.missing)}" if self.missing else "")

  # ---------------------------------------------------------------- retrieval
  def retrieve(self, queries: Sequence[str], k: Optional[int] = None) -> list:
    """Per query a list of `Hit`s (top `tool.top_k`): from the `retrieval.url` server (which
    embeds the queries itself), else from the local index."""
    if not queries:
      return []
    k = int(k or self.tool.top_k)
    if self.remote:
      return self.retriever.search(list(queries), k)
    return self.retriever.search_embeddings(self._embed(list(queries)), k)

  # ---------------------------------------------------------------- prompts and SFT
  def prompt_ids(self, ex) -> list:
    text = prompts.prompt(ex.question, self.config.data.prompt_style)
    if self.use_chat:
      from rlrag_jax.models import encode_prompt
      return encode_prompt(self.tokenizer, [{"role": "user", "content": text}],
                           thinking=self.config.model.thinking)
    return self.tokenizer(text, add_special_tokens=False)["input_ids"]

  def _queries(self, ex) -> list:
    """The demonstration's searches: the gold decomposition's questions with '#k' filled by
    the earlier answers, or the question itself."""
    answers = [s.answer for s in ex.decomposition]
    return prompts.gold_queries(ex.question, [schema.fill_references(s.question, answers)
                                              for s in ex.decomposition])

  def _pieces(self, ex) -> list:
    if ex.id not in self._gold:
      todo = [e for e in [ex] + list(self.train) if e.id not in self._gold]
      queries = sorted({q for e in todo for q in self._queries(e)})
      docs = dict(zip(queries, (prompts.format_docs(h) for h in self.retrieve(queries))))
      for e in todo:
        self._gold[e.id] = prompts.gold_pieces(self._queries(e), e.answers[0], docs.__getitem__)
    return self._gold[ex.id]

  def _encode_pieces(self, pieces) -> tuple:
    """(ids, loss mask) tokenized piece by piece as the rollout does; an observation body and
    its tail are cut to `tool.max_obs_tokens` as the rollout cuts them."""
    enc = lambda text: self.tokenizer(text, add_special_tokens=False)["input_ids"]
    ids, mask, i = [], [], 0
    while i < len(pieces):
      text, by_model = pieces[i]
      if by_model:
        t = enc(text)
      else:
        t, _ = truncate_observation(enc(text), enc(pieces[i + 1][0]), self.tool.max_obs_tokens)
        i += 1
      ids += t
      mask += [int(by_model)] * len(t)
      i += 1
    return ids, mask

  def sft_target_ids(self, ex) -> list:
    return self._encode_pieces(self._pieces(ex))[0] + self.eos()

  def sft_loss_mask(self, ex) -> list:
    """0 on the retrieved passages (as in RL), 1 on the model's tokens and EOS."""
    return self._encode_pieces(self._pieces(ex))[1] + [1] * len(self.eos())

  # ---------------------------------------------------------------- rollouts
  def rollout(self, policy, examples, rng, *, group_size: int = 1, greedy: bool = False) -> list:
    """Tool-loop episodes, group-major (example i's samples at [i*G, (i+1)*G))."""
    examples = list(examples)
    rows = [self.prompt_ids(ex) for ex in examples for _ in range(group_size)]
    t = self.tool
    out = run_tool_loop(
        policy, rows, _Env(self), rng=rng, tokenizer=self.tokenizer, max_turns=t.max_turns,
        max_obs_tokens=t.max_obs_tokens, max_total_len=t.max_total_len,
        stop=prompts.STOP_STRINGS, greedy=greedy, min_batch=t.min_batch,
        context_bucket=t.context_bucket, group_size=group_size, kv_reuse=bool(t.kv_reuse))
    episodes = []
    for i, p in enumerate(rows):
      comp = out.completion_ids[i]
      turns = out.turns[i]
      episodes.append(Episode(
          example=examples[i // group_size], prompt_ids=p, completion_ids=comp,
          loss_mask=out.loss_mask[i],
          text=self.tokenizer.decode(list(comp), skip_special_tokens=True).strip(),
          info={"turns": turns, "finish": out.finish_reason[i],
                "searches": out.num_tool_calls[i],
                "queries": [x.info["query"] for x in turns if "query" in x.info],
                "retrieved": [x.info["ids"] for x in turns if "ids" in x.info]}))
    return episodes

  # ---------------------------------------------------------------- rewards and metrics
  def rewards(self, episodes, step: int = 0) -> list:
    del step
    return [rewards.reward(ep.text, ep.example.answers) for ep in episodes]

  def eval_metrics(self, episodes) -> list:
    """em (the reward), f1, answered (an <answer> was given), searches, the prediction."""
    return [_eval_metrics(ep) for ep in episodes]

  def monitors(self) -> list:
    """The retrieval server's failure monitor when `retrieval.url` is set (its calls and
    failures are logged per RL step and evaluation; too many stop the run)."""
    return [self.retriever.monitor] if self.remote else []

  def eval_report(self, result: dict) -> str:
    """EM per dataset with intervals, the average, the published row (`search_r1.published`),
    and the datasets whose files are missing."""
    return report.format_report(result["rows"], self.datasets, self.missing,
                                self.settings.published)

  # ---------------------------------------------------------------- tokenizer data
  def tokenizer_texts(self):
    """Texts a from-scratch tokenizer is trained on: passages, prompts, demonstrations."""
    n = len(self.corpus)
    for i in range(0, n, 2):           # by row: a list or an index's passage store
      docs = [self.corpus[j] for j in range(i, min(i + 2, n))]
      yield prompts.OBS_OPEN + prompts.format_docs(docs) + prompts.OBS_CLOSE
    for ex in list(self.train) + list(self.eval):
      yield prompts.prompt(ex.question, self.config.data.prompt_style)
    for ex in self.train:
      yield "".join(t for t, _ in prompts.gold_pieces(self._queries(ex), ex.answers[0],
                                                       lambda q: ""))
    yield prompts.TEMPLATE


def _eval_metrics(episode) -> dict:
  pred = rewards.extract_answer(episode.text)
  answers = episode.example.answers
  return {"em": metrics.exact_match(pred, answers) if pred is not None else 0.0,
          "f1": metrics.f1(pred, answers) if pred is not None else 0.0,
          "answered": float(pred is not None),
          "searches": float(episode.info["searches"]), "prediction": pred or ""}


# -------------------------------------------------------------------------------- data
def _canonical_name(spec: str) -> str:
  name = sources.parse_spec(spec, "data.eval_mix")[0]
  dataset, subset = loaders._canonical(name)  # pylint: disable=protected-access
  return subset or dataset


def _select(config, per_dataset: int) -> tuple:
  """(Selection, evaluation dataset names in data.eval_mix order, the missing ones included,
  {dataset: why missing})."""
  data = config.data
  if data.source != "files":
    sel = sources.select(data, seed=config.seed)
    return sel, sorted({ex.source or "world" for ex in sel.eval}), {}
  train = []
  for spec in data.mix:
    try:
      train += sources.load_entry(spec, data, config.seed, "data.mix")
    except FileNotFoundError as e:
      log.warning("search_r1: training data incomplete, so none is used (the trainer refuses "
                  "to train; evaluation still runs): %s", e)
      train = []
      break
  random.Random(config.seed).shuffle(train)
  if data.max_train:
    train = train[:data.max_train]
  ev, names, missing = [], [], {}
  for spec in data.eval_mix:
    name = _canonical_name(spec)
    names.append(name)                # missing ones too: the report lists them in their place
    try:
      got = sources.load_entry(spec, data, config.seed, "data.eval_mix")
    except FileNotFoundError as e:
      missing[name] = str(e)
      continue
    if 0 < per_dataset < len(got):
      got = random.Random(f"{config.seed}:{spec}:eval").sample(got, per_dataset)
    ev += got
  if data.check_overlap:
    sources.check_disjoint(train, ev)
  return sources.Selection(train, ev, []), names, missing


def make_task(config) -> SearchR1Task:
  return SearchR1Task(config)
