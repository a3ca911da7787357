"""The shared training pipeline over any `Task`: its stages (SFT warm-up, RL, ...), then the
evaluation, report and export.

Data flows one way: task data -> rollout (sampling + environment + rewards) -> learner (loss,
update) -> checkpoint. The pipeline knows nothing of any one method; `config.method` names the
task. The parts live in `rlrag_jax.training`: steps (model and jitted updates), learners
(rl.algo), collection (rollouts, dynamic sampling), stages (the loops, resume), report,
compiles; run directories and auxiliary models are read by `rlrag_jax.run_dirs`.
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
  `RLTask.sibling_baselines`)."""
  name = f"{type(task).__name__} ({config.method})"
  if config_base.stage_runs(config.rl):
    if not isinstance(task, tasks.RLTask):
      raise ValueError(f"config keys 'rl.steps' / 'rl.epochs' are {config.rl.steps} / "
                       f"{config.rl.epochs}, but {name} is trained by SFT only (a tasks.Task, "
                       "not a tasks.RLTask); set both to 0")
    if task.group_size is not None and int(config.rl.group_size) != task.group_size:
      raise ValueError(f"config key 'rl.group_size' is {config.rl.group_size}, but {name} "
                       f"collects groups of {task.group_size} (set rl.group_size="
                       f"{task.group_size})")
    if (config.rl.algo == "ppo" and config.rl.ppo.critic == "tree_mc"
        and not task.sibling_baselines):
      raise ValueError(f"config key 'rl.ppo.critic' is 'tree_mc', whose values come from "
                       f"sibling branches, but {name} collects none (every advantage would be "
                       "0); use a value model ('separate' or 'head') or a tree rollout")
  for stage in ("sft", "rl"):
    sec = config[stage]
    if not config_base.stage_runs(sec):
      continue
    keys = (f"config keys '{stage}.steps' / '{stage}.epochs' are {sec.steps} / {sec.epochs}")
    if not task.train:
      raise ValueError(f"{keys}, but {type(task).__name__} ({config.method}) has no training "
                       "examples (see the log above)")


def run(config, *, resume: bool = False, progress: bool = True,
        stop_after: Optional[int] = None, force: bool = False) -> Optional[RunResult]:
  """Trains as `config` says. `stop_after=k` abandons the run right after global step k, without
  any final save (what a killed process leaves behind: checkpoints up to the last interval).

  A value outside what its key allows is a `config_check.ConfigError`, before anything is built.
  A workdir that already holds a run of another config (`rlrag_jax.fingerprint`) is a
  `fingerprint.ConfigMismatch` naming the differing keys, raised before anything is built;
  `force=True` starts anyway and records that it did in `<workdir>/fingerprint.json`.
  """
  config_check.check(config)
  identity = fingerprint.verify(config.workdir, config, force=force)
  _enable_compile_cache(config)             # before _setup: building the model compiles
  r = _setup(config, stop_after)
  if jax.process_index() == 0:              # after _setup: a start that fails there is no run
    fingerprint.record(r.workdir, identity, resume=resume)
  if resume:
    r.resume()
  config = r.config                         # with <stage>.steps computed from <stage>.epochs
  if r.step == 0 and r.lengths:             # the epochs' counts in metrics.jsonl, at step 0
    r.rlog.write(0, "schedule", {k: v for length in r.lengths.values()
                                 for k, v in length.metrics().items()})
  if r.state is None:
    r.state = r.steps.new_state(r.params, r.stage)
  r.params = None
  plan = stages.plan(config)
  r.bar = report.progress_bar(plan[-1][1] if plan else 0, r.step, progress)
  t_start = time.time()
  r.compiles = compiles.CompileCounter()        # compile/count and compile/seconds per step
  try:
    for stage, end in plan:
      stage.enter(r)
      stage.loop(r, end)
  except stages.Stopped:
    r.close_checkpoints()
    r.compiles.close()
    return None
  except judge.EndpointFailing:       # the judge or reader is down: the last checkpoint is
    if r.bar is not None:             # written in full, so --resume goes on once it is back
      r.bar.close()
    r.close_checkpoints()
    r.compiles.close()
    raise
  if r.bar is not None:
    r.bar.close()
  if config.checkpoint.every and r.ckpt.latest_step() != r.step:
    r.save("rl")
  r.restore_best()                    # with validation on: evaluate and export the best state
  r.close_checkpoints()
  r.compiles.close()
  log.info("XLA compiles over the run: %s", r.compiles.summary())
  log.debug("XLA compiles by program:\n  %s", "\n  ".join(r.compiles.by_function_lines()))
  label = report.final_label(config)
  after = r.evaluate(label)
  r.rlog.write(r.step, "eval_after", after["all"])
  report.write_report(r.workdir, r.rlog, r.before, after, time.time() - t_start, label)
  r.task.report(r.workdir, r.rlog, tasks.EvalSetup(
      policy=r.eval_policy.with_params(r.state.params), examples=r.eval_examples,
      batch_size=int(config.eval.batch_size), seed=int(config.seed)))
  if config.export_hf:
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
  from rlrag_jax.checkpoint import CheckpointManager
  from rlrag_jax.models import sharding
  if config.distributed.initialize:
    sharding.maybe_initialize_distributed(
        coordinator_address=config.distributed.coordinator_address or None,
        num_processes=config.distributed.num_processes or None,
        process_id=None if config.distributed.process_id < 0 else config.distributed.process_id)
  workdir = pathlib.Path(config.workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  spec = config.model.get("train_config", "")
  if config.model.init == "hf" and spec and not run_dirs.trained(config.model.path):
    # The policy starts from a run that its own config trains once (as models.* do).
    train_once("model", config.model.path, spec)
  task = get_task(config.method, config)
  _check_stages(task, config)
  tok = task.tokenizer
  model_cfg, params = build_model(config, tok)
  hf_io.write_config(model_cfg, workdir / "model")          # what export/evaluate rebuild from
  tok.save_pretrained(str(workdir / "model"))
  log.info("model: %s params, %d train / %d eval examples", f"{model_cfg.num_params():,}",
           len(task.train), len(task.eval))
  mesh = sharding.make_mesh(**dict(config.mesh))
  train_missing(config.models)
  run_dirs.bind(task, run_dirs.load_models(config.models, mesh))
  # From here on the config's <stage>.steps are the run's lengths (<stage>.epochs counted over
  # the task's data: stages.resolve_steps).
  items = sft_samples(task, config)
  config, lengths = stages.resolve_steps(config, task.train, items)
  steps = Steps(config, model_cfg, mesh, int(config.sft.steps), int(config.rl.steps))
  pad = tok.pad_token_id if tok.pad_token_id is not None else 0
  policy = Policy(model_cfg, None, temperature=config.rl.temperature, top_k=config.rl.top_k,
                  top_p=config.rl.top_p, max_new_tokens=config.rl.max_new_tokens,
                  eos_ids=tuple(model_cfg.eos_token_id), pad_id=pad,
                  rows_per_call=int(config.eval.batch_size))
  sft_iter, rl_iter = stage_iterators(task.train, config, sft_items=items)
  r = stages.Run(
      config=config, task=task, workdir=workdir, model_cfg=model_cfg, mesh=mesh, steps=steps,
      learner=learners.make_learner(config, steps, mesh, model_cfg, pad),
      ckpt=CheckpointManager(workdir / "checkpoints", max_to_keep=config.checkpoint.keep),
      rlog=runlog.RunLog(workdir), policy=policy,
      eval_policy=dataclasses.replace(policy, max_new_tokens=config.eval.max_new_tokens),
      eval_examples=sources.cut_eval(list(task.eval), config.eval.num_examples,
                                     "eval.num_examples"),
      iterators={"sft": sft_iter, "rl": rl_iter},
      evaluate_fn=functools.partial(_evaluate, eval_judge=judge.from_config(
          config.eval, prompt=task.judge_prompt,
          where="eval")),
      base_key=jax.random.PRNGKey(config.seed), pad=pad, stop_after=stop_after,
      stage="sft" if int(config.sft.steps) > 0 else "rl", params=params, lengths=lengths,
      val_examples=list(task.validation))
  if int(config.eval.val_every) > 0:
    if not r.val_examples:
      raise ValueError(f"config key 'eval.val_every' is {config.eval.val_every} but the task "
                       "has no validation examples: set data.val_mix (e.g. 'musique:train:150'), "
                       "or eval.val_every=0")
    r.early = early_stop.EarlyStopping(patience=int(config.eval.early_stop_patience))
  return r


def _evaluate(task, policy, examples, config, desc, eval_judge=None):
  """`evaluation.evaluate`; with eval.judge_url set, `eval_judge` (the task's `judge_prompt`: by
  default the neutral one) adds the 'judge' accuracy column, as `python -m rlrag_jax.evaluate`
  does."""
  return evaluation.evaluate(task, policy, examples, batch_size=config.eval.batch_size,
                             seed=config.seed, desc=desc, judge=eval_judge)


def train_missing(models_cfg) -> None:
  """Trains every entry of config section `models` that names a `train_config` and whose `path`
  holds no trained run yet (`train_once`); `run_dirs.load_models` then loads them all."""
  for name in sorted(models_cfg or {}):
    entry = models_cfg[name]
    path = entry.get("path", "") if hasattr(entry, "get") else ""
    spec = entry.get("train_config", "") if hasattr(entry, "get") else ""
    if path and spec and not run_dirs.trained(path):
      train_once(name, path, spec)


def train_once(name: str, path, spec: str) -> None:
  """Trains `spec` (config file[:preset]) into `path`, resuming a run a kill interrupted.
  Processes started together (experiments.seeds --parallel) take a file lock: one trains, the
  others wait for it and then load its run."""
  import fcntl
  from rlrag_jax import config_base
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
    run(config, resume=True, progress=False)


def task_for_checkpoint(config, path, step: Optional[int] = None) -> tuple:
  """(task, lm) for evaluating a trained checkpoint under `config`: the LM of `path` (as
  `run_dirs.load_trained`), and the config's task built with that run's own tokenizer (a run
  directory) or with the HF checkpoint as its model, its auxiliary models bound (trained first
  where missing). Raises FileNotFoundError (from `run_dirs.load_trained`) for a path that holds
  neither."""
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
