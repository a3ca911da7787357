"""rl.algo -> learner: PPO's GAE and value loss by hand through the learner; the outcome
estimators by name; PPO end to end in the trainer with an exact resume of its critic."""
import json

import jax
import numpy as np
import pytest

from configs import arena, sparkle
from rlrag_jax import trainer
from rlrag_jax.models import ModelConfig, init_params, sharding
from rlrag_jax.rl import optim_state
from rlrag_jax.rl.packing import logits_start, pack
from rlrag_jax.tasks import Episode
from stub_task import batch_of
from rlrag_jax.training import learners

CFG = ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                  num_kv_heads=1, head_dim=8, max_position_embeddings=64, model_type="llama",
                  tie_word_embeddings=True, eos_token_id=(1,), pad_token_id=0)


def _config(algo, **ppo):
  c = arena.get_config("")
  c.rl.algo = algo
  c.rl.prompts_per_step, c.rl.group_size = 2, 2
  c.rl.kl_beta = 0.0
  c.rl.pack_bucket = 8
  c.rl.aggregation = "token_mean"
  c.rl.ppo.update(ppo)
  return c


def _episodes():
  # Two prompts x two samples; row 2 has an environment token (mask 0) inside its completion.
  rows = [([5, 6, 7], [10, 11, 12], [1, 1, 1]),
          ([5, 6, 7], [13, 1], [1, 1]),
          ([8, 9], [14, 15, 16, 17], [1, 0, 1, 1]),
          ([8, 9], [18], [1])]
  return [Episode(example=None, prompt_ids=p, completion_ids=c, loss_mask=m, text="")
          for p, c, m in rows]


def _hand_gae(values, mask, score, gamma, lam):
  """Independent loop over one row's policy tokens: the outcome on the last one, V after it 0."""
  idx = [t for t in range(len(mask)) if mask[t]]
  adv = np.zeros(len(mask))
  nxt_v, nxt_a = 0.0, 0.0
  for k in reversed(idx):
    r = score if k == idx[-1] else 0.0
    delta = r + gamma * nxt_v - values[k]
    nxt_a = delta + gamma * lam * nxt_a
    nxt_v = values[k]
    adv[k] = nxt_a
  ret = np.where(np.asarray(mask) > 0, adv + np.asarray(values), 0.0)
  return adv, ret


def test_ppo_update_uses_hand_computed_gae_and_value_loss():
  mesh = sharding.make_mesh(data=1, fsdp=1, tensor=1)
  c = _config("ppo", gamma=0.9, lam=0.8, whiten=False, vf_clip=0.2, mini_batches=1)
  c.rl.mu = 1
  c.rl.steps = 3
  steps = trainer.Steps(c, CFG, mesh, 0, 3)
  learner = learners.make_learner(c, steps, mesh, CFG, pad_id=0)
  assert isinstance(learner, learners.PPOLearner)
  params = init_params(steps.module, jax.random.PRNGKey(0))
  state = steps.new_state(params, "rl")
  critic = learner.init_critic(state.params, jax.random.PRNGKey(3))
  # The critic starts from the policy's backbone.
  for a, b in zip(jax.tree_util.tree_leaves(params["model"]),
                  jax.tree_util.tree_leaves(critic.params["model"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  episodes = _episodes()
  scores = [{"total": s} for s in (1.0, 0.0, 2.0, -1.0)]
  host = pack([e.prompt_ids for e in episodes], [e.completion_ids for e in episodes],
              [e.loss_mask for e in episodes], pad_id=0, bucket=8)
  values = np.asarray(learner.vf.value_fn(critic.params, sharding.shard_batch(host, mesh)))
  mask = host["loss_mask"].astype(float)
  adv = np.zeros_like(mask)
  ret = np.zeros_like(mask)
  for i, s in enumerate(scores):
    adv[i], ret[i] = _hand_gae(values[i], mask[i], s["total"], 0.9, 0.8)

  calls = []
  logp = steps.logp
  steps.logp = lambda *a: calls.append(1) or logp(*a)
  _, _, m = learner.update(state, critic, batch_of(episodes, scores, 2),
                           None, jax.random.PRNGKey(4))
  assert not calls     # one update on the whole batch: no separate old-policy forward
  # Before its update the critic's values are the old values: the clipped loss is plain MSE.
  want_vf = (0.5 * (values - ret) ** 2 * mask).sum() / mask.sum()
  assert m["vf/loss"] == pytest.approx(want_vf, rel=1e-5)
  # On-policy ratio 1: the token-mean policy loss is minus the mean advantage.
  assert m["pg_loss"] == pytest.approx(-(adv * mask).sum() / mask.sum(), rel=1e-5, abs=1e-7)
  ev = 1 - np.var((ret - values)[mask > 0]) / np.var(ret[mask > 0])
  assert m["vf/explained_variance"] == pytest.approx(ev, rel=1e-6)
  assert logits_start(host["loss_mask"], 8) == 0


def test_tree_mc_advantage_is_the_return_minus_the_parent_value():
  """rl.ppo.critic='tree_mc': no value model; every policy token's advantage is its discounted
  return-to-go minus its episode's Episode.baseline, computed here by an explicit formula."""
  mesh = sharding.make_mesh(data=1, fsdp=1, tensor=1)
  c = _config("ppo", critic="tree_mc", gamma=0.9, whiten=False, mini_batches=1)
  c.rl.mu = 1
  c.rl.steps = 3
  steps = trainer.Steps(c, CFG, mesh, 0, 3)
  learner = learners.make_learner(c, steps, mesh, CFG, pad_id=0)
  assert not learner.has_critic
  fresh = lambda: steps.new_state(init_params(steps.module, jax.random.PRNGKey(0)), "rl")
  state = fresh()          # each update donates its state
  assert learner.init_critic(state.params, jax.random.PRNGKey(3)) is None
  episodes = _episodes()
  bases = (0.5, 0.5, 2.0, -1.0)      # the last row's one token ends at its value: A = 0
  for e, b in zip(episodes, bases):
    e.baseline = b
  scores = [{"total": s} for s in (1.0, 0.0, 2.0, -1.0)]
  hand, toks = 0.0, 0
  for e, s, b in zip(episodes, scores, bases):
    idx = [t for t, k in enumerate(e.loss_mask) if k]
    for j, _ in enumerate(reversed(idx)):          # j policy tokens after this one
      hand += 0.9 ** j * s["total"] - b
      toks += 1
  _, critic, m = learner.update(state, None, batch_of(episodes, scores, 2),
                                None, jax.random.PRNGKey(4))
  assert critic is None and not any(k.startswith("vf/") for k in m)
  # On-policy ratio 1: the token-mean policy loss is minus the mean advantage.
  assert m["pg_loss"] == pytest.approx(-hand / toks, rel=1e-5)
  # Zero: row 3's last token (2 - 2) and row 4's only token (-1 - -1); 7 of 9 are not.
  assert m["tree/adv_tokens_frac"] == pytest.approx(7 / 9)
  # Whitened: divided by the advantages' spread, not shifted (the zeros stay zero).
  adv = []
  for e, s_, b in zip(episodes, scores, bases):
    n = sum(e.loss_mask)
    adv += [0.9 ** j * s_["total"] - b for j in range(n)]
  c.rl.ppo.whiten = True
  learner = learners.make_learner(c, steps, mesh, CFG, pad_id=0)
  _, _, m = learner.update(fresh(), None, batch_of(episodes, scores, 2),
                           None, jax.random.PRNGKey(4))
  assert m["pg_loss"] == pytest.approx(-np.mean(adv) / np.std(adv), rel=1e-5)
  episodes[2].baseline = None
  with pytest.raises(ValueError, match=r"tree_mc.*episode 2 has no Episode.baseline"):
    learner.update(fresh(), None, batch_of(episodes, scores, 2), None, jax.random.PRNGKey(4))


def _recording_learner(c, mesh):
  """(steps, PPO learner, seen): the policy step records each mini-batch's rows by their last
  token and checks it was given the sampling policy's log-probs (mu > 1); no critic update."""
  steps = trainer.Steps(c, CFG, mesh, 0, 2)
  learner = learners.make_learner(c, steps, mesh, CFG, pad_id=0)
  seen = []

  def fake_step(state, batch, start):
    assert "old_logp" in batch
    ids, attn = np.asarray(batch["input_ids"]), np.asarray(batch["attention_mask"])
    last = attn.shape[1] - 1 - np.argmax(attn[:, ::-1], axis=1)
    seen.append(ids[np.arange(len(ids)), last].tolist())
    return state, {"loss": 0.0}
  steps.rl_step = fake_step
  learner.vf.value_step = lambda st, batch, start: (st, {"loss": 0.0})
  return steps, learner, seen


def test_ppo_mini_batches_visit_every_episode_once_per_epoch():
  mesh = sharding.make_mesh(data=1, fsdp=1, tensor=1)
  c = _config("ppo", mini_batches=2)
  c.rl.mu = 3
  steps, learner, seen = _recording_learner(c, mesh)
  params = init_params(steps.module, jax.random.PRNGKey(0))
  state = steps.new_state(params, "rl")
  critic = learner.init_critic(state.params, jax.random.PRNGKey(1))
  episodes = _episodes()
  for i, e in enumerate(episodes):          # a distinct last token marks each episode's row
    e.completion_ids = e.completion_ids[:-1] + [40 + i]
  learner.update(state, critic, batch_of(episodes, [{"total": 0.0}] * 4, 2),
                 None, jax.random.PRNGKey(2))
  assert len(seen) == 6 and all(len(s) == 2 for s in seen)      # 3 epochs x 2 mini-batches
  for epoch in range(3):
    assert sorted(seen[2 * epoch] + seen[2 * epoch + 1]) == [40, 41, 42, 43]
  assert learners.updates_per_step(c.rl) == 6
  # A task that pads its own episode count pads to micro-batches times mini-batches.
  c.rl.micro_batches = 3
  assert learners.episode_unit(c.rl) == 6
  c.rl.algo = "grpo"                   # no mini-batches outside PPO
  assert learners.episode_unit(c.rl) == 3


def test_advantages_whitened_per_action_type():
  """rl.ppo.whiten_by='role': each role's policy tokens are whitened over that role's tokens
  only (the SPARKLE authors normalise per action type). With tree values: divided by the
  role's spread, unshifted, against R - b by hand."""
  mesh = sharding.make_mesh(data=1, fsdp=1, tensor=1)
  totals, bases, roles = (1.0, 0.0, 2.0, -1.0), (0.5, 0.5, 0.0, 1.0), ("rd", "rd", "qf", "qf")
  for critic in ("tree_mc", "separate"):
    c = _config("ppo", critic=critic, gamma=1.0, lam=1.0, whiten=True, whiten_by="role")
    steps = trainer.Steps(c, CFG, mesh, 0, 2)
    learner = learners.make_learner(c, steps, mesh, CFG, pad_id=0)
    seen = {}
    steps.rl_step = lambda st, batch, start: (seen.update(
        {k: np.asarray(v) for k, v in batch.items()}) or st, {"loss": 0.0})
    learner.vf.value_step = lambda st, batch, start: (st, {"loss": 0.0})
    state = steps.new_state(init_params(steps.module, jax.random.PRNGKey(0)), "rl")
    crit = learner.init_critic(state.params, jax.random.PRNGKey(1))
    episodes = _episodes()
    for e, b, r in zip(episodes, bases, roles):
      e.baseline, e.info = b, {"role": r}
    learner.update(state, crit, batch_of(episodes, [{"total": t} for t in totals], 2), None,
                   jax.random.PRNGKey(2))
    adv = seen["advantages"]
    mask = seen["loss_mask"] > 0
    mask[:, 0] = False
    for rows in ((0, 1), (2, 3)):
      m = mask.copy()
      m[[i for i in range(4) if i not in rows]] = False
      if critic == "separate":
        assert abs(adv[m].mean()) < 1e-5 and abs(adv[m].std() - 1.0) < 1e-3
      else:
        raw = np.concatenate([np.full(int(m[i].sum()), totals[i] - bases[i]) for i in rows])
        np.testing.assert_allclose(np.concatenate([adv[i][m[i]] for i in rows]),
                                   raw / raw.std(), rtol=1e-5)
  with pytest.raises(ValueError, match="'rl.ppo.whiten_by' = 'role': episode 0"):
    learner.update(state, crit, batch_of(_episodes(), [{"total": 0.0}] * 4, 2),
                   None, jax.random.PRNGKey(2))


def test_algo_names_are_read_not_ignored():
  mesh = sharding.make_mesh(data=1, fsdp=1, tensor=1)
  totals = np.array([1.0, 0.0, 3.0, 1.0], np.float32)
  for algo, want in (("grpo", [0.7070, -0.7070, 0.7071, -0.7071]),   # (r - mean) / (std + 1e-4)
                     ("dr_grpo", [0.5, -0.5, 1.0, -1.0]),
                     ("rloo", [1.0, -1.0, 2.0, -2.0])):
    c = _config(algo)
    steps = trainer.Steps(c, CFG, mesh, 0, 2)
    learner = learners.make_learner(c, steps, mesh, CFG, pad_id=0)
    np.testing.assert_allclose(np.asarray(learner.estimate(totals, [0, 0, 1, 1])), want, atol=1e-4)
  with pytest.raises(ValueError, match="'rl.algo' is 'reinforce'"):
    learners.check_algo(_config("reinforce").rl)
  # The episode count is the task's (tree rollouts vary it): the split is checked per step.
  c = _config("ppo", mini_batches=3)
  steps = trainer.Steps(c, CFG, mesh, 0, 2)
  learner = learners.make_learner(c, steps, mesh, CFG, pad_id=0)
  state = steps.new_state(init_params(steps.module, jax.random.PRNGKey(0)), "rl")
  critic = learner.init_critic(state.params, jax.random.PRNGKey(1))
  with pytest.raises(ValueError, match="rl.ppo.mini_batches' = 3: it must divide the 4"):
    learner.update(state, critic, batch_of(_episodes(), [{"total": 0.0}] * 4, 2), None,
                   jax.random.PRNGKey(2))
  with pytest.raises(ValueError, match="'rl.ppo.critic' is 'shared'"):
    c = _config("ppo", critic="shared")
    learners.make_learner(c, trainer.Steps(c, CFG, mesh, 0, 2), mesh, CFG, pad_id=0)


def test_head_critic_reads_the_policy_backbone_and_trains_only_its_head():
  """critic='head': GAE values come from the head on the sampling policy's backbone (not the
  backbone the critic started from), and the value step changes the head only."""
  mesh = sharding.make_mesh(data=1, fsdp=1, tensor=1)
  c = _config("ppo", critic="head", whiten=False, mini_batches=1, vf_lr=1e-2)
  c.rl.mu, c.rl.steps, c.rl.lr = 1, 3, 1e-2
  steps = trainer.Steps(c, CFG, mesh, 0, 3)
  learner = learners.make_learner(c, steps, mesh, CFG, pad_id=0)
  state = steps.new_state(init_params(steps.module, jax.random.PRNGKey(0)), "rl")
  critic = learner.init_critic(state.params, jax.random.PRNGKey(3))
  episodes = _episodes()
  scores = [{"total": s} for s in (1.0, 0.0, 2.0, -1.0)]
  host = pack([e.prompt_ids for e in episodes], [e.completion_ids for e in episodes],
              [e.loss_mask for e in episodes], pad_id=0, bucket=8)
  batch = sharding.shard_batch(host, mesh)
  leaves = lambda t: [np.array(x) for x in jax.tree_util.tree_leaves(t)]
  policy0, head0 = leaves(state.params), leaves(critic.params["value_head"])   # (updates donate)
  backbone0 = leaves(state.params["model"])
  state1, critic1, m1 = learner.update(state, critic, batch_of(episodes, scores, 2),
                                       None, jax.random.PRNGKey(4))
  # The policy moved; the critic's backbone is the policy's before this update, unchanged by
  # the value step, while its head moved.
  assert any(not np.array_equal(a, b) for a, b in zip(policy0, leaves(state1.params)))
  for a, b in zip(backbone0, leaves(critic1.params["model"])):
    np.testing.assert_array_equal(a, b)
  assert any(not np.array_equal(a, b) for a, b in zip(head0, leaves(critic1.params["value_head"])))
  # Step 2 reads the moved policy: its values are the head's on state1's backbone.
  head_on_new = {"model": state1.params["model"], "value_head": critic1.params["value_head"]}
  head_on_old = {"model": critic1.params["model"], "value_head": critic1.params["value_head"]}
  want = np.asarray(learner.vf.value_fn(head_on_new, batch))
  stale = np.asarray(learner.vf.value_fn(head_on_old, batch))
  mask = host["loss_mask"].astype(float)
  mask[:, 0] = 0
  assert not np.allclose(want, stale)
  ret = np.zeros_like(mask)
  for i, s in enumerate(scores):
    ret[i] = _hand_gae(want[i], mask[i], s["total"], 1.0, 0.95)[1]
  _, _, m2 = learner.update(state1, critic1, batch_of(episodes, scores, 2),
                            None, jax.random.PRNGKey(5))
  ev = 1 - np.var((ret - want)[mask > 0]) / np.var(ret[mask > 0])
  assert m2["vf/explained_variance"] == pytest.approx(ev, rel=1e-4)
  for k in ("vf/loss", "pg_loss"):
    assert np.isfinite(m1[k]) and np.isfinite(m2[k])


@pytest.mark.slow
def test_arena_trains_with_ppo_and_resumes_its_critic_exactly(tmp_path):
  from test_train import tiny_config

  def config(workdir):
    c = tiny_config(workdir)
    c.rl.algo = "ppo"
    c.rl.mu = 2
    c.rl.ppo.mini_batches = 2
    return c

  full = trainer.run(config(tmp_path / "full"), progress=False)
  # Killed after step 5 (SFT 1-3, RL 4-5): the step-4 checkpoint holds the critic.
  assert trainer.run(config(tmp_path / "killed"), progress=False, stop_after=5) is None
  resumed = trainer.run(config(tmp_path / "killed"), progress=False, resume=True)
  for a, b in zip(jax.tree_util.tree_leaves(full.params),
                  jax.tree_util.tree_leaves(resumed.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  rows = lambda d: [{k: v for k, v in json.loads(l).items()
                     if not k.endswith("_s") and not k.startswith("compile/")}
                    for l in (d / "metrics.jsonl").read_text().splitlines()]
  full_rows = rows(tmp_path / "full")
  assert full_rows == rows(tmp_path / "killed")     # the critic's losses too: it resumed exactly
  rl_rows = [r for r in full_rows if r["stage"] == "rl"]
  assert len(rl_rows) == 4
  for r in rl_rows:
    for k in ("vf/loss", "vf/explained_variance", "vf/value_mean", "pg_loss"):
      assert k in r
    assert np.isfinite(r["vf/loss"])


@pytest.mark.slow
def test_arena_trains_with_a_head_critic_through_kill_and_resume(tmp_path):
  """configs/arena.py with rl.ppo.critic='head': the critic (its masked optimizer state too) is
  checkpointed and restored, and every RL step logs finite value metrics."""
  from test_train import tiny_config
  c = tiny_config(tmp_path / "run")
  c.rl.algo, c.rl.ppo.critic = "ppo", "head"
  assert trainer.run(c, progress=False, stop_after=5) is None
  trainer.run(c, progress=False, resume=True)
  rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  rl_rows = [r for r in rows if r["stage"] == "rl"]
  assert [r["step"] for r in rl_rows] == [4, 5, 6, 7]       # steps 6-7 after the resume
  for r in rl_rows:
    assert np.isfinite(r["vf/loss"]) and np.isfinite(r["vf/explained_variance"])


def test_ppo_mini_batch_size_splits_each_epoch_by_episode_count():
  """rl.ppo.mini_batch_size: each epoch shuffles the step's episodes into
  max(1, round(n / size)) mini-batches of sizes within one (np.array_split), and the update
  counts follow n: hand-computed for the SPARKLE paper preset's 1,024 too."""
  mesh = sharding.make_mesh(data=1, fsdp=1, tensor=1)
  c = _config("ppo", mini_batch_size=2)
  c.rl.mu = 2
  steps, learner, seen = _recording_learner(c, mesh)
  state = steps.new_state(init_params(steps.module, jax.random.PRNGKey(0)), "rl")
  critic = learner.init_critic(state.params, jax.random.PRNGKey(1))
  episodes = _episodes() + [Episode(example=None, prompt_ids=[8, 9], completion_ids=[19, 20],
                               loss_mask=[1, 1], text="")]
  for i, e in enumerate(episodes):          # a distinct last token marks each episode's row
    e.completion_ids = e.completion_ids[:-1] + [40 + i]
  state, critic, m = learner.update(state, critic, batch_of(episodes, [{"total": 0.0}] * 5, 2),
                                    None,
                                    jax.random.PRNGKey(2))
  # 5 episodes at 2 a mini-batch: round(2.5) = 2 mini-batches of 3 and 2, for 2 epochs.
  assert [len(s) for s in seen] == [3, 2, 3, 2] and m["updates"] == 4
  for epoch in range(2):
    assert sorted(seen[2 * epoch] + seen[2 * epoch + 1]) == [40, 41, 42, 43, 44]
  assert learners.updates_per_step(c.rl, 5) == 4 and learners.episode_unit(c.rl) == 1
  # The schedules count RL steps (their length is rl.steps), and the step moved the counters.
  assert learners.schedule_by_rl_step(c.rl) and learners.schedule_length(c.rl, 7) == 7
  for s in (state, critic):
    (counter,) = [x for x in jax.tree_util.tree_leaves(
        s.opt_state, is_leaf=lambda x: isinstance(x, optim_state.RLStepState))
        if isinstance(x, optim_state.RLStepState)]
    assert int(counter.rl_step) == 1
  # The paper preset: before, one update per step whatever its size; now one per ~1,024.
  paper = sparkle.get_config("paper").rl
  assert paper.ppo.mini_batch_size == 1024 and paper.lr_schedule == "cosine"
  paper.ppo.mini_batch_size = 0
  assert [learners.updates_per_step(paper) for n in (640, 2500, 3072)] == [1, 1, 1]
  assert learners.schedule_length(paper, 117) == 117
  paper.ppo.mini_batch_size = 1024
  assert [learners.updates_per_step(paper, n) for n in (640, 1536, 2500, 3072)] == [1, 2, 2, 3]
  assert [len(r) for r in np.array_split(np.arange(2500), 2)] == [1250, 1250]
  # rl.micro_batches > 1 cannot split mini-batches of varying sizes equally: a token budget can.
  c.rl.micro_batches = 2
  with pytest.raises(ValueError, match="'rl.ppo.mini_batch_size' = 2 .*rl.tokens_per_micro_b"):
    learners.make_learner(c, steps, mesh, CFG, pad_id=0)
  c.rl.tokens_per_micro_batch = 64
  learners.make_learner(c, steps, mesh, CFG, pad_id=0)


def test_rl_step_schedule_gives_every_update_of_a_step_that_steps_lr():
  """make_optimizer(by_rl_step=True): the lr is schedule(RL steps completed), unchanged by
  updates and moved by advance_rl_step. Constant gradients make each Adam direction 1, so an
  update is -lr; cosine over 4 steps from 1: lr 1, then (1 + cos(pi / 4)) / 2."""
  opt = optim_state.make_optimizer(optim_state.OptimizerConfig(lr=1.0, schedule="cosine", total_steps=4,
                                             max_grad_norm=None), by_rl_step=True)
  params = {"w": np.ones(2, np.float32)}
  grads = {"w": np.full(2, 0.5, np.float32)}
  st = opt.init(params)
  got = []
  for advance in (False, True, False):
    u, st = opt.update(grads, st, params)
    got.append(float(u["w"][0]))
    if advance:
      st = optim_state.advance_rl_step(st)
  u, st = opt.update(grads, st, params)
  got.append(float(u["w"][0]))
  want = [-1.0, -1.0, -(1 + np.cos(np.pi / 4)) / 2, -(1 + np.cos(np.pi / 4)) / 2]
  np.testing.assert_allclose(got, want, rtol=1e-4)
  # Without by_rl_step the schedule follows the updates (today's behaviour): 1, cos(pi/4), ...
  plain = optim_state.make_optimizer(optim_state.OptimizerConfig(lr=1.0, schedule="cosine", total_steps=4,
                                               max_grad_norm=None))
  st = plain.init(params)
  u1, st = plain.update(grads, st, params)
  u2, st = plain.update(grads, optim_state.advance_rl_step(st), params)
  np.testing.assert_allclose([float(u1["w"][0]), float(u2["w"][0])],
                             [-1.0, -(1 + np.cos(np.pi / 4)) / 2], rtol=1e-4)


def test_kl_form_reward_puts_minus_beta_kl_on_each_token_reward_and_drops_the_loss_term():
  """rl.kl_form='reward': a policy token's reward gains -beta * (logp - ref_logp) (k1), so with
  tree values, gamma 1 and no whitening its advantage is R - b plus the penalties from it to
  the end, summed here by hand; the loss's KL coefficient is 0 (no KL term)."""
  mesh = sharding.make_mesh(data=1, fsdp=1, tensor=1)
  c = _config("ppo", critic="tree_mc", gamma=1.0, whiten=False)
  c.rl.kl_beta, c.rl.kl_estimator, c.rl.kl_form = 0.5, "k1", "reward"
  steps = trainer.Steps(c, CFG, mesh, 0, 2)
  assert steps.with_ref and steps.loss_cfg.beta == 0.0
  learner = learners.make_learner(c, steps, mesh, CFG, pad_id=0)
  params = init_params(steps.module, jax.random.PRNGKey(0))
  ref = init_params(steps.module, jax.random.PRNGKey(7))
  episodes = _episodes()
  totals, bases = (1.0, 0.0, 2.0, -1.0), (0.5, 0.5, 2.0, -1.0)
  for e, b in zip(episodes, bases):
    e.baseline = b
  host = pack([e.prompt_ids for e in episodes], [e.completion_ids for e in episodes],
              [e.loss_mask for e in episodes], pad_id=0, bucket=8)
  dev = sharding.shard_batch(host, mesh)
  logp = np.asarray(steps.logp(params, dev, 0))
  ref_logp = np.asarray(steps.logp(ref, dev, 0))
  mask = host["loss_mask"].astype(float)
  mask[:, 0] = 0
  want = np.zeros_like(mask)
  for i, (r, b) in enumerate(zip(totals, bases)):
    idx = [t for t in range(mask.shape[1]) if mask[i, t]]
    for j, t in enumerate(idx):
      want[i, t] = r - b + sum(-0.5 * (logp[i, k] - ref_logp[i, k]) for k in idx[j:])
  seen = {}
  steps.rl_step = lambda st, batch, start: (seen.update(
      {k: np.asarray(v) for k, v in batch.items()}) or st, {"loss": 0.0})
  state = steps.new_state(params, "rl")
  _, _, m = learner.update(state, None, batch_of(episodes, [{"total": t} for t in totals], 2), ref,
                           jax.random.PRNGKey(2))
  np.testing.assert_allclose(seen["advantages"] * mask, want, rtol=1e-4, atol=1e-6)
  pen = -0.5 * ((logp - ref_logp) * mask).sum() / mask.sum()
  assert abs(pen) > 1e-4 and m["kl/reward_penalty"] == pytest.approx(pen, rel=1e-4)
  # The step still gets ref_logp (its 'kl' metric), with the loss's KL coefficient 0.
  assert "ref_logp" in seen and steps.loss_cfg.beta == 0.0
  # 'loss' (the CPU defaults' form): the step's loss carries beta * KL, the rewards do not.
  c.rl.kl_form = "loss"
  assert trainer.Steps(c, CFG, mesh, 0, 2).loss_cfg.beta == 0.5
  c.rl.algo, c.rl.kl_form = "grpo", "reward"
  with pytest.raises(ValueError, match="'rl.kl_form' is 'reward', which needs"):
    learners.make_learner(c, steps, mesh, CFG, pad_id=0)
  assert sparkle.get_config("paper").rl.kl_form == "reward"
  assert sparkle.get_config("").rl.kl_form == "loss"


def test_explained_variance_is_nan_when_the_returns_do_not_vary():
  mask = np.ones((2, 4), np.float32)
  values = np.array([[0.3, -0.2, 0.1, 0.0], [0.5, 0.4, -0.1, 0.2]], np.float32)
  # all-zero rewards: GAE returns of float32 rounding size, not a spread a critic can explain
  tiny = np.array([[1e-9, -2e-9, 0.0, 3e-9], [0.0, 1e-9, -1e-9, 0.0]], np.float32)
  assert np.isnan(learners.explained_variance(values, tiny, mask))
  assert np.isnan(learners.explained_variance(values, np.zeros_like(values), mask))
  returns = np.array([[1.0, 0.0, 0.5, 0.25], [0.0, 1.0, 0.75, 0.5]])
  r, v = returns.reshape(-1), values.reshape(-1).astype(np.float64)
  assert learners.explained_variance(values, returns, mask) == pytest.approx(
      1 - np.var(r - v) / np.var(r), rel=1e-12)
