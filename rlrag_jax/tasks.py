"""The contract between the shared trainer and a method folder, and the lookup by name.

A method (`rlrag_jax/methods/<name>/task.py`) provides `make_task(config) -> Task`. The trainer,
evaluator and benchmarks only talk to this protocol, so shared layers never import a method.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Optional, Protocol, Sequence


@dataclasses.dataclass
class Episode:
  """One finished rollout of one example: what the policy produced and what the env added."""
  example: Any
  prompt_ids: list
  completion_ids: list          # everything after the prompt (policy + environment tokens)
  loss_mask: list               # 1 where the policy wrote the token
  text: str                     # decoded completion
  info: dict = dataclasses.field(default_factory=dict)   # turns, queries, retrieved ids, ...


class Task(Protocol):
  name: str
  tokenizer: Any
  train: Sequence[Any]          # training examples
  eval: Sequence[Any]           # held-out examples
  # Optional: `validation: Sequence[Any]`, held-out examples for model selection while training
  # (data.val_mix; eval.val_every, eval.early_stop_patience): disjoint from train and eval.

  def prompt_ids(self, example) -> list: ...

  def sft_target(self, example) -> str: ...

  def sft_target_ids(self, example) -> list: ...
  """Token ids of the SFT target (ending with EOS)."""

  # Optional: `sft_loss_mask(example) -> list` (same length as sft_target_ids) with 0 on target
  # tokens the environment wrote (e.g. retrieved passages in a multi-turn gold trajectory).

  def rollout(self, policy: Callable, examples: Sequence[Any], rng, *, group_size: int,
              greedy: bool = False) -> list: ...
  """`policy(prompt_ids, rng, greedy)` samples continuations; returns list[Episode] (group-major)."""

  def reward(self, episode: Episode, step: int) -> dict: ...
  """Component dict with a 'total' key; never raises on malformed model output."""

  def eval_metrics(self, episode: Episode) -> dict: ...
  """Numeric metrics of one greedy episode (plus an optional 'prediction' string for judges)."""

  # Optional hooks (the shared trainer's defaults are the behaviour without them):
  #   report(workdir, runlog)          method-specific plots/tables after training.
  #   rewards(episodes, step)          batched rewards (one encoder call a batch), instead of
  #                                    reward() per episode.
  #   collect(policy, examples, rng, *, group_size, step) -> (episodes, reward dicts)
  #                                    rollouts that are not one stream per example (e.g.
  #                                    `rollout.tree.expand`); episodes may set
  #                                    info['group'] (who is compared with whom) and
  #                                    info['token_rewards'] (per-token rewards, PPO).
  #   sft_samples(example) -> [(prompt_ids, target_ids, loss_mask | None), ...]
  #                                    several SFT samples per example (roles, turns).
  #   eval_rollout(policy, examples, rng) -> episodes
  #                                    evaluation that differs from training rollouts.
  #   eval_metrics_batch(episodes) -> [dict, ...]
  #                                    eval_metrics for a whole evaluation batch at once.
  #   state_dict() / load_state_dict(d)  JSON state the task grows while training (e.g. a
  #                                    training pool from its own rollouts); checkpointed.
  #   bind_models({name: LM})          the config's auxiliary models (frozen reader, ...).
  #   monitors() -> [judge.FailureMonitor]
  #                                    the external endpoints the task calls (an LLM judge, an
  #                                    endpoint reader): their calls and failures are logged
  #                                    per RL step and per evaluation as '<name>/...'.


def monitors_of(task) -> list:
  """The task's endpoint failure monitors (its optional `monitors()` hook; [] without it)."""
  return list(task.monitors()) if hasattr(task, "monitors") else []


def validation_of(task) -> list:
  """The task's validation examples (its optional `validation`; [] without it)."""
  return list(task.validation) if hasattr(task, "validation") else []


def get_task(name: str, config) -> Task:
  """Imports `rlrag_jax.methods.<name>.task` and calls its `make_task(config)`."""
  try:
    mod = importlib.import_module(f"rlrag_jax.methods.{name}.task")
  except ModuleNotFoundError as e:
    raise ValueError(f"config key 'method' is {name!r}, but rlrag_jax/methods/{name}/task.py "
                     f"does not exist ({e})") from None
  return mod.make_task(config)
