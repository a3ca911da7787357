"""The jitted update steps on one device: loss and gradient against a direct computation,
micro-batch accumulation, the non-finite skip, mu iterations, the optimizer, SFT and critic."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlrag_jax import rl
from rlrag_jax.models import sharding as shd
from rlrag_jax.models.config import ModelConfig
from rlrag_jax.models.decoder import DecoderLM, ValueLM, init_params

CFG = ModelConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=4,
                  num_kv_heads=2, head_dim=8)
B, T = 4, 10


@pytest.fixture(scope="module")
def setup():
  model = DecoderLM(CFG)
  params = jax.jit(lambda r: init_params(model, r))(jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  ids = rng.integers(0, CFG.vocab_size, size=(B, T)).astype(np.int32)
  attn = np.ones((B, T), np.int32)
  attn[0, :3] = 0                                    # left padding
  loss_mask = np.zeros((B, T), np.float32)
  loss_mask[0, 5:] = 1                               # 5 tokens
  loss_mask[1, 4:6] = 1                              # 2 tokens, then "retrieved" text, then 2
  loss_mask[1, 8:] = 1
  loss_mask[2, 9:] = 1                               # 1 token
  # row 3: no loss tokens (a padding row)
  batch = {"input_ids": ids, "attention_mask": attn, "loss_mask": loss_mask,
           "advantages": np.array([1.0, -0.5, 2.0, 3.0], np.float32)}
  logp = np.asarray(jax.jit(rl.completion_logprobs, static_argnums=0)(model.apply, params, ids,
                                                                      attn))
  batch["old_logp"] = (logp + rng.normal(size=(B, T)).astype(np.float32) * 0.3).astype(np.float32)
  batch["ref_logp"] = (logp + rng.normal(size=(B, T)).astype(np.float32) * 0.2).astype(np.float32)
  return model, params, batch, shd.make_mesh()


def _copy(tree):
  return jax.tree_util.tree_map(lambda x: np.array(x), jax.device_get(tree))


CASES = [
    pytest.param(rl.LossConfig.preset("grpo", dual_clip=2.0), id="grpo"),
    pytest.param(rl.LossConfig.preset("dapo"), id="dapo", marks=pytest.mark.slow),
    pytest.param(rl.LossConfig.preset("dr_grpo", max_completion_len=7), id="dr_grpo",
                 marks=pytest.mark.slow),
]


@pytest.mark.parametrize("cfg", CASES)
def test_policy_step_equals_direct_gradient(setup, cfg):
  """With SGD(lr=1) the step's update is minus the gradient; compare it (and the loss) with
  jax.grad of rl.policy_loss on the whole batch, while the step uses 2 micro-batches."""
  model, params, batch, mesh = setup
  opt = optax.sgd(1.0)

  def direct(p):
    logp = rl.completion_logprobs(model.apply, p, batch["input_ids"], batch["attention_mask"])
    loss, _ = rl.policy_loss(logp, batch["old_logp"], batch["advantages"], batch["loss_mask"],
                             eps_low=cfg.eps_low, eps_high=cfg.eps_high,
                             dual_clip=cfg.dual_clip, aggregation=cfg.aggregation,
                             max_len=cfg.max_completion_len, ref_logp=batch["ref_logp"],
                             beta=cfg.beta, kl_estimator=cfg.kl_estimator)
    return loss

  want_loss, grads = jax.jit(jax.value_and_grad(direct))(params)
  state = rl.create_train_state(model, opt, mesh, params=params)
  step = rl.make_policy_step(model, opt, mesh, cfg, micro_batches=2)
  state, metrics = step(state, batch)
  assert float(metrics["loss"]) == pytest.approx(float(want_loss), abs=1e-6)
  assert float(metrics["skipped"]) == 0.0 and int(state.step) == 1
  want = jax.tree_util.tree_map(lambda p, g: p - g, params, grads)
  for a, b in zip(jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
  assert float(metrics["grad_norm"]) == pytest.approx(float(optax.global_norm(grads)), rel=1e-5)
  m = batch["loss_mask"]
  logp = jax.jit(rl.completion_logprobs, static_argnums=0)(
      model.apply, params, batch["input_ids"], batch["attention_mask"])
  k = np.asarray(rl.kl(logp, batch["ref_logp"], cfg.kl_estimator))
  assert float(metrics["kl"]) == pytest.approx(float((k * m).sum() / m.sum()), rel=1e-5)
  assert float(metrics["tokens"]) == m.sum()


@pytest.fixture(scope="module")
def adamw_step(setup):
  model, _, _, mesh = setup
  opt = rl.make_optimizer(rl.OptimizerConfig(lr=1e-2, total_steps=10))
  return opt, rl.make_policy_step(model, opt, mesh, rl.LossConfig(aggregation="token_mean"))


def test_nonfinite_skip(setup, adamw_step):
  model, params, batch, mesh = setup
  opt, step = adamw_step
  state = rl.create_train_state(model, opt, mesh, params=params)
  before = _copy(state)
  bad = dict(batch, advantages=np.array([1.0, np.nan, 2.0, 3.0], np.float32))
  state, metrics = step(state, bad)
  assert float(metrics["skipped"]) == 1.0 and not np.isfinite(float(metrics["loss"]))
  assert int(state.step) == 1                      # calls are counted ...
  after = _copy(state)
  for a, b in zip(jax.tree_util.tree_leaves(after.params),
                  jax.tree_util.tree_leaves(before.params)):
    np.testing.assert_array_equal(a, b)            # ... but nothing else moved
  for a, b in zip(jax.tree_util.tree_leaves(after.opt_state),
                  jax.tree_util.tree_leaves(before.opt_state)):
    np.testing.assert_array_equal(a, b)
  state, metrics = step(state, batch)
  assert float(metrics["skipped"]) == 0.0 and int(state.step) == 2
  assert int(rl.optim_state.optimizer_count(state.opt_state)) == 1
  moved = [np.abs(np.asarray(a) - b).max() for a, b in
           zip(jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(before.params))]
  assert max(moved) > 0


def test_mu_iterations_and_on_policy_default(setup, adamw_step):
  model, params, batch, mesh = setup
  opt, step = adamw_step
  logp_fn = rl.make_logprob_fn(model, mesh, micro_batches=2)
  on_policy = {k: v for k, v in batch.items() if k != "old_logp"}
  old = np.asarray(logp_fn(params, on_policy))
  want = np.asarray(jax.jit(rl.completion_logprobs, static_argnums=0)(
      model.apply, params, batch["input_ids"], batch["attention_mask"]))
  np.testing.assert_allclose(old, want, atol=1e-5)

  s1 = rl.create_train_state(model, opt, mesh, params=params)
  s1, m1 = step(s1, dict(on_policy, old_logp=old))
  assert float(m1["clip_frac"]) == 0.0 and abs(float(m1["approx_kl_old"])) < 1e-6
  s1, m2 = step(s1, dict(on_policy, old_logp=old))          # second inner iteration
  assert float(m2["approx_kl_old"]) > 1e-6 and float(m2["loss"]) != float(m1["loss"])

  s2 = rl.create_train_state(model, opt, mesh, params=params)
  s2, m3 = step(s2, on_policy)                               # no old_logp: ratio 1
  assert float(m3["loss"]) == pytest.approx(float(m1["loss"]), abs=1e-6)


def _np_adamw(params, grads_seq, cfg, lrs):
  """Reference AdamW with global-norm clipping and decay on matrices only."""
  p = {k: v.astype(np.float64) for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in p.items()}
  v = {k: np.zeros_like(x) for k, x in p.items()}
  for t, (g, lr) in enumerate(zip(grads_seq, lrs), start=1):
    norm = np.sqrt(sum(np.sum(np.square(x)) for x in g.values()))
    scale = min(1.0, cfg.max_grad_norm / norm)
    for k in p:
      gk = g[k] * scale
      m[k] = cfg.b1 * m[k] + (1 - cfg.b1) * gk
      v[k] = cfg.b2 * v[k] + (1 - cfg.b2) * gk * gk
      mh, vh = m[k] / (1 - cfg.b1 ** t), v[k] / (1 - cfg.b2 ** t)
      upd = mh / (np.sqrt(vh) + cfg.eps)
      if p[k].ndim >= 2:
        upd = upd + cfg.weight_decay * p[k]
      p[k] = p[k] - lr * upd
  return p


def test_optimizer_against_numpy():
  cfg = rl.OptimizerConfig(lr=0.1, warmup_steps=2, total_steps=6, weight_decay=0.3,
                           max_grad_norm=0.5, b1=0.8, b2=0.9, eps=1e-6, min_lr_ratio=0.1)
  sched = rl.make_schedule(cfg)
  # warmup 0 -> lr over 2 steps, then cosine from lr to 0.1 lr over the remaining 4.
  lrs = [0.0, 0.05] + [0.01 + 0.09 * 0.5 * (1 + np.cos(np.pi * k / 4)) for k in range(4)]
  np.testing.assert_allclose([float(sched(i)) for i in range(6)], lrs, rtol=1e-6, atol=1e-9)
  assert rl.OptimizerConfig(warmup_ratio=0.25, total_steps=8).warmup == 2
  rng = np.random.default_rng(0)
  params = {"w": rng.normal(size=(3, 2)).astype(np.float32),
            "b": rng.normal(size=3).astype(np.float32)}
  grads = [{k: rng.normal(size=x.shape).astype(np.float32) for k, x in params.items()}
           for _ in range(6)]
  opt = rl.make_optimizer(cfg)
  state, p = opt.init(params), params
  for g in grads:
    upd, state = opt.update(g, state, p)
    p = optax.apply_updates(p, upd)
  want = _np_adamw(params, grads, cfg, lrs)
  for k in params:
    np.testing.assert_allclose(np.asarray(p[k]), want[k], rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="unknown keys"):
    rl.OptimizerConfig.from_config({"lr": 1.0, "learning_rate": 2.0})
  assert rl.OptimizerConfig.from_config({"lr": 2.0}).lr == 2.0


@pytest.mark.slow
def test_sft_step(setup):
  model, params, batch, mesh = setup
  sft = {k: batch[k] for k in ("input_ids", "attention_mask", "loss_mask")}
  step = rl.make_sft_step(model, optax.sgd(1.0), mesh, micro_batches=2)
  state = rl.create_train_state(model, optax.sgd(1.0), mesh, params=params)

  def direct(p):
    logits, _ = model.apply({"params": p}, sft["input_ids"], sft["attention_mask"])
    ls = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    tgt = jnp.take_along_axis(ls, sft["input_ids"][:, 1:, None], axis=-1)[..., 0]
    m = sft["loss_mask"][:, 1:]
    return -jnp.sum(tgt * m) / jnp.sum(m)

  want_loss, grads = jax.jit(jax.value_and_grad(direct))(params)
  state, metrics = step(state, sft)
  assert float(metrics["loss"]) == pytest.approx(float(want_loss), rel=1e-6)
  want = jax.tree_util.tree_map(lambda p, g: p - g, params, grads)
  for a, b in zip(jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
  assert 0.0 <= float(metrics["accuracy"]) <= 1.0


def test_logits_window_equals_full_logits(setup):
  """`logits_start` (the prompt's logits skipped) changes nothing the losses read: the same
  log-probs at every position after the start (0 before), the same policy and SFT updates."""
  from rlrag_jax.rl.packing import logits_start
  model, params, batch, mesh = setup
  start = logits_start(batch["loss_mask"], 1, align=1)
  assert start == 3                              # row 1's first loss token sits in column 4
  logp_fn = rl.make_logprob_fn(model, mesh, micro_batches=2)
  full, win = np.asarray(logp_fn(params, batch)), np.asarray(logp_fn(params, batch, start))
  np.testing.assert_allclose(win[:, start + 1:], full[:, start + 1:], atol=1e-6)
  assert np.all(win[:, :start + 1] == 0)

  opt = optax.sgd(1.0)
  for make, data in ((lambda: rl.make_policy_step(model, opt, mesh, rl.LossConfig.preset("grpo"),
                                                  micro_batches=2), batch),
                     (lambda: rl.make_sft_step(model, opt, mesh, micro_batches=2),
                      {k: batch[k] for k in ("input_ids", "attention_mask", "loss_mask")})):
    step = make()
    out = []
    for s in (0, start):
      state = rl.create_train_state(model, opt, mesh, params=params)
      out.append(step(state, data, s))
    (s0, m0), (s1, m1) = out
    assert set(m0) == set(m1)
    for k in m0:
      assert float(m1[k]) == pytest.approx(float(m0[k]), rel=1e-5, abs=1e-7), k
    for a, b in zip(jax.tree_util.tree_leaves(s0.params), jax.tree_util.tree_leaves(s1.params)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
    with pytest.raises(ValueError, match="logits_start=9"):
      step(rl.create_train_state(model, opt, mesh, params=params), data, T - 1)


@pytest.mark.slow
def test_value_step(setup):
  _, _, batch, mesh = setup
  critic = ValueLM(CFG)
  vparams = jax.jit(lambda r: init_params(critic, r))(jax.random.PRNGKey(1))
  raw, _ = jax.jit(critic.apply)({"params": vparams}, batch["input_ids"], batch["attention_mask"])
  raw = np.asarray(raw)
  values = np.asarray(rl.make_value_fn(critic, mesh)(vparams, batch))
  np.testing.assert_allclose(values[:, 1:], raw[:, :-1], atol=1e-6)
  assert np.all(values[:, 0] == 0)
  rng = np.random.default_rng(2)
  vb = {k: batch[k] for k in ("input_ids", "attention_mask", "loss_mask")}
  vb["returns"] = rng.normal(size=(B, T)).astype(np.float32)
  vb["old_values"] = (values + rng.normal(size=(B, T)) * 0.3).astype(np.float32)
  opt = rl.make_optimizer(rl.OptimizerConfig(lr=1e-3, total_steps=10))
  step = rl.make_value_step(critic, opt, mesh, clip_eps=0.2, micro_batches=2)
  state = rl.create_train_state(critic, opt, mesh, params=vparams)
  state, metrics = step(state, vb)
  # numpy clipped value loss, token mean over the policy tokens.
  m = vb["loss_mask"]
  v_clip = vb["old_values"] + np.clip(values - vb["old_values"], -0.2, 0.2)
  err, err_c = (values - vb["returns"]) ** 2, (v_clip - vb["returns"]) ** 2
  want = (0.5 * np.maximum(err, err_c) * m).sum() / m.sum()
  assert float(metrics["loss"]) == pytest.approx(want, rel=1e-5)
  assert float(metrics["vf_clip_frac"]) == pytest.approx(((err_c > err) * m).sum() / m.sum())
  with pytest.raises(ValueError, match="old_values"):
    step(state, {k: v for k, v in vb.items() if k != "old_values"})


def test_batch_errors(setup):
  model, params, batch, mesh = setup
  opt = optax.sgd(1.0)
  state = rl.create_train_state(model, opt, mesh, params=params)
  step = rl.make_policy_step(model, opt, mesh, rl.LossConfig(beta=0.1))
  with pytest.raises(ValueError, match="ref_logp"):
    step(state, {k: v for k, v in batch.items() if k != "ref_logp"})
  step3 = rl.make_policy_step(model, opt, mesh, rl.LossConfig(), micro_batches=3)
  with pytest.raises(ValueError, match="micro_batches=3"):
    step3(state, batch)
  with pytest.raises(ValueError, match="loss.aggregation"):
    rl.LossConfig(aggregation="mean")
  with pytest.raises(ValueError, match="unknown keys"):
    rl.LossConfig.from_config({"eps": 0.2})


@pytest.mark.parametrize("warmup", [0, 2])
def test_linear_and_constant_schedules_by_hand(warmup):
  lin = rl.make_schedule(rl.OptimizerConfig(lr=0.1, warmup_steps=warmup, total_steps=6,
                                            schedule="linear", min_lr_ratio=0.1))
  con = rl.make_schedule(rl.OptimizerConfig(lr=0.1, warmup_steps=warmup, total_steps=6,
                                            schedule="constant"))
  ramp = [0.0, 0.05][:warmup]
  n = 6 - warmup   # linear: lr -> 0.1 lr over the steps after the warmup
  np.testing.assert_allclose([float(lin(i)) for i in range(6)],
                             ramp + [0.1 - 0.09 * k / n for k in range(n)], rtol=1e-6, atol=1e-9)
  np.testing.assert_allclose([float(con(i)) for i in range(6)], ramp + [0.1] * n, rtol=1e-6)
  with pytest.raises(ValueError, match="'linear'"):
    rl.make_schedule(rl.OptimizerConfig(schedule="step"))


def test_entropy_bonus_equals_direct_gradient(setup):
  """loss = policy loss - c * token-mean entropy, the entropy computed here from the model's
  logits with its own log-softmax; the step's update (SGD lr 1, 2 micro-batches) is minus the
  gradient of that, so the bonus's gradient flows through the entropy."""
  model, params, batch, mesh = setup
  c = 0.3
  cfg = rl.LossConfig(aggregation="token_mean", entropy_coef=c)
  opt = optax.sgd(1.0)
  m = jnp.asarray(batch["loss_mask"])

  def direct(p):
    logp = rl.completion_logprobs(model.apply, p, batch["input_ids"], batch["attention_mask"])
    loss, _ = rl.policy_loss(logp, batch["old_logp"], batch["advantages"], batch["loss_mask"],
                             aggregation="token_mean")
    out = model.apply({"params": p}, batch["input_ids"], batch["attention_mask"])
    logits = (out[0] if isinstance(out, tuple) else out)[:, :-1].astype(jnp.float32)
    lsm = jax.nn.log_softmax(logits, axis=-1)
    ent = -jnp.sum(jnp.exp(lsm) * lsm, axis=-1)                     # predicts slots 1..T-1
    ent = jnp.pad(ent, ((0, 0), (1, 0)))
    return loss - c * jnp.sum(ent * m) / jnp.sum(m)

  want_loss, grads = jax.jit(jax.value_and_grad(direct))(params)
  state = rl.create_train_state(model, opt, mesh, params=params)
  step = rl.make_policy_step(model, opt, mesh, cfg, micro_batches=2)
  state, metrics = step(state, batch)
  assert float(metrics["loss"]) == pytest.approx(float(want_loss), abs=1e-5)
  want = jax.tree_util.tree_map(lambda p, g: p - g, params, grads)
  for a, b in zip(jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
  # Without the bonus the entropy is a metric only: the update differs.
  plain = rl.make_policy_step(model, opt, mesh, rl.LossConfig(aggregation="token_mean"),
                              micro_batches=2)
  s0, m0 = plain(rl.create_train_state(model, opt, mesh, params=params), batch)
  assert float(m0["loss"]) - float(metrics["loss"]) == pytest.approx(
      c * float(metrics["entropy"]), rel=1e-4)
  with pytest.raises(ValueError):
    rl.LossConfig(entropy_coef=-0.1)
