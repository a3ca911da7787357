"""The training state and its optimizer: `TrainState` (params, optimizer state, step count),
AdamW with warmup and cosine / linear / constant decay (`OptimizerConfig`, `make_optimizer`),
an lr schedule indexed by RL steps (`advance_rl_step`), and the state's shardings, abstract
shapes and construction on a mesh.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional

import flax
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from rlrag_jax import settings as settings_lib
from rlrag_jax.models import sharding as shd

Array = jax.Array


@flax.struct.dataclass
class TrainState:
  params: Any
  opt_state: Any
  step: Array      # int32 scalar: calls of the step function, skipped updates included


def from_mapping(cls, cfg, where: str):
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
    return from_mapping(cls, cfg, "OptimizerConfig (config key optimizer)")

  @property
  def warmup(self) -> int:
    return self.warmup_steps if self.warmup_steps > 0 else int(round(self.warmup_ratio *
                                                                     self.total_steps))


SCHEDULES = settings_lib.SCHEDULES     # OptimizerConfig.schedule


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
