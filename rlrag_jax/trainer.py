"""The shared training pipeline over any `Task`: its stages (SFT warm-up, RL, ...), then the
evaluation, report and export.

Data flows one way: task data -> rollout (sampling + environment + rewards) -> learner (loss,
update) -> checkpoint. The pipeline knows nothing of any one method; `config.method` names the
task. The parts live in `rlrag_jax.training`: steps (model and jitted updates), learners
(rl.algo), collection (rollouts, dynamic sampling), stages (the loops, resume), report,
compiles; run directories and auxiliary models are read by `rlrag_jax.run_dirs`. The engine's
config sections are parsed once into `rlrag_jax.settings.Settings`, which the parts read.

The runs a config depends on (`model.train_config`: the run the policy starts from;
`models.<name>.train_config`: an auxiliary reader or generator) are trained by
`train_dependencies`, the step `python -m rlrag_jax.train` takes before `run`; `run` only loads
them, and refuses a config whose dependency has no finished run yet.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import pathlib
import time
from typing import Any, Optional

import jax

from rlrag_jax import (compile_cache, config_base, config_check, evaluation, fingerprint, judge,
                       run_dirs, runlog, tasks)
from rlrag_jax import settings as settings_lib
from rlrag_jax.data import sources
from rlrag_jax.models import LM, ModelConfig, hf_io, save_hf
from rlrag_jax.rollout.policy import Policy
from rlrag_jax.tasks import get_task
from rlrag_jax.training import compiles, early_stop, learners, report, stages
from rlrag_jax.training.stages import sft_samples, stage_iterators  # noqa: F401 (re-exported)
from rlrag_jax.training.steps import Steps, build_model  # noqa: F401 (re-exported)

log = logging.getLogger("rlrag_jax.trainer")


@dataclasses.dataclass
class RunResult:
  workdir: pathlib.Path
  before: Optional[dict]
  after: Optional[dict]
  model_config: ModelConfig
  params: Any


def _check_stages(task, config) -> None:
  """Refuses RL for a task that is not an `RLTask` (an SFT-only role), a stage with no
  examples, and RL settings its groups do not fit (`RLTask.group_size`,
  `RLTask.sibling_baselines`). `config`: the run's config (its `method`) or, with it, its
  parsed settings (`settings.of`)."""
  settings = settings_lib.of(config)
  name = f"{type(task).__name__} ({config.method})"
  rl = settings.rl
  if rl.runs:
    if not isinstance(task, tasks.RLTask):
      raise ValueError(f"config keys 'rl.steps' / 'rl.epochs' are {rl.steps} / {rl.epochs}, "
                       f"but {name} is trained by SFT only (a tasks.Task, not a "
                       "tasks.RLTask); set both to 0")
    if task.group_size is not None and rl.group_size != task.group_size:
      raise ValueError(f"config key 'rl.group_size' is {rl.group_size}, but {name} "
                       f"collects groups of {task.group_size} (set rl.group_size="
                       f"{task.group_size})")
    if rl.algo == "ppo" and rl.ppo.critic == "tree_mc" and not task.sibling_baselines:
      raise ValueError(f"config key 'rl.ppo.critic' is 'tree_mc', whose values come from "
                       f"sibling branches, but {name} collects none (every advantage would be "
                       "0); use a value model ('separate' or 'head') or a tree rollout")
  for stage in ("sft", "rl"):
    sec = settings.stage(stage)
    if not sec.runs:
      continue
    keys = (f"config keys '{stage}.steps' / '{stage}.epochs' are {sec.steps} / {sec.epochs}")
    if not task.train:
      raise ValueError(f"{keys}, but {name} has no training examples (see the log above)")


def run(config, *, resume: bool = False, progress: bool = True,
        stop_after: Optional[int] = None, force: bool = False) -> Optional[RunResult]:
  """Trains as `config` says. `stop_after=k` abandons the run right after global step k, without
  any final save (what a killed process leaves behind: checkpoints up to the last interval).

  A value outside what its key allows is a `config_check.ConfigError`, before anything is built.
  A workdir that already holds a run of another config (`rlrag_jax.fingerprint`) is a
  `fingerprint.ConfigMismatch` naming the differing keys, raised before anything is built;
  `force=True` starts anyway and records that it did in `<workdir>/fingerprint.json`. The runs
  the config depends on must be trained (`train_dependencies`, which `python -m
  rlrag_jax.train` runs first); a missing one is a FileNotFoundError naming its key.
  """
  config_check.check(config)
  identity = fingerprint.verify(config.workdir, config, force=force)
  _enable_compile_cache(config)             # before _setup: building the model compiles
  r = _setup(config, stop_after)
  if jax.process_index() == 0:              # after _setup: a start that fails there is no run
    fingerprint.record(r.workdir, identity, resume=resume)
  if resume:
    r.resume()
  if r.step == 0 and r.lengths:             # the epochs' counts in metrics.jsonl, at step 0
    r.rlog.write(0, "schedule", {k: v for length in r.lengths.values()
                                 for k, v in length.metrics().items()})
  if r.state is None:
    r.state = r.steps.new_state(r.params, r.stage)
  r.params = None
  t_start = time.time()
  if not _train(r, progress):
    return None
  return _finish(r, time.time() - t_start)


def _train(r: stages.Run, progress: bool) -> bool:
  """The stages' loops over `r` (False: stopped after `stop_after`), checkpoints closed; an
  unreachable judge or reader stops the run with its last checkpoint written in full, so that
  --resume goes on once it is back."""
  plan = stages.plan(r.settings)
  r.bar = report.progress_bar(plan[-1][1] if plan else 0, r.step, progress)
  r.compiles = compiles.CompileCounter()        # compile/count and compile/seconds per step
  try:
    for stage, end in plan:
      stage.enter(r)
      stage.loop(r, end)
  except stages.Stopped:
    r.close_checkpoints()
    r.compiles.close()
    return False
  except judge.EndpointFailing:
    if r.bar is not None:
      r.bar.close()
    r.close_checkpoints()
    r.compiles.close()
    raise
  if r.bar is not None:
    r.bar.close()
  if r.settings.checkpoint.every and r.ckpt.latest_step() != r.step:
    r.save("rl")
  r.restore_best()                    # with validation on: evaluate and export the best state
  r.close_checkpoints()
  r.compiles.close()
  log.info("XLA compiles over the run: %s", r.compiles.summary())
  log.debug("XLA compiles by program:\n  %s", "\n  ".join(r.compiles.by_function_lines()))
  return True


def _finish(r: stages.Run, seconds: float) -> RunResult:
  """The final evaluation, report, the task's own report and the HF export of a trained run."""
  label = report.final_label(r.settings)
  after = r.evaluate(label)
  r.rlog.write(r.step, "eval_after", after["all"])
  report.write_report(r.workdir, r.rlog, r.before, after, seconds, label)
  r.task.report(r.workdir, r.rlog, tasks.EvalSetup(
      policy=r.eval_policy.with_params(r.state.params), examples=r.eval_examples,
      batch_size=r.settings.eval.batch_size, seed=r.settings.seed))
  if r.settings.export_hf:
    save_hf(LM(r.model_cfg, jax.device_get(r.state.params), r.task.tokenizer), r.workdir / "hf")
  r.rlog.close()
  return RunResult(r.workdir, r.before, after, r.model_cfg, r.state.params)


def _enable_compile_cache(config) -> None:
  spec = config.get("compile_cache", "auto")
  path = compile_cache.enable(spec)
  if path is None:
    log.info("persistent compilation cache: off (compile_cache=%r)", spec)
  else:
    log.info("persistent compilation cache: on, in %s (compile_cache=%r)", path, spec)


def _setup(config, stop_after) -> stages.Run:
  """The run's task, model, mesh, jitted steps, learner, checkpoints, log and iterators."""
  from rlrag_jax.models import sharding
  _initialize_distributed(config)
  workdir = pathlib.Path(config.workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  check_dependencies(config)
  task = get_task(config.method, config)
  _check_stages(task, config)
  tok = task.tokenizer
  model_cfg, params = build_model(config, tok)
  hf_io.write_config(model_cfg, workdir / "model")          # what export/evaluate rebuild from
  tok.save_pretrained(str(workdir / "model"))
  log.info("model: %s params, %d train / %d eval examples", f"{model_cfg.num_params():,}",
           len(task.train), len(task.eval))
  mesh = sharding.make_mesh(**dict(config.mesh))
  run_dirs.bind(task, run_dirs.load_models(config.models, mesh))
  # From here on the config's <stage>.steps are the run's lengths (<stage>.epochs counted over
  # the task's data: stages.resolve_steps), and so are its settings'.
  items = sft_samples(task, config)
  config, lengths = stages.resolve_steps(config, task.train, items)
  settings = settings_lib.Settings.from_config(config)
  pad = tok.pad_token_id if tok.pad_token_id is not None else 0
  steps = Steps(settings, model_cfg, mesh, settings.sft.steps, settings.rl.steps)
  policy = _policy(settings, model_cfg, pad)
  sft_iter, rl_iter = stage_iterators(task.train, settings, sft_items=items)
  r = stages.Run(
      config=config, settings=settings, task=task, workdir=workdir, model_cfg=model_cfg,
      mesh=mesh, steps=steps, learner=learners.make_learner(config, steps, mesh, model_cfg, pad),
      ckpt=_checkpoints(workdir, settings), rlog=runlog.RunLog(workdir), policy=policy,
      eval_policy=dataclasses.replace(policy, max_new_tokens=settings.eval.max_new_tokens),
      eval_examples=sources.cut_eval(list(task.eval), settings.eval.num_examples,
                                     "eval.num_examples"),
      iterators={"sft": sft_iter, "rl": rl_iter},
      evaluate_fn=functools.partial(_evaluate, eval_judge=judge.from_config(
          settings.eval, prompt=task.judge_prompt, where="eval")),
      base_key=jax.random.PRNGKey(settings.seed), pad=pad, stop_after=stop_after,
      stage="sft" if settings.sft.steps > 0 else "rl", params=params, lengths=lengths,
      val_examples=list(task.validation))
  r.early = _early_stopping(settings, r.val_examples)
  return r


def _initialize_distributed(config) -> None:
  from rlrag_jax.models import sharding
  d = config.distributed
  if d.initialize:
    sharding.maybe_initialize_distributed(
        coordinator_address=d.coordinator_address or None,
        num_processes=d.num_processes or None,
        process_id=None if d.process_id < 0 else d.process_id)


def _policy(settings, model_cfg, pad: int) -> Policy:
  """The RL sampling policy (rl.temperature, top_k, top_p, max_new_tokens), params unset."""
  rl = settings.rl
  return Policy(model_cfg, None, temperature=rl.temperature, top_k=rl.top_k, top_p=rl.top_p,
                max_new_tokens=rl.max_new_tokens, eos_ids=tuple(model_cfg.eos_token_id),
                pad_id=pad, rows_per_call=settings.eval.batch_size)


def _checkpoints(workdir: pathlib.Path, settings):
  from rlrag_jax.checkpoint import CheckpointManager
  return CheckpointManager(workdir / "checkpoints", max_to_keep=settings.checkpoint.keep)


def _early_stopping(settings, val_examples) -> Optional[early_stop.EarlyStopping]:
  """With eval.val_every > 0: the validation's bookkeeping (refused without validation
  examples); None otherwise."""
  ev = settings.eval
  if ev.val_every <= 0:
    return None
  if not val_examples:
    raise ValueError(f"config key 'eval.val_every' is {ev.val_every} but the task "
                     "has no validation examples: set data.val_mix (e.g. 'musique:train:150'), "
                     "or eval.val_every=0")
  return early_stop.EarlyStopping(patience=ev.early_stop_patience)


def _evaluate(task, policy, examples, settings, desc, eval_judge=None):
  """`evaluation.evaluate`; with eval.judge_url set, `eval_judge` (the task's `judge_prompt`: by
  default the neutral one) adds the 'judge' accuracy column, as `python -m rlrag_jax.evaluate`
  does."""
  return evaluation.evaluate(task, policy, examples, batch_size=settings.eval.batch_size,
                             seed=settings.seed, desc=desc, judge=eval_judge)


# ------------------------------------------------------------------------------ dependencies
def dependencies(config) -> list:
  """[(name, path, spec)] of the runs `config` depends on: `model.train_config` (name 'model':
  with model.init 'hf', the run the policy starts from) and every `models.<name>.train_config`
  (an auxiliary model), each with the `path` it trains into; entries without a train_config
  (a path to load as it is) are not dependencies."""
  out = []
  spec = config.model.get("train_config", "")
  if config.model.init == "hf" and spec:
    out.append(("model", config.model.path, spec))
  return out + _model_dependencies(config.models)


def _model_dependencies(models_cfg) -> list:
  out = []
  for name in sorted(models_cfg or {}):
    entry = models_cfg[name]
    path = entry.get("path", "") if hasattr(entry, "get") else ""
    spec = entry.get("train_config", "") if hasattr(entry, "get") else ""
    if path and spec:
      out.append((name, path, spec))
  return out


def train_dependencies(config, *, force: bool = False) -> None:
  """The dependency step: trains every run `config` depends on (`dependencies`) whose `path`
  holds no finished run yet (`train_once`), in order (the policy's start, then the auxiliary
  models by name), before `run(config)`, which only loads them. The checks `run` starts with
  come first (a bad value, a workdir holding a run of another config unless `force`), so that
  nothing trains for a run that would be refused."""
  config_check.check(config)
  found = fingerprint.check(config.workdir, config)
  if found.status == "differs" and not force:
    raise fingerprint.ConfigMismatch(fingerprint.mismatch_message(config.workdir, found))
  for name, path, spec in dependencies(config):
    if not run_dirs.trained(path):
      train_once(name, path, spec)


def check_dependencies(config) -> None:
  """Refuses a config whose dependency (`dependencies`) has no finished run at its path: the
  dependency step (`train_dependencies`) trains it first."""
  for name, path, spec in dependencies(config):
    if not run_dirs.trained(path):
      key = "model.path" if name == "model" else f"models.{name}.path"
      raise FileNotFoundError(
          f"config key '{key}' is {str(path)!r}, which holds no finished run yet; it names "
          f"train_config={spec!r}: train it first (python -m rlrag_jax.train does, by "
          "trainer.train_dependencies)")


def train_missing(models_cfg) -> None:
  """Trains every entry of config section `models` that names a `train_config` and whose `path`
  holds no trained run yet (`train_once`): the auxiliary models of a checkpoint evaluated under
  a config (`task_for_checkpoint`); `run_dirs.load_models` then loads them all."""
  for name, path, spec in _model_dependencies(models_cfg):
    if not run_dirs.trained(path):
      train_once(name, path, spec)


def train_once(name: str, path, spec: str) -> None:
  """Trains `spec` (config file[:preset]) into `path` (its own dependencies first), resuming a
  run a kill interrupted. Processes started together (experiments.seeds --parallel) take a file
  lock: one trains, the others wait for it and then load its run."""
  import fcntl
  p = pathlib.Path(path).expanduser()
  p.parent.mkdir(parents=True, exist_ok=True)
  with open(p.parent / f".{p.name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if run_dirs.trained(p):
      return
    config = config_base.load_config_file(spec)
    config.workdir = str(p)
    log.info("auxiliary model %r: no trained run at %s; training it once with %s", name, p,
             spec)
    train_dependencies(config)
    run(config, resume=True, progress=False)


def task_for_checkpoint(config, path, step: Optional[int] = None) -> tuple:
  """(task, lm) for evaluating a trained checkpoint under `config`: the LM of `path` (as
  `run_dirs.load_trained`), and the config's task built with that run's own tokenizer (a run
  directory) or with the HF checkpoint as its model, its auxiliary models bound (trained first
  where missing: `train_missing`). Raises FileNotFoundError (from `run_dirs.load_trained`) for
  a path that holds neither."""
  from rlrag_jax.models.sharding import make_mesh
  config_check.check(config)
  lm = run_dirs.load_trained(path, step=step)
  ckpt = pathlib.Path(path)
  if (ckpt / "model").is_dir():               # the run's own tokenizer
    config.workdir = str(ckpt)
  elif config.model.init == "hf" or (ckpt / "config.json").exists():
    config.model.init, config.model.path = "hf", str(ckpt)
  task = get_task(config.method, config)
  train_missing(config.models)
  run_dirs.bind(task, run_dirs.load_models(config.models, make_mesh()))
  return task, lm
