"""APEX's config section `apex`, parsed once into frozen dataclasses (`config_base.section`):
every key is declared in configs/apex_planner.py (role 'planner') or configs/apex_executor.py
(role 'executor'), none defaulted here. The rules on their values are in config_rules.py.

`ADDED_LATER` holds the keys a run's saved config.json (read back by pipeline.py) may lack
because they were added after the run, with the value that reproduces what such a run did."""
from __future__ import annotations

import dataclasses

from rlrag_jax import config_base


@dataclasses.dataclass(frozen=True)
class PlannerSettings:
  role: str
  max_steps: int             # sub-questions a plan may hold
  sepr_threshold: float
  encoder_path: str          # SEPR's encoder ('': the packaged MiniLM)
  rewrite_symbolic: bool     # MuSiQue's 'X >> relation' steps as questions (rewrite.py)
  gold_plans: str            # JSONL of gold plans by example id ('': none)


@dataclasses.dataclass(frozen=True)
class ExecutorSettings:
  role: str
  max_steps: int
  max_hops: int
  top_k: int
  max_query_tokens: int
  max_answer_tokens: int
  max_passage_words: int     # 0: whole passages
  trajectories: str          # self_instruct.py's JSONL ('': the oracle's trajectories)


def planner(config) -> PlannerSettings:
  return config_base.section(PlannerSettings, config.apex, "apex")


def executor(config) -> ExecutorSettings:
  return config_base.section(ExecutorSettings, config.apex, "apex")


# A saved config of an older APEX run: keys added since, with the behaviour before them
# (the commit that added each). Applied by pipeline._run_config with config_base.ADDED_LATER.
ADDED_LATER = {
    "planner": {
        "apex.rewrite_symbolic": True,    # 29fb50e: symbolic steps were always rewritten
        "apex.gold_plans": "",            # 29fb50e: no plan file
    },
    "executor": {
        "apex.max_passage_words": 0,      # 714bb7d: whole passages
    },
}
