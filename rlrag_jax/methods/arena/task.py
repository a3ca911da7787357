"""ARENA glue for the shared trainer: data -> prompts, SFT targets, single-turn rollouts, rewards."""
from __future__ import annotations

from typing import Sequence

from rlrag_jax import metrics
from rlrag_jax.data import sources
from rlrag_jax.methods.arena import parsing, prompts, rewards, sft
from rlrag_jax.rollout.single_turn import single_turn

SPECIAL_TOKENS = ("<relevance>", "</relevance>", "<analysis>", "</analysis>", "<answer>",
                  "</answer>")
COMPACT_CUE = "Response:\n"


class ArenaTask:
  name = "arena"

  def __init__(self, config):
    self.config = config
    sel = sources.select(config.data, seed=config.seed)
    self.train, self.eval, self.corpus = sel.train, sel.eval, sel.corpus
    self.max_chars = config.data.max_passage_chars or None
    self.weights = dict(config.reward)
    self.tokenizer = _tokenizer(config, self)
    self.use_chat = bool(config.model.chat_template and
                         getattr(self.tokenizer, "chat_template", None))

  # ---------------------------------------------------------------- prompts
  def prompt_text(self, ex) -> str:
    if self.config.data.prompt_style == "compact":
      return (prompts.format_references(prompts.passages_of(ex), self.max_chars) +
              f"\nQuestion: {ex.question}\n{COMPACT_CUE}")
    return prompts.prompt_for(ex, self.max_chars)

  def prompt_ids(self, ex) -> list:
    if self.use_chat:
      from rlrag_jax.models import encode_prompt
      return encode_prompt(self.tokenizer, prompts.messages_for(ex, self.max_chars))
    return self.tokenizer(self.prompt_text(ex), add_special_tokens=False)["input_ids"]

  def sft_target(self, ex) -> str:
    return sft.gold_completion(ex, style=self.config.data.analysis_style)

  def sft_target_ids(self, ex) -> list:
    eos = self.tokenizer.eos_token_id
    ids = self.tokenizer(self.sft_target(ex), add_special_tokens=False)["input_ids"]
    return ids + ([eos] if eos is not None else [])

  # ---------------------------------------------------------------- rollouts and rewards
  def decode(self, ids: Sequence[int]) -> str:
    return self.tokenizer.decode(list(ids), skip_special_tokens=False).replace(
        self.tokenizer.eos_token or "\x00", "").strip()

  def rollout(self, policy, examples, rng, *, group_size=1, greedy=False):
    return single_turn(policy, examples, self.prompt_ids, self.decode, rng,
                       group_size=group_size, greedy=greedy)

  def reward(self, episode, step: int = 0) -> dict:
    ex = episode.example
    return rewards.reward(episode.text, ex.answers, prompts.reference_numbers(ex).gold,
                          **self.weights)

  def eval_metrics(self, episode) -> dict:
    ex = episode.example
    r = self.reward(episode)
    answer = parsing.parse(episode.text).answer or ""
    return {"em": metrics.exact_match(answer, ex.answers), "f1": metrics.f1(answer, ex.answers),
            "format": r["format"], "relevance": r["relevance"], "accuracy": r["accuracy"],
            "reward": r["total"], "prediction": answer}

  def tokenizer_texts(self):
    """Texts a from-scratch tokenizer is trained on: prompts and gold replies."""
    for ex in list(self.train) + list(self.eval):
      yield self.prompt_text(ex)
      yield self.sft_target(ex)


def _tokenizer(config, task):
  from rlrag_jax.data.tokenizer import tokenizer_for
  return tokenizer_for(config.model, config.workdir, task.tokenizer_texts, SPECIAL_TOKENS)


def make_task(config) -> ArenaTask:
  return ArenaTask(config)
