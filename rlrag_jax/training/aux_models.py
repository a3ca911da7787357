"""Auxiliary models: extra LMs a method uses besides the policy (a frozen reader or generator, a
second separately trained model), named in the config's `models` section:

  c.models.reader = ml_collections.ConfigDict(dict(path="runs/reader"))   # run dir or HF dir

Each is loaded once (with its own tokenizer), its params placed on the trainer's mesh by the
shared rule table, and handed to the task through `task.bind_models({name: LM})` before
training or evaluation. They are frozen: nothing here trains them.
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
    try:
      lm = load_trained(path, step=entry.get("step", None))
    except FileNotFoundError as e:
      raise FileNotFoundError(f"config key 'models.{name}.path': {e}") from None
    shardings = sharding.param_shardings(DecoderLM(lm.config), mesh)
    params = jax.device_put(lm.params, shardings)
    out[name] = dataclasses.replace(lm, params=params)
    log.info("auxiliary model %r: %s (%s params)", name, path, f"{lm.config.num_params():,}")
  return out


def bind(task, models: dict) -> None:
  """Hands the auxiliary models to the task; an error if it has no use for them."""
  if not models:
    return
  if not hasattr(task, "bind_models"):
    raise ValueError(f"config section 'models' names {sorted(models)}, but the "
                     f"{getattr(task, 'name', type(task).__name__)} task takes no auxiliary "
                     "models (it has no bind_models hook)")
  task.bind_models(models)
