"""Training stages over one run context: each owns its loop, its data iterator and its evaluations.

`config.stages` lists them in order (default ('sft', 'rl')); a stage with `<name>.steps` = 0 and
`<name>.epochs` = 0 is skipped. A stage's length is `<name>.steps`, or with `<name>.epochs` > 0
steps computed at start-up from the data the run really has (`resolve_steps`, the one place
that turns epochs into steps). Steps are counted globally (SFT 1..S, then RL S+1..S+R), every
step's randomness is `fold_in(seed_key, step)`, and the iterators' positions are checkpointed,
so a resumed run repeats exactly the steps an uninterrupted one takes.

With a validation set (`data.val_mix`, the task's `validation`) and `eval.val_every` > 0, the
RL stage evaluates it every that many RL steps, keeps the best state by `eval.val_metric` under
`<workdir>/best` and stops after `eval.early_stop_patience` validations without a new best
(training.early_stop); the trainer then evaluates, reports and exports the best state.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import pathlib
import time
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from rlrag_jax import judge, runlog
from rlrag_jax import settings as settings_lib
from rlrag_jax.settings import BATCH_KEYS, STAGES as STAGE_NAMES, Settings
from rlrag_jax.data.pipeline import BatchIterator
from rlrag_jax.models import sharding
from rlrag_jax.rl.packing import (logits_start, pack, pack_micro_batch, packed_lengths,
                                   plan_micro_batches)
from rlrag_jax.training import collection, early_stop, learners, report

log = logging.getLogger("rlrag_jax.trainer")


class Stopped(Exception):
  """Raised after global step `stop_after`: the run is abandoned as a killed process is."""


@dataclasses.dataclass
class Run:
  """Everything one training run holds; stages read and advance it. `config` is the raw config
  (saved with each checkpoint, read by the learner and the collection); `settings` its engine
  sections parsed once (`rlrag_jax.settings`), which the stages read; parsed from `config` when
  not given."""
  config: Any
  task: Any
  workdir: pathlib.Path
  model_cfg: Any
  mesh: Any
  steps: Any                   # training.steps.Steps
  learner: Any                 # training.learners.*Learner
  ckpt: Any
  rlog: Any
  policy: Any
  eval_policy: Any
  eval_examples: list
  iterators: dict              # stage name -> BatchIterator | None
  evaluate_fn: Callable        # (task, policy, examples, settings, desc) -> evaluation dict
  base_key: Any
  pad: int
  stop_after: Optional[int] = None
  params: Any = None           # the initial params, until the first TrainState holds them
  state: Any = None
  ref_params: Any = None
  critic: Any = None
  before: Optional[dict] = None
  step: int = 0
  stage: str = "sft"
  bar: Any = None
  compiles: Any = None
  lengths: dict = dataclasses.field(default_factory=dict)   # stage -> Length (epochs counted)
  val_examples: list = dataclasses.field(default_factory=list)   # the task's validation
  early: Optional[early_stop.EarlyStopping] = None   # set when eval.val_every > 0
  best_ckpt: Any = None        # CheckpointManager of <workdir>/best, made on the first best
  settings: Optional[Settings] = None

  def __post_init__(self):
    if self.settings is None:
      self.settings = settings_lib.of(self.config)

  @property
  def sft_total(self) -> int:
    return self.settings.sft.steps

  @property
  def rl_total(self) -> int:
    return self.settings.rl.steps

  def evaluate(self, desc: str, examples: Optional[list] = None) -> dict:
    """The evaluation of the current params on `examples` (default: the evaluation set)."""
    return self.evaluate_fn(self.task, self.eval_policy.with_params(self.state.params),
                            self.eval_examples if examples is None else examples,
                            self.settings, desc)

  def _best_manager(self):
    if self.best_ckpt is None:
      from rlrag_jax.checkpoint import CheckpointManager
      self.best_ckpt = CheckpointManager(self.workdir / "best", max_to_keep=1)
    return self.best_ckpt

  def save_best(self, value: float) -> None:
    """The current state as the best validation's (one kept, under <workdir>/best)."""
    self._best_manager().save(self.step, {"train": self.state},
                              config=self.config.to_json_best_effort(),
                              meta={"stage": "rl", "validation": float(value)}, force=True)

  def restore_best(self) -> bool:
    """With validation on: the state of the best validation step, when it is not the current
    one (True when it restored)."""
    if self.early is None or self.early.best_step is None or self.early.best_step == self.step:
      return False
    target = {"train": self.steps.checkpoint_target()["train"]}
    restored = self._best_manager().restore(target=target, step=int(self.early.best_step))
    self.state = restored.state["train"]
    log.info("the best validation (%s %.4f at step %d) is the final state, not step %d",
             self.settings.eval.val_metric, self.early.best, self.early.best_step, self.step)
    return True

  def close_checkpoints(self) -> None:
    self.ckpt.close()
    if self.best_ckpt is not None:
      self.best_ckpt.close()

  def save(self, stage: str) -> None:
    tree = {"train": self.state}
    if self.steps.with_ref:
      tree["ref"] = self.ref_params if self.ref_params is not None else self.state.params
    if self.critic is not None:
      tree["critic"] = self.critic
    task = self.task
    self.ckpt.save(
        self.step, tree, rng=self.base_key, config=self.config.to_json_best_effort(),
        data_position={**{name: it and it.state_dict() for name, it in self.iterators.items()},
                       # a task's own growing state (e.g. a training pool built from its
                       # rollouts), JSON, through optional state_dict / load_state_dict
                       "task": task.state_dict()},
        meta={"stage": stage, "before": self.before,
              "steps": {"sft": self.sft_total, "rl": self.rl_total},
              **({"early_stop": self.early.state_dict()} if self.early is not None else {})},
        force=True)

  def resume(self) -> bool:
    """Restores the latest checkpoint that restores, if any: state, reference, critic, data
    positions. Newer steps that do not restore (corrupt files) are set aside as
    `<step>.corrupt` with a warning (`checkpoint.CheckpointManager.restore`): this run saves
    those step numbers again."""
    if self.ckpt.latest_step() is None:
      log.info("--resume: no checkpoint under %s, starting fresh", self.ckpt.directory)
      return False

    def target(meta):             # the critic is in the tree from the RL stage on
      with_critic = self.learner.has_critic and meta["stage"] == "rl"
      return self.steps.checkpoint_target(self.learner.abstract_critic() if with_critic
                                          else None)
    restored = self.ckpt.restore_latest(target=target, set_aside_corrupt=True)
    check_resumed_steps(self.settings, restored.meta.get("steps"))
    self.step, self.stage = restored.step, restored.meta["stage"]
    for name, it in self.iterators.items():
      if it is not None and restored.data_position.get(name) is not None:
        it.load_state_dict(restored.data_position[name])
    self.before = restored.meta.get("before")
    if self.early is not None and restored.meta.get("early_stop") is not None:
      self.early.load_state_dict(restored.meta["early_stop"])
    if restored.data_position.get("task") is not None:
      self.task.load_state_dict(restored.data_position["task"])
    self.state = restored.state["train"]
    if self.stage == "rl":
      self.ref_params = restored.state.get("ref")
      self.critic = restored.state.get("critic")
    self.rlog.truncate_after(self.step)
    log.info("resumed from step %d (%s stage)", self.step, self.stage)
    return True

  def finish_step(self, stage: str, metrics: dict) -> None:
    """Logs a step, saves on the interval, stops after `stop_after`."""
    report.log_step(self.rlog, self.step, stage, metrics, self.settings.log_every, self.bar)
    every = self.settings.checkpoint.every
    if every and self.step % every == 0:
      self.save(stage)
    if self.stop_after is not None and self.step >= self.stop_after:
      raise Stopped()


# ------------------------------------------------------------------------------------ SFT
def sft_rows(items) -> tuple:
  """(prompts, targets, masks) of one SFT batch of (prompt, target, mask) samples
  (`Task.sft_samples`); a None mask trains on the whole target."""
  prompts, targets, masks = (list(x) for x in zip(*items))
  return prompts, targets, [m if m is not None else [1] * len(t) for m, t in zip(masks, targets)]


def sft_batches(prompts, targets, masks, sft, pad_id: int, shards: int) -> list:
  """One SFT step's host batches [(batch, logits_start)]: the whole batch, or with
  `sft.tokens_per_micro_batch` its length-sorted micro-batches of at most that many padded
  tokens (`rl.packing.plan_micro_batches`), rows padded to a multiple of `shards`. `sft`:
  `settings.SFTSettings`."""
  packing = dict(pad_id=pad_id, max_len=sft.max_len, bucket=sft.pack_bucket,
                 prompt_loss=sft.prompt_loss)
  budget = sft.token_budget
  if budget:
    plan = plan_micro_batches(*packed_lengths(prompts, targets, sft.max_len), budget,
                              bucket=sft.pack_bucket, shards=shards)
    batches = [pack_micro_batch(prompts, targets, masks, mb, **packing) for mb in plan]
  else:
    batches = [pack(prompts, targets, masks, **packing)]
  return [(b, logits_start(b["loss_mask"], sft.pack_bucket)) for b in batches]


class SFTStage:
  """Supervised warm-up on the task's targets (or its `sft_samples`)."""
  name = "sft"

  def steps(self, settings: Settings) -> int:
    return settings.sft.steps

  def enter(self, run: Run) -> None:
    pass

  def loop(self, run: Run, end: int) -> None:
    sft = run.settings.sft
    it = run.iterators["sft"]
    while run.stage == "sft" and run.step < end:
      run.step += 1
      parts = sft_batches(*sft_rows(next(it)), sft, run.pad,
                          learners.shard_count(run.mesh))
      parts = [(sharding.shard_batch(batch, run.mesh), start) for batch, start in parts]
      if sft.token_budget:
        run.state, m = run.steps.sft_step.accumulated(run.state, parts)
      else:
        run.state, m = run.steps.sft_step(run.state, *parts[0])
      run.finish_step("sft", {**m, **run.compiles.take()})


# ------------------------------------------------------------------------------------ RL
def step_rewards(batch) -> dict:
  """'reward/<key>': each reward key's mean over the step's episodes, then each key of the
  groups' `metrics` (a group's value counted once per episode of it)."""
  out = {}
  for rows in (batch.rewards, batch.metrics):
    for comp in rows[0]:
      out[f"reward/{comp}"] = float(np.mean([r[comp] for r in rows]))
  return out


class RLStage:
  """RL on the task's rollouts: collection (training.collection), then the learner's update."""
  name = "rl"

  def steps(self, settings: Settings) -> int:
    return settings.rl.steps

  def enter(self, run: Run) -> None:
    """The switch from SFT: the warm-up policy is the reference and the "before" baseline."""
    if run.stage == "sft":
      run.stage = "rl"
      if run.rl_total > 0:        # an SFT-only run is evaluated once, at the end
        run.before = run.evaluate("before RL")
        run.rlog.write(run.step, "eval_before", run.before["all"])
      run.state = run.steps.new_state(run.state.params, "rl")
    if run.ref_params is None and run.steps.with_ref:
      run.ref_params = jax.tree_util.tree_map(jnp.copy, run.state.params)
    if run.critic is None and run.learner.has_critic and run.rl_total > 0:
      run.critic = run.learner.init_critic(run.state.params, jax.random.fold_in(run.base_key, 0))
    if run.before is None and run.rl_total > 0:
      run.before = run.evaluate("before RL")
      run.rlog.write(run.step, "eval_before", run.before["all"])

  def loop(self, run: Run, end: int) -> None:
    every = run.settings.eval.every
    while run.step < end and not (run.early is not None and run.early.should_stop):
      run.step += 1
      key = jax.random.fold_in(run.base_key, run.step)
      t0 = time.time()
      endpoints = judge.Span(list(run.task.monitors()))   # judge/..., reader/... of this step
      batch, fill = collection.collect(
          run.task, run.policy.with_params(run.state.params), run.iterators["rl"], key,
          run.config, run.step - run.sft_total)
      rollout_s = time.time() - t0
      run.state, run.critic, m = run.learner.update(run.state, run.critic, batch,
                                                    run.ref_params, jax.random.fold_in(key, 0))
      m.update(step_rewards(batch))
      m["completion_len"] = float(np.mean([sum(e.loss_mask) for e in batch.episodes]))
      m["rollout_s"] = rollout_s
      m["step_s"] = time.time() - t0
      m.update({f"dynamic/{k}": v for k, v in fill.items()})
      m.update(endpoints.metrics())
      m.update(run.compiles.take())
      done = run.step - run.sft_total
      self._validate(run, done, m)       # before the step's save: the checkpoint holds it
      if every and done % every == 0 and run.step < end:
        self._mid_eval(run, done, m)
      else:
        run.finish_step("rl", m)
    if run.early is not None and run.early.should_stop and run.step < end:
      log.info("early stop after RL step %d: %d validations without a better %s than %.4f "
               "(step %d; eval.early_stop_patience=%d)", run.step - run.sft_total,
               run.early.since_best, run.settings.eval.val_metric, run.early.best,
               run.early.best_step, run.early.patience)

  def _validate(self, run: Run, done: int, m: dict) -> None:
    """Every eval.val_every RL steps: the validation set's eval.val_metric, a new best saved."""
    every = run.settings.eval.val_every
    if not every or done % every:
      return
    key = run.settings.eval.val_metric
    val = run.evaluate("validation", run.val_examples)
    run.rlog.write(run.step, "validation", val["all"])
    if key not in val["all"]:
      raise ValueError(f"config key 'eval.val_metric' is {key!r}, which the validation "
                       f"summary does not hold; it holds {sorted(val['all'])}")
    m[f"validation/{key}"] = val["all"][key]
    if run.early.update(run.step, val["all"][key]):
      run.save_best(val["all"][key])

  def _mid_eval(self, run: Run, done: int, m: dict) -> None:
    report.log_step(run.rlog, run.step, "rl", m, run.settings.log_every, run.bar)
    mid = run.evaluate("eval")
    run.rlog.write(run.step, "eval", mid["all"])
    # Per-example rows of this evaluation too (paired comparisons against a mid-run point,
    # e.g. the end of a reward stage): eval_rows_rl<k>.json, k = RL steps done.
    runlog.write_atomic(run.workdir / f"eval_rows_rl{done}.json", json.dumps(
        {"all": mid["all"], "rows": report.slim(mid["rows"])}))
    ckpt_every = run.settings.checkpoint.every
    if ckpt_every and run.step % ckpt_every == 0:
      run.save("rl")
    if run.stop_after is not None and run.step >= run.stop_after:
      raise Stopped()


STAGES = {"sft": SFTStage, "rl": RLStage}
assert tuple(STAGES) == STAGE_NAMES, "settings.STAGES names the stages config_check allows"


def plan(settings) -> list:
  """[(stage, last global step)] in `config.stages` order (config_base: sft then rl);
  `settings`: `rlrag_jax.settings.Settings` (or a config, parsed)."""
  settings = settings_lib.of(settings)
  names = settings.stages
  unknown = [n for n in names if n not in STAGES]
  if unknown or len(set(names)) != len(names):
    raise ValueError(f"config key 'stages' is {names}; expected distinct names from "
                     f"{tuple(STAGES)}")
  out, end = [], 0
  for n in names:
    stage = STAGES[n]()
    end += stage.steps(settings)
    out.append((stage, end))
  return out


# ------------------------------------------------------------------------------------ data
def sft_samples(task, config) -> Optional[list]:
  """The task's SFT samples (`Task.sft_samples(example) -> [(prompt_ids, target_ids, loss_mask
  or None), ...]`: one per example, or several, e.g. one per agent role or turn), flattened
  over the training examples in order; the SFT stage batches them (and `sft.epochs` counts
  passes over them). None when SFT does not run. `config`: the run's config or its parsed
  settings (`settings.of`)."""
  if not settings_lib.of(config).sft.runs:
    return None
  out = []
  for ex in task.train:
    for i, sample in enumerate(task.sft_samples(ex)):
      prompt, target, mask = sample
      if mask is not None and len(mask) != len(target):
        raise ValueError(f"{type(task).__name__}.sft_samples: example "
                         f"{getattr(ex, 'id', ex)!r} sample {i}: loss mask has {len(mask)} "
                         f"entries for {len(target)} target tokens")
      out.append((list(prompt), list(target), None if mask is None else list(mask)))
  return out


def stage_iterators(train, config, sft_items=None) -> tuple[Optional[BatchIterator],
                                                             Optional[BatchIterator]]:
  """(SFT, RL) batch iterators over the training examples (SFT: over `sft_items` when given,
  see `sft_samples`), each built only when its stage runs (steps > 0; else None). A training
  set smaller than a stage's batch is an error naming that stage and its batch key; a stage
  that does not run asks nothing of the data. `config`: `Settings` (or a config, parsed)."""
  settings = settings_lib.of(config)
  out = []
  for stage, seed in (("sft", settings.seed), ("rl", settings.seed + 1)):
    section = settings.stage(stage)
    if section.steps <= 0:
      out.append(None)
      continue
    items = sft_items if stage == "sft" and sft_items is not None else train
    batch, batch_key = section.batch, BATCH_KEYS[stage]
    what = "SFT samples" if items is sft_items else "training examples"
    if len(items) < batch:
      skip = (f"'{stage}.epochs=0'" if section.epochs > 0 else f"'{stage}.steps=0'")
      raise ValueError(
          f"{stage} stage: {len(items)} {what}, fewer than one batch "
          f"(config key '{stage}.{batch_key}' = {batch}); lower it, add data, or set "
          f"{skip} to skip the stage")
    window = section.group_by_length if stage == "sft" else 0
    lengths = [len(x[0]) + len(x[1]) for x in items] if window and items is sft_items else None
    out.append(BatchIterator(items, batch_size=batch, seed=seed, lengths=lengths,
                             length_window=window))
  return tuple(out)


# ------------------------------------------------------------------------------------ length

def epoch_steps(items: int, global_batch: int, epochs: float) -> int:
  """Steps for `epochs` passes over `items` at `global_batch` a step: ceil(epochs * items /
  global_batch), the fewest whose batches hold at least epochs * items samples. (The iterator
  drops each of its epochs' last partial batch and reshuffles, so a sample may be seen once
  more or less than another; the count of samples trained on is what is rounded up.)"""
  exact = epochs * items / global_batch
  return max(1, math.ceil(round(exact, 9)))     # round: 0.3 * 10 / 3 is 1.0000000000000002


@dataclasses.dataclass(frozen=True)
class Length:
  """One stage's length as computed from `<stage>.epochs` (see `resolve_steps`)."""
  stage: str
  items: int          # SFT samples (model calls) or RL training prompts
  global_batch: int   # <stage>.<batch key> x processes
  epochs: float
  steps: int

  def metrics(self) -> dict:
    return {f"{self.stage}/samples": self.items, f"{self.stage}/batch": self.global_batch,
            f"{self.stage}/epochs": self.epochs, f"{self.stage}/steps": self.steps}


def resolve_steps(config, train, sft_items=None, process_count: Optional[int] = None) -> tuple:
  """(config, lengths): where `<stage>.epochs` > 0 (stage 'sft', 'rl'), a copy of `config`
  whose `<stage>.steps` is the number of steps those epochs take over the data this run has:
  SFT over `sft_items` (the task's SFT samples, one model call each) when given, else over
  `train`; RL over `train` (its prompts), at `<stage>.<batch key>` x `process_count` (default
  `jax.process_count()`, as the batch iterators) items a step (`epoch_steps`). `lengths` holds
  a `Length` per such stage, each logged once here. Every consumer of a stage's length (the
  stage plan, the lr schedules, the PPO critic's schedule, the final label) reads the returned
  config's `<stage>.steps` (its settings: `Settings.with_steps`), so this is the only place
  epochs become steps. Without epochs the config comes back as it is. Setting both
  `<stage>.steps` and `<stage>.epochs` is an error naming the two keys. The count is a function
  of the data and config, so a resumed run computes the same one (`check_resumed_steps` makes
  sure)."""
  settings = settings_lib.of(config)
  lengths = {}
  for stage, key in BATCH_KEYS.items():
    section = settings.stage(stage)
    epochs, fixed = section.epochs, section.steps
    if epochs <= 0:
      continue
    if fixed:
      raise ValueError(f"config keys '{stage}.steps' = {fixed} and '{stage}.epochs' = {epochs} "
                       f"are both set; set '{stage}.steps=0' to count epochs, or "
                       f"'{stage}.epochs=0' for a fixed number of steps")
    items = sft_items if stage == "sft" and sft_items is not None else train
    if process_count is None:
      process_count = jax.process_count()
    batch = section.batch * int(process_count)
    lengths[stage] = Length(stage, len(items), batch, epochs,
                            epoch_steps(len(items), batch, epochs))
    what = "SFT samples" if items is sft_items else "training examples"
    log.info("%s stage: %s %s, batch %d ('%s.%s' x %d processes), %g epochs ('%s.epochs') "
             "-> %d steps", stage, f"{len(items):,}", what, batch, stage, key, process_count,
             epochs, stage, lengths[stage].steps)
  if not lengths:
    return config, lengths
  config = copy.deepcopy(config)
  for stage, length in lengths.items():
    config[stage].steps = length.steps
  return config, lengths


def check_resumed_steps(config, saved: Optional[dict]) -> None:
  """A resumed run's stage lengths, where counted in epochs, must be the ones its checkpoint
  was saved with (`saved`: the checkpoint's {'sft': steps, 'rl': steps}; None before such a
  record): otherwise the data changed under the run, and its global step numbers, stage switch
  and lr schedules would no longer be those of the run it resumes. `config`: `Settings` (or a
  config, parsed)."""
  if not saved:
    return
  settings = settings_lib.of(config)
  for stage in BATCH_KEYS:
    section = settings.stage(stage)
    if section.epochs > 0 and int(saved[stage]) != section.steps:
      raise ValueError(
          f"resume: '{stage}.epochs' = {section.epochs:g} gives {section.steps} "
          f"{stage} steps over this start's data, but the checkpoint's run had "
          f"{int(saved[stage])}; the training data (or '{stage}.{BATCH_KEYS[stage]}') changed "
          "since it started")
