"""The engine's own config sections parsed once into frozen dataclasses, with the values each
key may take beside them (Levanter: a component's config is a typed tree parsed once).

`Settings.from_config(config)` reads the top-level keys the trainer uses (seed, stages,
log_every, export_hf) and the sections `sft`, `rl` (with `rl.ppo`), `eval` and `checkpoint`;
every key of those sections is a field and every field a key (`section`), and each value is
cast once to its field's type, as the readers used to cast it where they read it. The trainer
and the stages then pass the parsed settings around, never the raw keys.

The allowed values (`ALGOS`, `KL_ESTIMATORS`, `AGGREGATIONS`, `CRITICS`, ...) are constants here,
so that `config_check` reads them without importing the engine: this module imports nothing of
rlrag_jax, and sits below every layer that reads a config (tests/test_layering.py). The engine's
own tables (`rl.kl.KL_ESTIMATORS`, `rl.losses.AGGREGATIONS`, ...) are checked against these
(tests/test_settings.py).

`section(cls, cfg, where)` is the one way a section becomes a dataclass, for the engine here and
for every method's `settings.py` (through `config_base.section`).
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Union

# ------------------------------------------------------------------------------ allowed values
STAGES = ("sft", "rl")                           # config key `stages` (training.stages.STAGES)
BATCH_KEYS = {"sft": "batch_size", "rl": "prompts_per_step"}   # a stage's batch key
OUTCOME_ALGOS = ("grpo", "dr_grpo", "rloo")      # rl.advantages.ADVANTAGE_ESTIMATORS
ALGOS = OUTCOME_ALGOS + ("ppo",)                 # rl.algo (rl.batching.ALGOS)
CRITICS = ("separate", "head", "tree_mc")        # rl.ppo.critic (training.learners.CRITICS)
# rl.kl_form: where rl.kl_beta's KL(policy || ref) acts: 'loss' (a term of the policy loss,
# GRPO's form) or 'reward' (PPO only: -kl_beta * KL on every policy token's reward before GAE,
# the OpenRLHF / InstructGPT form; the loss term is then off).
KL_FORMS = ("loss", "reward")
KL_ESTIMATORS = ("k1", "k2", "k3")               # rl.kl_estimator (rl.kl.KL_ESTIMATORS)
AGGREGATIONS = ("sequence_mean", "token_mean", "constant")   # rl.aggregation (rl.losses)
SCHEDULES = ("cosine", "linear", "constant")     # <stage>.lr_schedule (rl.optim_state)
HEAD_BACKWARDS = ("auto", "fused", "autodiff")   # <stage>.head_backward (rl.logprobs)
MODEL_INITS = ("scratch", "hf")                  # model.init (training.steps.build_model)


class ConfigError(ValueError):
  """A config value outside what its key allows (`config_check.check`), or a section whose keys
  are not its dataclass's fields (`section`)."""


def section(cls, cfg, where: str):
  """The frozen dataclass `cls` built from config section `cfg` (a ConfigDict or dict) at the
  dotted key `where` ('r2ag', 'sparkle.eval'): the one way a method or the trainer parses its
  section, once, so that every value it reads is a key the config file declares.

  Every key of the section must be a field (an unknown one, often a misspelt one, is an error
  naming it and the allowed keys), and every field of `cls` a key of the section (a missing one
  is an error naming its dotted key: there are no defaults in code). A field whose type is a
  dataclass is parsed from the nested section of that name; every other value is passed through
  as the config holds it (tuples stay tuples, numbers keep their type). Raises `ConfigError`
  (a ValueError).
  """
  if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
    raise TypeError(f"config_base.section: {cls!r} is not a dataclass")
  if cfg is None or not hasattr(cfg, "keys"):
    raise ConfigError(f"config section {where!r} is missing (found {cfg!r}); expected the "
                      f"keys {', '.join(f.name for f in dataclasses.fields(cls))}")
  fields = [f for f in dataclasses.fields(cls) if f.init]
  names = [f.name for f in fields]
  unknown = sorted(k for k in cfg.keys() if k not in names)
  if unknown:
    keys = ", ".join(f"'{where}.{k}'" for k in unknown)
    raise ConfigError(f"config key{'s' if len(unknown) > 1 else ''} {keys} unknown; section "
                      f"{where!r} takes {', '.join(sorted(names))}")
  missing = [n for n in names if n not in cfg]
  if missing:
    keys = ", ".join(f"'{where}.{n}'" for n in missing)
    raise ConfigError(f"config key{'s' if len(missing) > 1 else ''} {keys} "
                      f"{'are' if len(missing) > 1 else 'is'} missing (declare "
                      f"{'them' if len(missing) > 1 else 'it'} in the method's configs/*.py)")
  hints = typing.get_type_hints(cls)
  values = {}
  for n in names:
    t, v = hints.get(n), cfg[n]
    if isinstance(t, type) and dataclasses.is_dataclass(t):
      v = section(t, v, f"{where}.{n}")
    values[n] = v
  return cls(**values)


_CASTS = (bool, int, float, str, tuple)


def parsed(cls, cfg, where: str):
  """`section`, then every int / float / bool / str / tuple field cast to its type (nested
  sections too): the casts the engine's readers applied where they read each key."""
  return _cast(section(cls, cfg, where))


def _cast(obj):
  hints = typing.get_type_hints(type(obj))
  out = {}
  for f in dataclasses.fields(obj):
    v, t = getattr(obj, f.name), hints[f.name]
    if dataclasses.is_dataclass(v):
      v = _cast(v)
    elif t in _CASTS:
      v = t(v)
    out[f.name] = v
  return dataclasses.replace(obj, **out)


def one_of(value: str, allowed: tuple, key: str) -> str:
  if value not in allowed:
    raise ConfigError(f"config key {key!r} is {value!r}; expected one of {allowed}")
  return value


# ------------------------------------------------------------------------------ sections
@dataclasses.dataclass(frozen=True)
class SFTSettings:
  """Config section `sft` (config_base.trainer_config documents each key)."""
  steps: int
  epochs: float
  batch_size: int
  lr: float
  lr_schedule: str
  warmup_ratio: float
  weight_decay: float
  max_len: int
  pack_bucket: int
  group_by_length: int
  prompt_loss: float
  micro_batches: int
  tokens_per_micro_batch: int
  logits_chunk: int
  head_backward: str

  @property
  def runs(self) -> bool:
    """Whether the stage trains: fixed steps or epochs above 0."""
    return self.steps > 0 or self.epochs > 0

  @property
  def token_budget(self) -> int:
    """tokens_per_micro_batch (0: off); negative is refused."""
    if self.tokens_per_micro_batch < 0:
      raise ConfigError(f"config key 'tokens_per_micro_batch' is {self.tokens_per_micro_batch};"
                        " expected 0 (off) or a positive token count")
    return self.tokens_per_micro_batch

  @property
  def equal_micro_batches(self) -> int:
    """The equal-split micro-batch count a step is built with: micro_batches, or 1 when a token
    budget replaces them."""
    return 1 if self.token_budget else self.micro_batches

  @property
  def batch(self) -> int:
    """Items a step on one process (the stage's batch key, `BATCH_KEYS`)."""
    return self.batch_size


@dataclasses.dataclass(frozen=True)
class PPOSettings:
  """Config section `rl.ppo` (read with rl.algo 'ppo')."""
  critic: str
  gamma: float
  lam: float
  vf_lr: float
  vf_clip: float
  whiten: bool
  whiten_by: str
  mini_batches: int
  mini_batch_size: int


@dataclasses.dataclass(frozen=True)
class RLSettings:
  """Config section `rl` (config_base.trainer_config documents each key)."""
  algo: str
  steps: int
  epochs: float
  prompts_per_step: int
  group_size: int
  temperature: float
  top_k: int
  top_p: float
  max_new_tokens: int
  lr: float
  lr_schedule: str
  warmup_ratio: float
  weight_decay: float
  max_grad_norm: float
  kl_beta: float
  kl_estimator: str
  kl_form: str
  clip_eps_low: float
  clip_eps_high: float
  dual_clip: float
  entropy_coef: float
  aggregation: str
  scale_std: bool
  adv_eps: float
  mu: int
  micro_batches: int
  tokens_per_micro_batch: int
  dynamic_sampling: bool
  dynamic_sampling_key: str
  dynamic_max_tries: int
  pack_bucket: int
  logits_chunk: int
  head_backward: str
  ppo: PPOSettings

  runs = SFTSettings.runs
  token_budget = SFTSettings.token_budget
  equal_micro_batches = SFTSettings.equal_micro_batches

  @property
  def batch(self) -> int:
    return self.prompts_per_step

  @property
  def checked_algo(self) -> str:
    return one_of(self.algo, ALGOS, "rl.algo")

  @property
  def checked_kl_form(self) -> str:
    """rl.kl_form, refused where it does not apply ('reward' needs PPO's per-token rewards)."""
    form = one_of(self.kl_form, KL_FORMS, "rl.kl_form")
    if form == "reward" and self.checked_algo != "ppo":
      raise ConfigError(f"config key 'rl.kl_form' is 'reward', which needs per-token rewards "
                        f"(rl.algo 'ppo'); rl.algo is {self.algo!r}: use 'loss'")
    return form

  @property
  def mini_batch_size(self) -> int:
    """rl.ppo.mini_batch_size for PPO (episodes per update; 0: rl.ppo.mini_batches counts
    them), else 0."""
    return self.ppo.mini_batch_size if self.checked_algo == "ppo" else 0

  @property
  def schedule_by_rl_step(self) -> bool:
    """Whether the RL lr schedules count RL steps rather than updates (with
    rl.ppo.mini_batch_size > 0 a step's update count follows its episode count)."""
    return self.mini_batch_size > 0

  def schedule_length(self, rl_steps: int) -> int:
    """The RL lr schedule's length (at least 2): RL steps when `schedule_by_rl_step`, else RL
    steps x rl.mu epochs x the mini-batches of each."""
    if self.schedule_by_rl_step:
      n = int(rl_steps)
    else:
      minis = self.ppo.mini_batches if self.checked_algo == "ppo" else 1
      n = int(rl_steps) * self.mu * minis
    return max(n, 2)


@dataclasses.dataclass(frozen=True)
class EvalSettings:
  """Config section `eval` (config_base.trainer_config documents each key; the judge keys are
  read by `judge.from_config`)."""
  every: int
  num_examples: int
  max_new_tokens: int
  batch_size: int
  judge_url: str
  judge_model: str
  val_every: int
  val_metric: str
  early_stop_patience: int
  judge_concurrency: int
  judge_max_failure_rate: float
  judge_failure_window: int


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
  """Config section `checkpoint`: every (steps between saves; 0: none), keep."""
  every: int
  keep: int


@dataclasses.dataclass(frozen=True)
class Settings:
  """The trainer's settings: the top-level keys it reads and its sections, parsed once."""
  seed: int
  stages: tuple
  log_every: int
  export_hf: bool
  sft: SFTSettings
  rl: RLSettings
  eval: EvalSettings
  checkpoint: CheckpointSettings

  @classmethod
  def from_config(cls, config) -> "Settings":
    return cls(seed=int(config.seed), stages=tuple(config.stages),
               log_every=int(config.log_every), export_hf=bool(config.export_hf),
               sft=parsed(SFTSettings, config.sft, "sft"),
               rl=parsed(RLSettings, config.rl, "rl"),
               eval=parsed(EvalSettings, config.eval, "eval"),
               checkpoint=parsed(CheckpointSettings, config.checkpoint, "checkpoint"))

  def stage(self, name: str) -> Union[SFTSettings, RLSettings]:
    """The section of stage `name` ('sft' or 'rl')."""
    return {"sft": self.sft, "rl": self.rl}[name]

  def with_steps(self, steps: dict) -> "Settings":
    """A copy whose `<stage>.steps` are `steps` ({stage: steps}; training.stages.resolve_steps)."""
    out = self
    for name, n in steps.items():
      out = dataclasses.replace(out, **{name: dataclasses.replace(out.stage(name), steps=int(n))})
    return out


def of(config_or_settings) -> Settings:
  """`Settings` as they are, or parsed from a config (the helpers that tests and tools call with
  a ConfigDict take either)."""
  if isinstance(config_or_settings, Settings):
    return config_or_settings
  return Settings.from_config(config_or_settings)


__all__ = ["Settings", "SFTSettings", "RLSettings", "PPOSettings", "EvalSettings",
           "CheckpointSettings", "ConfigError", "section", "parsed", "of"]
