"""DAPO dynamic sampling: drop groups whose rewards are all equal (zero advantage, no signal) and
keep drawing prompts until a batch of informative groups is full; when tries run out, pad the
batch back to its size with dropped groups (`pad_groups`), which the engine silences.
Host-side numpy; the sizes vary from draw to draw, so none of this is jitted.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np


def filter_zero_spread_groups(rewards, group_size: int, tol: float = 0.0) -> np.ndarray:
  """Which groups to keep: max - min of the group's rewards > tol.

  Args:
    rewards: [N] ordered by group, or [N/G, G].
    group_size: G.
    tol: spreads at or below it count as zero.

  Returns:
    bool [N/G]; `np.repeat(keep, group_size)` gives the per-sample mask.
  """
  r = np.asarray(rewards, dtype=np.float64)
  if r.size % group_size or group_size < 1:
    raise ValueError(f"filter_zero_spread_groups: group_size={group_size} must be >= 1 and divide "
                     f"the number of rewards {r.size}")
  r = r.reshape(-1, group_size)
  return (r.max(axis=1) - r.min(axis=1)) > tol


@dataclasses.dataclass
class FillResult:
  """What `fill_groups` collected, and counts for metrics."""
  groups: list              # kept group payloads, at most target_groups
  rewards: list             # per kept group, its rewards ([size] float64; sizes may differ)
  tries: int                # calls to sample_fn
  drawn: int                # groups drawn over all tries
  discarded: int            # groups dropped for zero reward spread
  complete: bool            # True when len(groups) == target_groups

  def metrics(self) -> dict:
    return {"dynamic_sampling/tries": self.tries, "dynamic_sampling/drawn_groups": self.drawn,
            "dynamic_sampling/discarded_groups": self.discarded,
            "dynamic_sampling/kept_groups": len(self.groups),
            "dynamic_sampling/complete": float(self.complete)}


def group_rewards(rewards, n_groups: int) -> list:
  """Per group, its rewards as a float64 array: `rewards` is [n_groups, G] (or a flat
  [n_groups * G]) for groups of one size, or a sequence of n_groups sequences of any sizes
  (a tree's sibling branches)."""
  if n_groups and len(rewards) == n_groups and all(np.ndim(r) == 1 for r in rewards):
    out = [np.asarray(r, dtype=np.float64) for r in rewards]
  else:
    flat = np.asarray(rewards, dtype=np.float64).reshape(-1)
    if n_groups < 1 or flat.size % n_groups:
      raise ValueError(f"group_rewards: {flat.size} rewards do not split into {n_groups} "
                       "groups of one size")
    out = list(flat.reshape(n_groups, -1))
  if any(r.size == 0 for r in out):
    raise ValueError("group_rewards: a group without rewards (every group has >= 1 episode)")
  return out


def fill_groups(sample_fn: Callable[[int], tuple], target_groups: int, max_tries: int,
                tol: float = 0.0) -> FillResult:
  """Draws until `target_groups` groups with nonzero reward spread are kept or tries run out.

  Args:
    sample_fn: `sample_fn(needed) -> (groups, rewards)`: draws prompts, rolls out their groups
      and scores them. `needed` is how many groups are still missing (a hint; it may draw more
      or fewer). `groups` is a sequence of per-group payloads (anything), `rewards` the
      groups' rewards as `group_rewards` reads them (groups may differ in size).
    target_groups: groups wanted.
    max_tries: the most calls to sample_fn.
    tol: a group is kept when max - min of its rewards > tol (`filter_zero_spread_groups`).

  Returns:
    A FillResult; extra informative groups beyond the target are dropped (first come first kept).
    When tries run out first, `complete` is False and the caller decides (train on fewer, skip).
  """
  if target_groups < 1 or max_tries < 1:
    raise ValueError(f"fill_groups: target_groups={target_groups} and max_tries={max_tries} must "
                     "both be >= 1")
  kept: list = []
  kept_rewards: list = []
  tries = drawn = discarded = 0
  while len(kept) < target_groups and tries < max_tries:
    groups, rewards = sample_fn(target_groups - len(kept))
    tries += 1
    groups = list(groups)
    if not groups:
      continue
    rows = group_rewards(rewards, len(groups))
    drawn += len(groups)
    for g, row in zip(groups, rows):
      if row.max() - row.min() <= tol:
        discarded += 1
      elif len(kept) < target_groups:
        kept.append(g)
        kept_rewards.append(row)
  return FillResult(groups=kept, rewards=kept_rewards, tries=tries, drawn=drawn,
                    discarded=discarded, complete=len(kept) == target_groups)


def pad_groups(kept: list, dropped: list, target_groups: int) -> tuple:
  """(groups, fill): the first `target_groups` of `kept`, and, while they are fewer, the
  first `dropped` groups to pad the batch back to `target_groups` with. The caller silences
  the fill (the engine: `training.batch.from_groups(groups, silenced=fill)`: loss masks
  zeroed, advantage 0, ids of their own), so the update's shapes stay fixed and the padding
  adds nothing to the loss."""
  out = list(kept[:target_groups])
  return out, list(dropped[:target_groups - len(out)])
