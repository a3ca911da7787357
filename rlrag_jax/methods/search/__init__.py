"""Learning When to Search: prompt/protocol, parser, conciseness rules and multi-stage rewards."""
from rlrag_jax.methods.search import conciseness
from rlrag_jax.methods.search.conciseness import is_concise, to_keywords, violations
from rlrag_jax.methods.search.prompts import (
    PROMPT, SEARCH_STOP, STOP_STRINGS, TAGS, build_prompt, extract_query, format_observation,
    gold_pieces, gold_queries, gold_trajectory, gold_trajectory_direct, naive_rag_pieces,
    observation_block)
from rlrag_jax.methods.search.parsing import Parsed, parse
from rlrag_jax.methods.search.rewards import (
    Score, answer_reward, format_reward, is_correct, mean_pairwise_cosine, reward, score,
    search_reward)
