"""Search-R1's config sections `tool` and `search_r1`, each parsed once into a frozen dataclass
(`config_base.section`): every key is declared in configs/search_r1.py, none defaulted here."""
from __future__ import annotations

import dataclasses

from rlrag_jax import config_base


@dataclasses.dataclass(frozen=True)
class ToolSettings:
  top_k: int                    # passages per search (the paper: 3)
  max_turns: int                # searches per episode (the paper: 4)
  max_obs_tokens: int           # tokens of one <information> block, closing tag kept (500)
  max_total_len: int            # prompt + completion tokens (the paper's sequence length)
  min_batch: int                # padding of the tool loop's generate calls
  context_bucket: int
  kv_reuse: bool


@dataclasses.dataclass(frozen=True)
class SearchR1Settings:
  eval_per_dataset: int         # > 0: a seeded draw of at most this many per evaluation dataset
  published: str                # the published row the evaluation report stands beside ('' none)


def tool(config) -> ToolSettings:
  return config_base.section(ToolSettings, config.tool, "tool")


def search_r1(config) -> SearchR1Settings:
  return config_base.section(SearchR1Settings, config.search_r1, "search_r1")
