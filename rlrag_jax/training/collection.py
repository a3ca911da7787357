"""Collecting one RL step's episodes and rewards from a Task.

Three ways, in order of precedence:
  task.collect(policy, examples, rng, *, group_size, step) -> (episodes, scores)
      a task whose rollouts are not one stream per example (e.g. a tree of decisions); each
      episode's `Episode.group` says which episodes are compared with each other.
  rl.dynamic_sampling
      DAPO: groups whose `rl.dynamic_sampling_key` reward does not vary are dropped and fresh
      prompts drawn (`rl.fill_groups`, bounded tries). When tries run out, the batch is padded
      back to its fixed size with dropped groups silenced (`Episode.silenced`: loss masks
      zeroed, `padding` set), so the update's shapes never change and the padding adds nothing
      to the loss. When no group at all was kept, the last draw is trained on as drawn (its
      advantages come from the total reward, which may vary where the sampling key did not).
  otherwise
      one rollout of `rl.prompts_per_step` prompts x `rl.group_size` samples.

Rewards are asked in one call per batch when the task has `rewards(episodes, step)` (e.g. one
jitted encoder call), else episode by episode with `reward(episode, step)`.
"""
from __future__ import annotations

import jax

from rlrag_jax.rl import dynamic_sampling


def score(task, episodes, step) -> list:
  """The reward dicts of `episodes` (`Task.rewards`: by default `reward` per episode)."""
  out = list(task.rewards(episodes, step))
  if len(out) != len(episodes):
    raise ValueError(f"{type(task).__name__}.rewards returned {len(out)} reward dicts for "
                     f"{len(episodes)} episodes")
  return out


def collect(task, policy, rl_iter, key, config, step) -> tuple:
  """(episodes, reward dicts, counters) for one RL step."""
  rl = config.rl
  g, want = int(rl.group_size), int(rl.prompts_per_step)
  if task.collect is not None:        # the task collects its own rollouts
    if rl.dynamic_sampling:
      raise ValueError(f"config key 'rl.dynamic_sampling' is on, but the {config.method} task "
                       "collects its own rollouts (Task.collect); filter inside the hook")
    episodes, scores = task.collect(policy, next(rl_iter), jax.random.fold_in(key, 1),
                                    group_size=g, step=step)
    if len(scores) != len(episodes) or not episodes:
      raise ValueError(f"{type(task).__name__}.collect returned {len(episodes)} episodes and "
                       f"{len(scores)} reward dicts; expected equal, non-zero counts")
    return list(episodes), list(scores), {"tries": 1.0, "dropped_groups": 0.0}

  tries = 0
  drawn = []            # every group drawn, for padding

  def draw(needed=None):
    nonlocal tries
    tries += 1
    eps = task.rollout(policy, next(rl_iter), jax.random.fold_in(key, tries), group_size=g)
    sc = score(task, eps, step)
    groups = [(eps[i:i + g], sc[i:i + g]) for i in range(0, len(eps), g)]
    drawn.extend(groups)
    return groups

  if not rl.dynamic_sampling:
    groups = draw()
    return ([e for eps, _ in groups for e in eps], [s for _, sc in groups for s in sc],
            {"tries": 1.0, "dropped_groups": 0.0})

  key_name = rl.dynamic_sampling_key

  def sample_fn(needed):
    groups = draw(needed)
    if groups and key_name not in groups[0][1][0]:
      raise ValueError(f"config key 'rl.dynamic_sampling_key' is {key_name!r}, but the "
                       f"{config.method} reward has only {sorted(groups[0][1][0])}")
    return groups, [[s[key_name] for s in sc] for _, sc in groups]

  res = dynamic_sampling.fill_groups(sample_fn, want, int(rl.dynamic_max_tries))
  kept = list(res.groups)
  padded = 0
  if not kept:       # every group flat: train on the last draw as drawn (a full batch)
    kept = drawn[-want:]
  elif len(kept) < want:
    kept_ids = {id(grp) for grp in kept}
    kept, padded = dynamic_sampling.pad_groups(
        kept, [grp for grp in drawn if id(grp) not in kept_ids], want)
  return ([e for eps, _ in kept for e in eps], [s for _, sc in kept for s in sc],
          {"tries": float(res.tries), "dropped_groups": float(res.discarded),
           "padded_groups": float(padded)})

