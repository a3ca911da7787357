"""RL learners: one step's batch (`training.batch.Batch`: episodes, rewards, group ids) ->
policy (and critic) updates.

`rl.algo` picks the learner:
  'grpo' | 'dr_grpo' | 'rloo'   OutcomeLearner: one scalar reward per episode; advantages within
                                its group (the batch's group ids, never positions; 0 on silenced
                                episodes) by the estimator of that name in
                                `rl.ADVANTAGE_ESTIMATORS` ('grpo' honours rl.scale_std and
                                rl.adv_eps). DAPO is 'grpo' with DAPO's loss settings
                                (asymmetric clip, token-level aggregation, dynamic sampling).
  'ppo'                         PPOLearner: a critic (rl.ppo.critic 'separate': a value LM
                                started from the policy's backbone and trained whole; 'head': a
                                value head on the policy's own current backbone, which only the
                                policy loss trains; 'tree_mc': no value model, the value of a
                                decision's state is its parent node's Monte-Carlo return in the
                                rollout tree, Episode.baseline, as VinePPO estimates
                                values by rollouts), the outcome reward on each episode's last
                                policy token, GAE(gamma, lambda) per token, optional advantage
                                whitening, a clipped value loss with its own lr, rl.mu epochs of
                                rl.ppo.mini_batches shuffled mini-batches, or, with
                                rl.ppo.mini_batch_size > 0, of max(1, round(episodes / size))
                                (then the lr schedules count RL steps, not updates).

Both pack the episodes into one token batch, compute the sampling policy's log-probs when updates
are more than one (mu > 1 or mini-batches), the reference log-probs when the KL term is on, and
call the jitted, sharded update steps of `rl.step_factories`.

With `rl.tokens_per_micro_batch` > 0 no whole batch reaches the device: the episodes (PPO: each
mini-batch's) are planned into length-sorted micro-batches of at most that many padded tokens
(`rl.packing.plan_micro_batches`), each packed at its own width and padded with zero rows to
that width's one row count; the log-prob and value forwards run per micro-batch, and one
update accumulates them (`UpdateStep.accumulated`), with the whole batch's loss normalisers, so
it equals the one-batch update. mu > 1 repeats the plan. The logits start reaches those jits
traced (`Forward.any_start`, `UpdateStep.accumulate`), so a run compiles each of them once per
width bucket (`rl.packing.width_buckets`), whatever lengths its steps meet.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlrag_jax import settings as settings_lib
from rlrag_jax.models import ValueLM, value_params_from_policy
from rlrag_jax.models import sharding
from rlrag_jax.rl import advantages as adv_lib
from rlrag_jax.rl import losses
from rlrag_jax.rl import optim_state, step_factories
from rlrag_jax.rl.batching import (ALGOS, OUTCOME_ALGOS, check_algo, episode_unit,  # noqa: F401
                                    equal_micro_batches, mini_batch_size, token_budget)
from rlrag_jax.rl.batching import mini_batches as _mini_batches
from rlrag_jax.rl.packing import (logits_start, pack, pack_micro_batch, plan_micro_batches,
                                   put_rows, take_rows)

CRITICS = settings_lib.CRITICS            # rl.ppo.critic
# rl.kl_form: where rl.kl_beta's KL(policy || ref) acts: 'loss' (a term of the policy loss,
# GRPO's form) or 'reward' (PPO only: -kl_beta * KL on every policy token's reward before GAE,
# the OpenRLHF / InstructGPT form; the loss term is then off).
KL_FORMS = settings_lib.KL_FORMS


def kl_form(rl) -> str:
  form = str(rl.kl_form)
  if form not in KL_FORMS:
    raise ValueError(f"config key 'rl.kl_form' is {form!r}; expected one of {KL_FORMS}")
  if form == "reward" and check_algo(rl) != "ppo":
    raise ValueError(f"config key 'rl.kl_form' is 'reward', which needs per-token rewards "
                     f"(rl.algo 'ppo'); rl.algo is {rl.algo!r}: use 'loss'")
  return form


def updates_per_step(rl, episodes: int | None = None) -> int:
  """Optimizer updates one RL step of `episodes` episodes makes: rl.mu epochs of its
  mini-batches (`episodes` is needed only with rl.ppo.mini_batch_size > 0)."""
  return int(rl.mu) * _mini_batches(rl, episodes)


def schedule_by_rl_step(rl) -> bool:
  """Whether the RL lr schedules (policy and critic) are indexed by RL steps rather than by
  updates: with rl.ppo.mini_batch_size > 0 a step's update count follows its episode count,
  which a tree rollout varies, so no update count fixes the schedule's length in advance;
  every update of a step then takes the step's lr (`optim_state.advance_rl_step`)."""
  return mini_batch_size(rl) > 0


def schedule_length(rl, rl_steps: int) -> int:
  """The RL lr schedule's length (OptimizerConfig.total_steps, at least 2): RL steps when
  `schedule_by_rl_step`, else rl_steps x updates_per_step optimizer updates."""
  n = int(rl_steps) if schedule_by_rl_step(rl) else int(rl_steps) * updates_per_step(rl)
  return max(n, 2)


def shard_count(mesh) -> int:
  """Devices a batch's rows are split over (data x fsdp): a micro-batch's row multiple."""
  return int(mesh.shape["data"] * mesh.shape["fsdp"])


def plan_episodes(episodes, rows, budget: int, bucket: int, mesh) -> list:
  """Token-budget micro-batches (`rl.packing.MicroBatch`) of episodes[rows]; their `rows`
  index `episodes`."""
  rows = np.asarray(rows, np.int64)
  plan = plan_micro_batches([len(episodes[i].prompt_ids) for i in rows],
                            [len(episodes[i].completion_ids) for i in rows], budget,
                            bucket=bucket, shards=shard_count(mesh))
  return [dataclasses.replace(mb, rows=rows[mb.rows]) for mb in plan]


def pack_episodes(episodes, mb, pad_id: int, bucket: int) -> dict:
  """The micro-batch's episodes packed at its width, padded with zero rows to its size."""
  return pack_micro_batch([e.prompt_ids for e in episodes], [e.completion_ids for e in episodes],
                          [e.loss_mask for e in episodes], mb, pad_id=pad_id, bucket=bucket)


def _pad_to(x: np.ndarray, size: int) -> np.ndarray:
  return np.concatenate([x, np.zeros((size - x.shape[0],) + x.shape[1:], x.dtype)])


def make_learner(config, steps, mesh, model_cfg, pad_id: int):
  algo = check_algo(config.rl)
  if algo == "ppo":
    return PPOLearner(config, steps, mesh, model_cfg, pad_id)
  return OutcomeLearner(config, steps, mesh, pad_id)


class OutcomeLearner:
  """GRPO-family update: group advantages of the episodes' total rewards."""
  has_critic = False

  def __init__(self, config, steps, mesh, pad_id: int):
    self.rl, self.steps, self.mesh, self.pad = config.rl, steps, mesh, pad_id
    algo = self.algo = check_algo(config.rl)
    kl_form(config.rl)          # 'reward' is PPO's: refused here
    if algo == "grpo":
      self.estimate = lambda r, index: adv_lib.group_advantages(
          r, index, scale_std=bool(self.rl.scale_std), eps=self.rl.adv_eps)
    else:
      self.estimate = adv_lib.ADVANTAGE_ESTIMATORS[algo]

  def init_critic(self, policy_params, key):
    return None

  def update(self, state, critic, batch, ref_params, key) -> tuple:
    """One RL step on `batch` (`training.batch.Batch`): advantages of the total rewards within
    the batch's groups (its group ids), 0 on silenced episodes. Returns (state, critic,
    metrics)."""
    rl = self.rl
    episodes = batch.episodes
    adv = np.asarray(self.estimate(batch.totals(), batch.group_ids))
    adv = np.where(batch.live, adv, np.float32(0.0))
    if token_budget(rl):
      state, m = self._update_by_budget(state, episodes, adv.astype(np.float32), ref_params)
      return state, critic, m
    batch = pack([e.prompt_ids for e in episodes], [e.completion_ids for e in episodes],
                 [e.loss_mask for e in episodes], pad_id=self.pad, bucket=rl.pack_bucket)
    batch["advantages"] = adv.astype(np.float32)
    start = logits_start(batch["loss_mask"], rl.pack_bucket)
    batch = sharding.shard_batch(batch, self.mesh)
    if rl.mu > 1:      # with one update per batch the step's own stop_gradient suffices
      batch["old_logp"] = self.steps.logp(state.params, batch, start)
    if self.steps.with_ref:
      batch["ref_logp"] = self.steps.logp(ref_params, batch, start)
    for _ in range(rl.mu):
      state, m = self.steps.rl_step(state, batch, start)
    return state, critic, {k: float(v) for k, v in m.items()}

  def _update_by_budget(self, state, episodes, adv, ref_params) -> tuple:
    """The same update over token-budget micro-batches: the forwards per micro-batch, then
    rl.mu accumulated updates over the same plan."""
    rl = self.rl
    parts = []
    for mb in plan_episodes(episodes, np.arange(len(episodes)), token_budget(rl),
                            rl.pack_bucket, self.mesh):
      host = pack_episodes(episodes, mb, self.pad, rl.pack_bucket)
      host["advantages"] = _pad_to(adv[mb.rows], mb.size)
      start = logits_start(host["loss_mask"], rl.pack_bucket)
      batch = sharding.shard_batch(host, self.mesh)
      if rl.mu > 1:
        batch["old_logp"] = self.steps.logp.any_start(state.params, batch, start)
      if self.steps.with_ref:
        batch["ref_logp"] = self.steps.logp.any_start(ref_params, batch, start)
      parts.append((batch, start))
    for _ in range(rl.mu):
      state, m = self.steps.rl_step.accumulated(state, parts)
    return state, {k: float(v) for k, v in m.items()}


class Critic:
  """Where PPO's values come from (rl.ppo.critic), chosen once when the learner is built:
  `ValueModelCritic` ('separate', 'head') or `TreeMCCritic` ('tree_mc').

  trains: whether there is a critic TrainState to build, train and checkpoint.
  lam: GAE's lambda for these values.
  batch_keys: the host batch entries the critic update reads (none: nothing to train).
  """
  trains: bool
  lam: float
  batch_keys: tuple

  def init(self, policy_params, key):
    """The critic TrainState at the start of RL (None when nothing trains)."""
    raise NotImplementedError

  def abstract(self):
    """The critic TrainState's abstract shapes: a checkpoint restore target."""
    raise NotImplementedError

  def for_step(self, critic, policy_params):
    """The critic state this step reads and trains (given the sampling policy's params)."""
    return critic

  def values(self, forward, critic, episodes, mask):
    """Values [B, T] of the packed batch; `forward(fn, params)` runs a jitted forward over it."""
    raise NotImplementedError

  def metrics(self, values, adv, returns, mask) -> dict:
    """The step's value metrics, from the unwhitened advantages."""
    raise NotImplementedError

  def whiten(self, adv, mask, labels):
    """Advantages whitened over the batch (`labels` None) or over each label's episodes."""
    raise NotImplementedError

  def update(self, critic, batch) -> tuple:
    """(critic, metrics) after one update on a mini-batch of `batch_keys`."""
    return critic, {}

  def update_accumulated(self, critic, parts) -> tuple:
    """The same over token-budget micro-batches [(batch, 0)]."""
    return critic, {}

  def advance(self, critic):
    """The critic after the RL step, its lr schedule moved on (`schedule_by_rl_step`)."""
    return critic


class ValueModelCritic(Critic):
  """A value LM trained by a clipped value loss with its own optimizer (rl.ppo.vf_lr):
  'separate' trains a whole ValueLM started from the policy's backbone; 'head' trains only a
  value head, read on a copy of the policy's current backbone at each step."""
  trains = True
  batch_keys = ("input_ids", "attention_mask", "loss_mask", "returns", "old_values")

  def __init__(self, config, mesh, model_cfg):
    rl = config.rl
    self.mesh, self.lam = mesh, float(rl.ppo.lam)
    self.shared = rl.ppo.critic == "head"
    self.module = ValueLM(model_cfg)
    self.opt = optim_state.make_optimizer(optim_state.OptimizerConfig(
        lr=rl.ppo.vf_lr, schedule=rl.lr_schedule, warmup_ratio=rl.warmup_ratio,
        total_steps=schedule_length(rl, config.rl.steps),
        weight_decay=rl.weight_decay, max_grad_norm=rl.max_grad_norm),
        by_rl_step=schedule_by_rl_step(rl))
    if self.shared:    # only the head learns; XLA drops the backbone's unused gradient
      label = lambda tree, name: jax.tree_util.tree_map(lambda _: name, tree)
      shapes = sharding.param_shapes(self.module)
      self.opt = optax.multi_transform(
          {"head": self.opt, "frozen": optax.set_to_zero()},
          {"model": label(shapes["model"], "frozen"),
           "value_head": label(shapes["value_head"], "head")})
    clip = float(rl.ppo.vf_clip)
    self.value_step = step_factories.make_value_step(
        self.module, self.opt, mesh, clip_eps=clip if clip > 0 else None,
        aggregation=rl.aggregation, max_len=rl.max_new_tokens,
        micro_batches=equal_micro_batches(rl))
    self.value_fn = step_factories.make_value_fn(self.module, mesh, micro_batches=equal_micro_batches(rl))
    self.hidden = model_cfg.hidden_size
    self.param_dtype = model_cfg.params_dtype

  def init(self, policy_params, key):
    """The policy's backbone and a fresh value head (kernel N(0, 0.02))."""
    head = {"kernel": (0.02 * jax.random.normal(key, (self.hidden, 1))).astype(self.param_dtype),
            "bias": jnp.zeros((1,), self.param_dtype)}
    params = value_params_from_policy(jax.device_get(policy_params), {"value_head": head})
    return optim_state.create_train_state(self.module, self.opt, self.mesh, params=params)

  def abstract(self):
    return optim_state.abstract_train_state(self.module, self.opt, self.mesh)

  def for_step(self, critic, policy_params):
    """'head': the critic's backbone becomes a copy of the policy's current one (a copy: the
    value step donates its state, and the policy's arrays must outlive it), so values and the
    head's targets come from the policy that sampled."""
    if not self.shared:
      return critic
    model = jax.tree_util.tree_map(jnp.copy, policy_params["model"])
    return critic.replace(params={"model": model, "value_head": critic.params["value_head"]})

  def values(self, forward, critic, episodes, mask):
    return forward(self.value_fn, critic.params)

  def metrics(self, values, adv, returns, mask) -> dict:
    return {"vf/explained_variance": explained_variance(values, returns, mask),
            "vf/return_mean": _masked_mean(returns, mask)}

  def whiten(self, adv, mask, labels):
    if labels is None:
      return adv_lib.masked_whiten(adv, jnp.asarray(mask))
    # each label's tokens whitened alone; 0 outside its mask
    return sum(adv_lib.masked_whiten(adv, jnp.asarray(mask * _rows(labels, lab)))
               for lab in dict.fromkeys(labels))

  def update(self, critic, batch) -> tuple:
    return self.value_step(critic, batch, 0)

  def update_accumulated(self, critic, parts) -> tuple:
    return self.value_step.accumulated(critic, parts)

  def advance(self, critic):
    if critic is None:
      return None
    return critic.replace(opt_state=optim_state.advance_rl_step(critic.opt_state))


class TreeMCCritic(Critic):
  """rl.ppo.critic='tree_mc': no value model. Every token of a decision takes the Monte-Carlo
  return of the decision's parent node in the rollout tree (Episode.baseline) as its
  value, and GAE at lambda 1 gives it its return-to-go minus that. Nothing trains or is saved."""
  trains = False
  lam = 1.0
  batch_keys = ()

  def init(self, policy_params, key):
    return None

  def abstract(self):
    return None

  def values(self, forward, critic, episodes, mask):
    return jnp.asarray(_tree_values(episodes, mask))

  def metrics(self, values, adv, returns, mask) -> dict:
    nonzero = (np.abs(np.asarray(adv)) > 1e-6) & (mask > 0)
    return {"tree/adv_tokens_frac": float(nonzero.sum() / max(mask.sum(), 1.0)),
            "tree/adv_abs_mean": _masked_mean(np.abs(np.asarray(adv)), mask)}

  def whiten(self, adv, mask, labels):
    """Each decision is centred on its own state already, and a decision without siblings has
    exactly 0: advantages are divided by their spread only, so that no mean shift gives the
    zeros a sign."""
    labels = [None] * len(mask) if labels is None else labels
    a = np.asarray(adv, np.float64)
    out = np.zeros_like(a)
    for lab in dict.fromkeys(labels):
      m = (mask * _rows(labels, lab)) > 0
      if m.any():
        std = float(a[m].std())
        out[m] = a[m] / std if std > 1e-8 else a[m]
    return jnp.asarray(out, jnp.float32)


class PPOLearner:
  """PPO with a critic (`Critic`): GAE advantages per token, clipped policy and value losses."""

  def __init__(self, config, steps, mesh, model_cfg, pad_id: int):
    rl = config.rl
    self.rl, self.ppo, self.steps, self.mesh, self.pad = rl, rl.ppo, steps, mesh, pad_id
    if self.ppo.critic not in CRITICS:
      raise ValueError(f"config key 'rl.ppo.critic' is {self.ppo.critic!r}; expected one of "
                       f"{CRITICS}")
    if int(self.ppo.mini_batches) < 1 or equal_micro_batches(rl) < 1:
      raise ValueError(f"config keys 'rl.ppo.mini_batches' = {self.ppo.mini_batches} and "
                       f"'rl.micro_batches' = {rl.micro_batches} must be >= 1")
    if int(self.ppo.mini_batch_size) < 0:
      raise ValueError(f"config key 'rl.ppo.mini_batch_size' is {self.ppo.mini_batch_size}; "
                       "expected 0 (off: rl.ppo.mini_batches) or a positive episode count")
    if mini_batch_size(rl) and equal_micro_batches(rl) > 1:
      # np.array_split's mini-batches differ by one episode and follow the step's episode
      # count: an equal split into rl.micro_batches cannot be promised for every step.
      raise ValueError(
          f"config key 'rl.ppo.mini_batch_size' = {self.ppo.mini_batch_size} makes mini-batches "
          f"of varying sizes, which 'rl.micro_batches' = {rl.micro_batches} equal parts need not "
          "divide; set rl.micro_batches=1 or a token budget rl.tokens_per_micro_batch > 0 "
          "(micro-batches planned per mini-batch, any size)")
    self._gae = jax.jit(adv_lib.gae, static_argnums=(3, 4))
    # The value function (a Critic): the tree's own returns, or a value model to train.
    self.vf = (TreeMCCritic() if self.ppo.critic == "tree_mc" else
               ValueModelCritic(config, mesh, model_cfg))
    self.has_critic = self.vf.trains

  # ---- critic state
  def init_critic(self, policy_params, key):
    """The critic TrainState (`Critic.init`); None for 'tree_mc', which has no critic."""
    return self.vf.init(policy_params, key)

  def abstract_critic(self):
    return self.vf.abstract()

  # ---- one RL step
  def update(self, state, critic, batch, ref_params, key) -> tuple:
    """One RL step on `batch` (`training.batch.Batch`): advantages from the critic's values
    (0 on silenced episodes, whose loss mask is zero), then rl.mu epochs of mini-batch
    updates of the policy and the critic. Returns (state, critic, metrics)."""
    rl = self.rl
    critic = self.vf.for_step(critic, state.params)
    episodes = batch.episodes
    totals = batch.totals()
    host = pack([e.prompt_ids for e in episodes], [e.completion_ids for e in episodes],
                [e.loss_mask for e in episodes], pad_id=self.pad, bucket=rl.pack_bucket)
    start = logits_start(host["loss_mask"], rl.pack_bucket)
    n = totals.shape[0]
    mini = _mini_batches(rl, n)
    # One update on the whole batch samples and updates the same policy (ratio 1): the
    # step's own stop-gradient log-probs are the old ones, so no separate forward (unless
    # the KL reward needs the sampling policy's log-probs).
    on_policy = int(rl.mu) == 1 and mini == 1
    metrics = self._advantages(state, critic, episodes, totals, host, start, ref_params,
                               on_policy)
    state, critic, sums = self._epochs(state, critic, episodes, host, start, key, on_policy,
                                       n, mini)
    metrics.update({k: float(np.mean(v)) for k, v in sums.items()})
    if mini_batch_size(rl):
      metrics["updates"] = float(int(rl.mu) * mini)
    if schedule_by_rl_step(rl):          # the next step's updates take the next step's lr
      state = state.replace(opt_state=optim_state.advance_rl_step(state.opt_state))
      critic = self.vf.advance(critic)
    return state, critic, metrics

  def _forward(self, episodes, host, start):
    """`forward(fn, params)`: a jitted forward (log-probs, values) over the packed batch, as
    [B, T] in `host`'s layout; with a token budget, run per micro-batch (planned once)."""
    rl = self.rl
    budget = token_budget(rl)
    if not budget:
      dev = sharding.shard_batch(host, self.mesh)
      return lambda fn, params: fn(params, dev, start)
    p_len = max(len(e.prompt_ids) for e in episodes)      # pack's prompt columns
    fwd = []

    def forward(fn, params):
      if not fwd:
        for mb in plan_episodes(episodes, np.arange(len(episodes)), budget, rl.pack_bucket,
                                self.mesh):
          b = pack_episodes(episodes, mb, self.pad, rl.pack_bucket)
          fwd.append((mb, sharding.shard_batch(b, self.mesh),
                      logits_start(b["loss_mask"], rl.pack_bucket)))
      out = np.zeros(host["input_ids"].shape, np.float32)
      for mb, batch, s in fwd:
        put_rows(out, fn.any_start(params, batch, s), p_len, mb)
      return out
    return forward

  def _advantages(self, state, critic, episodes, totals, host, start, ref_params,
                  on_policy) -> dict:
    """Adds to `host` the log-probs the update needs (old_logp, ref_logp), the advantages,
    returns and old values; returns the step's value and KL metrics."""
    rl, ppo = self.rl, self.ppo
    forward = self._forward(episodes, host, start)
    kl_reward = self.steps.with_ref and kl_form(rl) == "reward"
    if not on_policy or kl_reward:
      host["old_logp"] = np.asarray(forward(self.steps.logp, state.params))
    if self.steps.with_ref:
      host["ref_logp"] = np.asarray(forward(self.steps.logp, ref_params))
    mask = (host["loss_mask"] > 0).astype(np.float32)
    mask[:, 0] = 0.0
    rewards, kl_metrics = self._rewards(episodes, totals, host, mask, kl_reward)
    values = self.vf.values(forward, critic, episodes, mask)
    adv, returns = self._gae(rewards, values, jnp.asarray(mask), float(ppo.gamma), self.vf.lam)
    metrics = self.vf.metrics(values, adv, returns, mask)
    metrics.update(kl_metrics)
    if ppo.whiten:
      adv = self._whiten(adv, mask, episodes)
    host["advantages"] = np.asarray(adv, np.float32)
    host["returns"] = np.asarray(returns, np.float32)
    host["old_values"] = np.asarray(values, np.float32)
    return metrics

  def _rewards(self, episodes, totals, host, mask, kl_reward: bool) -> tuple:
    """(per-token rewards [B, T], metrics): the task's rewards (`_token_rewards`), with
    rl.kl_form='reward' minus kl_beta x KL(sampling policy || ref) on every policy token."""
    rewards = _token_rewards(episodes, totals, host, mask)
    if not kl_reward:
      return rewards, {}
    rl = self.rl
    penalty = losses.kl_reward_penalty(jnp.asarray(host["old_logp"]),
                                       jnp.asarray(host["ref_logp"]), jnp.asarray(mask),
                                       float(rl.kl_beta), str(rl.kl_estimator))
    return rewards + penalty, {"kl/reward_penalty": _masked_mean(penalty, mask)}

  def _epochs(self, state, critic, episodes, host, start, key, on_policy, n: int,
              mini: int) -> tuple:
    """rl.mu epochs over the step's `n` episodes in `mini` mini-batches (shuffled when more
    than one): (state, critic, {metric: [value per update]})."""
    rl = self.rl
    by_size = bool(mini_batch_size(rl))
    size = n // mini
    if not by_size and (n % mini or size % equal_micro_batches(rl)):
      # The episode count may vary (a tree's decisions, padded to collection.batch_size's
      # buckets), so the split is checked here, per step.
      raise ValueError(
          f"config key 'rl.ppo.mini_batches' = {mini}: it must divide the {n} episodes of this "
          f"step into mini-batches that 'rl.micro_batches' = {rl.micro_batches} divides")
    rng = np.random.default_rng(int(jax.random.randint(key, (), 0, 2 ** 31 - 1)))
    pol_keys = ("input_ids", "attention_mask", "loss_mask", "advantages") + (
        () if on_policy else ("old_logp",)) + (("ref_logp",) if self.steps.with_ref else ())
    sums: dict = {}
    plans = {}            # the token-budget plan of the last mini-batch
    for _ in range(int(rl.mu)):
      order = rng.permutation(n) if mini > 1 else np.arange(n)
      # rl.ppo.mini_batch_size: sizes as equal as possible (n = 2,500 at 1,024: 834, 833, 833)
      split = (np.array_split(order, mini) if by_size else
               [order[j * size:(j + 1) * size] for j in range(mini)])
      for rows in split:
        state, critic, m = self._mini_batch(state, critic, episodes, host, start, rows,
                                            pol_keys, plans)
        for k, v in m:
          sums.setdefault(k, []).append(float(v))
    return state, critic, sums

  def _mini_batch(self, state, critic, episodes, host, start, rows, pol_keys, plans) -> tuple:
    """One policy update and one critic update on the episodes `rows`: (state, critic,
    [(metric, value)]). With a token budget the micro-batch plan is kept in `plans` for the
    next epochs of the same mini-batch (one mini-batch: mu epochs of the same rows)."""
    if token_budget(self.rl):
      key_rows = rows.tobytes()
      if key_rows not in plans:
        plans.clear()
        plans[key_rows] = self._budget_parts(episodes, rows, host, pol_keys, self.vf.batch_keys)
      pol, val = plans[key_rows]
      state, pm = self.steps.rl_step.accumulated(state, pol)
      critic, vm = self.vf.update_accumulated(critic, val)
    else:
      sub = lambda keys: sharding.shard_batch({k: host[k][rows] for k in keys}, self.mesh)
      state, pm = self.steps.rl_step(state, sub(pol_keys), start)
      critic, vm = self.vf.update(critic, sub(self.vf.batch_keys))
    return state, critic, list(pm.items()) + [(f"vf/{k}", v) for k, v in vm.items()]

  def _budget_parts(self, episodes, rows, host, pol_keys, val_keys) -> tuple:
    """Token-budget micro-batches of the mini-batch `rows`: ([(policy batch, logits_start)],
    [(critic batch, 0)]), the per-token entries moved from `host`'s layout to each one's."""
    rl = self.rl
    p_len = max(len(e.prompt_ids) for e in episodes)      # pack's prompt columns
    pol, val = [], []
    for mb in plan_episodes(episodes, rows, token_budget(rl), rl.pack_bucket, self.mesh):
      b = pack_episodes(episodes, mb, self.pad, rl.pack_bucket)
      for k in set(pol_keys + val_keys) - set(b):
        b[k] = take_rows(host[k], p_len, mb)
      start = logits_start(b["loss_mask"], rl.pack_bucket)
      b = sharding.shard_batch(b, self.mesh)
      pol.append(({k: b[k] for k in pol_keys}, start))
      val.append(({k: b[k] for k in val_keys}, 0))
    return pol, val

  def _whiten(self, adv, mask, episodes):
    """Advantages whitened over the batch, or, with rl.ppo.whiten_by naming an Episode.info
    key, separately over the episodes that share its value (the SPARKLE authors normalise per
    action type); how is the critic's (`Critic.whiten`)."""
    key = str(self.ppo.whiten_by)
    return self.vf.whiten(adv, mask, _labels(episodes, key) if key else None)


def _labels(episodes, key: str) -> list:
  """Episode.info[key] of every episode (rl.ppo.whiten_by)."""
  missing = [i for i, e in enumerate(episodes) if key not in getattr(e, "info", {})]
  if missing:
    raise ValueError(f"config key 'rl.ppo.whiten_by' = {key!r}: episode {missing[0]} of "
                     f"this step has no info[{key!r}]")
  return [e.info[key] for e in episodes]


def _rows(labels, lab) -> np.ndarray:
  """[B, 1] float mask of the episodes whose label is `lab`."""
  return np.array([l == lab for l in labels], np.float32)[:, None]


def _token_rewards(episodes, totals, host, mask):
  """Rewards [B, T]: an episode's Episode.token_rewards (one per completion token, e.g. per
  step) where given, else its total on its last policy token."""
  out = np.array(losses.outcome_token_rewards(jnp.asarray(totals), jnp.asarray(mask)))
  width = host["input_ids"].shape[1]
  p_len = max(len(e.prompt_ids) for e in episodes)
  for i, e in enumerate(episodes):
    per = e.token_rewards
    if per is None:
      continue
    if len(per) != len(e.completion_ids):
      raise ValueError(f"episode {i}: Episode.token_rewards has {len(per)} entries for "
                       f"{len(e.completion_ids)} completion tokens")
    row = np.zeros(width, np.float32)
    row[p_len:p_len + len(per)] = per
    out[i] = row * mask[i]
  return jnp.asarray(out)


def _tree_values(episodes, mask) -> np.ndarray:
  """Values [B, T] for rl.ppo.critic='tree_mc': each episode's Episode.baseline (its parent
  node's Monte-Carlo return, set by a tree rollout) on its loss tokens."""
  base = []
  for i, e in enumerate(episodes):
    if e.baseline is None:
      raise ValueError(
          f"config key 'rl.ppo.critic' is 'tree_mc', but episode {i} has no "
          "Episode.baseline (the Monte-Carlo value of its state); only a tree rollout that "
          "records its decisions' parent returns (rollout.tree.Decision.base) provides it")
    base.append(float(e.baseline))
  return np.asarray(base, np.float32)[:, None] * np.asarray(mask, np.float32)


def explained_variance(values, returns, mask) -> float:
  """1 - Var(returns - values) / Var(returns) over the masked tokens (1: a perfect critic,
  0: no better than a constant, < 0: worse). NaN when the returns do not vary beyond float32
  rounding (a relative spread under 1e-6: all-zero rewards leave GAE returns of order 1e-9,
  whose variance would make the ratio about -1e13)."""
  m = np.asarray(mask, np.float64) > 0
  v, r = np.asarray(values, np.float64)[m], np.asarray(returns, np.float64)[m]
  if not r.size:
    return float("nan")
  var_r = r.var()
  floor = (1e-6 * max(1.0, float(np.abs(r).max()))) ** 2
  return float(1.0 - (r - v).var() / var_r) if var_r > floor else float("nan")


def _masked_mean(x, mask) -> float:
  m = np.asarray(mask, np.float64)
  return float((np.asarray(x, np.float64) * m).sum() / max(m.sum(), 1.0))
