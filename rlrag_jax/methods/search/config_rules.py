"""The search agent's keys in the config check (`rlrag_jax.config_check`): key pattern ->
allowed values, each set the constant its consumer raises with."""
from rlrag_jax import config_check as cc
from rlrag_jax.methods.search import rewards

RULES = {
    "data.train_frac": cc.Range(lo=0, hi=1, lo_open=True),    # task._split
    "reward.beta": cc.NON_NEGATIVE,                 # the retrieval-count coefficient
    "reward.match": cc.OneOf(rewards.MATCHES),
    "reward.f1_threshold": cc.FRACTION,
    "reward.max_query_words": cc.COUNT,
    "reward.rs_form": cc.OneOf(rewards.RS_FORMS),
    "reward.answer_form": cc.OneOf(rewards.ANSWER_FORMS),
    **cc.TOOL_RULES,                               # the shared tool loop's keys
    "tool.max_prompt_len": cc.COUNT_OR_OFF,
    "search.sft.known_min_seen": cc.COUNT_OR_OFF,  # 0: every step searched
    "search.eval.naive_k": cc.COUNT,
}

# Open-domain questions search a corpus, not the other datasets' paragraphs (the paper: e5 over
# the September 2025 Wikipedia, prepared with FlashRAG; section 4 / appendix).
CHECKS = (cc.NeedsCorpus(protocol="the September 2025 Wikipedia with e5 (FlashRAG)"),)
