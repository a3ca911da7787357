"""The method-agnostic RL core: log-probs, KL estimators, advantages, losses, dynamic sampling,
the learner's token batches (`packing`) and the sharded jitted train steps: the state and its
optimizer (`optim_state`), one update's machinery (`update`, over `token_stats`), the steps and
forwards (`step_factories`). Algorithms are pure functions looked up by name:
`kl(logp, ref_logp, 'k3')`, `ADVANTAGE_ESTIMATORS['grpo']`, `AGGREGATIONS['token_mean']`.
"""
from rlrag_jax.rl.advantages import (ADVANTAGE_ESTIMATORS, gae, group_advantages, masked_whiten,
                                     rloo_advantages)
from rlrag_jax.rl.dynamic_sampling import (FillResult, fill_groups, filter_zero_spread_groups,
                                           group_rewards, pad_groups)
from rlrag_jax.rl.kl import KL_ESTIMATORS, kl
from rlrag_jax.rl.logprobs import (completion_logprobs, shift_logprobs, token_entropy,
                                   token_logprobs)
from rlrag_jax.rl.losses import (AGGREGATIONS, aggregate, aggregation_terms, kl_penalty_rewards,
                                 outcome_token_rewards, policy_loss, ppo_token_loss, sft_loss,
                                 value_loss, value_token_loss)
from rlrag_jax.rl.optim_state import (OptimizerConfig, TrainState, abstract_train_state,
                                      create_train_state, make_optimizer, make_schedule,
                                      train_state_shardings)
from rlrag_jax.rl.step_factories import (LossConfig, make_logprob_fn, make_policy_step,
                                         make_sft_step, make_value_fn, make_value_step)

__all__ = [
    "ADVANTAGE_ESTIMATORS", "gae", "group_advantages", "masked_whiten", "rloo_advantages",
    "FillResult", "fill_groups", "filter_zero_spread_groups", "group_rewards", "pad_groups", "KL_ESTIMATORS",
    "kl",
    "completion_logprobs", "shift_logprobs", "token_entropy", "token_logprobs", "AGGREGATIONS",
    "aggregate", "aggregation_terms", "kl_penalty_rewards", "outcome_token_rewards",
    "policy_loss", "ppo_token_loss", "sft_loss", "value_loss", "value_token_loss", "LossConfig",
    "OptimizerConfig", "TrainState", "abstract_train_state", "create_train_state",
    "make_logprob_fn", "make_optimizer",
    "make_policy_step", "make_schedule", "make_sft_step", "make_value_fn", "make_value_step",
    "train_state_shardings",
]
