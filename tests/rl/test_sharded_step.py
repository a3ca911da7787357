"""A policy step on 8 forced host devices (mesh data 2 x fsdp 2 x tensor 2), and on two
processes of 2 devices each, equals the same step on one device. JAX reads XLA_FLAGS once per
process, so these run in subprocesses: this file is also the worker
(`python test_sharded_step.py worker` / `... mp <process id> <port>`)."""
import os
import subprocess
import sys

import pytest

N_DEV = 8


def _worker():
  import jax
  import numpy as np
  from jax.sharding import PartitionSpec as P

  from rlrag_jax import rl
  from rlrag_jax.models import sharding as shd
  from rlrag_jax.models.config import ModelConfig
  from rlrag_jax.models.decoder import DecoderLM, init_params

  assert jax.device_count() == N_DEV, jax.devices()
  cfg = ModelConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8)
  model = DecoderLM(cfg)
  params = jax.device_get(jax.jit(lambda r: init_params(model, r))(jax.random.PRNGKey(0)))
  rng = np.random.default_rng(0)
  b, t = 16, 12
  ids = rng.integers(0, cfg.vocab_size, size=(b, t)).astype(np.int32)
  attn = np.ones((b, t), np.int32)
  attn[:5, :3] = 0
  loss_mask = np.zeros((b, t), np.float32)
  loss_mask[:, 6:] = 1
  loss_mask[::3, 9:] = 0
  loss_mask[7] = 0
  batch = {"input_ids": ids, "attention_mask": attn, "loss_mask": loss_mask,
           "advantages": rng.normal(size=b).astype(np.float32)}
  noise_old = rng.normal(size=(b, t)).astype(np.float32) * 0.3
  noise_ref = rng.normal(size=(b, t)).astype(np.float32) * 0.2
  opt = rl.make_optimizer(rl.OptimizerConfig(lr=1e-3, warmup_steps=1, total_steps=10,
                                             weight_decay=0.01))
  loss_cfg = rl.LossConfig.preset("grpo", dual_clip=3.0)

  def run(mesh, chunk=2 ** 26):
    state = rl.create_train_state(model, opt, mesh, params=params)
    logp = np.asarray(rl.make_logprob_fn(model, mesh, micro_batches=2, logits_chunk=chunk)(
        state.params, batch))
    full = dict(batch, old_logp=logp + noise_old, ref_logp=logp + noise_ref)
    step = rl.make_policy_step(model, opt, mesh, loss_cfg, micro_batches=2, logits_chunk=chunk)
    metrics = []
    for _ in range(3):
      state, m = step(state, full)
      metrics.append(jax.device_get(m))
    return logp, state, metrics

  one = shd.make_mesh(devices=jax.devices()[:1])
  mesh = shd.make_mesh(data=2, fsdp=2, tensor=2)
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
  logp1, s1, m1 = run(one)
  logp8, s8, m8 = run(mesh)

  # The state really is sharded: fsdp on embed, tensor on heads, moments mirror params.
  q = s8.params["model"]["layers_0"]["self_attn"]["q_proj"]["kernel"]
  assert q.sharding.spec == P("fsdp", "tensor", None), q.sharding
  assert len(q.addressable_shards) == N_DEV and q.addressable_shards[0].data.shape == (16, 2, 8)
  adam = [x for x in jax.tree_util.tree_leaves(s8.opt_state) if x.shape == q.shape]
  assert adam and all(x.sharding.spec == q.sharding.spec for x in adam), [x.sharding for x in adam]

  np.testing.assert_allclose(logp8, logp1, atol=1e-5)
  for a, b_ in zip(m1, m8):
    for k in a:
      np.testing.assert_allclose(b_[k], a[k], rtol=1e-5, atol=1e-6, err_msg=k)
  assert all(float(m["skipped"]) == 0 for m in m8)
  p1, p8 = jax.device_get(s1.params), jax.device_get(s8.params)
  worst = max(float(np.abs(x - y).max()) for x, y in
              zip(jax.tree_util.tree_leaves(p1), jax.tree_util.tree_leaves(p8)))
  moved = max(float(np.abs(x - y).max()) for x, y in
              zip(jax.tree_util.tree_leaves(p1), jax.tree_util.tree_leaves(params)))
  assert worst <= 1e-5 and moved > 1e-4, (worst, moved)
  # The LM head in chunks (3 positions of a device's 2 rows; the head gathered once for all
  # chunks, the chunk budget per device): the same steps, on 8 devices and on one.
  for m in (mesh, one):
    logp_c, s_c, m_c = run(m, chunk=2 * 3 * cfg.vocab_size)
    np.testing.assert_allclose(logp_c, logp1, atol=1e-5)
    for a, b_ in zip(m1, m_c):
      np.testing.assert_allclose(b_["loss"], a["loss"], rtol=1e-5, atol=1e-6)
    pc = jax.device_get(s_c.params)
    gap = max(float(np.abs(x - y).max()) for x, y in
              zip(jax.tree_util.tree_leaves(p1), jax.tree_util.tree_leaves(pc)))
    assert gap <= 1e-5, (dict(m.shape), gap)
  # model.attention='pallas' (the kernels in Pallas' interpreter, inside a shard_map over the
  # rows): on 8 devices the same log-probs and steps as the XLA attention on one device.
  cfg16 = cfg.replace(head_dim=16)
  p16 = jax.device_get(jax.jit(lambda r: init_params(DecoderLM(cfg16), r))(jax.random.PRNGKey(1)))
  results = {}
  for impl, m in (("xla", one), ("pallas", mesh)):
    model = DecoderLM(cfg16.replace(attention=impl))
    params = p16
    results[impl] = run(m)
  (lx, sx, mx), (lp, sp, mp) = results["xla"], results["pallas"]
  # log-probs predicted from a real position (the first real token's comes from a padding
  # query, which the dense XLA softmax spreads uniformly and the kernels zero)
  live = batch["attention_mask"].astype(bool)
  live[:, 1:] &= live[:, :-1]
  live[:, 0] = False
  np.testing.assert_allclose(lp[live], lx[live], atol=1e-5)
  for a, b_ in zip(mx, mp):
    np.testing.assert_allclose(b_["loss"], a["loss"], rtol=1e-5, atol=1e-6)
  gap = max(float(np.abs(x - y).max()) for x, y in
            zip(jax.tree_util.tree_leaves(jax.device_get(sx.params)),
                jax.tree_util.tree_leaves(jax.device_get(sp.params))))
  assert gap <= 1e-5, gap
  print(f"OK max |params_8dev - params_1dev| = {worst:.2e} after 3 steps (moved {moved:.2e})")


def _multiprocess_worker(pid: int, port: int):
  """One of two processes (2 CPU devices each): the step on the 4-device global mesh, fed with
  process-local rows through shard_batch, equals the step on one local device."""
  import jax
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  import numpy as np
  from jax.experimental import multihost_utils

  from rlrag_jax import rl
  from rlrag_jax.models import sharding as shd
  from rlrag_jax.models.config import ModelConfig
  from rlrag_jax.models.decoder import DecoderLM, init_params

  assert shd.maybe_initialize_distributed(f"127.0.0.1:{port}", 2, pid) is True
  assert jax.process_count() == 2 and jax.device_count() == 4
  cfg = ModelConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8)
  model = DecoderLM(cfg)
  params = jax.device_get(jax.jit(lambda r: init_params(model, r))(jax.random.PRNGKey(0)))
  rng = np.random.default_rng(0)
  b, t = 8, 10
  host = {"input_ids": rng.integers(0, cfg.vocab_size, size=(b, t)).astype(np.int32),
          "attention_mask": np.ones((b, t), np.int32),
          "loss_mask": (rng.random((b, t)) < 0.7).astype(np.float32),
          "advantages": rng.normal(size=b).astype(np.float32)}
  opt = rl.make_optimizer(rl.OptimizerConfig(lr=1e-3, total_steps=10))

  def run(mesh, batch):
    state = rl.create_train_state(model, opt, mesh, params=params)
    batch = dict(batch, old_logp=rl.make_logprob_fn(model, mesh)(state.params, batch))
    state, m = rl.make_policy_step(model, opt, mesh, rl.LossConfig())(state, batch)
    return state, {k: float(v) for k, v in m.items()}

  mesh = shd.make_mesh(data=1, fsdp=2, tensor=2)
  half = b // 2
  local_rows = {k: v[pid * half:(pid + 1) * half] for k, v in host.items()}
  g_state, g_metrics = run(mesh, shd.shard_batch(local_rows, mesh))
  gathered = multihost_utils.process_allgather(g_state.params, tiled=True)
  if pid == 0:                       # the single-device reference, once
    l_state, l_metrics = run(shd.make_mesh(devices=jax.local_devices()[:1]), host)
    for k in l_metrics:
      np.testing.assert_allclose(g_metrics[k], l_metrics[k], rtol=1e-5, atol=1e-6, err_msg=k)
    for x, y in zip(jax.tree_util.tree_leaves(gathered),
                    jax.tree_util.tree_leaves(l_state.params)):
      np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-5)
  print(f"OK process {pid}")


def _free_port() -> int:
  import socket
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_equal_single_device():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
             JAX_PLATFORMS="cpu")
  port = str(_free_port())
  procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "mp", str(i), port],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i in range(2)]
  outs = []
  for p in procs:
    try:
      outs.append(p.communicate(timeout=900))
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      raise
  for i, (p, (out, err)) in enumerate(zip(procs, outs)):
    assert p.returncode == 0, f"process {i}: " + out[-2000:] + err[-6000:]
    assert f"OK process {i}" in out


@pytest.mark.slow
def test_sharded_step_equals_single_device():
  env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={N_DEV}",
             JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, os.path.abspath(__file__), "worker"], env=env,
                        capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
  assert "OK" in proc.stdout


if __name__ == "__main__":
  if sys.argv[1:] == ["worker"]:
    _worker()
  elif sys.argv[1:2] == ["mp"]:
    _multiprocess_worker(int(sys.argv[2]), int(sys.argv[3]))
