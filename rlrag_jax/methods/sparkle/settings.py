"""SPARKLE's config section `sparkle`, parsed once into frozen dataclasses
(`config_base.section`): every key is declared in configs/sparkle.py (the reader's
configs/sparkle_reader.py starts from it and sets role 'reader'), none defaulted here. The rules
on their values are in config_rules.py."""
from __future__ import annotations

import dataclasses

from rlrag_jax import config_base
from rlrag_jax.methods.sparkle.rewards import RewardConfig


@dataclasses.dataclass(frozen=True)
class TreeSettings:
  depth: int


@dataclasses.dataclass(frozen=True)
class AgentSettings:
  """`sparkle.agent`, read by `agent.AgentConfig.from_config`."""
  top_docs: int
  top_triples: int
  max_steps: int
  max_retrievals: int
  recall_k: int
  rd_default: bool
  ki_fallback: str
  ki_output: str
  reasoning_reader: bool
  passage_words: int
  rd_mode: str
  qf_mode: str
  ki_mode: str
  all_docs: int


@dataclasses.dataclass(frozen=True)
class MaxNewSettings:
  """`sparkle.max_new`: the most new tokens of each role's output."""
  rd: int
  qf: int
  ki: int
  reader: int


@dataclasses.dataclass(frozen=True)
class ReaderSettings:
  """`sparkle.reader`: an OpenAI-compatible reader (url '': the bound `models.reader`)."""
  url: str
  model: str
  max_tokens: int
  concurrency: int
  max_failure_rate: float
  failure_window: int


@dataclasses.dataclass(frozen=True)
class EvalSettings:
  naive_k: int
  baselines: bool           # the reader-alone and naive-RAG rows of every evaluation
  recall_steps: int         # recall@k after each of the first this many steps


@dataclasses.dataclass(frozen=True)
class ReaderSftSettings:
  retrieve_prob: float
  distractor_prob: float


@dataclasses.dataclass(frozen=True)
class SparkleSettings:
  role: str
  rollout: str
  tree: TreeSettings
  agent: AgentSettings
  max_new: MaxNewSettings
  max_len: int              # prompt + output tokens of a proxy call (0: the model's positions)
  reward: RewardConfig
  reader: ReaderSettings
  triples_file: str
  kg_default: str
  sft_trajectories: str
  valid_fraction: float
  eval_on: str
  eval: EvalSettings
  reader_sft: ReaderSftSettings


def parse(config) -> SparkleSettings:
  return config_base.section(SparkleSettings, config.sparkle, "sparkle")
