"""The contract between the shared engine and a method folder, and the lookup by name.

A method (`rlrag_jax/methods/<name>/task.py`) provides `make_task(config) -> Task`. Two small
abstract classes make the contract:

  Task      a model trained by SFT and evaluated: its SFT samples (`sft_samples`) and its
            evaluation (`evaluate` -> `EvalRow`s). An SFT-only role (a frozen reader, a
            generator, an executor) is a plain `Task`.
  RLTask    a `Task` trained by RL as well: `collect` draws one step's `Group`s.

`SingleStreamTask` is a kit over `RLTask` for the common case, one stream of tokens per
example (ARENA, the search agent, the APEX planner): a method writes its prompt, its SFT
target, its rollout and its batch reward and evaluation metrics; the kit turns them into the
contract (one Group per example, a greedy evaluation) and holds the glue every constructor
repeats (data selection, tokenizer, chat flag, EOS). The trainer, evaluator and experiments only
talk to these classes, so shared layers never import a method.
"""
from __future__ import annotations

import abc
import dataclasses
import importlib
import numbers
import types
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence

from rlrag_jax import judge as judge_lib


class Example(Protocol):
  """What the engine reads of an example (a `data.schema.Example` or a method's own type):
  `question` and `answers` for the LLM judge (`eval.judge_url`), `id` for the evaluation's
  rows. An evaluation also reads `hops` and `source` where an example has them (the per-hop
  and per-dataset breakdowns). Everything else about an example is the method's."""
  id: Any
  question: str
  answers: Sequence[str]


# One SFT sample: (prompt ids, target ids ending with EOS, loss mask over the target or None:
# train on the whole target).
SFTSample = tuple


@dataclasses.dataclass
class Episode:
  """One finished rollout of one example: what the policy produced and what the env added.

  The fields after `info` are the ones the engine reads beyond the tokens; `info` is the
  method's own (turns, queries, retrieved ids, roles, ...) and the engine reads none of it,
  except the key that `rl.ppo.whiten_by` names. Which group an episode belongs to is the
  `Group` it is collected in (the engine's ids: `training.batch.Batch.group_ids`).
  """
  example: Any
  prompt_ids: list
  completion_ids: list          # everything after the prompt (policy + environment tokens)
  loss_mask: list               # 1 where the policy wrote the token
  text: str                     # decoded completion
  info: dict = dataclasses.field(default_factory=dict)   # the method's: turns, queries, ...
  # One reward per completion token (PPO's GAE uses them instead of the outcome reward on the
  # last policy token); None: the outcome reward.
  token_rewards: Optional[list] = None
  # The Monte-Carlo value of the episode's state, e.g. its parent node's return in a rollout
  # tree (`rollout.tree.Decision.base`): the value of every token with
  # rl.ppo.critic='tree_mc', which refuses an episode without one.
  baseline: Optional[float] = None


def _numbers(what: str, values: Mapping) -> None:
  for k, v in values.items():
    if not isinstance(v, numbers.Real):
      raise ValueError(f"{what}: {k!r} is {v!r}; expected a number")


@dataclasses.dataclass(frozen=True)
class Group:
  """Episodes that the group-relative advantages compare with each other: a prompt's
  `rl.group_size` samples, or a tree decision's sibling branches (any size). The unit of
  `RLTask.collect`, of dynamic sampling (a group whose rewards do not vary is dropped) and of
  padding (`training.batch`: whole silenced groups).

  episodes  the group's `Episode`s (at least one)
  rewards   one reward dict per episode, in order: numbers with a 'total' (what the learners
            train on), the same keys for every episode; each key's mean over a step is logged
            as 'reward/<key>'
  metrics   the method's statistics of the draw the group came from (a tree's leaf reward,
            a forest level): numbers, logged with the rewards as 'reward/<key>' (each key's
            mean over the step's episodes), never trained on
  padding   a silenced copy (`training.batch.silence_group`; the engine's only): loss masks
            zero, advantage 0
  """
  episodes: tuple
  rewards: tuple
  metrics: Mapping = dataclasses.field(default_factory=dict)
  padding: bool = False

  def __post_init__(self):
    object.__setattr__(self, "episodes", tuple(self.episodes))
    object.__setattr__(self, "rewards", tuple(self.rewards))
    object.__setattr__(self, "metrics", types.MappingProxyType(dict(self.metrics)))
    n = len(self.episodes)
    if not n or len(self.rewards) != n:
      raise ValueError(f"Group: {n} episodes and {len(self.rewards)} reward dicts; expected "
                       "equal, non-zero counts")
    keys = list(self.rewards[0])
    for i, r in enumerate(self.rewards):
      if "total" not in r:
        raise ValueError(f"Group: reward dict {i} has no 'total' (keys {sorted(r)})")
      if sorted(r) != sorted(keys):
        raise ValueError(f"Group: reward dict {i} has keys {sorted(r)}, reward dict 0 "
                         f"{sorted(keys)}; expected the same keys for every episode")
      _numbers(f"Group: reward dict {i}", r)
    _numbers("Group.metrics", self.metrics)
    overlap = sorted(set(keys) & set(self.metrics))
    if overlap:
      raise ValueError(f"Group: {overlap} are both reward keys and metrics; both are logged "
                       "as 'reward/<key>'")


@dataclasses.dataclass(frozen=True)
class EvalRow:
  """One evaluated example: `Task.evaluate` returns one per example, in order.

  prediction  the answer string (the LLM judge's input, `eval.judge_url`)
  metrics     numbers, averaged over the evaluation (and per hop count and per dataset)
  completion  the decoded output kept in the row's 'completion' (default: the prediction)
  """
  example: Any
  prediction: str
  metrics: Mapping
  completion: Optional[str] = None

  def __post_init__(self):
    if "prediction" in self.metrics:
      raise ValueError("EvalRow.metrics holds 'prediction'; it is the row's `prediction` field")


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
  """A model the shared engine trains by SFT and evaluates (trainer, evaluation, experiments).

  Required: the data attributes below (set by the subclass, usually in `__init__`) and the two
  abstract methods, `sft_samples` and `evaluate`; a subclass missing one cannot be
  instantiated. Every other member has a working default. The engine calls members; it never
  asks whether a task has one. A task trained by RL too is an `RLTask`.
  """
  # ------------------------------------------------------------------ required data
  name: str                     # the method's name (config key 'method')
  tokenizer: Any
  train: Sequence[Any]          # training examples (`Example`s)
  eval: Sequence[Any]           # held-out examples

  # ------------------------------------------------------------------ optional data
  # Held-out examples for model selection while training (data.val_mix; eval.val_every,
  # eval.early_stop_patience): disjoint from train and eval.
  validation: Sequence[Any] = ()
  # The LLM judge's prompt for the 'judge' accuracy column (eval.judge_url).
  judge_prompt: judge_lib.JudgePrompt = judge_lib.DEFAULT_PROMPT

  # ------------------------------------------------------------------ required methods
  @abc.abstractmethod
  def sft_samples(self, example) -> list:
    """The example's SFT samples, [(prompt_ids, target_ids, loss_mask or None), ...]: one
    (a prompt and its gold reply) or several (one per agent role or turn), [] for none. The
    target ends with EOS; the mask (over the target) is 0 on tokens the environment wrote, None
    trains on the whole target. Called once per training example when SFT runs; SFT batches
    the samples (`sft.epochs` counts passes over them)."""

  @abc.abstractmethod
  def evaluate(self, policy: Callable, examples: Sequence[Any], rng) -> list:
    """One `EvalRow` per example, in order: the evaluation of `examples` (one batch of
    `eval.batch_size`) with `policy` (greedy unless the method says otherwise)."""

  # ------------------------------------------------------------------ optional methods
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


class RLTask(Task):
  """A `Task` trained by RL as well: `collect` draws the groups of an RL step."""
  # The rl.group_size the task's `collect` is built for (SPARKLE: one tree per question), None:
  # any; the trainer refuses another before the RL stage.
  group_size: Optional[int] = None
  # Whether `collect`'s groups are a tree's branches with each episode's Episode.baseline from
  # its siblings: rl.ppo.critic 'tree_mc' takes its values from them and needs them.
  sibling_baselines: bool = False

  @abc.abstractmethod
  def collect(self, policy: Callable, examples: Sequence[Any], rng, *, group_size: int,
              want: int, step: int) -> list:
    """One draw of an RL step's groups (list[Group]). The engine calls it once a step, and
    again with fresh `examples` while `rl.dynamic_sampling` refills dropped groups; it drops
    flat groups, pads, and silences the padding for every task, so a task returns what it
    drew. `examples` is one drawn batch of `rl.prompts_per_step` prompts; `want` is how many
    groups the step still needs (a hint); `group_size` is `rl.group_size`; `step` is the RL
    step (1: the first, whatever the SFT warm-up's length). Episodes may set
    `Episode.token_rewards` (PPO) and `Episode.baseline` (rl.ppo.critic='tree_mc')."""


class SingleStreamTask(RLTask):
  """The kit for one stream of tokens per example. A subclass writes `prompt_ids`,
  `sft_target_ids`, `rollout`, `rewards` and `eval_metrics`; the kit makes of them:

    sft_samples  one sample per example: prompt, target, `sft_loss_mask`
    collect      `group_size` `rollout` samples per example, scored by `rewards`, one Group
                 per example (no metrics)
    evaluate     the greedy `rollout` (`eval_rollout`), scored by `eval_metrics`, whose
                 'prediction' becomes the row's prediction and the decoded text its completion

  and the constructor glue: `select_data`, `use_tokenizer` (the tokenizer and the chat flag),
  `eos`."""
  use_chat: bool = False

  # ------------------------------------------------------------------ what a method writes
  @abc.abstractmethod
  def prompt_ids(self, example) -> list:
    """Token ids of the example's prompt."""

  @abc.abstractmethod
  def sft_target_ids(self, example) -> list:
    """Token ids of the SFT target (ending with EOS)."""

  @abc.abstractmethod
  def rollout(self, policy: Callable, examples: Sequence[Any], rng, *, group_size: int = 1,
              greedy: bool = False) -> list:
    """list[Episode], group-major: `group_size` episodes per example (example i's at
    [i*G, (i+1)*G)), sampled with `policy` (greedy when `greedy`)."""

  @abc.abstractmethod
  def rewards(self, episodes: Sequence[Episode], step: int = 0) -> list:
    """A reward dict per episode, with a 'total' key; never raises on malformed model output
    (a scored failure instead). `step` is the RL step (1: the first; 0 outside training)."""

  @abc.abstractmethod
  def eval_metrics(self, episodes: Sequence[Episode]) -> list:
    """A metrics dict per greedy episode: numbers, plus a 'prediction' string (the judge's
    input)."""

  # ------------------------------------------------------------------ optional
  def sft_loss_mask(self, example) -> Optional[list]:
    """Per target token, 0 where the environment wrote it (retrieved passages in a multi-turn
    gold trajectory), else 1; None: train on the whole target."""
    return None

  def eval_rollout(self, policy: Callable, examples: Sequence[Any], rng) -> list:
    """The evaluation's episodes, one per example; by default the greedy `rollout`."""
    return self.rollout(policy, examples, rng, group_size=1, greedy=True)

  # ------------------------------------------------------------------ the contract
  def sft_samples(self, example) -> list:
    return [(self.prompt_ids(example), self.sft_target_ids(example),
             self.sft_loss_mask(example))]

  def collect(self, policy, examples, rng, *, group_size, want, step) -> list:
    del want
    eps = list(self.rollout(policy, examples, rng, group_size=group_size))
    scores = list(self.rewards(eps, step))
    if len(scores) != len(eps):
      raise ValueError(f"{type(self).__name__}.rewards returned {len(scores)} reward dicts for "
                       f"{len(eps)} episodes")
    return [Group(eps[i:i + group_size], scores[i:i + group_size])
            for i in range(0, len(eps), group_size)]

  def evaluate(self, policy, examples, rng) -> list:
    eps = list(self.eval_rollout(policy, examples, rng))
    return eval_rows(eps, self.eval_metrics(eps))

  # ------------------------------------------------------------------ constructor glue
  def select_data(self, config):
    """The config's data selection (`data.sources.select(config.data, seed=config.seed)`)."""
    return select_data(config)

  def use_tokenizer(self, config, special_tokens) -> None:
    """Sets `tokenizer` and `use_chat` (`tasks.use_tokenizer`)."""
    use_tokenizer(self, config, special_tokens)

  def eos(self) -> list:
    """[EOS id], or [] for a tokenizer without one."""
    return eos(self.tokenizer)


def eval_rows(episodes: Sequence[Episode], metrics: Sequence[Mapping]) -> list:
  """The `EvalRow`s of evaluated episodes: per episode its metrics, whose 'prediction' (a
  string; '' without one) becomes the row's prediction, and its decoded text the completion."""
  rows = []
  for ep, m in zip(episodes, metrics, strict=True):
    m = dict(m)
    rows.append(EvalRow(ep.example, m.pop("prediction", ""), m, completion=ep.text))
  return rows


# ------------------------------------------------------------------------ glue for any Task
def select_data(config):
  """The config's data selection: `data.sources.select(config.data, seed=config.seed)`."""
  from rlrag_jax.data import sources
  return sources.select(config.data, seed=config.seed)


def use_tokenizer(task, config, special_tokens, *, chat: bool = True) -> None:
  """Sets `task.tokenizer` (`data.tokenizer.tokenizer_for`: the config model's, or one trained
  on `task.tokenizer_texts` with `special_tokens`) and `task.use_chat` (the model's chat
  template, when `model.chat_template` asks for it and `chat`)."""
  from rlrag_jax.data.tokenizer import tokenizer_for
  tok = tokenizer_for(config.model, config.workdir, task.tokenizer_texts, special_tokens)
  task.tokenizer = tok
  task.use_chat = bool(chat and config.model.chat_template and getattr(tok, "chat_template", None))


def eos(tokenizer) -> list:
  """[the tokenizer's EOS id], or [] without one."""
  e = tokenizer.eos_token_id
  return [e] if e is not None else []


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
