"""R2AG (reasoning-augmented retrieval trees): a retrieval-steering model expands a
multi-branch retrieval tree, each query retrieving its top-1 document; Top-Survivor rewards;
DAPO; progressive training over a retrieval forest. This package owns the method's prompts,
parsing, rewards, forest and glue; the RL engine, models, sampler and retrieval are shared."""
