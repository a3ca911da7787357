"""ARENA (Adaptive-Rewarded Evidence Navigation Agent, Ren et al. 2025): prompt, parser, rewards.

The generator reads a question over references numbered [1]..[n] and replies
`<relevance>[ids]</relevance><analysis>…</analysis><answer>…</answer>`; the rule-based reward is
format + accuracy + relevance, plus a bonus of 10 when all three are perfect.
The batched reward is `arena.rewards.rewards` (the submodule keeps its name, so the function is
not re-exported here).
"""
from rlrag_jax.methods.arena.parsing import Parsed
from rlrag_jax.methods.arena.parsing import parse
from rlrag_jax.methods.arena.prompts import INSTRUCTION
from rlrag_jax.methods.arena.prompts import Numbering
from rlrag_jax.methods.arena.prompts import build_messages
from rlrag_jax.methods.arena.prompts import build_prompt
from rlrag_jax.methods.arena.prompts import messages_for
from rlrag_jax.methods.arena.prompts import prompt_for
from rlrag_jax.methods.arena.prompts import reference_numbers
from rlrag_jax.methods.arena.rewards import reward
from rlrag_jax.methods.arena.sft import gold_completion
from rlrag_jax.methods.arena.sft import sft_pair
