"""Collecting one RL step's episodes and rewards from a Task, as groups.

A task draws groups (`Task.collect`: by default a `rollout` of the drawn prompts, scored by
`rewards`, one group per prompt; a tree's decisions or a forest's expansions in the methods
that override it). What happens to them next is the engine's alone, the same for every task:
  rl.dynamic_sampling
      DAPO: groups whose `rl.dynamic_sampling_key` reward does not vary are dropped and fresh
      ones drawn (`rl.dynamic_max_tries` draws at most). When tries run out, the batch is
      padded back to `rl.prompts_per_step` groups with dropped groups silenced
      (`Group.silenced`: loss masks zeroed, `padding` set), so the update's shapes never change
      and the padding adds nothing to the loss. When no group at all was kept, the last draw is
      trained on as drawn (its advantages come from the total reward, which may vary where the
      sampling key did not).
  otherwise
      one draw, trained on as drawn.
A step's nominal batch is `rl.prompts_per_step` x `rl.group_size` episodes. A collection with
another count (a tree's decisions vary from step to step), or one the update cannot split into
its mini- and micro-batches, is padded with silenced copies of its first episodes up to
`batch_size`'s bucket, so that the update compiles a bounded set of shapes.
"""
from __future__ import annotations

import jax

from rlrag_jax.rl import batching, dynamic_sampling
from rlrag_jax.rollout.batch import geometric_round


def batch_size(n: int, rl) -> int:
  """The episode count a collection of `n` off the nominal batch is padded to: a multiple of
  `batching.episode_unit` (the smallest one >= 8), from a set of ~2 sizes per doubling."""
  unit = batching.episode_unit(rl)
  return geometric_round(n, unit * -(-8 // unit), per_octave=2)


def _check(task, groups) -> list:
  groups = list(groups)
  for i, g in enumerate(groups):
    if not g.episodes or len(g.episodes) != len(g.scores):
      raise ValueError(f"{type(task).__name__}.collect: group {i} has {len(g.episodes)} episodes "
                       f"and {len(g.scores)} reward dicts; expected equal, non-zero counts")
  return groups


def collect(task, policy, rl_iter, key, config, step) -> tuple:
  """(episodes, reward dicts, counters) for RL step `step` (1: the first RL step)."""
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
    groups = draw(want)
    counters = {"tries": 1.0, "dropped_groups": 0.0}
  else:
    groups, counters = _fill(task, draw, drawn, want, rl, config.method)
  episodes = [e for grp in groups for e in grp.episodes]
  scores = [s for grp in groups for s in grp.scores]
  if not episodes:
    raise ValueError(f"{type(task).__name__}.collect returned no episodes")
  n = len(episodes)
  nominal = n == want * g and n % batching.episode_unit(rl) == 0
  size = n if nominal else batch_size(n, rl)
  episodes += [episodes[k % n].silenced() for k in range(size - n)]
  scores += [dict(scores[k % n]) for k in range(size - n)]
  counters["padded_episodes"] = float(size - n)
  return episodes, scores, counters


def _fill(task, draw, drawn, want, rl, method) -> tuple:
  """DAPO's dynamic sampling over `draw`: (groups, counters)."""
  key_name = rl.dynamic_sampling_key

  def sample_fn(needed):
    groups = draw(needed)
    if groups and key_name not in groups[0].scores[0]:
      raise ValueError(f"config key 'rl.dynamic_sampling_key' is {key_name!r}, but the "
                       f"{method} reward has only {sorted(groups[0].scores[0])}")
    return groups, [[s[key_name] for s in grp.scores] for grp in groups]

  res = dynamic_sampling.fill_groups(sample_fn, want, int(rl.dynamic_max_tries))
  kept = list(res.groups)
  padded = 0
  if not kept:       # every group flat: train on the last draw as drawn (a full batch)
    kept = drawn[-want:]
  elif len(kept) < want:
    kept_ids = {id(grp) for grp in kept}
    kept, padded = dynamic_sampling.pad_groups(
        kept, [grp for grp in drawn if id(grp) not in kept_ids], want)
  return kept, {"tries": float(res.tries), "dropped_groups": float(res.discarded),
                "padded_groups": float(padded)}
