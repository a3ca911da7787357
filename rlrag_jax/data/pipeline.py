"""A deterministic, resumable, per-process input pipeline over an in-memory list.

Every epoch has one global order (a permutation seeded by `(seed, epoch)`, identical on all
processes). Step `s` of the epoch takes the next `global_batch = batch_size * process_count`
items of that order and splits them into `process_count` contiguous parts; process `p` yields
part `p`. So:

  * over an epoch, the processes together see every item exactly once (drop_remainder=False),
    or every item of the first `steps_per_epoch * global_batch` positions (drop_remainder=True);
  * all processes yield the same number of batches per epoch (lockstep for collectives); with
    drop_remainder=False the last one is split as evenly as possible, so it is smaller and may
    be empty on some processes when fewer items than processes remain;
  * the state `(epoch, position)` is the same on every process: `position` counts items of the
    global order consumed in this epoch. Restoring it reproduces the uninterrupted stream.

Example:
  it = BatchIterator(examples, batch_size=8, seed=0)
  batch = next(it)            # list of 8 examples on this process
  ckpt = it.state_dict()      # {'epoch': 0, 'position': 8 * process_count, ...}
  it2 = BatchIterator(examples, batch_size=8, seed=0); it2.load_state_dict(ckpt)

Length grouping (`lengths`, `length_window=W`): each epoch's order is cut into windows of W
global batches; a window is sorted by item length, cut into batches, and those batches are
shuffled within the window. Batches then hold items of similar length (less padding when the
items' lengths vary widely, as in multi-role SFT samples); the order is still a deterministic
function of (seed, epoch), so resuming is unchanged.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

import numpy as np


def epoch_order(num_items: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
  """The global order of epoch `epoch`: a permutation of range(num_items)  # [N] int64."""
  if not shuffle:
    return np.arange(num_items, dtype=np.int64)
  return np.random.default_rng([seed, epoch]).permutation(num_items).astype(np.int64)


def group_by_length(order: np.ndarray, lengths: np.ndarray, batch: int, window: int,
                    seed: int, epoch: int) -> np.ndarray:
  """`order` with each run of `window * batch` positions sorted by length and its batches
  shuffled (see the module docstring); a trailing partial batch stays last."""
  rng = np.random.default_rng([seed, epoch, 1])
  out, span = [], window * batch
  for start in range(0, len(order), span):
    chunk = order[start:start + span]
    chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
    full = len(chunk) // batch
    blocks = [chunk[i * batch:(i + 1) * batch] for i in range(full)]
    blocks = [blocks[i] for i in rng.permutation(full)] + [chunk[full * batch:]]
    out.extend(blocks)
  return np.concatenate(out) if out else order


class BatchIterator:
  """Iterates batches (lists of items, or `collate(list)`) for this process; see module doc."""

  def __init__(self, items: Sequence, batch_size: int, *, seed: int = 0, shuffle: bool = True,
               drop_remainder: bool = True, num_epochs: Optional[int] = None,
               process_index: Optional[int] = None, process_count: Optional[int] = None,
               collate: Optional[Callable[[list], Any]] = None,
               lengths: Optional[Sequence[int]] = None, length_window: int = 0):
    """Args:
      items: any sequence (list of `Example`s, ...); indexed, never copied.
      batch_size: items per batch on this process (the global batch is batch_size * count).
      seed: seeds the per-epoch permutations.
      shuffle: False keeps the items' order in every epoch.
      drop_remainder: drop the last global batch of an epoch when it is not full.
      num_epochs: stop after this many epochs; None repeats forever.
      process_index, process_count: default `jax.process_index()` / `jax.process_count()`.
      collate: applied to each batch's list of items.
      lengths, length_window: group items of similar length into batches, within windows of
        `length_window` global batches (0: off); `lengths[i]` is item i's length.
    """
    if batch_size < 1:
      raise ValueError(f"batch_size must be >= 1, found {batch_size}")
    if process_index is None or process_count is None:
      import jax  # pylint: disable=g-import-not-at-top
      process_index = jax.process_index() if process_index is None else process_index
      process_count = jax.process_count() if process_count is None else process_count
    if process_count < 1 or not 0 <= process_index < process_count:
      raise ValueError(f"expected 0 <= process_index < process_count, found "
                       f"process_index={process_index}, process_count={process_count}")
    self.items = items
    self.batch_size = batch_size
    self.seed = seed
    self.shuffle = shuffle
    self.drop_remainder = drop_remainder
    self.num_epochs = num_epochs
    self.process_index = process_index
    self.process_count = process_count
    self.collate = collate
    self.length_window = int(length_window) if lengths is not None else 0
    self.lengths = None if not self.length_window else np.asarray(lengths, np.int64)
    if self.lengths is not None and len(self.lengths) != len(items):
      raise ValueError(f"lengths has {len(self.lengths)} entries for {len(items)} items")
    self.global_batch_size = batch_size * process_count
    n = len(items)
    if drop_remainder:
      self.steps_per_epoch = n // self.global_batch_size
    else:
      self.steps_per_epoch = math.ceil(n / self.global_batch_size)
    if self.steps_per_epoch == 0:
      raise ValueError(f"no batch per epoch: {n} items, global batch {self.global_batch_size} "
                       f"(batch_size {batch_size} x {process_count} processes), "
                       f"drop_remainder={drop_remainder}")
    self._epoch = 0
    self._position = 0
    self._order_epoch, self._order = -1, None

  # --------------------------------------------------------------------------- iteration

  @property
  def epoch(self) -> int:
    return self._epoch

  @property
  def position(self) -> int:
    return self._position

  @property
  def _epoch_items(self) -> int:
    """Positions of the global order consumed per epoch."""
    return self.steps_per_epoch * self.global_batch_size if self.drop_remainder \
        else len(self.items)

  def _epoch_order(self, epoch: int) -> np.ndarray:
    if self._order_epoch != epoch:
      self._order = epoch_order(len(self.items), self.seed, epoch, self.shuffle)
      if self.length_window:
        self._order = group_by_length(self._order, self.lengths, self.global_batch_size,
                                      self.length_window, self.seed, epoch)
      self._order_epoch = epoch
    return self._order

  def local_indices(self, epoch: int, position: int) -> np.ndarray:
    """Indices into `items` of this process's batch at (epoch, position)  # [<= batch_size]."""
    chunk = self._epoch_order(epoch)[position:position + self.global_batch_size]
    return np.array_split(chunk, self.process_count)[self.process_index]

  def __iter__(self) -> "BatchIterator":
    return self

  def __next__(self):
    if self.num_epochs is not None and self._epoch >= self.num_epochs:
      raise StopIteration
    idx = self.local_indices(self._epoch, self._position)
    self._position += self.global_batch_size
    if self._position >= self._epoch_items:
      self._epoch, self._position = self._epoch + 1, 0
    batch = [self.items[int(i)] for i in idx]
    return self.collate(batch) if self.collate is not None else batch

  # --------------------------------------------------------------------------- state

  def state_dict(self) -> dict:
    """Small JSON-able state; identical on every process."""
    return {"epoch": self._epoch, "position": self._position, "seed": self.seed,
            "shuffle": self.shuffle, "num_items": len(self.items),
            "global_batch_size": self.global_batch_size, "length_window": self.length_window}

  def load_state_dict(self, state: dict) -> None:
    """Restores `state_dict()` output; the next batch is the one the saved iterator would give.

    The seed, shuffle flag and item count must match (else the orders differ). A different
    global batch size is accepted when `position` is a multiple of it.
    """
    for key in ("seed", "shuffle", "num_items", "length_window"):
      mine = len(self.items) if key == "num_items" else getattr(self, key)
      if key in state and state[key] != mine:
        raise ValueError(f"iterator state key {key!r}: saved {state[key]!r}, but this iterator "
                         f"has {mine!r}; the epoch orders would differ")
    for key in ("epoch", "position"):
      if not isinstance(state.get(key), int) or state[key] < 0:
        raise ValueError(f"iterator state key {key!r}: expected an int >= 0, found "
                         f"{state.get(key)!r}")
    epoch, position = state["epoch"], state["position"]
    if position % self.global_batch_size or position >= self._epoch_items:
      raise ValueError(f"iterator state key 'position': {position} is not the start of a global "
                       f"batch of {self.global_batch_size} within the {self._epoch_items} "
                       "positions of an epoch")
    self._epoch, self._position = epoch, position
