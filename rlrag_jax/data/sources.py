"""Config-driven data selection shared by every method: which examples train, which evaluate.

`config.data.source`:
  'world'  the embedded world (`world.build(**config.data.world)`): train / dev (eval) / corpus;
  'files'  real datasets named 'name:split[:count]' in `config.data.mix` and
           `config.data.eval_mix`, read with `load_dataset` from `config.data.dir` (default
           RLRAG_DATA_DIR). A count draws that many examples of the split (seeded by
           `config.seed` and the entry); more than the split holds is a `QuotaError` naming the
           dataset, split and both counts, unless `data.allow_short=True` takes the whole split
           and warns; `data.eval_allow_short=True` does the same for `data.eval_mix` alone
           (a paper's "up to N per dataset", or its N on samples smaller than the dataset).
           Train and eval questions must not overlap (`OverlapError`; the check is
           `data.check_overlap`, on by default).

Validation (model selection while training, e.g. early stopping): `config.data.val_mix`
entries 'name:split:count' are drawn (seeded) from what the training and evaluation selections
leave of each split, and from what earlier validation entries leave, so the three are disjoint
by construction; a count above what is left takes the rest (`data.allow_short`, warned) or is
a `QuotaError`. Empty (the default): no validation set.

Evaluation on several datasets: give each `data.eval_mix` entry its own count
('hotpotqa:dev:1000'), or none for the whole split. `data.max_eval` cuts the evaluation list,
which holds the datasets one after the other, so a cut of a list from several datasets would
keep the first ones only: that is an error (`EvalCutError`), not a silent HotpotQA-only
evaluation.
"""
from __future__ import annotations

import dataclasses
import logging
import pathlib
import random
from typing import Optional

from rlrag_jax.data.schema import Example

log = logging.getLogger("rlrag_jax.data")

SOURCES = ("world", "files")          # config key data.source


class QuotaError(ValueError):
  """A `data.mix` entry asks for more examples than its split holds."""


class EvalCutError(ValueError):
  """`data.max_eval` would cut an evaluation list that holds several datasets."""


class OverlapError(ValueError):
  """The same question is in the training and the evaluation selection."""


@dataclasses.dataclass
class Selection:
  train: list
  eval: list
  corpus: list            # CorpusRecords for retrieval ([] when the source has none)
  world: Optional[object] = None
  val: list = dataclasses.field(default_factory=list)   # data.val_mix (model selection)


def select(data_cfg, seed: int = 0) -> Selection:
  if data_cfg.source == "world":
    from rlrag_jax.data import world as world_lib
    w = world_lib.build(**dict(data_cfg.world))
    train, ev, corpus = list(w.train), list(w.dev), list(w.corpus)
    sel = Selection(train, ev, corpus, w)
  elif data_cfg.source == "files":
    load = lambda spec, key: _load_spec(spec, data_cfg, seed, key)
    train = [ex for spec in data_cfg.mix for ex in load(spec, "data.mix")]
    ev = [ex for spec in data_cfg.eval_mix for ex in load(spec, "data.eval_mix")]
    if data_cfg.get("check_overlap", True):
      check_disjoint(train, ev)
    val = []
    for spec in data_cfg.val_mix:
      val += _load_spec(spec, data_cfg, seed, "data.val_mix", exclude=train + ev + val)
    sel = Selection(train, ev, [], val=val)
  else:
    raise ValueError(f"config key 'data.source' is {data_cfg.source!r}; expected one of {SOURCES}")
  rng = random.Random(seed)
  rng.shuffle(sel.train)
  if data_cfg.max_train:
    sel.train = sel.train[: data_cfg.max_train]
  if data_cfg.max_eval:
    sel.eval = cut_eval(sel.eval, data_cfg.max_eval, "data.max_eval")
  if getattr(data_cfg, "max_contexts", 0):
    sel.train = [limit_contexts(ex, data_cfg.max_contexts, seed) for ex in sel.train]
    sel.eval = [limit_contexts(ex, data_cfg.max_contexts, seed) for ex in sel.eval]
  return sel


def cut_eval(examples: list, n: int, key: str) -> list:
  """The first `n` evaluation examples, refused (`EvalCutError`) when they come from several
  datasets and `n` would drop some: the list holds the datasets one after the other."""
  if n <= 0:
    return []
  if n >= len(examples):
    return list(examples)
  counts = {}
  for ex in examples:
    counts[ex.source or "?"] = counts.get(ex.source or "?", 0) + 1
  if len(counts) > 1:
    held = ", ".join(f"{k} {v}" for k, v in counts.items())
    raise EvalCutError(
        f"config key '{key}' is {n} but the evaluation selection holds {len(examples)} "
        f"examples from {len(counts)} datasets ({held}), one after the other: the first {n} "
        "would leave datasets out. Give each data.eval_mix entry its own count "
        f"('hotpotqa:dev:500') and set {key} to at least their sum"
        + (" or 0 (all)" if key == "data.max_eval" else ""))
  return list(examples[:n])


def parse_spec(spec: str, key: str = "data.mix") -> tuple:
  """'name:split[:count]' -> (name, split or None, count or 0); errors name the config key."""
  parts = str(spec).split(":")
  name, split = parts[0].strip(), (parts[1].strip() if len(parts) > 1 else "")
  count = 0
  if len(parts) > 3 or not name:
    raise ValueError(f"config key '{key}' entry {spec!r} should look like 'hotpotqa:dev' or "
                     "'hotpotqa:train:10000'")
  if len(parts) == 3:
    try:
      count = int(parts[2])
    except ValueError:
      count = -1
    if count <= 0:
      raise ValueError(f"config key '{key}' entry {spec!r}: the count {parts[2]!r} should be a "
                       "positive integer")
  return name, split or None, count


def load_entry(spec: str, data_cfg, seed: int, key: str) -> list:
  """The examples of one 'name:split[:count]' entry of config key `key`, read as `select` reads
  `data.mix` / `data.eval_mix` entries (data.dir, data.skip_invalid, the seeded count). A
  missing file is a FileNotFoundError naming it and where it looked (RLRAG_DATA_DIR or
  data.dir), for a caller that lists missing datasets instead of stopping at the first."""
  return _load_spec(spec, data_cfg, seed, key)


def _load_spec(spec: str, data_cfg, seed: int, key: str, exclude: Optional[list] = None) -> list:
  """The examples of one mix entry; `exclude`: examples whose questions are not drawn (case and
  spacing ignored), left out before the count is drawn."""
  from rlrag_jax.data import loaders
  name, split, count = parse_spec(spec, key)
  path = None
  if data_cfg.dir:
    root = pathlib.Path(data_cfg.dir).expanduser()
    if not root.is_dir():
      raise FileNotFoundError(f"config key 'data.dir' is {data_cfg.dir!r}, which is not a "
                              f"directory (it holds the datasets of {key} entry {spec!r}, in "
                              "place of RLRAG_DATA_DIR)")
    dataset, subset = loaders._canonical(name)  # pylint: disable=protected-access
    path = root / (subset or loaders.FOLDERS[dataset])
  try:
    examples = list(loaders.load_dataset(name, path=path, split=split,
                                         skip_invalid=data_cfg.skip_invalid))
  except FileNotFoundError as e:
    if path is None:
      raise
    raise FileNotFoundError(f"config key 'data.dir' is {data_cfg.dir!r}, {key} entry "
                            f"{spec!r}: {e}") from None
  if exclude:
    taken = {_question_key(ex.question) for ex in exclude}
    examples = [ex for ex in examples if _question_key(ex.question) not in taken]
  if not count:
    return examples
  if count > len(examples):
    msg = (f"config key '{key}' entry {spec!r}: asks for {count} examples but {name} split "
           f"{split or '(default)'} has {len(examples)}"
           + (" left after the training, evaluation and earlier validation draws" if exclude
              else ""))
    short_key = "eval_allow_short" if key == "data.eval_mix" else "allow_short"
    if not data_cfg.get(short_key, False):
      raise QuotaError(msg + "; lower the count, point data.dir at the full dataset, or set "
                       f"data.{short_key}=True to take them all")
    log.warning("%s; data.%s=True: taking all %d", msg, short_key, len(examples))
    return examples
  return random.Random(f"{seed}:{spec}").sample(examples, count)


def _question_key(q: str) -> str:
  return " ".join(str(q).lower().split())


def check_disjoint(train: list, ev: list) -> None:
  """Raises OverlapError when a question (case and spacing ignored) is in both selections."""
  seen = {_question_key(ex.question) for ex in train}
  both = [ex for ex in ev if _question_key(ex.question) in seen]
  if both:
    raise OverlapError(
        f"{len(both)} of {len(ev)} evaluation questions are also in the training selection "
        f"(e.g. {both[0].source or '?'} {both[0].id!r}: {both[0].question[:80]!r}); use disjoint "
        "splits in data.mix / data.eval_mix, or data.check_overlap=False to allow it")


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
