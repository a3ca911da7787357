"""R2AG's keys in the config check (`rlrag_jax.config_check`): key pattern -> allowed values,
each set the constant its consumer raises with."""
from rlrag_jax import config_check as cc
from rlrag_jax.methods.r2ag import forest, rewards, task

class TByDataset:
  """A 'dataset:t' entry, t a whole number (task.parse_t_by_dataset)."""

  def __call__(self, v):
    try:
      task.parse_t_by_dataset([v])
    except ValueError:
      return "must look like 'dataset:t' with t a whole number, e.g. 'hotpotqa:1'"
    return None


RULES = {
    "r2ag.role": cc.OneOf(task.ROLES),
    "r2ag.train_top_k": cc.COUNT,
    "r2ag.passage_words": cc.COUNT_OR_OFF,           # 0: whole passages
    "r2ag.generator_distractors": cc.NON_NEGATIVE,
    "r2ag.reward.alpha": cc.NON_NEGATIVE,            # weights of Eq. 5's terms
    "r2ag.reward.beta": cc.NON_NEGATIVE,
    "r2ag.reward.gamma": cc.NON_NEGATIVE,
    "r2ag.reward.ell": cc.NON_NEGATIVE,
    "r2ag.reward.format_*": cc.NON_NEGATIVE,
    "r2ag.reward.t_base": cc.NON_NEGATIVE,           # queries whose documents the AP counts
    "r2ag.reward.t_pred": cc.NON_NEGATIVE,
    "r2ag.reward.weighting": cc.OneOf(rewards.WEIGHTINGS),
    "r2ag.forest.size": cc.COUNT,                    # forest.Forest: >= 1
    "r2ag.forest.max_iterations": cc.COUNT,
    "r2ag.forest.max_children": cc.COUNT,
    "r2ag.forest.max_size": cc.COUNT,
    "r2ag.forest.carry": cc.OneOf(forest.CARRIES),
    "r2ag.eval.top_k": cc.COUNT,
    "r2ag.eval.other_top_k": cc.Each(cc.COUNT),
    "r2ag.eval.t_base": cc.NON_NEGATIVE,             # base queries that open a branch
    "r2ag.eval.t_pred": cc.NON_NEGATIVE,
    "r2ag.eval.t_base_by_dataset": cc.Each(TByDataset()),   # 'dataset:t' (task.parse_t_...)
    "r2ag.eval.max_iterations": cc.COUNT,
    "r2ag.eval.max_branches": cc.COUNT,
    "r2ag.eval.temperature": cc.NON_NEGATIVE,        # 0: greedy
    "r2ag.eval.top_p": cc.Range(lo=0, hi=1, lo_open=True),
    "r2ag.eval.sr_k": cc.COUNT_OR_OFF,               # 0: no single-step retrieval row
    "r2ag.eval.generator_max_docs": cc.COUNT,
    "r2ag.eval.answer_tokens": cc.COUNT,
    "r2ag.eval.generator_thinking": cc.BOOL,
}
