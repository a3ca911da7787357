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

Restoring the latest step falls back to the newest step that restores when newer ones do not
(a file truncated or lost after the save), with a warning naming each skipped step and why.
With `set_aside_corrupt` (the trainer's resume, which saves those step numbers again) a skipped
step's folder is renamed `<step>.corrupt`, which Orbax ignores; nothing is deleted.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any, Callable, Optional, Union

import jax
import numpy as np
import orbax.checkpoint as ocp

_ITEMS = ("state", "meta", "config")

log = logging.getLogger("rlrag_jax.checkpoint")


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

  def restore(self, target: Union[Any, Callable[[dict], Any]] = None,
              step: Optional[int] = None, *, set_aside_corrupt: bool = False) -> Restored:
    """Restores `step` onto `target`'s structure, dtypes and shardings (without a target: as
    saved). `target` may be a function of the step's extra meta fields (`read_meta`) that
    returns the target, e.g. one whose shape depends on the saved training stage.

    Without `step`: the latest step that restores. A newer step that fails (a corrupt or
    missing file) is skipped with a warning naming the step and the error, and with
    `set_aside_corrupt` its folder is renamed `<step>.corrupt`. When no step restores, the
    error names each step's failure (and nothing is renamed: the same failure at every step is
    a wrong target, not corruption).
    """
    self.wait()
    if step is not None:
      if step not in self._mgr.all_steps():
        raise FileNotFoundError(f"no checkpoint for step {step} under {self.directory}; found "
                                f"steps {sorted(self._mgr.all_steps())}")
      return self._restore(step, target)
    steps = sorted(self._mgr.all_steps(), reverse=True)
    if not steps:
      raise FileNotFoundError(f"no checkpoint to restore under {self.directory}")
    failed = []
    for s in steps:
      try:
        restored = self._restore(s, target)
      except Exception as e:                # pylint: disable=broad-except  # any failure: next
        failed.append((s, e))
        continue
      for bad, e in failed:
        where = ""
        if set_aside_corrupt:
          where = f"; its folder is set aside as {self._set_aside(bad)}"
        log.warning("checkpoint step %d under %s does not restore (%s: %s); restored step %d "
                    "instead%s", bad, self.directory, type(e).__name__, _first_line(e), s,
                    where)
      if failed and set_aside_corrupt:
        self._mgr.reload()
      return restored
    reasons = "; ".join(f"step {s}: {type(e).__name__}: {_first_line(e)}" for s, e in failed)
    raise RuntimeError(f"no checkpoint under {self.directory} restores: {reasons}") \
        from failed[0][1]

  def _restore(self, step: int, target) -> Restored:
    if callable(target):
      target = target(self.read_meta(step))
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

  def restore_latest(self, target=None, *, set_aside_corrupt: bool = False) -> Restored:
    return self.restore(target, set_aside_corrupt=set_aside_corrupt)

  def _set_aside(self, step: int) -> str:
    """Renames step `step`'s folder to `<step>.corrupt` (`.corrupt-<k>` when taken); returns
    the new path. Orbax lists only integer-named folders as steps."""
    src = os.path.join(self.directory, str(step))
    dst, k = src + ".corrupt", 1
    while os.path.exists(dst):
      dst, k = f"{src}.corrupt-{k}", k + 1
    os.rename(src, dst)
    return dst

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


def _first_line(e: BaseException, limit: int = 300) -> str:
  """An exception's first line, shortened: TensorStore errors run to many lines of spec."""
  text = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
  return text if len(text) <= limit else text[:limit] + " ..."


def latest_step(directory: str) -> Optional[int]:
  """The newest complete checkpoint step under `directory`, or None (no directory created)."""
  if not os.path.isdir(directory):
    return None
  steps = ocp.utils.checkpoint_steps(directory)
  return max(steps) if steps else None
