"""Auxiliary models: extra LMs a method uses besides the policy (a frozen reader or generator, a
second separately trained model), named in the config's `models` section:

  c.models.reader = ml_collections.ConfigDict(dict(path="runs/reader"))   # run dir or HF dir

Each is loaded once (with its own tokenizer), its params placed on the trainer's mesh by the
shared rule table, and handed to the task through `task.bind_models({name: LM})` before
training or evaluation. They are frozen: nothing here updates them.

An entry may name the config that trains it, `train_config="configs/x.py[:preset]"`: when `path`
holds no trained run yet, that config is trained once into `path` first (its own workdir is
replaced by `path`), and every later run reuses it. A method's CPU default thus needs no manual
step for its frozen helper (e.g. R2AG's generator).
"""
from __future__ import annotations

import dataclasses
import logging

import jax

from rlrag_jax.models import DecoderLM, sharding

log = logging.getLogger("rlrag_jax.aux_models")


def load(models_cfg, mesh) -> dict:
  """{name: LM} for every entry of `models`, params sharded over `mesh`."""
  from rlrag_jax.trainer import load_trained
  out = {}
  for name in sorted(models_cfg or {}):
    entry = models_cfg[name]
    path = entry.get("path", "") if hasattr(entry, "get") else ""
    if not path:
      raise ValueError(f"config key 'models.{name}.path' is empty; set a training run directory "
                       "or a Hugging Face checkpoint directory")
    train_config = entry.get("train_config", "") if hasattr(entry, "get") else ""
    if train_config and not trained(path):
      train_once(name, path, train_config)
    try:
      step = entry.get("step", None)        # a run dir's checkpoint step; None or < 0: latest
      lm = load_trained(path, step=None if step is None or int(step) < 0 else int(step))
    except FileNotFoundError as e:
      raise FileNotFoundError(f"config key 'models.{name}.path': {e}") from None
    shardings = sharding.param_shardings(DecoderLM(lm.config), mesh)
    params = jax.device_put(lm.params, shardings)
    out[name] = dataclasses.replace(lm, params=params)
    log.info("auxiliary model %r: %s (%s params)", name, path, f"{lm.config.num_params():,}")
  return out


def trained(path) -> bool:
  """Whether `path` holds a finished training run or an HF checkpoint directory."""
  import pathlib
  p = pathlib.Path(path).expanduser()
  if (p / "config.json").exists() and not (p / "checkpoints").exists():
    return True                      # a Hugging Face checkpoint directory
  ckpt = p / "checkpoints"
  return (p / "eval_summary.json").exists() and ckpt.is_dir() and any(ckpt.iterdir())


def train_once(name: str, path, spec: str) -> None:
  """Trains `spec` (config file[:preset]) into `path`, resuming a run a kill interrupted.
  Processes started together (experiments.seeds --parallel) take a file lock: one trains, the
  others wait for it and then load its run."""
  import fcntl
  import pathlib
  from rlrag_jax import config_base, trainer
  p = pathlib.Path(path).expanduser()
  p.parent.mkdir(parents=True, exist_ok=True)
  with open(p.parent / f".{p.name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if trained(p):
      return
    config = config_base.load_config_file(spec)
    config.workdir = str(p)
    log.info("auxiliary model %r: no trained run at %s; training it once with %s", name, p,
             spec)
    trainer.run(config, resume=True, progress=False)


def bind(task, models: dict) -> None:
  """Hands the auxiliary models to the task; an error if it has no use for them."""
  if not models:
    return
  if not hasattr(task, "bind_models"):
    raise ValueError(f"config section 'models' names {sorted(models)}, but the "
                     f"{getattr(task, 'name', type(task).__name__)} task takes no auxiliary "
                     "models (it has no bind_models hook)")
  task.bind_models(models)
