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

  # Optional: `report(workdir, runlog)` writes method-specific plots/tables after training.


def get_task(name: str, config) -> Task:
  """Imports `rlrag_jax.methods.<name>.task` and calls its `make_task(config)`."""
  try:
    mod = importlib.import_module(f"rlrag_jax.methods.{name}.task")
  except ModuleNotFoundError as e:
    raise ValueError(f"config key 'method' is {name!r}, but rlrag_jax/methods/{name}/task.py "
                     f"does not exist ({e})") from None
  return mod.make_task(config)
