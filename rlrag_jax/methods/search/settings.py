"""The search agent's config sections `reward` and `search`, each parsed once into a frozen
dataclass (`config_base.section`): every key is declared in configs/search.py, none defaulted
here. The rules on the values are in config_rules.py."""
from __future__ import annotations

import dataclasses

from rlrag_jax import config_base


@dataclasses.dataclass(frozen=True)
class RewardSettings:
  beta: float                   # the search reward's weight
  stage2_step: int              # the RL step stage 2 starts at (0: never)
  match: str                    # 'em' | 'f1' | 'judge'
  f1_threshold: float
  max_query_words: int
  judge_url: str                # the correctness judge (judge.from_config) when match 'judge'
  judge_model: str
  judge_concurrency: int
  judge_max_failure_rate: float
  judge_failure_window: int
  rs_form: str                  # 'eq8' | 'pairwise_mean'
  answer_form: str              # 'staged' | 'unified'
  use_search: bool
  use_answer: bool


def reward(config) -> RewardSettings:
  return config_base.section(RewardSettings, config.reward, "reward")


@dataclasses.dataclass(frozen=True)
class SftSettings:
  known_min_seen: int           # SFT recalls a gold step whose fact >= this many others hold
  observation_loss: bool        # SFT also trains on the retrieved passages of its targets


@dataclasses.dataclass(frozen=True)
class EvalSettings:
  baselines: bool               # the no-retrieval and naive-RAG pipelines in the final report
  naive_k: int                  # naive RAG's top-k


@dataclasses.dataclass(frozen=True)
class SearchSettings:
  sft: SftSettings
  eval: EvalSettings


def search(config) -> SearchSettings:
  return config_base.section(SearchSettings, config.search, "search")
