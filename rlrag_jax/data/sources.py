"""Config-driven data selection shared by every method: which examples train, which evaluate.

`config.data.source`:
  'world'  the embedded world (`world.build(**config.data.world)`): train / dev (eval) / corpus;
  'files'  real datasets named 'name:split' in `config.data.mix` and `config.data.eval_mix`,
           read with `load_dataset` from `config.data.dir` (default RLRAG_DATA_DIR).
"""
from __future__ import annotations

import dataclasses
import pathlib
import random
from typing import Optional

from rlrag_jax.data.schema import Example


@dataclasses.dataclass
class Selection:
  train: list
  eval: list
  corpus: list            # CorpusRecords for retrieval ([] when the source has none)
  world: Optional[object] = None


def select(data_cfg, seed: int = 0) -> Selection:
  if data_cfg.source == "world":
    from rlrag_jax.data import world as world_lib
    w = world_lib.build(**dict(data_cfg.world))
    train, ev, corpus = list(w.train), list(w.dev), list(w.corpus)
    sel = Selection(train, ev, corpus, w)
  elif data_cfg.source == "files":
    load = lambda spec: _load_spec(spec, data_cfg.skip_invalid, data_cfg.dir or None)
    train = [ex for spec in data_cfg.mix for ex in load(spec)]
    ev = [ex for spec in data_cfg.eval_mix for ex in load(spec)]
    sel = Selection(train, ev, [])
  else:
    raise ValueError(f"config key 'data.source' is {data_cfg.source!r}; expected 'world' or 'files'")
  rng = random.Random(seed)
  rng.shuffle(sel.train)
  if data_cfg.max_train:
    sel.train = sel.train[: data_cfg.max_train]
  if data_cfg.max_eval:
    sel.eval = sel.eval[: data_cfg.max_eval]
  if getattr(data_cfg, "max_contexts", 0):
    sel.train = [limit_contexts(ex, data_cfg.max_contexts, seed) for ex in sel.train]
    sel.eval = [limit_contexts(ex, data_cfg.max_contexts, seed) for ex in sel.eval]
  return sel


def _load_spec(spec: str, skip_invalid: bool, data_dir: Optional[str] = None) -> list:
  from rlrag_jax.data import loaders
  name, _, split = spec.partition(":")
  if not name:
    raise ValueError(f"config key 'data.mix' entry {spec!r} should look like 'hotpotqa:dev'")
  path = None
  if data_dir:
    dataset, subset = loaders._canonical(name)  # pylint: disable=protected-access
    path = pathlib.Path(data_dir) / (subset or loaders.FOLDERS[dataset])
  return list(loaders.load_dataset(name, path=path, split=split or None,
                                   skip_invalid=skip_invalid))


def limit_contexts(ex: Example, max_contexts: int, seed: int = 0) -> Example:
  """Keeps every gold context plus the first distractors up to `max_contexts`, in a seeded order."""
  if max_contexts <= 0 or len(ex.contexts) <= max_contexts:
    return ex
  gold = set(ex.gold_ids)
  keep_gold = [c for c in ex.contexts if c.id in gold]
  distract = [c for c in ex.contexts if c.id not in gold]
  kept = keep_gold + distract[: max(0, max_contexts - len(keep_gold))]
  random.Random(f"{seed}:{ex.id}").shuffle(kept)
  return dataclasses.replace(ex, contexts=kept)
