"""SPARKLE (a structured, plug-and-play agentic retrieval policy): one proxy model plays three
agents (Retrieval Decision, Query Formulation through a KG-triple reasoning chain, Knowledge
Integration by selecting one candidate triple) around a frozen reader that reasons step by
step; PPO with a value model on binary tree rollouts with pruning and Monte-Carlo credit. This
package owns the method's prompts, parsing, rewards, triples and rollout glue; the RL engine,
models, sampler and retrieval are shared."""
