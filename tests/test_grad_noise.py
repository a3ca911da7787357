"""experiments.grad_noise: the signal / noise estimates by hand and on known Gaussians, and the
measured gradients against a policy gradient and a cross-entropy gradient written out here."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlrag_jax import trainer
from rlrag_jax.experiments import grad_noise
from rlrag_jax.models import DecoderLM
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
  policy = trainer.checkpoint_policy(lm, task.tokenizer, config.rl.max_new_tokens)
  episodes = task.rollout(policy, list(task.train)[:2], jax.random.PRNGKey(3), group_size=4)
  # Rewards that differ within each group (the tiny model's own rewards may all be equal).
  totals = [1.0, 0.0, 0.5, 2.0, 0.0, 0.0, 1.0, 3.0]
  scores = [{"total": t} for t in totals]
  got = _flat(probe.rl_gradient(episodes, scores, jax.random.PRNGKey(0)))

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

  want = _flat(jax.grad(loss)(lm.params))
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

  want = _flat(jax.grad(loss)(lm.params))
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
  policy = trainer.checkpoint_policy(lm, task.tokenizer, config.rl.max_new_tokens)
  episodes = task.rollout(policy, list(task.train)[:2], jax.random.PRNGKey(3), group_size=4)
  a = probe.rl_gradient(episodes, [{"total": t} for t in (1.0, 0, 0, 2, 0, 0, 1, 3)],
                        jax.random.PRNGKey(0))
  b = probe.rl_gradient(episodes, [{"total": t} for t in (0, 1.0, 0, 0, 3, 0, 0, 0)],
                        jax.random.PRNGKey(0))
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
