"""experiments.grad_noise: the signal / noise estimates by hand and on known Gaussians, and the
measured gradients against a policy gradient and a cross-entropy gradient written out here."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlrag_jax import trainer
from rlrag_jax.experiments import grad_noise
from rlrag_jax.models import DecoderLM
from rlrag_jax.rollout.policy import checkpoint_policy
from stub_task import StubTask, batch_of
from test_train import tiny_config


def test_noise_stats_by_hand():
  m = grad_noise.NoiseMeter()
  m.add({"w": np.array([1.0, 0.0])})
  m.add({"w": np.array([1.0, 2.0])})
  s = m.stats()
  # ||g1 + g2||^2 = 8, ||g1||^2 + ||g2||^2 = 6: signal = (8 - 6) / 2 = g1 . g2 = 1;
  # mean ||g||^2 = 3, noise = 3 - 1 = 2.
  assert s["k"] == 2
  assert s["signal"] == pytest.approx(1.0)
  assert s["noise"] == pytest.approx(2.0)
  assert s["snr"] == pytest.approx(0.5)
  assert s["batches_for_snr_1"] == pytest.approx(2.0)
  assert s["cosine"] == pytest.approx(1 / 3)


def test_too_few_batches_is_an_error():
  m = grad_noise.NoiseMeter()
  m.add({"w": np.ones(3)})
  with pytest.raises(ValueError, match="at least 2"):
    m.stats()


def test_meter_recovers_a_known_signal_and_noise():
  """g_k = mu + N(0, s^2 I) over a pytree of two leaves: signal ||mu||^2 = 4, noise d s^2 = 20."""
  rng = np.random.default_rng(0)
  d1, d2, s, k = 1500, 500, 0.1, 400
  mu = rng.normal(size=d1 + d2)
  mu *= 2.0 / np.linalg.norm(mu)
  m = grad_noise.NoiseMeter()
  for _ in range(k):
    g = mu + s * rng.normal(size=d1 + d2)
    m.add({"a": g[:d1].reshape(30, 50), "b": {"c": g[d1:]}})
  st = m.stats()
  assert st["signal"] == pytest.approx(4.0, abs=0.1)      # its std here is about 0.02
  assert st["noise"] == pytest.approx(20.0, rel=0.01)     # about 0.2%
  assert st["snr"] == pytest.approx(0.2, rel=0.03)
  assert st["cosine"] == pytest.approx(4.0 / 24.0, rel=0.03)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  work = tmp_path_factory.mktemp("gn") / "run"
  config = tiny_config(work)
  config.rl.steps, config.export_hf = 0, False
  trainer.run(config, progress=False)
  task, lm = trainer.task_for_checkpoint(tiny_config(work), work)
  return task, lm, work


def _sequence_logp(module, params, prompt, completion, temperature):
  """Per-token log-probs of `completion` after `prompt`, one unpadded sequence, by hand."""
  ids = jnp.asarray([list(prompt) + list(completion)], jnp.int32)
  logits, _ = module.apply({"params": params}, ids, jnp.ones_like(ids))
  logp = jax.nn.log_softmax(logits[0, :-1].astype(jnp.float32) / temperature, axis=-1)
  tok = jnp.take_along_axis(logp, ids[0, 1:, None], axis=-1)[:, 0]
  return tok[len(prompt) - 1:]                               # the completion's tokens


def _flat(tree):
  return np.concatenate([np.ravel(np.asarray(x, np.float64))
                         for x in jax.tree_util.tree_leaves(tree)])


def test_rl_gradient_is_the_group_relative_policy_gradient(tiny_run):
  """On-policy (ratio 1, nothing clipped) the measured gradient is that of
  -(1/B) sum_i A_i mean_t log p(y_it), A the group-normalised rewards (ddof 1, eps 1e-4)."""
  task, lm, work = tiny_run
  config = tiny_config(work)
  config.rl.group_size = 4
  probe = grad_noise.Probe(config, lm, task.tokenizer.pad_token_id or 0, with_sft=False)
  policy = checkpoint_policy(lm, task.tokenizer, config.rl.max_new_tokens)
  episodes = task.rollout(policy, list(task.train)[:2], jax.random.PRNGKey(3), group_size=4)
  # Rewards that differ within each group (the tiny model's own rewards may all be equal).
  totals = [1.0, 0.0, 0.5, 2.0, 0.0, 0.0, 1.0, 3.0]
  scores = [{"total": t} for t in totals]
  got = _flat(probe.rl_gradient(batch_of(episodes, scores, 4), jax.random.PRNGKey(0)))

  r = np.array(totals).reshape(2, 4)
  adv = ((r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + 1e-4)).ravel()
  module = DecoderLM(lm.config)
  temperature = float(config.rl.temperature)

  def loss(params):
    total = 0.0
    for a, ep in zip(adv, episodes):
      tok = _sequence_logp(module, params, ep.prompt_ids, ep.completion_ids, temperature)
      m = jnp.asarray(ep.loss_mask, jnp.float32)
      total = total - a * jnp.sum(tok * m) / jnp.sum(m)
    return total / len(episodes)

  want = _flat(jax.jit(jax.grad(loss))(lm.params))   # one compile, not one per op
  assert np.linalg.norm(want) > 1e-3
  np.testing.assert_allclose(got, want, atol=2e-5 * np.abs(want).max())


def test_sft_gradient_is_the_token_mean_cross_entropy_gradient(tiny_run):
  task, lm, work = tiny_run
  config = tiny_config(work)
  probe = grad_noise.Probe(config, lm, task.tokenizer.pad_token_id or 0)
  exs = list(task.train)[:3]
  prompts = [task.prompt_ids(ex) for ex in exs]
  targets = [task.sft_target_ids(ex) for ex in exs]
  got = _flat(probe.sft_gradient(prompts, targets))
  module = DecoderLM(lm.config)

  def loss(params):
    nll = [-_sequence_logp(module, params, p, t, 1.0) for p, t in zip(prompts, targets)]
    return jnp.sum(jnp.concatenate(nll)) / sum(len(t) for t in targets)

  want = _flat(jax.jit(jax.grad(loss))(lm.params))   # one compile, not one per op
  np.testing.assert_allclose(got, want, atol=2e-5 * np.abs(want).max())


def test_measure_end_to_end(tiny_run):
  task, lm, work = tiny_run
  config = tiny_config(work)
  out = grad_noise.measure(task, lm, config, list(task.train), batches=3,
                           rng=jax.random.PRNGKey(0), progress=False)
  assert out["rl"]["k"] == 3 and out["sft"]["k"] == 3
  for name in ("rl", "sft"):      # the tiny model's groups may all tie: an RL gradient of 0
    s = out[name]
    assert np.isfinite(s["mean_norm_sq"]) and s["mean_norm_sq"] >= 0
    assert s["signal"] + s["noise"] == pytest.approx(s["mean_norm_sq"])
  assert out["sft"]["mean_norm_sq"] > 0
  assert out["batch"] == {"prompts": config.rl.prompts_per_step,
                          "group_size": config.rl.group_size,
                          "episodes": config.rl.prompts_per_step * config.rl.group_size}
  table = grad_noise.format_table(out)
  assert "rl " in table and "sft " in table
  with pytest.raises(ValueError, match="questions for 3 batches"):
    grad_noise.measure(task, lm, config, list(task.train)[:3], batches=3,
                       rng=jax.random.PRNGKey(0), progress=False)


def test_ppo_measures_the_policy_gradient_with_a_fresh_critic(tiny_run):
  """rl.algo 'ppo' (a separate critic, GAE): the measured gradient is the policy's (the
  critic's own update is not in it), and it changes when the advantages do."""
  task, lm, work = tiny_run
  config = tiny_config(work)
  config.rl.algo, config.rl.group_size = "ppo", 4
  probe = grad_noise.Probe(config, lm, task.tokenizer.pad_token_id or 0, with_sft=False)
  policy = checkpoint_policy(lm, task.tokenizer, config.rl.max_new_tokens)
  episodes = task.rollout(policy, list(task.train)[:2], jax.random.PRNGKey(3), group_size=4)
  a = probe.rl_gradient(batch_of(episodes, [{"total": t} for t in (1.0, 0, 0, 2, 0, 0, 1, 3)],
                                 4), jax.random.PRNGKey(0))
  b = probe.rl_gradient(batch_of(episodes, [{"total": t} for t in (0, 1.0, 0, 0, 3, 0, 0, 0)],
                                 4), jax.random.PRNGKey(0))
  assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(lm.params)
  fa, fb = _flat(a), _flat(b)
  assert np.all(np.isfinite(fa)) and np.linalg.norm(fa) > 0
  assert np.linalg.norm(fa - fb) > 1e-3 * np.linalg.norm(fa)


def test_command_helpers(tmp_path, capsys):
  """The helpers the checkpoint commands share: a path without a checkpoint prints why and
  gives None; a report is written as table + JSON."""
  from rlrag_jax.experiments import load_checkpoint, write_report
  assert load_checkpoint("grad_noise", tiny_config(tmp_path / "w"), str(tmp_path)) is None
  assert capsys.readouterr().err.startswith("grad_noise: ")
  write_report(str(tmp_path / "out"), "x", "a table", {"k": 1})
  assert (tmp_path / "out" / "x.txt").read_text() == "a table\n"
  assert (tmp_path / "out" / "x.json").read_text().replace(" ", "").replace("\n", "") == '{"k":1}'


def test_batch_group_takes_the_majority_value():
  scores = [{"total": 0.0, "iteration": v} for v in (1, 1, 2, 2, 2, 0)]
  assert grad_noise.batch_group(scores, "iteration") == 2.0
  assert grad_noise.batch_group(scores[:4], "iteration") == 1.0     # a tie: the smaller
  with pytest.raises(KeyError, match="group_by='level'.*iteration"):
    grad_noise.batch_group(scores, "level")


class _Levels(StubTask):
  """The tiny task with a `level` score field that alternates 0, 1, 0, … batch by batch."""

  def __init__(self, task, per_batch):
    self.task, self.per_batch, self.calls = task, per_batch, 0
    self.tokenizer, self.train = task.tokenizer, task.train

  def prompt_ids(self, ex):
    return self.task.prompt_ids(ex)

  def sft_target_ids(self, ex):
    return self.task.sft_target_ids(ex)

  def rollout(self, *a, **k):
    return self.task.rollout(*a, **k)

  def rewards(self, episodes, step=0):
    out = []
    for r in self.task.rewards(episodes, step):
      out.append(dict(r, level=float(self.calls // self.per_batch % 2)))
      self.calls += 1
    return out


def test_measure_groups_batches_and_keeps_the_mean_gradient(tiny_run):
  """Batches go to their group whole: the groups' mean ||g||^2 average back to the overall
  one, and the kept mean gradient has ||mean||^2 = (signal (K - 1) + E||g||^2) / K."""
  task, lm, work = tiny_run
  config = tiny_config(work)
  config.rl.group_size = 4
  per_batch = config.rl.prompts_per_step * config.rl.group_size
  out = grad_noise.measure(_Levels(task, per_batch), lm, config, list(task.train), batches=4,
                           rng=jax.random.PRNGKey(0), progress=False, group_by="level",
                           keep_mean=True)
  by = out["rl_by"]
  assert sorted(by) == [0.0, 1.0] and by[0.0]["k"] == by[1.0]["k"] == 2
  rl = out["rl"]
  assert (by[0.0]["mean_norm_sq"] + by[1.0]["mean_norm_sq"]) / 2 == pytest.approx(
      rl["mean_norm_sq"], rel=1e-5)
  mean = _flat(out["mean_rl_gradient"])
  assert mean @ mean == pytest.approx((rl["signal"] * 3 + rl["mean_norm_sq"]) / 4, rel=1e-4)
  assert "RL batches by level" in grad_noise.format_table(out)


class _NormTask(StubTask):
  """Each episode's reward is the norm of the parameters it was sampled with; the keys it was
  sampled with are recorded."""

  def __init__(self, tokenizer):
    self.tokenizer, self.keys = tokenizer, []

  def rollout(self, policy, batch, key, group_size=1):
    self.keys.append(np.asarray(jax.random.key_data(key)) if jnp.issubdtype(
        key.dtype, jax.dtypes.prng_key) else np.asarray(key))
    norm = float(np.linalg.norm(_flat(policy.params)))
    return [norm] * (len(batch) * group_size)

  def rewards(self, episodes, step=0):
    return [{"total": e} for e in episodes]


def test_line_search_steps_against_the_direction_with_common_keys(tiny_run):
  """Along direction = params, params - alpha * params has norm |1 - alpha| ||params||, and
  every alpha draws its batches with the same keys."""
  task, lm, work = tiny_run
  config = tiny_config(work)
  fake = _NormTask(task.tokenizer)
  rows = grad_noise.line_search(fake, lm, config, lm.params, [0.0, 0.5, 2.0],
                                [["q1", "q2"], ["q3", "q4"], ["q5", "q6"]],
                                jax.random.PRNGKey(5))
  norm = float(np.linalg.norm(_flat(lm.params)))
  assert [r["alpha"] for r in rows] == [0.0, 0.5, 2.0]
  assert [r["reward"] for r in rows] == pytest.approx([norm, 0.5 * norm, norm], rel=1e-5)
  assert all(r["reward_se"] == pytest.approx(0.0, abs=1e-6) for r in rows)
  assert len(fake.keys) == 9
  for b in range(3):                        # batch b: one key, the same at every alpha
    assert np.array_equal(fake.keys[b], fake.keys[3 + b])
    assert np.array_equal(fake.keys[b], fake.keys[6 + b])
  assert not np.array_equal(fake.keys[0], fake.keys[1])
  table = grad_noise.format_table({"batch": {"prompts": 2, "group_size": 2, "episodes": 4.0},
                                   "reward": 0.1, "reward_std": 0.0, "rl": None,
                                   "line_search": rows})
  assert "alpha 0.5" in table


def test_hold_aside_takes_the_last_batches():
  rest, held = grad_noise.hold_aside(list(range(10)), 2, 3)
  assert rest == [0, 1, 2, 3] and held == [[4, 5], [6, 7], [8, 9]]
  with pytest.raises(ValueError, match="10 questions cannot hold 4 line-search batches of 2"):
    grad_noise.hold_aside(list(range(10)), 2, 4)
