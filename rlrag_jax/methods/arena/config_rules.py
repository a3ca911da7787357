"""ARENA's keys in the config check (`rlrag_jax.config_check`): key pattern -> allowed values,
each set the constant its consumer raises with."""
from rlrag_jax import config_check as cc
from rlrag_jax.methods.arena import parsing, rewards, sft, task

RULES = {
    "data.max_passage_chars": cc.COUNT_OR_OFF,           # 0: whole passages
    "data.analysis_style": cc.OneOf(sft.STYLES),
    "reward.relevance_parse": cc.OneOf(parsing.RELEVANCE_PARSERS),
    "reward.accuracy": cc.OneOf(rewards.ACCURACY_MODES),
    "reward.w_*": cc.NON_NEGATIVE,                      # weights of the part scores
    "reward.bonus_value": cc.NON_NEGATIVE,
    "arena.sft.target": cc.OneOf(task.SFT_TARGETS),
}
