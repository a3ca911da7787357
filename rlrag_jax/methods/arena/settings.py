"""ARENA's config sections `reward` and `arena`, each parsed once into a frozen dataclass
(`config_base.section`): every key is declared in configs/arena.py, none defaulted here. The
rules on the values are in config_rules.py."""
from __future__ import annotations

import dataclasses

from rlrag_jax import config_base


@dataclasses.dataclass(frozen=True)
class RewardSettings:
  w_format: float
  w_accuracy: float
  w_relevance: float
  bonus_value: float
  relevance_parse: str          # 'strict' (a JSON list, the paper's) | 'lenient'
  accuracy: str                 # 'em' | 'f1' | 'judge'
  judge_url: str                # the accuracy judge (judge.from_config) when accuracy 'judge'
  judge_model: str
  judge_concurrency: int
  judge_max_failure_rate: float
  judge_failure_window: int


def reward(config) -> RewardSettings:
  return config_base.section(RewardSettings, config.reward, "reward")


@dataclasses.dataclass(frozen=True)
class SftSettings:
  target: str                   # 'structured' (ours) | 'direct' | 'teacher' (the SFT baselines)
  teacher_traces: str           # JSONL of methods.arena.teacher_traces, for target 'teacher'


@dataclasses.dataclass(frozen=True)
class ArenaSettings:
  sft: SftSettings


def arena(config) -> ArenaSettings:
  return config_base.section(ArenaSettings, config.arena, "arena")
