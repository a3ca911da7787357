"""How much of one RL step's gradient is signal: the policy gradient's noise at a checkpoint.

  python -m rlrag_jax.experiments.grad_noise --config=configs/arena.py --checkpoint=runs/arena \
      [--batches=16 --split=train --out=DIR]

An RL step estimates the gradient of the expected reward from `rl.prompts_per_step` x
`rl.group_size` samples. If that estimate is mostly noise, the optimiser walks at random: the
weights move (the KL to the warm-up grows) while the reward does not. This command measures
it. From the checkpoint it draws `--batches` independent training batches exactly as the
trainer's first RL step would (`training.collection.collect`: the task's rollout or its own
`collect` hook, dynamic sampling, rewards), and takes the raw gradient of the policy loss on
each through the learner's own update (its advantages and packing; for PPO a fresh critic, as
at the first step) with plain SGD in place of the optimiser, so nothing is clipped or rescaled.
The KL term is left out: its gradient is zero at the reference. With g_1 … g_K the batch
gradients, mu their expectation and Sigma their covariance:

  signal  ||mu||^2, estimated without bias as the mean dot product of two different batches'
          gradients (sum_{i != j} g_i . g_j / (K (K - 1))); it can come out negative when it
          is small against the noise;
  noise   tr(Sigma) = mean ||g_k||^2 - signal;
  snr     signal / noise for one batch. The sum of n independent batches' gradients has n times
          it, so n x snr is the signal-to-noise of a run of n steps while the gradient stays
          about the same, and 1 / snr is the number of batches before the direction is more
          signal than noise (McCandlish et al.'s "simple noise scale" in batches);
  cosine  signal / mean ||g_k||^2: the expected cosine of two batches' gradients.

For comparison the same is measured for the SFT loss (target tokens, token mean) on the same
questions, built as the SFT stage builds it (every `sft_samples` sample of a question, else its
one gold target). Only running sums of the gradients are kept, so memory is two copies of the
parameters whatever K is.

Two follow-ups ask where the signal is and whether it helps:

  --group_by=FIELD   also splits the batches by a numeric field of their scores (each batch
                     goes to the value most of its samples carry), e.g. `iteration`, the
                     forest level of an R2AG expansion: one signal/noise row per value.
  --alphas=0,1,2,4   a line search along the mean RL gradient g (its estimate from the K
                     batches): the training reward of task.rollout at params - alpha * g, a
                     plain gradient step of size alpha (not Adam's), on `--line_batches`
                     batches of questions held aside from the K (the last ones of the split;
                     a task whose `collect` hook draws its own questions, like the R2AG
                     forest, may still meet them). task.rollout is a question's first step:
                     for the R2AG forest, its root expansion. Every alpha draws with the same
                     random numbers, so the differences between alphas are not the rollouts'
                     sampling noise.
"""
from __future__ import annotations

import collections
import itertools
import sys
from typing import Optional, Sequence

import numpy as np
from absl import app, flags
from ml_collections import config_flags

# Flags are defined only when this module runs as a command (tests import it beside others).
_CONFIG = _CKPT = _STEP = _BATCHES = _SPLIT = _OUT = _GROUP_BY = _ALPHAS = _LINE_BATCHES = None


def define_flags() -> None:
  global _CONFIG, _CKPT, _STEP, _BATCHES, _SPLIT, _OUT, _GROUP_BY, _ALPHAS, _LINE_BATCHES
  _CONFIG = config_flags.DEFINE_config_file("config", None, "configs/<method>.py[:preset]")
  _CKPT = flags.DEFINE_string("checkpoint", None, "run directory or HF checkpoint directory")
  _STEP = flags.DEFINE_integer("step", None, "checkpoint step (default: latest)")
  _BATCHES = flags.DEFINE_integer("batches", 16, "independent batches (K >= 2)")
  _SPLIT = flags.DEFINE_enum("split", "train", ["train", "eval"], "which questions")
  _OUT = flags.DEFINE_string("out", None, "write grad_noise.txt and grad_noise.json here")
  _GROUP_BY = flags.DEFINE_string("group_by", None,
                                  "a numeric score field to split the batches by (e.g. iteration)")
  _ALPHAS = flags.DEFINE_list("alphas", [], "line search steps along the mean RL gradient")
  _LINE_BATCHES = flags.DEFINE_integer("line_batches", 16,
                                       "held-aside batches of questions for the line search")


class NoiseMeter:
  """Running sums over gradient pytrees: sum of g, sum of ||g||^2 and the count."""

  def __init__(self):
    self.total = None
    self.sq = 0.0
    self.k = 0

  def add(self, grad) -> None:
    import jax
    import jax.numpy as jnp
    g = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), grad)
    self.sq += float(sum(jnp.vdot(x, x) for x in jax.tree_util.tree_leaves(g)))
    self.total = g if self.total is None else jax.tree_util.tree_map(jnp.add, self.total, g)
    self.k += 1

  def stats(self) -> dict:
    import jax
    import jax.numpy as jnp
    if self.k < 2:
      raise ValueError(f"grad_noise: {self.k} gradient(s); signal and noise need at least 2")
    total_sq = float(sum(jnp.vdot(x, x) for x in jax.tree_util.tree_leaves(self.total)))
    return noise_stats(total_sq, self.sq, self.k)


def noise_stats(sum_norm_sq: float, sum_of_norms_sq: float, k: int) -> dict:
  """From ||sum_k g_k||^2, sum_k ||g_k||^2 and K: {'k', 'mean_norm_sq', 'signal', 'noise',
  'snr', 'batches_for_snr_1', 'cosine'} (see the module docstring). `signal` may come out
  negative when it is small against the noise (an unbiased estimate); `snr` and `cosine` are
  then reported as they are and `batches_for_snr_1` as inf."""
  if k < 2:
    raise ValueError(f"grad_noise: K = {k}; need at least 2 batches")
  mean_sq = sum_of_norms_sq / k
  signal = (sum_norm_sq - sum_of_norms_sq) / (k * (k - 1))
  noise = mean_sq - signal
  snr = signal / noise if noise > 0 else float("inf")
  return {"k": int(k), "mean_norm_sq": mean_sq, "signal": signal, "noise": noise, "snr": snr,
          "batches_for_snr_1": (1.0 / snr) if snr > 0 else float("inf"),
          "cosine": signal / mean_sq if mean_sq > 0 else 0.0}


def _sgd_state(module, mesh, params):
  """A train state whose optimiser is plain SGD with step 1: new params = params - grad."""
  import optax
  from rlrag_jax.rl import optim_state
  opt = optax.sgd(1.0)
  return opt, optim_state.create_train_state(module, opt, mesh, params=params)


def _copy(tree):
  """A copy of a train state: the jitted steps donate (and so delete) their input state."""
  import jax
  import jax.numpy as jnp
  return jax.tree_util.tree_map(jnp.copy, tree)


def _difference(before, after):
  import jax
  return jax.tree_util.tree_map(lambda a, b: a - b, before, after)


def _examples_of(episodes) -> list:
  """The distinct examples of a batch's episodes, in order of first appearance."""
  seen, out = set(), []
  for ep in episodes:
    ex = ep.example
    key = str(getattr(ex, "id", id(ex)))
    if key not in seen:
      seen.add(key)
      out.append(ex)
  return out


def _sft_rows(task, exs) -> tuple:
  """The SFT stage's rows (`stages.sft_rows`) for these examples: all their samples
  (`Task.sft_samples`)."""
  from rlrag_jax.training.stages import sft_rows
  items = [r for ex in exs for r in task.sft_samples(ex)]
  if not items:
    raise ValueError("grad_noise: the batch's questions have no SFT samples")
  return sft_rows(items)


def rl_gradient(learner, state, batch, key):
  """The raw policy-loss gradient of one RL batch, through the learner's own update (its
  advantages and packing) with a plain SGD(1) state: params - new params. A learner with a
  critic gets a fresh one (the first RL step's)."""
  import jax
  critic = (learner.init_critic(state.params, jax.random.fold_in(key, 1))
            if learner.has_critic else None)
  new, _, _ = learner.update(_copy(state), critic, batch, None, key)
  return _difference(state.params, new.params)


class _Steps:
  """What a learner's `update` calls: the RL step (here an SGD(1) step) and the log-probs."""
  with_ref = False

  def __init__(self, rl_step, logp):
    self.rl_step, self.logp = rl_step, logp


class Probe:
  """The learner and SFT step of `config` over `lm`'s parameters with a plain SGD(1) optimiser,
  so that one update's parameter change is the raw gradient (no clipping, no Adam). The KL
  term is left out (its gradient is zero at the reference). With rl.algo 'ppo' the critic is
  a fresh one for every batch, as at the first RL step, and the gradient is the policy's."""

  def __init__(self, config, lm, pad_id: int, with_sft: bool = True):
    from rlrag_jax.models import DecoderLM
    from rlrag_jax.models.sharding import make_mesh
    from rlrag_jax.rl import step_factories
    from rlrag_jax.training import learners
    from rlrag_jax import settings
    from rlrag_jax.training.steps import policy_loss_config
    rl = config.rl
    self.config, self.pad = config, int(pad_id)
    self.mesh = make_mesh()
    self.module = DecoderLM(lm.config)
    self.loss_cfg = policy_loss_config(settings.of(config).rl, beta=0.0)
    opt, self.state = _sgd_state(self.module, self.mesh, lm.params)
    chunk = int(rl.logits_chunk)
    rl_step = step_factories.make_policy_step(self.module, opt, self.mesh, self.loss_cfg,
                                  micro_batches=learners.equal_micro_batches(rl),
                                  logits_chunk=chunk, head_backward=rl.head_backward)
    logp = step_factories.make_logprob_fn(self.module, self.mesh, temperature=rl.temperature,
                              micro_batches=learners.equal_micro_batches(rl), logits_chunk=chunk)
    self.learner = learners.make_learner(config, _Steps(rl_step, logp), self.mesh, lm.config,
                                         self.pad)
    self.sft_step = (step_factories.make_sft_step(self.module, opt, self.mesh,
                                      logits_chunk=int(config.sft.logits_chunk),
                                      head_backward=config.sft.head_backward)
                     if with_sft else None)

  def rl_gradient(self, batch, key):
    return rl_gradient(self.learner, self.state, batch, key)

  def sft_gradient(self, prompts, targets, masks=None):
    """The gradient of the SFT loss (target tokens, token mean) on these rows."""
    from rlrag_jax.models import sharding
    from rlrag_jax.rl.packing import logits_start, pack
    sft = self.config.sft
    batch = pack(prompts, targets, masks, pad_id=self.pad, max_len=sft.max_len,
                 bucket=sft.pack_bucket)
    start = logits_start(batch["loss_mask"], sft.pack_bucket)
    new, _ = self.sft_step(_copy(self.state), sharding.shard_batch(batch, self.mesh), start)
    return _difference(self.state.params, new.params)


def _rl_policy(lm, task, config):
  """The policy the trainer's RL stage samples with (config section `rl`'s temperature, top-k,
  top-p; eval.batch_size rows a call) over the checkpoint's parameters."""
  from rlrag_jax.rollout.policy import checkpoint_policy
  rl = config.rl
  return checkpoint_policy(lm, task.tokenizer, rl.max_new_tokens,
                           temperature=float(rl.temperature), top_k=rl.top_k, top_p=rl.top_p,
                           rows_per_call=int(config.eval.batch_size))


# The RL step the engine passes to collect and rewards at the first RL step (rewards staged by
# step see their first stage).
FIRST_RL_STEP = 1


def measure(task, lm, config, examples: Sequence, *, batches: int, rng,
            progress: bool = True, group_by: Optional[str] = None,
            keep_mean: bool = False) -> dict:
  """{'rl': noise_stats, 'sft': noise_stats or None, 'reward' / 'reward_std': mean and spread
  of the batches' training reward, 'batch': {'prompts', 'group_size', 'episodes' (the mean
  episode count: a task's collect hook may return more than prompts x group_size)}} at `lm`'s
  parameters, over `batches` consecutive batches of `examples`. With `group_by` also
  'rl_by': {value: noise_stats or None (fewer than 2 batches), with 'reward'}; with
  `keep_mean` also 'mean_rl_gradient', the mean of the RL gradients (a pytree)."""
  import jax
  from tqdm.auto import tqdm
  from rlrag_jax.training import collection

  rl = config.rl
  n, g = int(rl.prompts_per_step), int(rl.group_size)
  if batches < 2:
    raise ValueError(f"grad_noise: --batches is {batches}; need at least 2")
  if len(examples) < n * batches:
    raise ValueError(f"grad_noise: {len(examples)} questions for {batches} batches of {n}")
  probe = Probe(config, lm, task.tokenizer.pad_token_id or 0)
  policy = _rl_policy(lm, task, config)
  batches_of = [list(examples[b * n:(b + 1) * n]) for b in range(len(examples) // n)]
  rl_iter = itertools.cycle(batches_of)   # dynamic sampling may draw several batches a step
  step = FIRST_RL_STEP
  rl_meter, sft_meter, rewards, counts = NoiseMeter(), NoiseMeter(), [], []
  by_meter, by_reward = {}, {}
  it = range(batches)
  for _ in (tqdm(it, desc="batches", unit="batch") if progress else it):
    rng, sub, key = jax.random.split(rng, 3)
    batch, _ = collection.collect(task, policy, rl_iter, sub, config, step)
    episodes, scores = batch.episodes, batch.rewards
    rewards.append(float(np.mean([s["total"] for s in scores])))
    counts.append(len(episodes))
    grad = probe.rl_gradient(batch, key)
    rl_meter.add(grad)
    if group_by is not None:
      value = batch_group([{**s, **m} for s, m in zip(scores, batch.metrics)], group_by)
      by_meter.setdefault(value, NoiseMeter()).add(grad)
      by_reward.setdefault(value, []).append(rewards[-1])
    sft_meter.add(probe.sft_gradient(*_sft_rows(task, _examples_of(episodes))))
  out = {"rl": rl_meter.stats(), "sft": sft_meter.stats() if sft_meter.k else None,
         "reward": float(np.mean(rewards)), "reward_std": float(np.std(rewards)),
         "batch": {"prompts": n, "group_size": g, "episodes": float(np.mean(counts))}}
  if group_by is not None:
    out["group_by"] = group_by
    out["rl_by"] = {v: (dict(by_meter[v].stats(), reward=float(np.mean(by_reward[v])))
                        if by_meter[v].k >= 2 else
                        {"k": by_meter[v].k, "reward": float(np.mean(by_reward[v]))})
                    for v in sorted(by_meter)}
  if keep_mean:
    out["mean_rl_gradient"] = jax.tree_util.tree_map(lambda x: x / rl_meter.k, rl_meter.total)
  return out


def batch_group(scores: Sequence[dict], field: str) -> float:
  """The value of `field` that most of a batch's samples carry (ties: the smallest); `scores`:
  per sample its reward dict with its group's metrics."""
  values = [float(s[field]) for s in scores if field in s]
  if not values:
    raise KeyError(f"grad_noise: --group_by={field!r}, but no score of the batch has it "
                   f"(fields: {sorted(scores[0]) if scores else []})")
  counts = collections.Counter(values)
  return min(counts, key=lambda v: (-counts[v], v))


def hold_aside(examples: Sequence, per_batch: int, batches: int) -> tuple:
  """(the rest, `batches` batches of `per_batch` from the end of `examples`)."""
  cut = len(examples) - per_batch * batches
  if batches < 1 or cut < 2 * per_batch:
    raise ValueError(f"grad_noise: {len(examples)} questions cannot hold {batches} line-search "
                     f"batches of {per_batch} aside and leave two gradient batches")
  return (list(examples[:cut]),
          [list(examples[cut + b * per_batch:cut + (b + 1) * per_batch]) for b in range(batches)])


def line_search(task, lm, config, direction, alphas: Sequence[float], batches: Sequence,
                rng) -> list:
  """The training reward of task.rollout (config.rl's group size and temperature) on
  `batches` (lists of questions) at params - alpha * `direction`, for each alpha. Every alpha
  draws with the same keys. [{'alpha', 'reward', 'reward_se' (over batches)}]."""
  import dataclasses
  import jax
  rl = config.rl
  base = _rl_policy(lm, task, config)
  keys = jax.random.split(rng, len(batches))
  step = FIRST_RL_STEP
  out = []
  for alpha in alphas:
    params = jax.tree_util.tree_map(lambda p, d: p - alpha * d.astype(p.dtype), lm.params,
                                    direction)
    policy = dataclasses.replace(base, params=params)
    means = []
    for batch, key in zip(batches, keys):
      episodes = task.rollout(policy, list(batch), key, group_size=int(rl.group_size))
      means.append(float(np.mean([s["total"] for s in task.rewards(episodes, step)])))
    se = float(np.std(means, ddof=1) / np.sqrt(len(means))) if len(means) > 1 else 0.0
    out.append({"alpha": float(alpha), "reward": float(np.mean(means)), "reward_se": se})
  return out


def format_table(result: dict) -> str:
  b = result["batch"]
  lines = [f"batches of {b['prompts']} questions x {b['group_size']} samples "
           f"({b['episodes']:.1f} episodes on average; SFT: their gold targets); "
           f"mean training reward "
           f"{result['reward']:.3f} ± {result['reward_std']:.3f} over batches",
           f"{'loss':<5} {'K':>3} {'E||g||^2':>10} {'signal':>10} {'noise':>10} {'snr':>8} "
           f"{'1/snr':>8} {'cosine':>7}"]
  for name in ("rl", "sft"):
    s = result.get(name)
    if s:
      lines.append(f"{name:<5} {s['k']:>3} {s['mean_norm_sq']:>10.3e} {s['signal']:>10.3e} "
                   f"{s['noise']:>10.3e} {s['snr']:>8.4f} {s['batches_for_snr_1']:>8.1f} "
                   f"{s['cosine']:>7.4f}")
  if result.get("rl_by"):
    lines.append(f"RL batches by {result['group_by']} (each batch: the value most of its "
                 f"samples carry)")
    for v, s in result["rl_by"].items():
      name = f"{v:g}"
      if "snr" not in s:
        lines.append(f"  {name:<4} {s['k']:>3} batch(es): too few for signal and noise; "
                     f"reward {s['reward']:.3f}")
        continue
      lines.append(f"  {name:<4} {s['k']:>3} {s['mean_norm_sq']:>10.3e} {s['signal']:>10.3e} "
                   f"{s['noise']:>10.3e} {s['snr']:>8.4f} {s['batches_for_snr_1']:>8.1f} "
                   f"{s['cosine']:>7.4f}  reward {s['reward']:.3f}")
  if result.get("line_search"):
    lines.append("training reward at params - alpha * (mean RL gradient), held-aside batches, "
                 "same random numbers at every alpha")
    for r in result["line_search"]:
      lines.append(f"  alpha {r['alpha']:<6g} {r['reward']:.4f} ± {r['reward_se']:.4f}")
  return "\n".join(lines)


def main(argv) -> int:
  del argv
  import jax
  from rlrag_jax.experiments import load_checkpoint, write_report
  config = _CONFIG.value
  loaded = load_checkpoint("grad_noise", config, _CKPT.value, _STEP.value)
  if loaded is None:
    return 2
  task, lm = loaded
  split = list(task.train if _SPLIT.value == "train" else task.eval)
  alphas = [float(a) for a in _ALPHAS.value]
  held = []
  if alphas:
    try:
      split, held = hold_aside(split, int(config.rl.prompts_per_step), _LINE_BATCHES.value)
    except ValueError as e:
      print(e, file=sys.stderr)
      return 2
  result = measure(task, lm, config, split, batches=_BATCHES.value,
                   rng=jax.random.PRNGKey(config.seed), group_by=_GROUP_BY.value,
                   keep_mean=bool(alphas))
  if alphas:
    result["line_search"] = line_search(task, lm, config, result.pop("mean_rl_gradient"),
                                        alphas, held, jax.random.PRNGKey(config.seed + 1))
  table = f"gradient noise at {_CKPT.value} ({_SPLIT.value} questions)\n" + format_table(result)
  print(table)
  if _OUT.value:
    write_report(_OUT.value, "grad_noise", table,
                 {"checkpoint": _CKPT.value, "split": _SPLIT.value, **result})
  return 0


if __name__ == "__main__":
  define_flags()
  flags.mark_flags_as_required(["config", "checkpoint"])
  app.run(lambda argv: sys.exit(main(argv)))
