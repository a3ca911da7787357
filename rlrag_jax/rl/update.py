"""The machinery of one sharded, jitted update, shared by the step factories
(`rl.step_factories`: policy, SFT, critic) and the forwards they build.

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
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from rlrag_jax.models import sharding as shd
from rlrag_jax.rl.losses import aggregation_terms
from rlrag_jax.rl.optim_state import TrainState, optimizer_count

Array = jax.Array


def loss_mask(mask: Array) -> Array:
  m = jnp.asarray(mask).astype(jnp.float32)
  return m * (jnp.arange(m.shape[1]) > 0).astype(jnp.float32)[None, :]


@dataclasses.dataclass(frozen=True)
class _TokenNorms:
  """norms_fn for `make_update_step`: the loss denominator over the whole batch (so that
  micro-batching does not change the loss) and the loss-token count for the metrics.

  `norms(batch)` traces them from one batch; `norms.host(loss_masks)` computes the same
  numbers in numpy from the loss masks of an update's micro-batches of any widths (every
  mode's denominator is a sum over rows, and pad rows, with no loss token, add nothing), so
  token-budget micro-batches divide by the one-big-batch normaliser too."""
  aggregation: str
  max_len: Optional[int]

  def __call__(self, batch) -> dict:
    m = loss_mask(batch["loss_mask"])
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


def token_norms(aggregation: str, max_len: Optional[int]) -> _TokenNorms:
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


def _check_start(start, width: int, where: str) -> int:
  if not isinstance(start, (int, np.integer)) or not 0 <= int(start) <= width - 2:
    raise ValueError(f"{where}: logits_start={start!r} must be an int in [0, T - 2] = "
                     f"[0, {width - 2}] (see rl.packing.logits_start)")
  return int(start)


class UpdateStep:
  """One optimizer update, in either of two forms (built by `make_update_step`).

  `state, metrics = step(state, batch, logits_start=0)`: ONE jit over one batch [B, T], split
  into `micro_batches` equal micro-batches scanned inside it (rows m, m + M, ...).

  `state, metrics = step.accumulated(state, [(mb, logits_start), ...])`: one update over
  micro-batches of any widths and row counts (token-budget micro-batches,
  `rl.packing.plan_micro_batches`), each a multiple of data x fsdp rows (all-zero pad rows
  add nothing). Two jits: `accumulate(params, grads, sums, loss, mb, norms, start)` adds one
  micro-batch's float32 gradient to `grads` (donated), compiled once per micro-batch shape
  (the logits start is a traced int32 scalar: its head chunks before the start are skipped at
  run time, `token_stats`); `apply(state, grads, sums, loss, norms)` clips, runs the optimizer, skips a
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


def make_update_step(mb_loss: Callable, norms_fn: _TokenNorms, finalize: Callable, opt,
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


def make_forward(fn: Callable, module, mesh: Mesh, micro_batches: int, rules, where: str):
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
