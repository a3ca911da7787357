"""R2AG's config section `r2ag`, parsed once into frozen dataclasses (`config_base.section`):
every key is declared in configs/r2ag.py (the steering model) or configs/r2ag_generator.py (the
frozen generator), none defaulted here. The rules on their values are in config_rules.py."""
from __future__ import annotations

import dataclasses

from rlrag_jax import config_base
from rlrag_jax.methods.r2ag.forest import ForestConfig
from rlrag_jax.methods.r2ag.rewards import RewardConfig


@dataclasses.dataclass(frozen=True)
class EvalSettings:
  """`r2ag.eval`: the inference trees of an evaluation and the generator that answers."""
  top_k: int                  # documents per query, main tree
  other_top_k: tuple          # extra trees at these top-k ('top{k}_' metrics)
  base_only: bool             # a tree without predicted queries ('base_' metrics)
  t_base: int                 # base queries expanded per output
  t_pred: int                 # predicted queries per output
  max_iterations: int
  t_base_by_dataset: tuple    # 'dataset:t' entries overriding t_base per evaluation source
  max_branches: int
  temperature: float          # 0: greedy
  top_p: float
  sr_k: int                   # single-step retrieval documents ('sr_' metrics; 0: none)
  generator_max_docs: int     # documents the generator reads
  answer_tokens: int          # the generator's answer length
  generator_thinking: bool    # Qwen3's enable_thinking for the generator's prompts


@dataclasses.dataclass(frozen=True)
class SteeringSettings:
  """`r2ag` with role 'steering' (configs/r2ag.py)."""
  role: str
  train_top_k: int
  passage_words: int          # evidence cut to this many words (0: whole)
  oracle_predicted: bool
  reward: RewardConfig
  forest: ForestConfig
  eval: EvalSettings


@dataclasses.dataclass(frozen=True)
class GeneratorSettings:
  """`r2ag` with role 'generator' (configs/r2ag_generator.py)."""
  role: str
  passage_words: int
  generator_distractors: int  # retrieved distractors among a question's gold documents


def steering(config) -> SteeringSettings:
  return config_base.section(SteeringSettings, config.r2ag, "r2ag")


def generator(config) -> GeneratorSettings:
  return config_base.section(GeneratorSettings, config.r2ag, "r2ag")
