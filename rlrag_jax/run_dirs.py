"""Reading what training runs wrote: a run directory's model, and the auxiliary models a config
names. Below the trainer and every method, so anything that loads a trained model imports this,
never `rlrag_jax.trainer`.

A run directory is what `trainer.run` writes: `model/` (config.json + tokenizer) and
`checkpoints/` (one folder per step, `rlrag_jax.checkpoint`).

Auxiliary models are extra LMs a method uses besides the policy (a frozen reader or generator, a
second separately trained model), named in the config's `models` section:

  c.models.reader = ml_collections.ConfigDict(dict(path="runs/reader"))   # run dir or HF dir

Each is loaded once (with its own tokenizer), its params placed on the trainer's mesh by the
shared rule table, and handed to the task through `task.bind_models({name: LM})` before
training or evaluation. They are frozen: nothing here updates them. An entry may name the config
that trains it, `train_config="configs/x.py[:preset]"`: the dependency step
(`trainer.train_dependencies`, which `python -m rlrag_jax.train` takes before the run) trains it
once into `path`; the run, and `load_models` itself, only load.
"""
from __future__ import annotations

import dataclasses
import logging
import pathlib
from typing import Optional

from rlrag_jax.models import LM, ModelConfig, hf_io, load_hf

log = logging.getLogger("rlrag_jax.aux_models")


def is_run_dir(path) -> bool:
  """Whether `path` is a training run directory (what `run` writes: model/ + checkpoints/)."""
  p = pathlib.Path(path).expanduser()
  return (p / "checkpoints").is_dir() and (p / "model" / "config.json").exists()


def load_trained(path, step: Optional[int] = None) -> LM:
  """An `LM` from a run directory (its latest or given checkpoint) or from an HF checkpoint dir.

  A run directory is what `run` writes: `model/` (config.json + tokenizer) and `checkpoints/`.
  """
  from rlrag_jax.checkpoint import CheckpointManager
  p = pathlib.Path(path).expanduser()
  if p.name == "checkpoints" and (p.parent / "model").is_dir():
    p = p.parent
  if is_run_dir(p):
    cfg = ModelConfig.from_hf_file(p / "model" / "config.json")
    mgr = CheckpointManager(p / "checkpoints", max_to_keep=None)
    if mgr.latest_step() is None:
      raise FileNotFoundError(f"{p / 'checkpoints'}: no checkpoint saved yet")
    restored = mgr.restore(step=step)
    mgr.close()
    train = restored.state["train"]
    params = train["params"] if isinstance(train, dict) else train.params
    return LM(cfg, params, hf_io.load_tokenizer(p / "model"))
  if (p / "config.json").exists():
    return load_hf(p)
  raise FileNotFoundError(f"{p}: neither a training run directory (model/ + checkpoints/) nor a "
                          "Hugging Face checkpoint directory (config.json)")


def trained(path) -> bool:
  """Whether `path` holds a finished training run or an HF checkpoint directory."""
  p = pathlib.Path(path).expanduser()
  if (p / "config.json").exists() and not (p / "checkpoints").exists():
    return True                      # a Hugging Face checkpoint directory
  ckpt = p / "checkpoints"
  return (p / "eval_summary.json").exists() and ckpt.is_dir() and any(ckpt.iterdir())


def load_models(models_cfg, mesh) -> dict:
  """{name: LM} for every entry of config section `models`, params sharded over `mesh`."""
  import jax
  from rlrag_jax.models import DecoderLM, sharding
  out = {}
  for name in sorted(models_cfg or {}):
    entry = models_cfg[name]
    path = entry.get("path", "") if hasattr(entry, "get") else ""
    if not path:
      raise ValueError(f"config key 'models.{name}.path' is empty; set a training run directory "
                       "or a Hugging Face checkpoint directory")
    try:
      step = entry.get("step", None)        # a run dir's checkpoint step; None or < 0: latest
      lm = load_trained(path, step=None if step is None or int(step) < 0 else int(step))
    except FileNotFoundError as e:
      spec = entry.get("train_config", "")
      hint = (f"; it names train_config={spec!r}, which the dependency step trains first "
              "(trainer.train_dependencies; python -m rlrag_jax.train takes it)" if spec else "")
      raise FileNotFoundError(f"config key 'models.{name}.path': {e}{hint}") from None
    shardings = sharding.param_shardings(DecoderLM(lm.config), mesh)
    params = jax.device_put(lm.params, shardings)
    out[name] = dataclasses.replace(lm, params=params)
    log.info("auxiliary model %r: %s (%s params)", name, path, f"{lm.config.num_params():,}")
  return out


def bind(task, models: dict) -> None:
  """Hands the auxiliary models, if any, to the task (`Task.bind_models`, which refuses them by
  default)."""
  if models:
    task.bind_models(models)
