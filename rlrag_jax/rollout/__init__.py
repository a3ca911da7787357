"""Turning a policy + an environment into trajectories (single turn, tool loop)."""
from rlrag_jax.rollout.tool_loop import (Observation, ToolLoopResult, Turn, run_tool_loop,
                                         truncate_observation)

__all__ = ["Observation", "ToolLoopResult", "Turn", "run_tool_loop", "truncate_observation"]
