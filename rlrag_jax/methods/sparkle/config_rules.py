"""SPARKLE's keys in the config check (`rlrag_jax.config_check`): key pattern -> allowed values,
each set the constant its consumer raises with."""
from rlrag_jax import config_check as cc
from rlrag_jax.methods.sparkle import agent, rewards, task, triples

RULES = {
    "sparkle.role": cc.OneOf(task.ROLES),
    "sparkle.rollout": cc.OneOf(task.ROLLOUTS),
    "sparkle.tree.depth": cc.NON_NEGATIVE,          # rollout.tree.expand: max_depth >= 0
    "sparkle.agent.top_docs": cc.COUNT,
    "sparkle.agent.top_triples": cc.COUNT,
    "sparkle.agent.max_steps": cc.COUNT,
    "sparkle.agent.max_retrievals": cc.NON_NEGATIVE,
    "sparkle.agent.recall_k": cc.COUNT,
    "sparkle.agent.ki_fallback": cc.OneOf(agent.KI_FALLBACKS),
    "sparkle.agent.ki_output": cc.OneOf(agent.KI_OUTPUTS),
    "sparkle.agent.passage_words": cc.COUNT_OR_OFF,  # 0: whole passages
    "sparkle.agent.rd_mode": cc.OneOf(agent.RD_MODES),
    "sparkle.agent.qf_mode": cc.OneOf(agent.QF_MODES),
    "sparkle.agent.ki_mode": cc.OneOf(agent.KI_MODES),
    "sparkle.agent.all_docs": cc.COUNT_OR_OFF,       # 0: top_docs
    "sparkle.max_new.*": cc.COUNT,
    "sparkle.max_len": cc.COUNT_OR_OFF,              # 0: the proxy model's positions
    "sparkle.reward.alpha": cc.FRACTION,
    "sparkle.reward.weighting": cc.OneOf(rewards.WEIGHTINGS),
    "sparkle.reader.max_tokens": cc.COUNT,
    "sparkle.reader.concurrency": cc.COUNT,
    "sparkle.reader.failure_window": cc.COUNT,
    "sparkle.reader.max_failure_rate": cc.FRACTION,
    "sparkle.kg_default": cc.OneOf(triples.KG_DEFAULTS),
    "sparkle.valid_fraction": cc.RATIO_BELOW_ONE,   # task.split_validation; 0: no validation
    "sparkle.eval_on": cc.OneOf(task.EVAL_ON),
    "sparkle.eval.naive_k": cc.COUNT,
    "sparkle.eval.recall_steps": cc.COUNT,
    "sparkle.reader_sft.*_prob": cc.FRACTION,
}

# Open-domain questions (NQ, TriviaQA, Bamboogle in ':paper') search a corpus, not the other
# datasets' paragraphs (appendix D.1: DPR's Wikipedia for them, the datasets' own corpora for
# HotpotQA, 2Wiki and MuSiQue).
CHECKS = (cc.NeedsCorpus(protocol="DPR's December 2018 Wikipedia (Karpukhin et al. 2020) for "
                                  "NQ, TriviaQA and Bamboogle, with e5-large-v2"),)
