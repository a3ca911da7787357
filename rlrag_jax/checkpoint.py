"""Orbax checkpoints of a training run: state (params, optimizer state, step), RNG key, data
position and config, under one directory with one subfolder per step.

  <dir>/<step>/state    the TrainState (or any pytree of arrays; orbax StandardSave, sharded
                        arrays are written shard by shard)
  <dir>/<step>/meta     JSON: step, RNG key data and impl, data position, extra caller fields
  <dir>/<step>/config   JSON: the run's config

Restoring takes a target (a TrainState of arrays or of jax.ShapeDtypeStructs with shardings, e.g.
`rl.abstract_train_state`), so a state saved on one mesh restores onto the target's shardings.
Without a target the arrays come back as saved (same device layout needed). Saves are
asynchronous by default; `wait()` blocks until the last one is on disk.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp

_ITEMS = ("state", "meta", "config")


@dataclasses.dataclass
class Restored:
  state: Any                       # the TrainState, on the target's shardings
  step: int
  rng: Optional[jax.Array]         # the saved key (typed when a typed key was saved), or None
  data_position: dict
  config: Optional[dict]
  meta: dict                       # the extra JSON fields given to save(meta=...)


def _jsonable(config) -> Optional[dict]:
  if config is None:
    return None
  if isinstance(config, str):                                # already JSON
    return json.loads(config)
  if hasattr(config, "to_json_best_effort"):                 # ml_collections.ConfigDict
    return json.loads(config.to_json_best_effort())
  if dataclasses.is_dataclass(config) and not isinstance(config, type):
    config = dataclasses.asdict(config)
  return json.loads(json.dumps(dict(config), default=str))


def _rng_to_json(rng) -> Optional[dict]:
  if rng is None:
    return None
  if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
    impl = str(jax.random.key_impl(rng))
    data = np.asarray(jax.random.key_data(rng))
  else:
    impl, data = None, np.asarray(rng)
  return {"impl": impl, "dtype": data.dtype.name, "shape": list(data.shape),
          "data": data.reshape(-1).tolist()}


def _rng_from_json(d: Optional[dict]):
  if not d:
    return None
  data = np.asarray(d["data"], dtype=d["dtype"]).reshape(d["shape"])
  if d["impl"] is None:
    return jax.numpy.asarray(data)
  return jax.random.wrap_key_data(data, impl=d["impl"])


def abstract_like(tree):
  """Arrays -> jax.ShapeDtypeStructs carrying their shardings (ShapeDtypeStructs pass through)."""
  def one(x):
    if isinstance(x, jax.ShapeDtypeStruct):
      return x
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))
  return jax.tree_util.tree_map(one, tree)


class CheckpointManager:
  """Keeps the newest `max_to_keep` checkpoints of a run under `directory`."""

  def __init__(self, directory: str, max_to_keep: Optional[int] = 3,
               save_interval_steps: int = 1, async_save: bool = True):
    self.directory = os.path.abspath(os.fspath(directory))
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep,
                                           save_interval_steps=save_interval_steps, create=True,
                                           enable_async_checkpointing=async_save)
    self._mgr = ocp.CheckpointManager(self.directory, options=options, item_names=_ITEMS)

  def save(self, step: int, state, *, rng=None, data_position: Optional[dict] = None,
           config=None, meta: Optional[dict] = None, force: bool = False) -> bool:
    """Saves at `step` (skipped, returning False, off the save interval unless `force`).

    Args:
      step: the checkpoint's number.
      state: a TrainState or any pytree of arrays.
      rng: a PRNG key (typed or raw uint32), restored as it was.
      data_position: where the data iterators stand (small JSON dict).
      config: a ConfigDict, dataclass, dict or JSON string.
      meta: extra JSON fields (training stage, evaluation results, ...).
    """
    meta = {"step": int(step), "rng": _rng_to_json(rng), "data_position": dict(data_position or {}),
            "extra": dict(meta or {})}
    json.dumps(meta)   # fail here, with the offending value, rather than in a background thread
    args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta),
                              config=ocp.args.JsonSave(_jsonable(config) or {}))
    return self._mgr.save(int(step), args=args, force=force)

  def restore(self, target=None, step: Optional[int] = None) -> Restored:
    """Restores `step` (default: the latest) onto `target`'s structure, dtypes and shardings
    (without a target: as saved)."""
    self.wait()
    if step is None:
      step = self._mgr.latest_step()
      if step is None:
        raise FileNotFoundError(f"no checkpoint to restore under {self.directory}")
    if step not in self._mgr.all_steps():
      raise FileNotFoundError(f"no checkpoint for step {step} under {self.directory}; found "
                              f"steps {sorted(self._mgr.all_steps())}")
    item = None if target is None else abstract_like(target)
    args = ocp.args.Composite(state=ocp.args.StandardRestore(item),
                              meta=ocp.args.JsonRestore(), config=ocp.args.JsonRestore())
    out = self._mgr.restore(step, args=args)
    meta = out["meta"]
    return Restored(state=out["state"], step=int(meta["step"]), rng=_rng_from_json(meta["rng"]),
                    data_position=meta["data_position"], config=out["config"] or None,
                    meta=meta.get("extra", {}))

  def read_meta(self, step: Optional[int] = None) -> dict:
    """The extra meta fields saved with `step` (default: the latest), without the state: e.g.
    the training stage, which decides the restore target's shape."""
    self.wait()
    step = self._mgr.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint under {self.directory}")
    out = self._mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    return out["meta"].get("extra", {})

  def restore_latest(self, target=None) -> Restored:
    return self.restore(target)

  def latest_step(self) -> Optional[int]:
    return self._mgr.latest_step()

  def all_steps(self) -> list:
    return sorted(self._mgr.all_steps())

  def wait(self):
    self._mgr.wait_until_finished()

  def close(self):
    self._mgr.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def latest_step(directory: str) -> Optional[int]:
  """The newest complete checkpoint step under `directory`, or None (no directory created)."""
  if not os.path.isdir(directory):
    return None
  steps = ocp.utils.checkpoint_steps(directory)
  return max(steps) if steps else None
