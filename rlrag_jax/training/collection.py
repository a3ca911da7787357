"""Collecting one RL step's episodes and rewards from a Task, as groups.

A task draws groups (`Task.collect`: by default a `rollout` of the drawn prompts, scored by
`rewards`, one group per prompt; a tree's decisions or a forest's expansions in the methods
that override it). What happens to them next is the engine's alone, the same for every task:
  rl.dynamic_sampling
      DAPO: groups whose `rl.dynamic_sampling_key` reward does not vary are dropped and fresh
      ones drawn (`rl.dynamic_max_tries` draws at most). When tries run out, the batch is
      padded back to `rl.prompts_per_step` groups with dropped groups silenced
      (`batch_lib.silence_group`: loss masks zeroed, `Group.padding` set, advantage 0), so the
      update's shapes never change and the padding adds nothing to the loss. When no group at all was
      kept, the last draw is trained on as drawn (its advantages come from the total reward,
      which may vary where the sampling key did not).
  otherwise
      one draw, trained on as drawn.
The groups become a `batch_lib.Batch`: one engine-assigned group id per group, in order, which
is all the learners group by. A step's nominal batch is `rl.prompts_per_step` x `rl.group_size`
episodes. One the update cannot split into its mini- and micro-batches is padded to the
smallest multiple of `rl.batching.episode_unit` (`batch_lib.padded_size`); a collection of another
count (a tree's decisions vary from step to step) to `batch_size`'s bucket, so that the update
compiles a bounded set of shapes. Padding is whole silenced groups under fresh ids
(`batch_lib.pad`), which touch no real group's statistics.
"""
from __future__ import annotations

import jax

from rlrag_jax.rl import batching, dynamic_sampling
from rlrag_jax.rollout.batch import geometric_round
from rlrag_jax.tasks import Group
from rlrag_jax.training import batch as batch_lib


def batch_size(n: int, rl) -> int:
  """The episode count a collection of `n` off the nominal batch is padded to: a multiple of
  `batching.episode_unit` (the smallest one >= 8), from a set of ~2 sizes per doubling."""
  unit = batching.episode_unit(rl)
  return geometric_round(n, unit * -(-8 // unit), per_octave=2)


def _check(task, groups) -> list:
  """`collect`'s groups (each validated when it was made: `tasks.Group`), none a padding copy."""
  groups = list(groups)
  for i, g in enumerate(groups):
    if not isinstance(g, Group) or g.padding:
      raise ValueError(f"{type(task).__name__}.collect: item {i} is "
                       f"{'a padding Group' if isinstance(g, Group) else type(g).__name__}; "
                       "expected drawn tasks.Groups (the engine pads)")
  return groups


def collect(task, policy, rl_iter, key, config, step) -> tuple:
  """(batch_lib.Batch, counters) for RL step `step` (1: the first RL step)."""
  rl = config.rl
  g, want = int(rl.group_size), int(rl.prompts_per_step)
  tries = 0
  drawn = []            # every group drawn, for padding

  def draw(needed):
    nonlocal tries
    tries += 1
    groups = _check(task, task.collect(policy, next(rl_iter), jax.random.fold_in(key, tries),
                                       group_size=g, want=needed, step=step))
    drawn.extend(groups)
    return groups

  if not rl.dynamic_sampling:
    batch = batch_lib.from_groups(draw(want))
    counters = {"tries": 1.0, "dropped_groups": 0.0}
  else:
    batch, counters = _fill(task, draw, drawn, want, rl, config.method)
  n = len(batch)
  if not n:
    raise ValueError(f"{type(task).__name__}.collect returned no episodes")
  unit = batching.episode_unit(rl)
  size = batch_lib.padded_size(n, unit) if n == want * g else batch_size(n, rl)
  batch = batch_lib.pad(batch, size, g)
  counters["padded_episodes"] = float(size - n)
  return batch, counters


def _fill(task, draw, drawn, want, rl, method) -> tuple:
  """DAPO's dynamic sampling over `draw`: (groups, counters)."""
  key_name = rl.dynamic_sampling_key

  def sample_fn(needed):
    groups = draw(needed)
    if groups and key_name not in groups[0].rewards[0]:
      raise ValueError(f"config key 'rl.dynamic_sampling_key' is {key_name!r}, but the "
                       f"{method} reward has only {sorted(groups[0].rewards[0])}")
    return groups, [[s[key_name] for s in grp.rewards] for grp in groups]

  res = dynamic_sampling.fill_groups(sample_fn, want, int(rl.dynamic_max_tries))
  kept, fill = list(res.groups), []
  if not kept:       # every group flat: train on the last draw as drawn (a full batch)
    kept = drawn[-want:]
  elif len(kept) < want:
    kept_ids = {id(grp) for grp in kept}
    kept, fill = dynamic_sampling.pad_groups(
        kept, [grp for grp in drawn if id(grp) not in kept_ids], want)
  return batch_lib.from_groups(kept, silenced=fill), {
      "tries": float(res.tries), "dropped_groups": float(res.discarded),
      "padded_groups": float(len(fill))}
