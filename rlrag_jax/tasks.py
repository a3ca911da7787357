"""The contract between the shared engine and a method folder, and the lookup by name.

A method (`rlrag_jax/methods/<name>/task.py`) provides `make_task(config) -> Task`, a subclass
of `Task` below. The trainer, evaluator and experiments only talk to this class, so shared
layers never import a method.
"""
from __future__ import annotations

import abc
import dataclasses
import importlib
from typing import Any, Callable, Hashable, Optional, Sequence

from rlrag_jax import judge as judge_lib


@dataclasses.dataclass
class Episode:
  """One finished rollout of one example: what the policy produced and what the env added.

  The fields after `info` (but `group`, the method's own) are the ones the engine reads
  beyond the tokens; `info` is the method's own (turns, queries, retrieved ids, roles, ...) and the engine reads none of it,
  except the key that `rl.ppo.whiten_by` names.
  """
  example: Any
  prompt_ids: list
  completion_ids: list          # everything after the prompt (policy + environment tokens)
  loss_mask: list               # 1 where the policy wrote the token
  text: str                     # decoded completion
  info: dict = dataclasses.field(default_factory=dict)   # the method's: turns, queries, ...
  # The method's own name for the episode's group (a tree decision's parent node): the engine
  # does not read it. What the group-relative advantages compare is the `Group` that `collect`
  # returned the episode in; the engine numbers those groups itself (`training.batch`).
  group: Optional[Hashable] = None
  # One reward per completion token (PPO's GAE uses them instead of the outcome reward on the
  # last policy token); None: the outcome reward.
  token_rewards: Optional[list] = None
  # The Monte-Carlo value of the episode's state, e.g. its parent node's return in a rollout
  # tree (`rollout.tree.Decision.base`): the value of every token with
  # rl.ppo.critic='tree_mc', which refuses an episode without one.
  baseline: Optional[float] = None
  # A padding copy (`training.batch.silence`): its loss mask is all zero, it only keeps a
  # batch's shape.
  padding: bool = False


@dataclasses.dataclass
class Group:
  """Episodes that the group-relative advantages compare with each other, with their reward
  dicts (one per episode, in order): a prompt's `rl.group_size` samples, or a tree decision's
  sibling branches (any size). The unit of `Task.collect`, of dynamic sampling (a group whose
  rewards do not vary is dropped) and of padding (`training.batch`: whole silenced groups)."""
  episodes: list
  scores: list


@dataclasses.dataclass(frozen=True)
class EvalSetup:
  """How the engine evaluated the final params, handed to `Task.report`: a report that
  evaluates more (reference pipelines on the same questions) uses these instead of reading
  config sections `eval` / `rl`."""
  policy: Callable              # the final params' evaluation policy (eval.max_new_tokens,
                                # rl.temperature / top_k / top_p, eval.batch_size rows a call)
  examples: Sequence[Any]       # the evaluation's examples (eval.num_examples of `Task.eval`)
  batch_size: int               # eval.batch_size
  seed: int                     # the run's seed (the evaluation's rollout keys)


class Task(abc.ABC):
  """What the shared engine (trainer, evaluation, experiments) knows of a method.

  Required: the data attributes below (set by the subclass, usually in `__init__`) and the
  abstract methods; a subclass missing one of those methods cannot be instantiated. Every
  other member has a default that is the engine's single-stream behaviour, so a task overrides
  only what it does differently. The engine calls members; it never asks whether a task has one.
  """
  # ------------------------------------------------------------------ required data
  name: str                     # the method's name (config key 'method')
  tokenizer: Any
  train: Sequence[Any]          # training examples
  eval: Sequence[Any]           # held-out examples

  # ------------------------------------------------------------------ optional data
  # The training stages the task supports: the trainer refuses a config that trains another
  # (an SFT-only role: ('sft',)).
  stages: tuple = ("sft", "rl")
  # Held-out examples for model selection while training (data.val_mix; eval.val_every,
  # eval.early_stop_patience): disjoint from train and eval.
  validation: Sequence[Any] = ()
  # The rl.group_size the task's `collect` is built for (SPARKLE: one tree per question), None:
  # any; the trainer refuses another before the RL stage.
  group_size: Optional[int] = None
  # Whether `collect`'s groups are a tree's branches with each episode's Episode.baseline from
  # its siblings: rl.ppo.critic 'tree_mc' takes its values from them and needs them.
  sibling_baselines: bool = False
  # The LLM judge's prompt for the 'judge' accuracy column (eval.judge_url).
  judge_prompt: judge_lib.JudgePrompt = judge_lib.DEFAULT_PROMPT
  # An alternative engine path, None where the task takes the engine's own:
  #   sft_samples(example) -> [(prompt_ids, target_ids, loss_mask | None), ...]
  #     several SFT samples per example (roles, turns); SFT then batches samples. None: one
  #     sample per example, prompt_ids + sft_target_ids with sft_loss_mask.
  sft_samples: Optional[Callable[[Any], list]] = None

  # ------------------------------------------------------------------ required methods
  @abc.abstractmethod
  def prompt_ids(self, example) -> list:
    """Token ids of the example's prompt."""

  @abc.abstractmethod
  def sft_target_ids(self, example) -> list:
    """Token ids of the SFT target (ending with EOS)."""

  @abc.abstractmethod
  def rollout(self, policy: Callable, examples: Sequence[Any], rng, *, group_size: int = 1,
              greedy: bool = False) -> list:
    """list[Episode], group-major: `group_size` episodes per example, sampled with `policy`
    (greedy when `greedy`)."""

  @abc.abstractmethod
  def reward(self, episode: Episode, step: int = 0) -> dict:
    """Component dict with a 'total' key; never raises on malformed model output. `step` is
    the RL step (1: the first RL step, whatever the SFT warm-up's length; 0 outside
    training)."""

  @abc.abstractmethod
  def eval_metrics(self, episode: Episode) -> dict:
    """Numeric metrics of one greedy episode (plus an optional 'prediction' string for
    judges)."""

  # ------------------------------------------------------------------ optional methods
  def sft_loss_mask(self, example) -> Optional[list]:
    """Per target token, 0 where the environment wrote it (e.g. retrieved passages in a
    multi-turn gold trajectory), else 1; None: train on the whole target."""
    return None

  def rewards(self, episodes: Sequence[Episode], step: int = 0) -> list:
    """Reward dicts of a whole rollout batch (override for one batched call, e.g. one encoder
    call a batch); by default `reward` per episode."""
    return [self.reward(e, step) for e in episodes]

  def collect(self, policy: Callable, examples: Sequence[Any], rng, *, group_size: int,
              want: int, step: int) -> list:
    """One draw of an RL step's groups (list[Group]). The engine calls it once a step, and
    again with fresh `examples` while `rl.dynamic_sampling` refills dropped groups; it drops
    flat groups, pads, and silences the padding for every task, so a task returns what it
    drew. `want` is how many groups the step still needs (a hint: `examples` is one drawn
    batch of `rl.prompts_per_step` prompts).

    By default `group_size` `rollout` samples per example, scored by `rewards`, one Group per
    example. Override for rollouts that are not one stream per example: a tree of decisions
    (a Group per decision's sibling branches, any size), a forest that draws
    its own questions (`examples` unused); episodes may also set `Episode.token_rewards`
    (PPO) and `Episode.baseline` (rl.ppo.critic='tree_mc')."""
    eps = list(self.rollout(policy, examples, rng, group_size=group_size))
    scores = score(self, eps, step)
    return [Group(eps[i:i + group_size], scores[i:i + group_size])
            for i in range(0, len(eps), group_size)]

  def eval_rollout(self, policy: Callable, examples: Sequence[Any], rng) -> list:
    """The evaluation's episodes, one per example; by default the greedy `rollout`."""
    return self.rollout(policy, examples, rng, group_size=1, greedy=True)

  def eval_metrics_batch(self, episodes: Sequence[Episode]) -> list:
    """`eval_metrics` of a whole evaluation batch (override for one call a batch)."""
    return [self.eval_metrics(e) for e in episodes]

  def state_dict(self) -> dict:
    """JSON state the task grows while training (e.g. a pool built from its own rollouts),
    saved in every checkpoint; none by default."""
    return {}

  def load_state_dict(self, state: dict) -> None:
    """Restores what `state_dict` returned (on resume)."""

  def bind_models(self, models: dict) -> None:
    """Receives the config's auxiliary models ({name: LM}: a frozen reader, ...). A task that
    takes none refuses them."""
    if models:
      raise ValueError(f"config section 'models' names {sorted(models)}, but the {self.name} "
                       "task takes no auxiliary models (it does not override "
                       "Task.bind_models)")

  def monitors(self) -> list:
    """The task's external endpoints as `judge.FailureMonitor`s (an LLM judge, an endpoint
    reader): their calls and failures are logged per RL step and per evaluation as
    '<name>/...'; none by default."""
    return []

  def eval_report(self, result: dict) -> str:
    """The method's own summary of an evaluation result (`evaluation.evaluate`'s dict: 'all',
    per hop and dataset, and the per-example 'rows'), printed by `python -m rlrag_jax.evaluate`
    after the shared table; '' (nothing) by default."""
    del result
    return ""

  def report(self, workdir, runlog, setup: EvalSetup) -> None:
    """Method-specific plots and tables after training, given the run log and how the final
    evaluation ran (`setup`); none by default."""


def score(task: Task, episodes: Sequence[Episode], step: int) -> list:
  """The reward dicts of `episodes` at RL step `step` (`Task.rewards`), one per episode."""
  out = list(task.rewards(episodes, step))
  if len(out) != len(episodes):
    raise ValueError(f"{type(task).__name__}.rewards returned {len(out)} reward dicts for "
                     f"{len(episodes)} episodes")
  return out


def get_task(name: str, config) -> Task:
  """Imports `rlrag_jax.methods.<name>.task` and calls its `make_task(config)`."""
  try:
    mod = importlib.import_module(f"rlrag_jax.methods.{name}.task")
  except ModuleNotFoundError as e:
    raise ValueError(f"config key 'method' is {name!r}, but rlrag_jax/methods/{name}/task.py "
                     f"does not exist ({e})") from None
  task = mod.make_task(config)
  if not isinstance(task, Task):
    raise TypeError(f"rlrag_jax/methods/{name}/task.py: make_task returned a "
                    f"{type(task).__name__}, which is not a subclass of rlrag_jax.tasks.Task")
  return task
