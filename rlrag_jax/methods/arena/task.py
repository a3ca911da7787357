"""ARENA glue for the shared trainer: data -> prompts, SFT targets, single-turn rollouts, rewards."""
from __future__ import annotations

import json
import logging
from typing import Sequence

from rlrag_jax import judge as judge_lib
from rlrag_jax import metrics
from rlrag_jax.methods.arena import parsing, prompts, rewards, settings, sft
from rlrag_jax.rollout.single_turn import decode_keeping_tags, single_turn
from rlrag_jax.tasks import SingleStreamTask

SPECIAL_TOKENS = ("<relevance>", "</relevance>", "<analysis>", "</analysis>", "<answer>",
                  "</answer>")
COMPACT_CUE = "Response:\n"
SFT_TARGETS = ("structured", "direct", "teacher")
log = logging.getLogger("rlrag_jax.arena")


REWARD_WEIGHTS = ("w_format", "w_accuracy", "w_relevance", "bonus_value")


class ArenaTask(SingleStreamTask):
  name = "arena"
  judge_prompt = judge_lib.JudgePrompt(prompts.JUDGE_TEMPLATE)     # the paper's Table 6

  def __init__(self, config):
    self.config = config
    sel = self.select_data(config)
    self.train, self.eval, self.corpus = sel.train, sel.eval, sel.corpus
    self.max_chars = config.data.max_passage_chars or None
    self.reward_cfg = r = settings.reward(config)
    self.weights = {k: float(getattr(r, k)) for k in REWARD_WEIGHTS}
    self.relevance_parse = r.relevance_parse
    self.accuracy = r.accuracy
    self.judge = judge_lib.from_config(r, prompt=self.judge_prompt, where="reward")
    if self.accuracy == "judge" and self.judge is None:
      raise ValueError("config key 'reward.accuracy' is 'judge' but 'reward.judge_url' is empty")
    self.settings = settings.arena(config)
    self.sft_kind = self.settings.sft.target
    if self.sft_kind not in SFT_TARGETS:
      raise ValueError(f"config key 'arena.sft.target' is {self.sft_kind!r}; expected one of "
                       f"{SFT_TARGETS}")
    self.instruction = (prompts.DIRECT_INSTRUCTION if self.sft_kind == "direct"
                        else prompts.INSTRUCTION)
    self.traces = (_teacher_traces(self.settings.sft.teacher_traces, self)
                   if self.sft_kind == "teacher" else {})
    self.use_tokenizer(config, SPECIAL_TOKENS)

  # ---------------------------------------------------------------- prompts
  def prompt_text(self, ex) -> str:
    if self.config.data.prompt_style == "compact":
      return (prompts.format_references(prompts.passages_of(ex), self.max_chars) +
              f"\nQuestion: {ex.question}\n{COMPACT_CUE}")
    return prompts.prompt_for(ex, self.max_chars, self.instruction)

  def prompt_ids(self, ex) -> list:
    if self.use_chat:
      from rlrag_jax.models import encode_prompt
      return encode_prompt(self.tokenizer, prompts.messages_for(ex, self.max_chars,
                                                                instruction=self.instruction),
                           thinking=self.config.model.thinking)
    return self.tokenizer(self.prompt_text(ex), add_special_tokens=False)["input_ids"]

  def sft_target(self, ex) -> str:
    """'structured': our gold relevance / analysis / answer; 'direct': the gold answer alone
    (SFT-direct); 'teacher': the gold ids and answer around the teacher's trace (SFT-reasoning)."""
    if self.sft_kind == "direct":
      return ex.answers[0]
    if self.sft_kind == "teacher":
      gold = json.dumps(list(prompts.reference_numbers(ex).gold))
      return (f"<relevance>{gold}</relevance><analysis>{self.traces[str(ex.id)]}</analysis>"
              f"<answer>{ex.answers[0]}</answer>")
    return sft.gold_completion(ex, style=self.config.data.analysis_style)

  def sft_target_ids(self, ex) -> list:
    return self.tokenizer(self.sft_target(ex), add_special_tokens=False)["input_ids"] + self.eos()

  # ---------------------------------------------------------------- rollouts and rewards
  def decode(self, ids: Sequence[int]) -> str:
    return decode_keeping_tags(self.tokenizer, ids)

  def rollout(self, policy, examples, rng, *, group_size=1, greedy=False):
    return single_turn(policy, examples, self.prompt_ids, self.decode, rng,
                       group_size=group_size, greedy=greedy)

  def rewards(self, episodes, step: int = 0) -> list:
    """`reward` of each episode, the judge's questions asked concurrently (judge.batched)."""
    return judge_lib.batched(self.judge, lambda j: [self._reward(ep, j) for ep in episodes])

  def _reward(self, episode, judge_fn) -> dict:
    ex = episode.example
    judge, verdicts = None, []
    if judge_fn is not None:
      def judge(answer, aliases):
        verdicts.append(judge_fn(ex.question, answer, aliases))
        return verdicts[-1]
    out = rewards.reward(episode.text, ex.answers, prompts.reference_numbers(ex).gold,
                         relevance_parse=self.relevance_parse, accuracy=self.accuracy,
                         judge=judge, **self.weights)
    if judge_fn is not None:       # "not judged" scored 0; its mean is the failure rate
      out["judge_failed"] = float(any(v is None for v in verdicts))
    return out

  def monitors(self) -> list:
    """The judge's failure monitor (its counts go into the step metrics as judge/...)."""
    return [self.judge.monitor] if self.judge is not None else []

  def eval_metrics(self, episodes) -> list:
    """em, f1, the reward's format / relevance / accuracy / total, and the prediction; the
    judge's questions asked concurrently (judge.batched)."""
    return judge_lib.batched(self.judge,
                             lambda j: [self._eval_metrics(ep, j) for ep in episodes])

  def _eval_metrics(self, episode, judge_fn) -> dict:
    ex = episode.example
    r = self._reward(episode, judge_fn)
    answer = parsing.parse(episode.text, self.relevance_parse).answer or ""
    if self.sft_kind == "direct":        # SFT-direct replies with the bare answer
      answer = episode.text.strip()
    return {"em": metrics.exact_match(answer, ex.answers), "f1": metrics.f1(answer, ex.answers),
            "format": r["format"], "relevance": r["relevance"], "accuracy": r["accuracy"],
            "reward": r["total"], "prediction": answer}

  def tokenizer_texts(self):
    """Texts a from-scratch tokenizer is trained on: prompts and gold replies."""
    for ex in list(self.train) + list(self.eval):
      yield self.prompt_text(ex)
      yield self.sft_target(ex)


def _teacher_traces(path: str, task) -> dict:
  """The traces file of `arena.sft.teacher_traces`; training keeps the examples that have a
  trace."""
  from rlrag_jax.methods.arena import teacher_traces
  if not path:
    raise ValueError("config key 'arena.sft.target' is 'teacher' but 'arena.sft.teacher_traces' "
                     "is empty; build the file with python -m "
                     "rlrag_jax.methods.arena.teacher_traces")
  traces = teacher_traces.read_traces(path)
  keep = [ex for ex in task.train if str(ex.id) in traces]
  if not keep:
    raise ValueError(f"{path}: no trace for any of the {len(task.train)} training examples")
  if len(keep) < len(task.train):
    log.warning("%s: %d of %d training examples have no teacher trace and are left out",
                path, len(task.train) - len(keep), len(task.train))
  task.train = keep
  return traces


def make_task(config) -> ArenaTask:
  return ArenaTask(config)
