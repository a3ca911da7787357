"""The logical-axis rule table, the mesh and the sharding helpers (8-device runs live in
tests/rl/test_sharded_step.py)."""
import jax
import numpy as np
import optax
import pytest
from jax.sharding import AbstractMesh, PartitionSpec as P

from rlrag_jax.models import sharding as shd
from rlrag_jax.models.config import ModelConfig
from rlrag_jax.models.decoder import DecoderLM, ValueLM, logical_axes

CFG = ModelConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=8)


def _mesh(data, fsdp, tensor):
  return AbstractMesh((data, fsdp, tensor), shd.MESH_AXES)


def _specs(module, mesh):
  return shd.logical_to_mesh_specs(logical_axes(module), shd.param_shapes(module), mesh)


def test_decoder_params_on_2x2x2():
  specs = _specs(DecoderLM(CFG), _mesh(2, 2, 2))
  layer = specs["model"]["layers_0"]
  assert specs["model"]["embed_tokens"]["embedding"] == P("tensor", "fsdp")
  assert specs["lm_head"]["kernel"] == P("fsdp", "tensor")
  assert layer["self_attn"]["q_proj"]["kernel"] == P("fsdp", "tensor", None)
  assert layer["self_attn"]["k_proj"]["kernel"] == P("fsdp", "tensor", None)
  assert layer["self_attn"]["o_proj"]["kernel"] == P("tensor", None, "fsdp")
  assert layer["mlp"]["gate_proj"]["kernel"] == P("fsdp", "tensor")
  assert layer["mlp"]["down_proj"]["kernel"] == P("tensor", "fsdp")
  assert layer["input_layernorm"]["weight"] == P(None)
  assert specs["model"]["norm"]["weight"] == P(None)


def test_no_mesh_axis_twice_and_indivisible_dims_replicate():
  mesh = _mesh(1, 2, 4)      # tensor = 4 does not divide num_kv_heads = 2
  for module in (DecoderLM(CFG), ValueLM(CFG)):
    for spec in jax.tree_util.tree_leaves(_specs(module, mesh),
                                          is_leaf=lambda x: isinstance(x, P)):
      used = [a for entry in spec if entry for a in ((entry,) if isinstance(entry, str) else entry)]
      assert len(used) == len(set(used)), spec
  specs = _specs(DecoderLM(CFG), mesh)
  assert specs["model"]["layers_0"]["self_attn"]["k_proj"]["kernel"] == P("fsdp", None, None)
  assert specs["model"]["layers_0"]["self_attn"]["q_proj"]["kernel"] == P("fsdp", "tensor", None)
  assert _specs(ValueLM(CFG), mesh)["value_head"]["kernel"] == P("fsdp", None)


def test_rule_priority_and_fallbacks():
  rules = (("a", "tensor"), ("b", "tensor"), ("b", "fsdp"), ("c", ("data", "fsdp")))
  # 'b' cannot reuse 'tensor' (taken by 'a'), so its fallback rule gives 'fsdp'.
  assert shd.logical_to_mesh_spec(("a", "b"), rules=rules) == P("tensor", "fsdp")
  assert shd.logical_to_mesh_spec(("b", "a"), rules=rules) == P("tensor", None)
  assert shd.logical_to_mesh_spec(("c", None), rules=rules) == P(("data", "fsdp"), None)
  # With a shape, a rule only applies when its mesh size divides the dimension.
  assert shd.logical_to_mesh_spec(("b",), (6,), _mesh(1, 3, 4), rules) == P("fsdp")
  assert shd.logical_to_mesh_spec(("c",), (6,), _mesh(2, 2, 1), rules) == P(None)
  assert shd.logical_to_mesh_spec(("activation_batch", "activation_vocab"), (8, 128),
                                  _mesh(2, 2, 2)) == P(("data", "fsdp"), "tensor")
  with pytest.raises(ValueError, match="'embd' has no rule"):
    shd.logical_to_mesh_spec(("embd",))
  with pytest.raises(ValueError, match="shape"):
    shd.logical_to_mesh_spec(("embed",), (2, 3), _mesh(1, 1, 1))


def test_make_mesh_and_distributed_noop():
  n = jax.device_count()
  mesh = shd.make_mesh()
  assert mesh.axis_names == shd.MESH_AXES and dict(mesh.shape) == {"data": n, "fsdp": 1,
                                                                   "tensor": 1}
  with pytest.raises(ValueError, match="devices"):
    shd.make_mesh(data=n + 1)
  with pytest.raises(ValueError, match="at most one -1"):
    shd.make_mesh(data=-1, fsdp=-1)
  assert shd.maybe_initialize_distributed() is False
  assert shd.maybe_initialize_distributed(num_processes=1) is False
  assert jax.process_count() == 1


def test_opt_state_mirrors_params():
  mesh = shd.make_mesh()
  module = DecoderLM(CFG)
  p_sh = shd.param_shardings(module, mesh)
  opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
  o_sh = shd.opt_state_shardings(opt, p_sh, shd.param_shapes(module), mesh)
  adam = o_sh[1][0]
  assert adam.mu["model"]["layers_1"]["mlp"]["up_proj"]["kernel"].spec == P("fsdp", "tensor")
  assert jax.tree_util.tree_map(lambda s: s.spec, adam.nu) == jax.tree_util.tree_map(
      lambda s: s.spec, p_sh)
  assert adam.count.spec == P()


def test_batch_sharding_and_shard_batch():
  mesh = shd.make_mesh()
  assert shd.batch_sharding(mesh).spec == P(("data", "fsdp"))
  assert shd.batch_sharding(mesh, leading_axes=1).spec == P(None, ("data", "fsdp"))
  out = shd.shard_batch({"ids": np.arange(6).reshape(2, 3)}, mesh)
  assert out["ids"].sharding.spec == P(("data", "fsdp"))
  np.testing.assert_array_equal(np.asarray(out["ids"]), np.arange(6).reshape(2, 3))
