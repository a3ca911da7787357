"""Orbax checkpoints: save -> restore equality, keep-N, and resume == uninterrupted training."""
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from rlrag_jax import checkpoint, rl
from rlrag_jax.models import sharding as shd
from rlrag_jax.models.config import ModelConfig
from rlrag_jax.models.decoder import DecoderLM, init_params

CFG = ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                  num_kv_heads=1, head_dim=8)


def _leaves_equal(a, b):
  la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
  assert len(la) == len(lb)
  for x, y in zip(la, lb):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def setup():
  model = DecoderLM(CFG)
  mesh = shd.make_mesh()
  ocfg = rl.OptimizerConfig(lr=1e-2, warmup_steps=1, total_steps=20, weight_decay=0.1)
  opt = rl.make_optimizer(ocfg)
  params = jax.device_get(jax.jit(lambda r: init_params(model, r))(jax.random.PRNGKey(0)))
  step = rl.make_policy_step(model, opt, mesh, rl.LossConfig(aggregation="token_mean"))
  return model, mesh, ocfg, opt, params, step


def _batch(i):
  """The i-th batch of a deterministic data stream."""
  rng = np.random.default_rng(100 + i)
  ids = rng.integers(0, CFG.vocab_size, size=(4, 8)).astype(np.int32)
  mask = np.zeros((4, 8), np.float32)
  mask[:, 4:] = 1
  return {"input_ids": ids, "attention_mask": np.ones((4, 8), np.int32), "loss_mask": mask,
          "advantages": rng.normal(size=4).astype(np.float32)}


def test_save_restore_roundtrip(tmp_path, setup):
  model, mesh, ocfg, opt, params, step = setup
  state = rl.create_train_state(model, opt, mesh, params=params)
  state, _ = step(state, _batch(0))
  rng = jax.random.key(7)
  with checkpoint.CheckpointManager(tmp_path / "ckpt", max_to_keep=2) as mgr:
    assert mgr.latest_step() is None
    saved = jax.device_get(state)
    mgr.save(1, state, rng=rng, data_position={"epoch": 0, "index": 12},
             config={"optimizer": {"lr": ocfg.lr}, "name": "test"})
    mgr.wait()
    assert mgr.latest_step() == 1
    target = rl.abstract_train_state(model, opt, mesh)
    out = mgr.restore(target)
  assert out.step == 1 and out.data_position == {"epoch": 0, "index": 12}
  assert out.config == {"optimizer": {"lr": ocfg.lr}, "name": "test"}
  np.testing.assert_array_equal(np.asarray(jax.random.key_data(out.rng)),
                                np.asarray(jax.random.key_data(rng)))
  assert jax.random.key_impl(out.rng) == jax.random.key_impl(rng)
  _leaves_equal(out.state, saved)
  assert jax.tree_util.tree_structure(out.state) == jax.tree_util.tree_structure(saved)
  q = out.state.params["model"]["layers_0"]["self_attn"]["q_proj"]["kernel"]
  assert q.sharding == target.params["model"]["layers_0"]["self_attn"]["q_proj"]["kernel"].sharding
  assert checkpoint.latest_step(str(tmp_path / "ckpt")) == 1
  assert checkpoint.latest_step(str(tmp_path / "nothing")) is None


def test_keep_n(tmp_path, setup):
  model, mesh, _, opt, params, _ = setup
  state = rl.create_train_state(model, opt, mesh, params=params)
  mgr = checkpoint.CheckpointManager(tmp_path, max_to_keep=2)
  for s in (10, 20, 30, 40):
    mgr.save(s, state, data_position={"i": s})
  mgr.wait()
  assert mgr.all_steps() == [30, 40] and mgr.latest_step() == 40
  assert sorted(int(p) for p in os.listdir(tmp_path) if p.isdigit()) == [30, 40]
  out = mgr.restore(state, step=30)                 # a concrete state works as the target too
  assert out.data_position == {"i": 30} and out.rng is None and out.meta == {}
  with pytest.raises(FileNotFoundError, match="step 10"):
    mgr.restore(state, step=10)
  mgr.close()


def test_plain_pytree_without_target(tmp_path, setup):
  """Any pytree of arrays (e.g. params plus a reference model) restores as saved without a
  target; extra meta fields and a JSON-string config come back too."""
  _, _, _, _, params, _ = setup
  items = {"params": params, "ref_params": params, "step": np.int32(4)}
  with checkpoint.CheckpointManager(tmp_path) as mgr:
    mgr.save(4, items, meta={"stage": "rl", "iters": [1, 2]}, config='{"seed": 3}')
  with checkpoint.CheckpointManager(tmp_path) as mgr:
    out = mgr.restore_latest()
  assert out.meta == {"stage": "rl", "iters": [1, 2]} and out.config == {"seed": 3}
  _leaves_equal(out.state, items)
  assert set(out.state) == {"params", "ref_params", "step"}


def test_resume_equals_uninterrupted(tmp_path, setup):
  """k steps, save, restore into a fresh state in a fresh manager, continue: the params equal
  those of a run that never stopped."""
  model, mesh, _, opt, params, step = setup
  k, total = 3, 6

  state = rl.create_train_state(model, opt, mesh, params=params)
  for i in range(total):
    state, _ = step(state, _batch(i))
  straight = jax.device_get(state)

  state = rl.create_train_state(model, opt, mesh, params=params)
  for i in range(k):
    state, _ = step(state, _batch(i))
  with checkpoint.CheckpointManager(tmp_path) as mgr:
    mgr.save(int(state.step), state, data_position={"next_batch": k})
  del state

  with checkpoint.CheckpointManager(tmp_path) as mgr:          # a new process would do this
    out = mgr.restore(rl.abstract_train_state(model, opt, mesh))
  state = out.state
  assert int(state.step) == k
  for i in range(out.data_position["next_batch"], total):
    state, _ = step(state, _batch(i))
  _leaves_equal(jax.device_get(state), straight)


def _truncate_largest_state_file(step_dir):
  """A half-lost write: the biggest array-data file of a step cut to 100 bytes."""
  files = [os.path.join(root, f) for root, _, names in os.walk(os.path.join(step_dir, "state"))
           for f in names if os.sep + "d" + os.sep in os.path.join(root, f) + os.sep]
  with open(max(files, key=os.path.getsize), "r+b") as f:
    f.truncate(100)


def test_a_corrupt_latest_step_falls_back_to_the_newest_intact_one(tmp_path, caplog):
  items = {"w": np.arange(1000, dtype=np.float32), "b": np.ones(3, np.float32)}
  with checkpoint.CheckpointManager(tmp_path, max_to_keep=3) as mgr:
    for s in (1, 2, 3):
      mgr.save(s, {**items, "b": items["b"] * s}, meta={"stage": "rl", "at": s})
  _truncate_largest_state_file(tmp_path / "3")
  seen = []

  def target(meta):                          # a target chosen from the step's own meta
    seen.append(meta["at"])
    return items
  with checkpoint.CheckpointManager(tmp_path, max_to_keep=3) as mgr:
    with caplog.at_level("WARNING", logger="rlrag_jax.checkpoint"):
      out = mgr.restore(target)                      # a reader: falls back, renames nothing
    assert out.step == 2 and out.meta == {"stage": "rl", "at": 2} and seen == [3, 2]
    np.testing.assert_array_equal(np.asarray(out.state["b"]), items["b"] * 2)
    assert "checkpoint step 3 under" in caplog.text
    assert "does not restore (ValueError: " in caplog.text
    assert "restored step 2 instead" in caplog.text and mgr.all_steps() == [1, 2, 3]
    caplog.clear()
    with caplog.at_level("WARNING", logger="rlrag_jax.checkpoint"):
      out = mgr.restore_latest(items, set_aside_corrupt=True)       # the trainer's resume
    assert out.step == 2 and mgr.latest_step() == 2 and mgr.all_steps() == [1, 2]
    assert f"set aside as {tmp_path / '3.corrupt'}" in caplog.text
    assert sorted(os.listdir(tmp_path)) == ["1", "2", "3.corrupt"]        # nothing deleted
    mgr.save(3, items)                                                     # step 3 again
    mgr.wait()
    assert mgr.restore(items).step == 3
  # Every step failing (here: a target of another structure) is one error naming each step.
  with checkpoint.CheckpointManager(tmp_path) as mgr:
    with pytest.raises(RuntimeError, match=r"restores: step 3: \w+: .*; step 2: .*; step 1: "):
      mgr.restore({"other": np.zeros(2, np.float32)}, set_aside_corrupt=True)
    assert mgr.all_steps() == [1, 2, 3]                              # nothing set aside


def _sharded_worker(directory):
  from jax.sharding import PartitionSpec as P
  model = DecoderLM(CFG)
  opt = rl.make_optimizer(rl.OptimizerConfig(lr=1e-2, total_steps=20))
  params = jax.jit(lambda r: init_params(model, r))(jax.random.PRNGKey(0))
  src = shd.make_mesh(data=2, fsdp=2, tensor=2)
  state = rl.create_train_state(model, opt, src, params=params)
  with checkpoint.CheckpointManager(directory) as mgr:
    mgr.save(5, state)
  dst = shd.make_mesh(data=1, fsdp=4, tensor=2)
  with checkpoint.CheckpointManager(directory) as mgr:
    out = mgr.restore(rl.abstract_train_state(model, opt, dst))
  emb = out.state.params["model"]["embed_tokens"]["embedding"]
  assert emb.sharding.mesh == dst and emb.sharding.spec == P("tensor", "fsdp"), emb.sharding
  assert emb.addressable_shards[0].data.shape == (32, 4)
  _leaves_equal(jax.device_get(out.state), jax.device_get(state))
  print("OK")


@pytest.mark.slow
def test_sharded_restore_onto_another_mesh(tmp_path):
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
             JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, os.path.abspath(__file__), "worker", str(tmp_path)],
                        env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
  assert "OK" in proc.stdout


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
  _sharded_worker(sys.argv[2])
