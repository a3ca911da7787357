"""Search-R1 (Jin et al. 2025): an LLM that reasons, searches and answers in one stream, trained
with PPO or GRPO on the exact match of its answer; the protocol's prompt, parsing, reward and
published rows, on the shared tool loop."""
