"""APEX's keys in the config check (`rlrag_jax.config_check`): key pattern -> allowed values,
each set the constant or bound its consumer raises with."""
from rlrag_jax import config_check as cc
from rlrag_jax.methods.apex import task

RULES = {
    "apex.role": cc.OneOf(task.ROLES),
    "apex.max_steps": cc.COUNT,                      # task.PlannerTask / ExecutorTask: >= 1
    "apex.max_hops": cc.COUNT,
    "apex.top_k": cc.COUNT,
    "apex.sepr_threshold": cc.Range(lo=0, hi=1, lo_open=True),    # sepr: (0, 1]
    "apex.max_query_tokens": cc.COUNT,
    "apex.max_answer_tokens": cc.COUNT,
    "apex.max_passage_words": cc.COUNT_OR_OFF,       # 0: whole passages
}

# Open-domain questions (Bamboogle in the executor's ':paper') search a corpus, not the other
# datasets' paragraphs. The planner has no retrieval section and passes.
CHECKS = (cc.NeedsCorpus(protocol="Search-R1's environment: e5 over the December 2018 "
                                  "Wikipedia (wiki-18)"),)
