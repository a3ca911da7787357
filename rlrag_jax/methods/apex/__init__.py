"""APEX-Searcher (Chen et al.): a GRPO planner rewarded by the Set-Equivalence Plan Reward, an
SFT executor, and the plan -> execute pipeline. This package owns the method's prompts, plan
parsing, reward and glue; the RL engine, models, sampler and retrieval are shared."""
