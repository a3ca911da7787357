"""One rule table from logical axis names to mesh axes, the mesh, and sharding helpers.

The mesh has three axes: 'data' (pure data parallel, params replicated), 'fsdp' (data parallel
with params, gradients and optimizer state sharded over it) and 'tensor' (Megatron-style tensor
parallel over heads, MLP width and vocab). Batches shard over ('data', 'fsdp').

RULES lists (logical name, mesh axes) pairs in priority order; a logical name may appear more
than once (fallbacks). For each dimension of an array the first rule whose mesh axes are not yet
used by an earlier dimension (a mesh axis can appear only once per PartitionSpec) and whose size
divides the dimension wins; when none fits, the dimension is replicated. Names without any rule
are an error, so a typo in a module cannot silently replicate a large weight.
"""
from __future__ import annotations

import contextlib
import math
from typing import Any, Optional, Sequence

import jax
import numpy as np
import optax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from rlrag_jax.models.decoder import activation_sharding, init_params, logical_axes

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

RULES = (
    # params
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("norm", None),
    # activations (decoder.py constrains them through nn.with_logical_constraint)
    ("activation_batch", BATCH_AXES),
    ("activation_length", None),
    ("activation_embed", None),
    ("activation_heads", "tensor"),
    ("activation_kv_heads", "tensor"),
    ("activation_mlp", "tensor"),
    ("activation_vocab", "tensor"),
)


# ------------------------------------------------------------------------------------ mesh
def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1,
              devices: Optional[Sequence[Any]] = None) -> Mesh:
  """A ('data', 'fsdp', 'tensor') mesh over all global devices (every process's, multi-host).

  One of the sizes may be -1: it takes all remaining devices. Axis types are Auto, so XLA's
  sharding propagation fills in what in/out shardings and constraints leave open.
  """
  devices = list(jax.devices() if devices is None else devices)
  sizes = [data, fsdp, tensor]
  if sum(s == -1 for s in sizes) > 1 or any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f"make_mesh: sizes data={data}, fsdp={fsdp}, tensor={tensor} must be >= 1, "
                     "with at most one -1")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if len(devices) % known:
      raise ValueError(f"make_mesh: {len(devices)} devices are not divisible by the fixed axes "
                       f"(product {known}) of data={data}, fsdp={fsdp}, tensor={tensor}")
    sizes[sizes.index(-1)] = len(devices) // known
  if math.prod(sizes) != len(devices):
    raise ValueError(f"make_mesh: data x fsdp x tensor = {sizes} uses {math.prod(sizes)} devices; "
                     f"{len(devices)} are available")
  return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


def maybe_initialize_distributed(coordinator_address: Optional[str] = None,
                                 num_processes: Optional[int] = None,
                                 process_id: Optional[int] = None, *, auto: bool = False) -> bool:
  """Calls jax.distributed.initialize when asked; a no-op for a single process.

  Asked means: a coordinator / process count / id was given (num_processes > 1), or
  `auto=True` (let JAX detect a TPU pod or SLURM cluster). Returns True when the process is part
  of a multi-process run afterwards. Call it before anything touches jax.devices().
  """
  if jax.distributed.is_initialized():
    return True
  asked = auto or coordinator_address is not None or process_id is not None or (
      num_processes is not None and num_processes > 1)
  if not asked or num_processes == 1:
    return False
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id)
  return True


# ------------------------------------------------------------------------------------ rules
def _as_axes(mesh_axes) -> tuple:
  if mesh_axes is None:
    return ()
  return (mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes)


def logical_to_mesh_spec(names: Sequence[Optional[str]], shape: Optional[Sequence[int]] = None,
                         mesh: Optional[Mesh] = None, rules=RULES) -> P:
  """Logical names of one array (e.g. P('embed', 'mlp')) -> a mesh PartitionSpec.

  With `shape` and `mesh`, a rule only applies when its mesh size divides that dimension.
  """
  names = tuple(names)
  if shape is not None and len(shape) != len(names):
    raise ValueError(f"logical axes {names} have {len(names)} entries but the array has shape "
                     f"{tuple(shape)}")
  used: set = set()
  out = []
  for dim, name in enumerate(names):
    choice = None
    if name is not None:
      candidates = [axes for logical, axes in rules if logical == name]
      if not candidates:
        raise ValueError(f"logical axis {name!r} has no rule in rlrag_jax/models/sharding.py RULES "
                         f"(known: {sorted({n for n, _ in rules})})")
      for cand in candidates:
        axes = _as_axes(cand)
        if not axes:
          break                                          # an explicit "replicate" rule
        if any(a in used for a in axes):
          continue
        if shape is not None and mesh is not None:
          if shape[dim] % math.prod(mesh.shape[a] for a in axes):
            continue
        choice = axes
        break
    if choice:
      used.update(choice)
      out.append(choice[0] if len(choice) == 1 else choice)
    else:
      out.append(None)
  return P(*out)


def activation_constraints(mesh: Mesh, rules=RULES):
  """A context under which traced decoder activations are constrained by the rule table
  (`decoder.activation_sharding`); nothing on a one-device mesh."""
  if mesh.devices.size == 1:
    return contextlib.nullcontext()
  return activation_sharding(
      lambda names, shape: NamedSharding(mesh, logical_to_mesh_spec(names, shape, mesh, rules)))


def _is_spec(x) -> bool:
  return isinstance(x, P)


def logical_to_mesh_specs(logical_tree, shapes_tree=None, mesh: Optional[Mesh] = None,
                          rules=RULES):
  """Pytree of logical PartitionSpecs (from decoder.logical_axes) -> pytree of mesh specs."""
  if shapes_tree is None:
    return jax.tree_util.tree_map(lambda s: logical_to_mesh_spec(s, rules=rules), logical_tree,
                                  is_leaf=_is_spec)
  return jax.tree_util.tree_map(
      lambda s, x: logical_to_mesh_spec(s, x.shape, mesh, rules), logical_tree, shapes_tree,
      is_leaf=_is_spec)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh, leading_axes: int = 0) -> NamedSharding:
  """Shards dimension `leading_axes` (the batch) over ('data', 'fsdp'); 0 for [B, ...] arrays,
  1 for micro-batched [M, B, ...] ones."""
  return NamedSharding(mesh, P(*([None] * leading_axes), BATCH_AXES))


# ------------------------------------------------------------------------------------ params
def param_shapes(module, seq_len: int = 8):
  """Abstract params (ShapeDtypeStructs) of a decoder module, without allocating."""
  return jax.eval_shape(lambda: init_params(module, jax.random.PRNGKey(0), seq_len))


def param_shardings(module, mesh: Mesh, rules=RULES):
  """NamedShardings of a module's params from its logical axes and the rule table."""
  specs = logical_to_mesh_specs(logical_axes(module), param_shapes(module), mesh, rules)
  return jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), specs, is_leaf=_is_spec)


def opt_state_shardings(opt, params_shardings, params_abstract, mesh: Mesh):
  """Shardings of `opt.init(params)`: moments mirror their param, everything else replicated."""
  state = jax.eval_shape(opt.init, params_abstract)
  masked = lambda x: isinstance(x, optax.MaskedNode)     # params a masked transform skips
  return optax.tree_map_params(opt, lambda p, s: p if masked(p) else s, state, params_shardings,
                               transform_non_params=lambda _: replicated(mesh), is_leaf=masked)


def init_sharded_params(module, rng, mesh: Mesh, rules=RULES, seq_len: int = 8):
  """Random params created directly in their shards (no full copy on one device)."""
  shardings = param_shardings(module, mesh, rules)
  return jax.jit(lambda r: init_params(module, r, seq_len), out_shardings=shardings)(rng)


def shard_batch(batch, mesh: Mesh, leading_axes: int = 0):
  """Host arrays -> global jax.Arrays sharded over the batch axes.

  Multi-host: each process passes its own rows and they are stacked in process order.
  """
  sharding = batch_sharding(mesh, leading_axes)
  if jax.process_count() == 1:
    return jax.device_put(jax.tree_util.tree_map(np.asarray, batch), sharding)
  return jax.tree_util.tree_map(
      lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), batch)
