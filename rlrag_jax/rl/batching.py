"""How one step's batch splits, read from config section `rl` (or `sft`): the learner
(`rl.algo`), its mini-batches and micro-batches, and the episode count a step must be a
multiple of (`episode_unit`). Pure config reading, below `training`.
"""
from __future__ import annotations

from rlrag_jax.rl import advantages as adv_lib

OUTCOME_ALGOS = tuple(adv_lib.ADVANTAGE_ESTIMATORS)
ALGOS = OUTCOME_ALGOS + ("ppo",)


def check_algo(rl) -> str:
  algo = rl.get("algo", "grpo")
  if algo not in ALGOS:
    raise ValueError(f"config key 'rl.algo' is {algo!r}; expected one of {ALGOS}")
  return algo


def mini_batch_size(rl) -> int:
  """rl.ppo.mini_batch_size for PPO (episodes per update; 0: rl.ppo.mini_batches counts them),
  else 0."""
  return int(rl.ppo.mini_batch_size) if check_algo(rl) == "ppo" else 0


def mini_batches(rl, episodes: int | None = None) -> int:
  """Mini-batches per epoch: rl.ppo.mini_batches for PPO, or with rl.ppo.mini_batch_size
  max(1, round(episodes / mini_batch_size)) of this step's episodes (Python's round:
  half to even); else the whole batch."""
  size = mini_batch_size(rl)
  if size:
    if episodes is None:
      raise ValueError("config key 'rl.ppo.mini_batch_size' > 0: the mini-batch count follows "
                       "each step's episode count; pass it")
    return max(1, int(round(episodes / size)))
  return int(rl.ppo.mini_batches) if check_algo(rl) == "ppo" else 1


def token_budget(section) -> int:
  """`tokens_per_micro_batch` of config section `rl` or `sft` (0: off)."""
  budget = int(section.get("tokens_per_micro_batch", 0))
  if budget < 0:
    raise ValueError(f"config key 'tokens_per_micro_batch' is {budget}; expected 0 (off) or a "
                     "positive token count")
  return budget


def equal_micro_batches(section) -> int:
  """The equal-split micro-batch count a step is built with: `micro_batches` of config
  section `rl` or `sft`, or 1 when a token budget replaces them."""
  return 1 if token_budget(section) else int(section.get("micro_batches", 1))


def episode_unit(rl) -> int:
  """The number a step's episode count must be a multiple of: rl.micro_batches in each of
  the mini-batches (token-budget micro-batches pad their own rows: the mini-batches only).
  The engine pads a collection of varying count (training.collection.batch_size) to a
  multiple of this.
  With rl.ppo.mini_batch_size the mini-batches take any size (PPOLearner requires
  rl.micro_batches 1 or a token budget then): 1."""
  if mini_batch_size(rl):
    return 1
  return equal_micro_batches(rl) * mini_batches(rl)
