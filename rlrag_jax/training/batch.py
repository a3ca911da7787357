"""One RL step's batch and its groups, owned by the engine, the same for every task.

A task's `collect` returns `tasks.Group`s. `from_groups` flattens them into a `Batch` whose
`group_ids` number them in order, one id per Group (0, 1, ...): the learners compute group
statistics from these ids only (the advantage estimators' `index`, as in verl), never from
positions or `rl.group_size`. A group's `metrics` (the method's statistics of its draw) ride
beside its episodes (`Batch.metrics`, one dict per episode) to the step's log.

Silenced groups (dynamic sampling's dropped groups, and the padding below) are copies whose
loss mask is all zero (`silence_group`, the one place a `Group` is made with `padding` set):
`Batch.live` is False on them, their advantage is 0, and their ids are their own, so they
neither count in the loss nor move a real group's mean or std.

Padding (`pad`) brings a step's episode count to one the update splits evenly (a multiple of
`rl.batching.episode_unit`) with whole silenced groups under fresh ids: as many groups of the
step's group size as fit, then silenced groups of one for a remainder no whole group fits
(`padding_groups`). The copies take the batch's first episodes in turn, so no padded row is
longer than a real one.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from rlrag_jax.tasks import Episode, Group


def silence(episode: Episode) -> Episode:
  """A padding copy of `episode`: the same tokens, the loss mask all zero, so that it keeps a
  batch's shape and adds nothing to the loss."""
  return dataclasses.replace(episode, loss_mask=[0] * len(episode.loss_mask),
                             info=dict(episode.info))


def silence_group(group: Group) -> Group:
  """The group's padding copy: every episode `silence`d, the reward dicts and metrics as
  drawn, `padding` set."""
  return Group([silence(e) for e in group.episodes], [dict(s) for s in group.rewards],
               group.metrics, padding=True)


@dataclasses.dataclass(frozen=True, eq=False)
class Batch:
  """A step's episodes in group order, with their reward dicts and groups.

  metrics: per episode, its group's `Group.metrics` (the same dict for a group's episodes).
  group_ids: [N] int64, the engine's group of each episode: the collected groups numbered in
    order, fresh ids (above every real one) for padding groups.
  live: [N] bool, False on silenced episodes (loss mask zero, advantage 0).
  """
  episodes: tuple
  rewards: tuple
  metrics: tuple
  group_ids: np.ndarray
  live: np.ndarray

  def __post_init__(self):
    n = len(self.episodes)
    if not (len(self.rewards) == len(self.metrics) == n == self.group_ids.shape[0]
            == self.live.shape[0]):
      raise ValueError(f"Batch: {n} episodes, {len(self.rewards)} reward dicts, "
                       f"{len(self.metrics)} metrics dicts, {self.group_ids.shape[0]} group ids "
                       f"and {self.live.shape[0]} live flags; expected one of each per episode")

  def __len__(self) -> int:
    return len(self.episodes)

  def totals(self) -> np.ndarray:
    """[N] float32: each episode's 'total' reward."""
    return np.array([s["total"] for s in self.rewards], np.float32)

  def next_id(self) -> int:
    """The smallest id no group of the batch has: where fresh ids start."""
    return int(self.group_ids.max()) + 1 if len(self) else 0


def from_groups(groups: Sequence[Group], silenced: Sequence[Group] = ()) -> Batch:
  """The batch of `groups` followed by silenced copies of `silenced` (dynamic sampling's
  padding), one group id per group, in order; a group with `padding` set is not live."""
  episodes, rewards, metrics, ids, live = [], [], [], [], []
  for gid, grp in enumerate(list(groups) + [silence_group(g) for g in silenced]):
    n = len(grp.episodes)
    episodes += grp.episodes
    rewards += grp.rewards
    metrics += [grp.metrics] * n
    ids += [gid] * n
    live += [not grp.padding] * n
  return Batch(tuple(episodes), tuple(rewards), tuple(metrics), np.array(ids, np.int64),
               np.array(live, bool))


def padded_size(n_episodes: int, unit: int) -> int:
  """The smallest multiple of `unit` (the update's episode unit: micro-batches x
  mini-batches) that holds `n_episodes` episodes: the size a step of a fixed episode count
  pads to. ARENA ':paper' with rl.micro_batches=48: 1,792 episodes (256 prompts x 7) pad to
  1,824, not 2,304 (the bucket of a count that varies, `training.collection.batch_size`)."""
  if n_episodes < 1 or unit < 1:
    raise ValueError(f"padded_size: n_episodes ({n_episodes}) and unit ({unit}) must be >= 1")
  return -(-n_episodes // unit) * unit


def padding_groups(n_pad: int, group_size: int) -> tuple:
  """(whole groups, singletons): the silenced groups that pad `n_pad` episodes, as many of
  `group_size` episodes as fit, the rest groups of one. 1,792 -> 1,824 at group size 7:
  32 episodes, 4 groups of 7 and 4 of one. (Whole groups alone would need 7k = -1,792
  (mod 48): k = 32 groups, 224 episodes, to reach 2,016.)"""
  if n_pad < 0 or group_size < 1:
    raise ValueError(f"padding_groups: n_pad ({n_pad}) must be >= 0 and group_size "
                     f"({group_size}) >= 1")
  return divmod(n_pad, group_size)


def pad(batch: Batch, size: int, group_size: int) -> Batch:
  """`batch` padded to `size` episodes with silenced groups under fresh ids
  (`padding_groups`); copies of the batch's episodes in turn, their reward dicts as drawn."""
  n = len(batch)
  if n < 1 or size < n:
    raise ValueError(f"pad: a batch of {n} episodes cannot be padded to {size}")
  whole, single = padding_groups(size - n, group_size)
  sizes = [group_size] * whole + [1] * single
  fresh = batch.next_id()
  src = [k % n for k in range(size - n)]
  ids = np.repeat(np.arange(fresh, fresh + len(sizes), dtype=np.int64), sizes)
  return Batch(batch.episodes + tuple(silence(batch.episodes[k]) for k in src),
               batch.rewards + tuple(dict(batch.rewards[k]) for k in src),
               batch.metrics + tuple(batch.metrics[k] for k in src),
               np.concatenate([batch.group_ids, ids]),
               np.concatenate([batch.live, np.zeros(size - n, bool)]))
