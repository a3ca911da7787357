"""Search-R1's keys in the config check (`rlrag_jax.config_check`): key pattern -> allowed
values, and the cross-key check that every dataset has a corpus to search."""
from rlrag_jax import config_check as cc
from rlrag_jax.methods.search_r1 import report

RULES = {
    **cc.TOOL_RULES,                               # the shared tool loop's keys
    "tool.kv_reuse": cc.BOOL,
    "search_r1.eval_per_dataset": cc.COUNT_OR_OFF,  # 0: every question of each dataset
    "search_r1.published": cc.OneOf(("",) + tuple(report.PUBLISHED)),
}

# Search-R1 retrieves from wiki-18 for every dataset, the multi-hop ones included: pooling their
# own distractor paragraphs would be another (closed) setting, so a real-data run names its
# corpus whatever datasets it holds.
CHECKS = (cc.NeedsCorpus(protocol="the December 2018 Wikipedia (wiki-18, 21M passages) with "
                                  "e5-base-v2, top 3", always=True),)
