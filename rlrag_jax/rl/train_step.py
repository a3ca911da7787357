"""The sharded, jitted update steps: policy (GRPO / DAPO / Dr. GRPO), SFT and PPO critic.

Each `make_*_step` returns an `UpdateStep`: ONE `jax.jit` with explicit in/out shardings and
the TrainState donated, `state, metrics = step(state, batch)`, and the same update over
token-budget micro-batches of different widths, `step.accumulated(state, parts)` (an
`accumulate` jit per micro-batch, then an `apply` jit).

Design choices:
  * Gradient accumulation is a `lax.scan` over micro-batches inside the one jit, not
    optax.MultiSteps. The loss normalisers (token counts, sequence counts) are computed once from
    the whole batch, so the summed micro-batch gradients equal the full-batch gradient exactly for
    every aggregation mode (MultiSteps averages per-micro-batch means, which is wrong for
    token_mean with uneven lengths), and one call is one optimizer update, which keeps step
    counting, the non-finite skip and mu inner iterations simple.
  * Micro-batch m takes rows m, m + M, m + 2M, ...: with the batch sharded over ('data', 'fsdp')
    in contiguous blocks, that split moves no data between devices.
  * Token-budget micro-batches (`rl.tokens_per_micro_batch`, `sft.tokens_per_micro_batch`):
    the host packs each micro-batch at its own width (`rl.packing.plan_micro_batches`), so
    peak memory follows the budget, not the longest episode; the normalisers still come from
    all of the update's loss masks, so the update equals the one-batch one.
  * Non-finite loss or gradient norm: params and opt_state are returned unchanged (so the
    optimizer's count and the lr schedule do not advance) and metrics['skipped'] = 1. `step`
    counts calls and always advances, so checkpoint numbering and logging keep moving.
  * mu inner iterations (PPO epochs on one batch): compute `old_logp` once with
    `make_logprob_fn` (or leave it out of the batch when mu = 1: then old_logp =
    stop_gradient(logp), the on-policy ratio of 1), and call the step mu times with the same
    batch; the batch is not donated.
  * Column 0 of every mask is ignored: nothing predicts the first slot (logp[:, 0] = 0).
  * Multi-host: numpy batches are refused by jit there; pass each process's rows through
    `models.sharding.shard_batch` and keep `make_logprob_fn` outputs as the global arrays they
    are (np.asarray on them fails when they span processes).
  * On a multi-device mesh the steps are traced under `models.sharding.activation_constraints`:
    the decoder's activations (batch over data x fsdp, heads / MLP over tensor) are constrained
    by the rule table (no global mesh is set), and `compute_params` casts weight matrices to
    the compute dtype where they are stored, so FSDP all-gathers bf16. On one device neither
    changes the program.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple, Optional

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding

from rlrag_jax.models import sharding as shd
from rlrag_jax.rl.kl import KL_ESTIMATORS, kl as kl_fn
from rlrag_jax.rl.logprobs import (DEFAULT_LOGITS_CHUNK, chunk_positions, chunked_head_logprobs,
                                   use_fused_backward,
                                   predicted_logprobs)
from rlrag_jax.rl.losses import AGGREGATIONS, aggregation_terms, ppo_token_loss, value_token_loss

Array = jax.Array


# ------------------------------------------------------------------------------------ state
@flax.struct.dataclass
class TrainState:
  params: Any
  opt_state: Any
  step: Array      # int32 scalar: calls of the step function, skipped updates included


def _from_mapping(cls, cfg, where: str):
  """Builds a frozen dataclass from a dict / ConfigDict; unknown keys are an error."""
  d = dict(cfg.to_dict() if hasattr(cfg, "to_dict") else cfg)
  fields = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(d) - fields)
  if unknown:
    raise ValueError(f"{where}: unknown keys {unknown}; expected a subset of {sorted(fields)}")
  return cls(**d)


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """AdamW with linear warmup then cosine decay (or constant), and global-norm clipping."""
  lr: float = 1e-6
  warmup_steps: int = 0            # used when > 0, else round(warmup_ratio * total_steps)
  warmup_ratio: float = 0.0
  total_steps: int = 1000          # optimizer updates over the run (includes warmup)
  schedule: str = "cosine"         # 'cosine' | 'linear' (decay to min_lr_ratio) | 'constant'
                                   # (after warmup)
  min_lr_ratio: float = 0.0        # cosine ends at lr * min_lr_ratio
  weight_decay: float = 0.0        # decoupled; applied to matrices only (not norms, biases)
  max_grad_norm: Optional[float] = 1.0
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8

  @classmethod
  def from_config(cls, cfg) -> "OptimizerConfig":
    return _from_mapping(cls, cfg, "OptimizerConfig (config key optimizer)")

  @property
  def warmup(self) -> int:
    return self.warmup_steps if self.warmup_steps > 0 else int(round(self.warmup_ratio *
                                                                     self.total_steps))


SCHEDULES = ("cosine", "linear", "constant")     # OptimizerConfig.schedule


def make_schedule(cfg: OptimizerConfig) -> optax.Schedule:
  warmup = cfg.warmup
  if cfg.schedule == "cosine":
    if cfg.total_steps <= warmup:
      raise ValueError(f"optimizer.total_steps={cfg.total_steps} must exceed the warmup ({warmup} "
                       "steps) for a cosine schedule")
    return optax.warmup_cosine_decay_schedule(0.0, cfg.lr, warmup, cfg.total_steps,
                                              end_value=cfg.lr * cfg.min_lr_ratio)
  if cfg.schedule == "linear":
    if cfg.total_steps <= warmup:
      raise ValueError(f"optimizer.total_steps={cfg.total_steps} must exceed the warmup ({warmup} "
                       "steps) for a linear schedule")
    decay = optax.linear_schedule(cfg.lr, cfg.lr * cfg.min_lr_ratio, cfg.total_steps - warmup)
    if warmup == 0:
      return decay
    return optax.join_schedules([optax.linear_schedule(0.0, cfg.lr, warmup), decay], [warmup])
  if cfg.schedule == "constant":
    if warmup == 0:
      return optax.constant_schedule(cfg.lr)
    return optax.join_schedules([optax.linear_schedule(0.0, cfg.lr, warmup),
                                 optax.constant_schedule(cfg.lr)], [warmup])
  raise ValueError(f"optimizer.schedule is {cfg.schedule!r}; expected one of {SCHEDULES}")


def make_optimizer(cfg: OptimizerConfig, by_rl_step: bool = False) -> optax.GradientTransformation:
  """clip_by_global_norm(max_grad_norm) -> adamw(schedule, b1, b2, eps, weight_decay).

  by_rl_step: the schedule is indexed by RL steps (a counter in the optimizer state that
  `advance_rl_step` moves), not by updates, so every update of one RL step takes that step's lr
  and cfg.total_steps counts RL steps: for a learner whose updates per step vary with the
  step's episode count (rl.ppo.mini_batch_size), as verl steps its scheduler once per batch."""
  decay_mask = lambda params: jax.tree_util.tree_map(lambda p: p.ndim >= 2, params)
  if by_rl_step:
    adamw = optax.chain(optax.scale_by_adam(b1=cfg.b1, b2=cfg.b2, eps=cfg.eps),
                        optax.add_decayed_weights(cfg.weight_decay, decay_mask),
                        _scale_by_rl_step_schedule(make_schedule(cfg)))
  else:
    adamw = optax.adamw(make_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                        weight_decay=cfg.weight_decay, mask=decay_mask)
  if cfg.max_grad_norm is None:
    return adamw
  return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), adamw)


class RLStepState(NamedTuple):
  """The RL steps completed, for a schedule indexed by them (make_optimizer(by_rl_step=True))."""
  rl_step: Array     # int32 scalar


def _scale_by_rl_step_schedule(schedule) -> optax.GradientTransformation:
  """-schedule(RL steps completed) x updates; the counter moves only by `advance_rl_step`."""
  def init(params):
    del params
    return RLStepState(rl_step=jnp.zeros((), jnp.int32))

  def update(updates, state, params=None):
    del params
    lr = schedule(state.rl_step)
    return jax.tree_util.tree_map(lambda g: jnp.asarray(-lr, g.dtype) * g, updates), state
  return optax.GradientTransformation(init, update)


def advance_rl_step(opt_state):
  """`opt_state` with its RL-step counter moved on by one (a no-op for an optimizer made
  without by_rl_step)."""
  is_counter = lambda x: isinstance(x, RLStepState)
  return jax.tree_util.tree_map(
      lambda x: RLStepState(rl_step=x.rl_step + 1) if is_counter(x) else x, opt_state,
      is_leaf=is_counter)


def optimizer_count(opt_state) -> Array:
  """Applied updates so far, read from the optimizer state (first 'count' field found)."""
  found = optax.tree_utils.tree_get_all_with_path(opt_state, "count")
  return found[0][1] if found else jnp.zeros((), jnp.int32)


def train_state_shardings(module, opt, mesh: Mesh, rules=shd.RULES) -> TrainState:
  p_sh = shd.param_shardings(module, mesh, rules)
  o_sh = shd.opt_state_shardings(opt, p_sh, shd.param_shapes(module), mesh)
  return TrainState(params=p_sh, opt_state=o_sh, step=shd.replicated(mesh))


def abstract_train_state(module, opt, mesh: Mesh, rules=shd.RULES) -> TrainState:
  """The TrainState as jax.ShapeDtypeStructs with shardings: a restore target, no allocation."""
  sh = train_state_shardings(module, opt, mesh, rules)
  shapes = shd.param_shapes(module)
  abstract = TrainState(params=shapes, opt_state=jax.eval_shape(opt.init, shapes),
                        step=jax.ShapeDtypeStruct((), jnp.int32))
  return jax.tree_util.tree_map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                abstract, sh)


def create_train_state(module, opt, mesh: Mesh, *, params=None, rng=None,
                       rules=shd.RULES) -> TrainState:
  """A sharded TrainState: from given `params` (placed onto their shards) or random from `rng`."""
  sh = train_state_shardings(module, opt, mesh, rules)
  if params is None:
    if rng is None:
      raise ValueError("create_train_state: pass params or rng")
    params = shd.init_sharded_params(module, rng, mesh, rules)
  else:
    params = jax.device_put(params, sh.params, may_alias=False)   # the state is donated later
  opt_state = jax.jit(opt.init, out_shardings=sh.opt_state)(params)
  step = jax.device_put(jnp.zeros((), jnp.int32), sh.step)
  return TrainState(params=params, opt_state=opt_state, step=step)


# ------------------------------------------------------------------------------------ loss config
@dataclasses.dataclass(frozen=True)
class LossConfig:
  """Policy-loss settings (config keys under `loss`)."""
  eps_low: float = 0.2
  eps_high: Optional[float] = None       # None: = eps_low (PPO); DAPO clip-higher: 0.28
  dual_clip: Optional[float] = None      # c > 1 caps the loss of A < 0 tokens at -A c
  aggregation: str = "sequence_mean"     # sequence_mean | token_mean | constant
  max_completion_len: Optional[int] = None   # the constant of 'constant' (Dr. GRPO)
  beta: float = 0.0                      # KL loss coefficient; 0: no ref_logp needed
  kl_estimator: str = "k3"
  temperature: float = 1.0               # the sampler's temperature
  compute_entropy: bool = True
  entropy_coef: float = 0.0              # > 0: minus this times the aggregated token entropy
                                         # joins the loss (an exploration bonus; needs
                                         # compute_entropy)

  def __post_init__(self):
    if self.aggregation not in AGGREGATIONS:
      raise ValueError(f"loss.aggregation is {self.aggregation!r}; expected one of "
                       f"{sorted(AGGREGATIONS)}")
    if self.kl_estimator not in KL_ESTIMATORS:
      raise ValueError(f"loss.kl_estimator is {self.kl_estimator!r}; expected one of "
                       f"{sorted(KL_ESTIMATORS)}")
    if self.aggregation == "constant" and not self.max_completion_len:
      raise ValueError("loss.aggregation='constant' needs loss.max_completion_len >= 1")
    if self.entropy_coef < 0 or (self.entropy_coef and not self.compute_entropy):
      raise ValueError(f"loss.entropy_coef is {self.entropy_coef}; expected >= 0, and "
                       "compute_entropy=True when it is > 0")

  @classmethod
  def from_config(cls, cfg) -> "LossConfig":
    return _from_mapping(cls, cfg, "LossConfig (config key loss)")

  @classmethod
  def preset(cls, name: str, **overrides) -> "LossConfig":
    """'grpo' (eps 0.2, sequence_mean, beta 0.04, k3), 'dapo' (clip-higher 0.2/0.28, token_mean,
    no KL) or 'dr_grpo' (constant normaliser, no KL; pair with the 'dr_grpo' advantages)."""
    presets = {
        "grpo": dict(aggregation="sequence_mean", beta=0.04, kl_estimator="k3"),
        "dapo": dict(eps_low=0.2, eps_high=0.28, aggregation="token_mean", beta=0.0),
        "dr_grpo": dict(aggregation="constant", beta=0.0),
    }
    if name not in presets:
      raise ValueError(f"LossConfig.preset: {name!r} unknown; expected one of {sorted(presets)}")
    return cls(**{**presets[name], **overrides})


# ------------------------------------------------------------------------------------ helpers
def _loss_mask(mask: Array) -> Array:
  m = jnp.asarray(mask).astype(jnp.float32)
  return m * (jnp.arange(m.shape[1]) > 0).astype(jnp.float32)[None, :]


@dataclasses.dataclass(frozen=True)
class _TokenNorms:
  """norms_fn for `_make_update_step`: the loss denominator over the whole batch (so that
  micro-batching does not change the loss) and the loss-token count for the metrics.

  `norms(batch)` traces them from one batch; `norms.host(loss_masks)` computes the same
  numbers in numpy from the loss masks of an update's micro-batches of any widths (every
  mode's denominator is a sum over rows, and pad rows, with no loss token, add nothing), so
  token-budget micro-batches divide by the one-big-batch normaliser too."""
  aggregation: str
  max_len: Optional[int]

  def __call__(self, batch) -> dict:
    m = _loss_mask(batch["loss_mask"])
    _, den = aggregation_terms(m, m, self.aggregation, self.max_len)
    return {"den": jnp.maximum(den, 1e-8), "tokens": jnp.maximum(jnp.sum(m), 1.0)}

  def host(self, loss_masks) -> dict:
    tokens, rows = 0.0, 0
    for mask in loss_masks:
      m = np.asarray(mask, np.float32)[:, 1:]          # column 0 is never a loss token
      tokens += float(np.sum(m, dtype=np.float64))
      rows += int(np.sum(np.sum(m, axis=1) > 0))      # rows with tokens (losses.AGGREGATIONS)
    den = {"sequence_mean": float(rows), "token_mean": tokens,
           "constant": float(rows) * float(self.max_len or 0)}[self.aggregation]
    return {"den": np.float32(max(den, 1e-8)), "tokens": np.float32(max(tokens, 1.0))}


def _token_norms(aggregation: str, max_len: Optional[int]) -> _TokenNorms:
  return _TokenNorms(aggregation, max_len)


def _check_batch(batch: dict, required, where: str):
  missing = [k for k in required if k not in batch]
  if missing:
    raise ValueError(f"{where}: batch is missing keys {missing}; found {sorted(batch)}")


def _split_micro(x: Array, m: int, mesh: Mesh) -> Array:
  """[B, ...] -> [M, B/M, ...]; micro-batch i holds rows i, i + M, ... (no cross-device moves)."""
  b = x.shape[0] // m
  y = jnp.swapaxes(x.reshape((b, m) + x.shape[1:]), 0, 1)
  return jax.lax.with_sharding_constraint(y, shd.batch_sharding(mesh, leading_axes=1))


def _merge_micro(y: Array, mesh: Mesh) -> Array:
  """Inverse of _split_micro: [M, B/M, ...] -> [B, ...]."""
  x = jnp.swapaxes(y, 0, 1)
  x = x.reshape((-1,) + x.shape[2:])
  return jax.lax.with_sharding_constraint(x, shd.batch_sharding(mesh))


def _check_micro(batch_size: int, micro_batches: int, mesh: Mesh, where: str):
  shards = mesh.shape["data"] * mesh.shape["fsdp"]
  if micro_batches < 1 or batch_size % micro_batches or (batch_size // micro_batches) % shards:
    raise ValueError(f"{where}: batch size {batch_size} must split into micro_batches="
                     f"{micro_batches} micro-batches whose size is a multiple of data x fsdp = "
                     f"{shards}")


def _constrain(x: Array, names, mesh: Mesh, rules) -> Array:
  spec = shd.logical_to_mesh_spec(names, x.shape, mesh, rules)
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def _predictor_logits(lm, input_ids, attention_mask, start: int = 0):
  """DecoderLM method: logits of positions start..T-2 only, the predictors of tokens
  start+1..T-1.

  Slicing the hidden states [B, T, E] instead of the logits [B, T, V] saves a full-size copy of
  the logits (and of their gradient) per step; on XLA:CPU that copy was ~20% of a small
  model's policy update. `start` skips the prompt's positions as well, whose logits no loss
  reads (TRL's `logits_to_keep`): the head's matmul, the softmax and their gradients shrink to
  the completion's width.
  """
  h, _ = lm.model(input_ids, attention_mask)
  h = h[:, start:-1]                                                         # [B, T-1-start, E]
  logits = lm.model.attend(h) if lm.config.tie_word_embeddings else lm.lm_head(h)
  return logits.astype(jnp.float32)                                          # [B, T-1-start, V]


def _pred_logits(module, params, mb, mesh, rules, start: int):
  logits = module.apply({"params": params}, mb["input_ids"], mb["attention_mask"], start,
                        method=_predictor_logits)
  return _constrain(logits, ("activation_batch", "activation_length", "activation_vocab"),
                    mesh, rules)                                             # [b, T-1-start, V]


def _predictor_hidden(lm, input_ids, attention_mask, start: int = 0):
  """DecoderLM method: the final hidden states of positions start..T-2 [B, T-1-start, E]."""
  h, _ = lm.model(input_ids, attention_mask)
  return h[:, start:-1]


def lm_head_weight(config, params) -> tuple:
  """(weight in the compute dtype, transposed): the untied head's kernel [E, V], or the tied
  embedding [V, E] (transposed=True)."""
  if config.tie_word_embeddings:
    return params["model"]["embed_tokens"]["embedding"].astype(config.compute_dtype), True
  return params["lm_head"]["kernel"].astype(config.compute_dtype), False


def compute_params(module, params, mesh: Mesh, rules=shd.RULES):
  """The decoder's weight matrices cast to the compute dtype where they are stored, so that FSDP
  all-gathers them in bf16, not as float32 masters (left alone, XLA gathered first and cast
  after: a 7B LM head took 2.2 GB per device in float32). 1-D weights (norms) and a critic's
  float32 value head stay as stored; on one device nothing changes."""
  cfg = module.config
  dt = cfg.compute_dtype
  if mesh.devices.size == 1 or jnp.dtype(dt) == jnp.dtype(cfg.params_dtype):
    return params
  sh = shd.param_shardings(module, mesh, rules)

  def cast(path, p, s):
    if p.ndim < 2 or any(getattr(k, "key", None) == "value_head" for k in path):
      return p
    return jax.lax.with_sharding_constraint(p.astype(dt), s)
  return jax.tree_util.tree_map_with_path(cast, params, sh)


def _token_stats(module, params, mb, mesh, rules, start, *, chunk: int, **kw) -> dict:
  """Aligned per-token statistics [b, T] of a micro-batch: 'lp' (log-prob of each token), and
  'ent' (entropy of the distribution that predicted it) / 'hit' (greedy prediction right),
  each 0 at positions 0..start (`_window_stats`).

  `start` a Python int: the logits window starts there (one program per start). A traced
  int32 scalar (the token-budget step, one program per width): the window is the whole row,
  its head chunks before `start` are skipped at run time (`chunked_head_logprobs`' `first`),
  and positions 0..start are set to 0, so the numbers are the int form's up to the summation
  order of the head's chunks.
  """
  if isinstance(start, (int, np.integer)):
    return _window_stats(module, params, mb, mesh, rules, int(start), chunk=chunk, **kw)
  out = _window_stats(module, params, mb, mesh, rules, 0, chunk=chunk, first=start, **kw)
  keep = jnp.arange(mb["input_ids"].shape[1])[None, :] > start              # [1, T]
  return {k: jnp.where(keep, v, jnp.zeros((), v.dtype)) for k, v in out.items()}


def _window_stats(module, params, mb, mesh, rules, start: int, *, chunk: int,
                  temperature: float = 1.0, with_entropy: bool = False,
                  entropy_grad: bool = False, with_hits: bool = False,
                  head_backward: str = "auto", first=None) -> dict:
  """`_token_stats` over the window of positions start..T-2 (a static start).

  When the window's logits [b, T-1-start, V] fit in `chunk` elements (or chunk = 0) they are
  computed at once (`_pred_logits`); else from the hidden states in chunks of tokens against
  the LM head, each chunk recomputed in the backward pass (`chunked_head_logprobs`, which
  skips the chunks before a traced `first`), so no [tokens, vocab] array lives in the update.
  """
  ids = mb["input_ids"]
  cfg = module.config
  params = compute_params(module, params, mesh, rules)
  b, n = ids.shape[0], ids.shape[1] - 1 - start
  pad = lambda x: jnp.pad(x, ((0, 0), (start + 1, 0)))
  # `chunk` bounds one device's logits: the rows are sharded over the batch axes, so a chunk
  # spans shards-times more positions than one device's budget over all rows would give
  # (XLA:GPU's plan of a 7B update on 8 H100s: 8x fewer passes over the head's weight and
  # gradient, docs/results/memory/).
  shards = int(np.prod([mesh.shape[a] for a in shd.BATCH_AXES if a in mesh.shape]))
  rows = b // shards if shards > 1 and b % shards == 0 else b
  if chunk_positions(rows, n, cfg.vocab_size, chunk) >= n:
    pred = _pred_logits(module, params, mb, mesh, rules, start)             # [b, n, V]
    out = predicted_logprobs(pred, ids, with_entropy=with_entropy, temperature=temperature,
                             start=start, entropy_grad=entropy_grad)
    out = dict(zip(("lp", "ent"), out)) if with_entropy else {"lp": out}
    if with_hits:
      out["hit"] = pad((jnp.argmax(pred, axis=-1) == ids[:, start + 1:]).astype(jnp.float32))
    return out
  h = module.apply({"params": params}, ids, mb["attention_mask"], start,
                   method=_predictor_hidden)                                # [b, n, E]
  h = _constrain(h, ("activation_batch", "activation_length", "activation_embed"), mesh, rules)
  head, transposed = lm_head_weight(cfg, params)
  if mesh.devices.size > 1:
    # Gathered once for all chunks: left FSDP-sharded, the weight is a loop constant of the
    # chunk scan that XLA all-gathered in every chunk, and its gradient was reduce-scattered
    # in every chunk (XLA:GPU's plan of a 7B update on 8 H100s: 8.7 of its 26.9 TB of
    # traffic a step, docs/results/memory/). Replicated, the chunks accumulate the gradient
    # locally and the constraint's transpose reduce-scatters it once.
    head = _constrain(head, (None, None), mesh, rules)
  # `head_backward` 'auto': reduced-precision compute (the accelerator presets) takes the
  # hand-written chunk backward; float32 (the CPU defaults) keeps autodiff's.
  fused = use_fused_backward(head_backward, cfg.compute_dtype, entropy_grad)
  out = chunked_head_logprobs(h, head, ids[:, start + 1:], chunk=chunk * (b // rows),
                              transposed=transposed,
                              temperature=temperature, with_entropy=with_entropy,
                              entropy_grad=entropy_grad, with_hits=with_hits, fused=fused,
                              first=first)
  return {k: pad(v) for k, v in out.items()}


def _check_start(start, width: int, where: str) -> int:
  if not isinstance(start, (int, np.integer)) or not 0 <= int(start) <= width - 2:
    raise ValueError(f"{where}: logits_start={start!r} must be an int in [0, T - 2] = "
                     f"[0, {width - 2}] (see rl.packing.logits_start)")
  return int(start)


class UpdateStep:
  """One optimizer update, in either of two forms (built by `_make_update_step`).

  `state, metrics = step(state, batch, logits_start=0)`: ONE jit over one batch [B, T], split
  into `micro_batches` equal micro-batches scanned inside it (rows m, m + M, ...).

  `state, metrics = step.accumulated(state, [(mb, logits_start), ...])`: one update over
  micro-batches of any widths and row counts (token-budget micro-batches,
  `rl.packing.plan_micro_batches`), each a multiple of data x fsdp rows (all-zero pad rows
  add nothing). Two jits: `accumulate(params, grads, sums, loss, mb, norms, start)` adds one
  micro-batch's float32 gradient to `grads` (donated), compiled once per micro-batch shape
  (the logits start is a traced int32 scalar: its head chunks before the start are skipped at
  run time, `_token_stats`); `apply(state, grads, sums, loss, norms)` clips, runs the optimizer, skips a
  non-finite update and writes the metrics exactly as the one-jit step does. The whole-batch
  normalisers come once from every micro-batch's loss mask (`_TokenNorms.host`), so the summed
  gradient, loss and metrics equal those of the one batch the micro-batches split, for every
  aggregation mode. Live memory follows the largest micro-batch, not the whole batch.
  """

  def __init__(self, step, accumulate, apply, zeros, mb_loss, norms_fn, mesh: Mesh, required,
               where: str):
    self.jit, self.accumulate, self.apply, self.zeros = step, accumulate, apply, zeros
    self._mb_loss, self._norms_fn, self._mesh = mb_loss, norms_fn, mesh
    self._required, self._where = required, where
    self._sums = {}                  # batch keys -> the sums dict's abstract shape

  def __call__(self, state: TrainState, batch: dict, logits_start: int = 0):
    return self.jit(state, batch, logits_start)

  def lower(self, *args, **kwargs):
    return self.jit.lower(*args, **kwargs)

  def norms(self, loss_masks) -> dict:
    """The whole-update normalisers from the micro-batches' loss masks [b_i, T_i] (host)."""
    return jax.device_put(self._norms_fn.host(loss_masks), shd.replicated(self._mesh))

  def abstract_sums(self, params, mb: dict, start: int = 0) -> dict:
    """The metric sums' shapes for batches with mb's keys (ref_logp, old_logp add some)."""
    key = tuple(sorted(mb))
    if key not in self._sums:
      norms = {"den": jax.ShapeDtypeStruct((), jnp.float32),
               "tokens": jax.ShapeDtypeStruct((), jnp.float32)}
      fn = functools.partial(self._mb_loss, start=start)
      self._sums[key] = jax.eval_shape(fn, params, mb, norms)[1]
    return self._sums[key]

  def zero_sums(self, params, mb: dict, start: int = 0) -> tuple:
    """(zero sums, zero loss) on the devices, the accumulator's start."""
    zeros = jax.tree_util.tree_map(lambda x: np.zeros(x.shape, x.dtype),
                                   self.abstract_sums(params, mb, start))
    return jax.device_put((zeros, np.zeros((), np.float32)), shd.replicated(self._mesh))

  def accumulated(self, state: TrainState, parts) -> tuple:
    """One update over `parts`, a list of (micro-batch dict, logits_start int); each start
    reaches `accumulate` as a traced int32 scalar."""
    if not parts:
      raise ValueError(f"{self._where}: accumulated() needs at least one micro-batch")
    if jax.process_count() > 1:
      raise ValueError(f"{self._where}: token-budget micro-batches are planned from one "
                       "process's episodes; multi-host runs need tokens_per_micro_batch=0")
    starts = []
    for mb, start in parts:
      _check_batch(mb, self._required, self._where)
      if set(mb) != set(parts[0][0]):
        raise ValueError(f"{self._where}: micro-batches carry different keys: {sorted(mb)} "
                         f"and {sorted(parts[0][0])}")
      _check_micro(mb["input_ids"].shape[0], 1, self._mesh, self._where)
      starts.append(_check_start(start, mb["input_ids"].shape[1], self._where))
    norms = self.norms([mb["loss_mask"] for mb, _ in parts])
    grads = self.zeros(state.params)
    sums, loss = self.zero_sums(state.params, parts[0][0])
    rep = shd.replicated(self._mesh)
    for (mb, _), start in zip(parts, starts):
      start = jax.device_put(np.int32(start), rep)
      grads, sums, loss = self.accumulate(state.params, grads, sums, loss, mb, norms, start)
    return self.apply(state, grads, sums, loss, norms)


def _update_applier(opt, finalize: Callable, lr_schedule: Optional[Callable]) -> Callable:
  """`apply_update(state, grads, sums, loss, norms) -> (state, metrics)`: clips, runs the
  optimizer, keeps the old params and opt_state when the loss or gradient norm is not finite,
  and writes the metrics (finalize's, loss, grad_norm, skipped, lr)."""
  def apply_update(state: TrainState, grads, sums, loss, norms):
    grad_norm = optax.global_norm(grads)
    ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    updates, new_opt = opt.update(grads, state.opt_state, state.params)
    new_params = optax.apply_updates(state.params, updates)
    keep = lambda new, old: jax.tree_util.tree_map(lambda n, o: jnp.where(ok, n, o), new, old)
    metrics = finalize(sums, norms)
    metrics.update(loss=loss, grad_norm=grad_norm, skipped=1.0 - ok.astype(jnp.float32))
    if lr_schedule is not None:
      metrics["lr"] = jnp.asarray(lr_schedule(optimizer_count(state.opt_state)), jnp.float32)
    new_state = TrainState(params=keep(new_params, state.params),
                           opt_state=keep(new_opt, state.opt_state), step=state.step + 1)
    return new_state, metrics
  return apply_update


def _batch_grads(loss_fn: Callable, params, batch: dict, norms: dict, bsh) -> tuple:
  """(float32 grads, sums, loss) of `loss_fn(params, batch, norms)` over the whole batch."""
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  mb = jax.tree_util.tree_map(lambda x: jax.lax.with_sharding_constraint(x, bsh), batch)
  (loss, sums), grads = grad_fn(params, mb, norms)
  grads = jax.tree_util.tree_map(lambda g: g.astype(jnp.float32), grads)
  return grads, sums, loss


def _scanned_grads(loss_fn: Callable, params, batch: dict, norms: dict, micro_batches: int,
                   mesh: Mesh, state_sh: TrainState) -> tuple:
  """The same, summed over `micro_batches` micro-batches (rows m, m + M, ...) in a
  `lax.scan`: float32 gradients accumulated in the params' sharding."""
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  mbs = jax.tree_util.tree_map(lambda x: _split_micro(x, micro_batches, mesh), batch)
  first = jax.tree_util.tree_map(lambda x: x[0], mbs)
  sums_shape = jax.eval_shape(loss_fn, params, first, norms)[1]
  zeros_g = jax.tree_util.tree_map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
  zeros_g = jax.lax.with_sharding_constraint(zeros_g, state_sh.params)
  zeros_s = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), sums_shape)

  def body(carry, mb):
    g_acc, s_acc, l_acc = carry
    (l, s), g = grad_fn(params, mb, norms)
    g_acc = jax.tree_util.tree_map(lambda a, b: a + b.astype(jnp.float32), g_acc, g)
    g_acc = jax.lax.with_sharding_constraint(g_acc, state_sh.params)
    s_acc = jax.tree_util.tree_map(jnp.add, s_acc, s)
    return (g_acc, s_acc, l_acc + l), None

  (grads, sums, loss), _ = jax.lax.scan(body, (zeros_g, zeros_s, jnp.zeros((), jnp.float32)),
                                        mbs)
  return grads, sums, loss


def _make_update_step(mb_loss: Callable, norms_fn: _TokenNorms, finalize: Callable, opt,
                      mesh: Mesh, state_sh: TrainState, micro_batches: int, required, where: str,
                      lr_schedule: Optional[Callable], rules=shd.RULES) -> UpdateStep:
  """Shared machinery: scan over micro-batches, accumulate grads, skip non-finite, update.

  mb_loss(params, mb, norms, start) -> (loss already divided by the whole-batch normaliser,
  sums dict); `start` is the step's static `logits_start` (the first position whose logits are
  computed). norms_fn(batch) -> dict of whole-batch normalisers; finalize(sums, norms)
  -> metrics dict. The jitted step is `step(state, batch, logits_start=0)`; each distinct
  logits_start compiles once. See `UpdateStep` for the token-budget form, whose `accumulate`
  takes the start traced (an int32 scalar): one program per micro-batch shape.
  """
  bsh, rep = shd.batch_sharding(mesh), shd.replicated(mesh)
  apply_update = _update_applier(opt, finalize, lr_schedule)

  def step(state: TrainState, batch: dict, logits_start: int = 0):
    _check_batch(batch, required, where)
    batch_size = batch["input_ids"].shape[0]
    _check_micro(batch_size, micro_batches, mesh, where)
    start = _check_start(logits_start, batch["input_ids"].shape[1], where)
    norms = norms_fn(batch)
    loss_fn = functools.partial(mb_loss, start=start)
    if micro_batches == 1:
      grads, sums, loss = _batch_grads(loss_fn, state.params, batch, norms, bsh)
    else:
      grads, sums, loss = _scanned_grads(loss_fn, state.params, batch, norms, micro_batches,
                                         mesh, state_sh)
    return apply_update(state, grads, sums, loss, norms)

  def accumulate(params, grads, sums, loss, mb: dict, norms: dict, start):
    grad_fn = jax.value_and_grad(functools.partial(mb_loss, start=start), has_aux=True)
    mb = jax.tree_util.tree_map(lambda x: jax.lax.with_sharding_constraint(x, bsh), mb)
    (l, s), g = grad_fn(params, mb, norms)
    grads = jax.tree_util.tree_map(lambda a, b: a + b.astype(jnp.float32), grads, g)
    grads = jax.lax.with_sharding_constraint(grads, state_sh.params)
    return grads, jax.tree_util.tree_map(jnp.add, sums, s), loss + l

  zeros = lambda params: jax.tree_util.tree_map(lambda p: jnp.zeros(p.shape, jnp.float32),
                                                params)
  step, accumulate = _constrained(step, mesh, rules), _constrained(accumulate, mesh, rules)
  return UpdateStep(
      jax.jit(step, in_shardings=(state_sh, bsh), out_shardings=(state_sh, rep),
              donate_argnums=(0,), static_argnums=(2,)),
      jax.jit(accumulate, in_shardings=(state_sh.params, state_sh.params, rep, rep, bsh, rep,
                                        rep),
              out_shardings=(state_sh.params, rep, rep), donate_argnums=(1,)),
      jax.jit(apply_update, in_shardings=(state_sh, state_sh.params, rep, rep, rep),
              out_shardings=(state_sh, rep), donate_argnums=(0,)),
      jax.jit(zeros, in_shardings=(state_sh.params,), out_shardings=state_sh.params),
      mb_loss, norms_fn, mesh, required, where)


# ------------------------------------------------------------------------------------ policy
def make_policy_step(module, opt, mesh: Mesh, loss_cfg: LossConfig = LossConfig(), *,
                     micro_batches: int = 1, lr_schedule: Optional[Callable] = None,
                     logits_chunk: int = DEFAULT_LOGITS_CHUNK, head_backward: str = "auto",
                     rules=shd.RULES):
  """GRPO / DAPO / Dr. GRPO update: `state, metrics = step(state, batch, logits_start=0)`.

  batch: input_ids [B, T], attention_mask [B, T], loss_mask [B, T], advantages [B] or [B, T],
  old_logp [B, T] (optional: absent means on-policy, ratio 1), ref_logp [B, T] (required when
  loss_cfg.beta > 0; when present with beta = 0 it only feeds the 'kl' metric).
  B must split into `micro_batches` micro-batches, each a multiple of data x fsdp.
  logits_start (static int, `rl.packing.logits_start`): logits are computed for positions
  logits_start..T-2 only; no loss_mask token may sit at or before it. The ref_logp / old_logp
  entries are read at loss tokens only, so they may come from the same window.

  metrics: loss, pg_loss, kl (the configured estimator; with ref_logp also kl_k1, kl_k2, kl_k3,
  each estimator's token mean), clip_frac (+ _low / _high), dual_clip_frac, entropy,
  approx_kl_old (k3 between sampling and current policy), tokens, grad_norm, skipped, lr.
  """
  cfg = loss_cfg
  state_sh = train_state_shardings(module, opt, mesh, rules)

  norms_fn = _token_norms(cfg.aggregation, cfg.max_completion_len)

  def mb_loss(params, mb, norms, start):
    out = _token_stats(module, params, mb, mesh, rules, start, chunk=logits_chunk,
                       temperature=cfg.temperature, with_entropy=cfg.compute_entropy,
                       entropy_grad=cfg.entropy_coef > 0, head_backward=head_backward)
    logp, ent = out["lp"], out.get("ent")
    m = _loss_mask(mb["loss_mask"])
    old = mb.get("old_logp")
    old = jax.lax.stop_gradient(logp) if old is None else old
    pg_tok, info = ppo_token_loss(logp, old, mb["advantages"], cfg.eps_low, cfg.eps_high,
                                  cfg.dual_clip)
    pg_num, _ = aggregation_terms(pg_tok, m, cfg.aggregation, cfg.max_completion_len)
    loss = pg_num / norms["den"]
    tsum = lambda x: jnp.sum(jax.lax.stop_gradient(x) * m)
    sums = {"pg_loss": jax.lax.stop_gradient(loss),
            "clip_frac_low": tsum(info["clipped_low"]),
            "clip_frac_high": tsum(info["clipped_high"]),
            "dual_clip_frac": tsum(info["dual_clipped"]),
            "approx_kl_old": tsum(kl_fn(logp, old, "k3"))}
    if ent is not None:
      sums["entropy"] = tsum(ent)
    if "ref_logp" in mb:
      kl_sums, kl_loss = _policy_kl(logp, mb["ref_logp"], m, norms, cfg, tsum)
      sums.update(kl_sums)
      if kl_loss is not None:
        loss = loss + kl_loss
    if cfg.entropy_coef:
      ent_num, _ = aggregation_terms(ent, m, cfg.aggregation, cfg.max_completion_len)
      loss = loss - cfg.entropy_coef * ent_num / norms["den"]
    return loss, sums

  required = ["input_ids", "attention_mask", "loss_mask", "advantages"]
  if cfg.beta:
    required.append("ref_logp")
  return _make_update_step(mb_loss, norms_fn, _policy_metrics, opt, mesh, state_sh,
                           micro_batches, required, "make_policy_step", lr_schedule, rules)


def _policy_kl(logp, ref_logp, m, norms: dict, cfg: LossConfig, tsum: Callable) -> tuple:
  """(metric sums, loss term or None) of the KL to the reference policy: the configured
  estimator's token sum as 'kl', every estimator's as 'kl_<name>' (so runs trained with
  different estimators compare), and with beta > 0 its aggregated term beta x KL."""
  k = kl_fn(logp, ref_logp, cfg.kl_estimator)
  sums = {"kl": tsum(k)}
  for name in sorted(KL_ESTIMATORS):
    sums[f"kl_{name}"] = tsum(kl_fn(logp, ref_logp, name))
  if not cfg.beta:
    return sums, None
  kl_num, _ = aggregation_terms(k, m, cfg.aggregation, cfg.max_completion_len)
  return sums, cfg.beta * kl_num / norms["den"]


def _policy_metrics(sums: dict, norms: dict) -> dict:
  """make_policy_step's finalize: token sums -> token means; pg_loss is already a mean."""
  out = {k: (v if k == "pg_loss" else v / norms["tokens"]) for k, v in sums.items()}
  out["clip_frac"] = out["clip_frac_low"] + out["clip_frac_high"]
  out["tokens"] = norms["tokens"]
  return out


# ------------------------------------------------------------------------------------ SFT
def make_sft_step(module, opt, mesh: Mesh, *, aggregation: str = "token_mean",
                  max_len: Optional[int] = None, micro_batches: int = 1,
                  lr_schedule: Optional[Callable] = None,
                  logits_chunk: int = DEFAULT_LOGITS_CHUNK, head_backward: str = "auto",
                  rules=shd.RULES):
  """Masked cross-entropy update. batch: input_ids, attention_mask, loss_mask (1 on targets).
  `state, metrics = step(state, batch, logits_start=0)`, logits_start as in `make_policy_step`.

  metrics: loss, accuracy (greedy next-token hits on targets), tokens, grad_norm, skipped, lr.
  """
  state_sh = train_state_shardings(module, opt, mesh, rules)
  aggregation_terms(jnp.zeros((1, 1)), jnp.zeros((1, 1)), aggregation, max_len)  # validates

  norms_fn = _token_norms(aggregation, max_len)

  def mb_loss(params, mb, norms, start):
    out = _token_stats(module, params, mb, mesh, rules, start, chunk=logits_chunk,
                       with_hits=True, head_backward=head_backward)
    m = _loss_mask(mb["loss_mask"])
    num, _ = aggregation_terms(-out["lp"], m, aggregation, max_len)
    return num / norms["den"], {"accuracy": jnp.sum(out["hit"] * m)}

  def finalize(sums, norms):
    return {"accuracy": sums["accuracy"] / norms["tokens"], "tokens": norms["tokens"]}

  return _make_update_step(mb_loss, norms_fn, finalize, opt, mesh, state_sh, micro_batches,
                           ["input_ids", "attention_mask", "loss_mask"], "make_sft_step",
                           lr_schedule, rules)


# ------------------------------------------------------------------------------------ critic
def shift_values(values: Array) -> Array:
  """Critic outputs per position [B, T] -> aligned like logp: out[:, t] = V(ids[:, <t]), the
  value of the state in which token t was chosen; out[:, 0] = 0."""
  return jnp.pad(values[:, :-1], ((0, 0), (1, 0)))


def make_value_step(module, opt, mesh: Mesh, *, clip_eps: Optional[float] = 0.2,
                    aggregation: str = "token_mean", max_len: Optional[int] = None,
                    micro_batches: int = 1, lr_schedule: Optional[Callable] = None,
                    rules=shd.RULES):
  """PPO critic update (a ValueLM with its own optimizer, e.g. a larger lr).

  batch: input_ids, attention_mask, loss_mask [B, T], returns [B, T] (from `rl.gae`), and
  old_values [B, T] (the values GAE used; required when clip_eps is not None). Values are
  aligned as in `shift_values`.
  metrics: loss, vf_clip_frac, value_mean, tokens, grad_norm, skipped, lr.
  """
  state_sh = train_state_shardings(module, opt, mesh, rules)
  aggregation_terms(jnp.zeros((1, 1)), jnp.zeros((1, 1)), aggregation, max_len)  # validates

  norms_fn = _token_norms(aggregation, max_len)

  def mb_loss(params, mb, norms, start):
    del start            # a scalar head per position: nothing to window
    raw, _ = module.apply({"params": compute_params(module, params, mesh, rules)},
                          mb["input_ids"], mb["attention_mask"])
    v = shift_values(raw)
    m = _loss_mask(mb["loss_mask"])
    tok, clipped = value_token_loss(v, mb.get("old_values", v), mb["returns"], clip_eps)
    num, _ = aggregation_terms(tok, m, aggregation, max_len)
    return num / norms["den"], {"vf_clip_frac": jnp.sum(clipped * m),
                                "value_mean": jnp.sum(jax.lax.stop_gradient(v) * m)}

  def finalize(sums, norms):
    out = {k: v / norms["tokens"] for k, v in sums.items()}
    out["tokens"] = norms["tokens"]
    return out

  required = ["input_ids", "attention_mask", "loss_mask", "returns"]
  if clip_eps is not None:
    required.append("old_values")
  return _make_update_step(mb_loss, norms_fn, finalize, opt, mesh, state_sh, micro_batches,
                           required, "make_value_step", lr_schedule, rules)


# ------------------------------------------------------------------------------------ forwards
def _make_forward(fn: Callable, module, mesh: Mesh, micro_batches: int, rules, where: str):
  p_sh = shd.param_shardings(module, mesh, rules)
  bsh, rep = shd.batch_sharding(mesh), shd.replicated(mesh)

  def forward(params, batch, start):
    _check_micro(batch["input_ids"].shape[0], micro_batches, mesh, where)
    if micro_batches == 1:
      return fn(params, batch, start)
    mbs = jax.tree_util.tree_map(lambda x: _split_micro(x, micro_batches, mesh), batch)
    return _merge_micro(jax.lax.map(lambda mb: fn(params, mb, start), mbs), mesh)

  forward = _constrained(forward, mesh, rules)
  return Forward(jax.jit(forward, in_shardings=(p_sh, bsh), out_shardings=bsh,
                         static_argnums=(2,)),
                 jax.jit(forward, in_shardings=(p_sh, bsh, rep), out_shardings=bsh),
                 rep, where)


class Forward:
  """A jitted forward over a packed batch (log-probs, values), in two forms:
  `fn(params, batch, logits_start=0)` with a static start (one program per start), and
  `fn.any_start(params, batch, logits_start)` with the start traced (one program per batch
  shape, the token-budget micro-batches'). Only input_ids and attention_mask reach the jit,
  so batches that carry other entries share its programs."""

  def __init__(self, static, traced, rep, where: str):
    self.static, self.traced, self._rep, self._where = static, traced, rep, where

  def _inputs(self, batch: dict, logits_start) -> tuple:
    _check_batch(batch, ["input_ids", "attention_mask"], self._where)
    start = _check_start(logits_start, batch["input_ids"].shape[1], self._where)
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}, start

  def __call__(self, params, batch: dict, logits_start: int = 0):
    return self.static(params, *self._inputs(batch, logits_start))

  def any_start(self, params, batch: dict, logits_start: int):
    batch, start = self._inputs(batch, logits_start)
    return self.traced(params, batch, jax.device_put(np.int32(start), self._rep))

  def lower(self, params, batch: dict, logits_start: int = 0):
    return self.static.lower(params, *self._inputs(batch, logits_start))


def _constrained(fn: Callable, mesh: Mesh, rules) -> Callable:
  """`fn` traced under the rule table's activation constraints (forward and backward pass)."""
  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    with shd.activation_constraints(mesh, rules):
      return fn(*args, **kwargs)
  return wrapped


def make_logprob_fn(module, mesh: Mesh, *, temperature: float = 1.0, micro_batches: int = 1,
                    logits_chunk: int = DEFAULT_LOGITS_CHUNK, rules=shd.RULES):
  """Jitted `logp = fn(params, batch, logits_start=0)`: aligned per-token log-probs [B, T]
  (float32) for the old_logp / ref_logp batch entries; works for the policy and the reference
  params alike. With logits_start > 0, positions 0..logits_start hold 0."""
  def fn(params, batch, start):
    return jax.lax.stop_gradient(_token_stats(module, params, batch, mesh, rules, start,
                                              chunk=logits_chunk, temperature=temperature)["lp"])
  return _make_forward(fn, module, mesh, micro_batches, rules, "make_logprob_fn")


def make_value_fn(module, mesh: Mesh, *, micro_batches: int = 1, rules=shd.RULES):
  """Jitted `values = fn(params, batch)`: critic values [B, T] aligned as in `shift_values`
  (a logits_start argument is accepted and ignored)."""
  def fn(params, batch, start):
    del start
    raw, _ = module.apply({"params": compute_params(module, params, mesh, rules)},
                          batch["input_ids"], batch["attention_mask"])
    return shift_values(raw)
  return _make_forward(fn, module, mesh, micro_batches, rules, "make_value_fn")
