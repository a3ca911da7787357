"""Token-budget micro-batches (`UpdateStep.accumulated`): with SGD(lr=1) one update over
micro-batches of different widths (each with its own logits_start, zero pad rows) equals the
one-batch update of the same episodes, for the policy step with a KL term, the SFT step and the
PPO critic step, and for every aggregation mode; the learners give the same params with
`rl.tokens_per_micro_batch` as without."""
import dataclasses

import jax
import numpy as np
import optax
import pytest

from configs import arena
from rlrag_jax import rl, settings, trainer
from rlrag_jax.models import sharding as shd
from rlrag_jax.models.config import ModelConfig
from rlrag_jax.models.decoder import DecoderLM, ValueLM
from rlrag_jax.rl.packing import (logits_start, pack, pack_micro_batch, packed_lengths,
                                   pad_rows, plan_micro_batches, take_rows)
from rlrag_jax.tasks import Episode
from stub_task import batch_of
from rlrag_jax.training import learners, stages

CFG = ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                  num_kv_heads=1, head_dim=8, max_position_embeddings=64, model_type="llama",
                  tie_word_embeddings=True, eos_token_id=(1,), pad_token_id=0)
BUCKET, BUDGET = 4, 72
# One long completion (3 + 30 tokens: 36 columns) and three short ones after long prompts
# (20 + 4: 24 columns): the plan makes a micro-batch of one episode at 36 columns, padded to
# its width's row count (72 // 36 = 2: a zero row), and a 3 x 24 one (padded here to 4 rows:
# a zero row), whose logits start at 0 and at 16.
PROMPT_LENS, COMPLETION_LENS = (3, 20, 18, 16), (30, 3, 2, 4)


@pytest.fixture(scope="module")
def data():
  rng = np.random.default_rng(0)
  prompts = [list(rng.integers(2, 64, size=k)) for k in PROMPT_LENS]
  completions = [list(rng.integers(2, 64, size=k)) for k in COMPLETION_LENS]
  masks = [[1] * len(c) for c in completions]
  masks[0][10:14] = [0] * 4                      # environment tokens inside a completion
  whole = pack(prompts, completions, masks, bucket=BUCKET)
  shape = whole["input_ids"].shape
  per_token = {"ref_logp": -rng.uniform(2.0, 6.0, size=shape), "returns": rng.normal(size=shape),
               "old_values": rng.normal(size=shape) * 0.1,
               "old_logp": -rng.uniform(2.0, 6.0, size=shape)}
  whole.update({k: v.astype(np.float32) for k, v in per_token.items()})
  whole["advantages"] = np.array([1.0, -0.5, 2.0, -1.5], np.float32)
  plan = plan_micro_batches(*packed_lengths(prompts, completions), BUDGET, bucket=BUCKET)
  assert [(len(m.rows), m.size, m.width) for m in plan] == [(1, 2, 36), (3, 3, 24)]
  p_len = max(PROMPT_LENS)
  parts = []
  for m in plan:
    b = pack_micro_batch(prompts, completions, masks, m, bucket=BUCKET)
    b.update({k: take_rows(whole[k], p_len, m) for k in per_token})
    b["advantages"] = whole["advantages"][m.rows]
    b, _ = pad_rows(b, 4 if m.size == 3 else m.size)
    parts.append((b, logits_start(b["loss_mask"], BUCKET)))
  assert [s for _, s in parts] == [0, 16]
  return whole, parts, shd.make_mesh()


def random_params(module, seed: int):
  """Host-random params (no init compile): N(0, 0.2) matrices, norm weights 1."""
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map_with_path(
      lambda path, x: (np.ones(x.shape, np.float32) if "norm" in jax.tree_util.keystr(path)
                       else rng.normal(0.0, 0.2, size=x.shape).astype(np.float32)),
      shd.param_shapes(module))


@pytest.fixture(scope="module")
def policy_params():
  return random_params(DecoderLM(CFG), 0)


def _select(batch, keys):
  return {k: batch[k] for k in keys}


def _same_update(module, step, params, whole, parts, keys, mesh, windowed=True):
  """Runs `step` once on the whole batch and once over the micro-batches (each with its own
  logits_start when `windowed`); compares params and metrics."""
  opt = optax.sgd(1.0)
  one = rl.create_train_state(module, opt, mesh, params=params)
  start = logits_start(whole["loss_mask"], BUCKET) if windowed else 0
  one, m_one = step(one, _select(whole, keys), start)
  acc = rl.create_train_state(module, opt, mesh, params=params)
  acc, m_acc = step.accumulated(acc, [(_select(b, keys), s if windowed else 0)
                                      for b, s in parts])
  for a, b in zip(jax.tree_util.tree_leaves(acc.params), jax.tree_util.tree_leaves(one.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
  assert sorted(m_acc) == sorted(m_one)
  for k in m_one:
    assert float(m_acc[k]) == pytest.approx(float(m_one[k]), rel=1e-5, abs=1e-5), k
  assert int(acc.step) == int(one.step) == 1 and float(m_acc["skipped"]) == 0.0
  moved = max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in
              zip(jax.tree_util.tree_leaves(acc.params), jax.tree_util.tree_leaves(params)))
  assert moved > 1e-3                            # the update is not trivially zero
  return m_acc


POLICY_CASES = [
    pytest.param("sequence_mean", id="sequence_mean"),
    pytest.param("token_mean", id="token_mean", marks=pytest.mark.slow),
    pytest.param("constant", id="constant", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("aggregation", POLICY_CASES)
def test_policy_step_with_kl_over_token_budget_equals_one_batch(data, policy_params,
                                                                aggregation):
  whole, parts, mesh = data
  module = DecoderLM(CFG)
  cfg = rl.LossConfig(aggregation=aggregation, max_completion_len=40, beta=0.1,
                      kl_estimator="k3", entropy_coef=0.01)
  step = rl.make_policy_step(module, optax.sgd(1.0), mesh, cfg)
  keys = ("input_ids", "attention_mask", "loss_mask", "advantages", "old_logp", "ref_logp")
  m = _same_update(module, step, policy_params, whole, parts, keys, mesh)
  assert m["tokens"] == whole["loss_mask"][:, 1:].sum()
  assert float(m["kl"]) > 0.0


def test_sft_step_over_token_budget_equals_one_batch(data, policy_params):
  whole, parts, mesh = data
  module = DecoderLM(CFG)
  step = rl.make_sft_step(module, optax.sgd(1.0), mesh, aggregation="token_mean")
  _same_update(module, step, policy_params, whole, parts,
               ("input_ids", "attention_mask", "loss_mask"), mesh)


def test_value_step_over_token_budget_equals_one_batch(data, policy_params):
  whole, parts, mesh = data
  module = ValueLM(CFG)
  params = random_params(module, 1)
  step = rl.make_value_step(module, optax.sgd(1.0), mesh, clip_eps=0.2, aggregation="constant",
                            max_len=40)
  _same_update(module, step, params, whole, parts,
               ("input_ids", "attention_mask", "loss_mask", "returns", "old_values"), mesh,
               windowed=False)


def test_sft_batches_split_the_whole_batch_by_token_budget():
  """The SFT stage's batches (host only): the same rows, truncated and weighted as the whole
  batch's, within the budget, in shard multiples, with the whole batch's normalisers."""
  sft = dataclasses.replace(settings.Settings.from_config(arena.get_config("")).sft,
                            max_len=24, pack_bucket=4, prompt_loss=0.25)
  rng = np.random.default_rng(3)
  prompts = [list(rng.integers(2, 64, size=k)) for k in (3, 12, 5, 2, 9)]
  targets = [list(rng.integers(2, 64, size=k)) for k in (30, 2, 6, 1, 3)]
  masks = [[1] * len(t) for t in targets]
  masks[2][1:3] = [0, 0]

  def rows(batches):
    out = []
    for b, _ in batches:
      for ids, attn, lm in zip(b["input_ids"], b["attention_mask"], b["loss_mask"]):
        if attn.any():
          out.append((tuple(ids[attn > 0]), tuple(lm[attn > 0])))
    return sorted(out)

  whole = stages.sft_batches(prompts, targets, masks,
                             dataclasses.replace(sft, tokens_per_micro_batch=0), 0, 2)
  parts = stages.sft_batches(prompts, targets, masks,
                             dataclasses.replace(sft, tokens_per_micro_batch=40), 0, 2)
  assert len(whole) == 1 and len(parts) > 1
  assert rows(parts) == rows(whole)
  for b, start in parts:
    n, width = b["input_ids"].shape
    assert n % 2 == 0 and (n * width <= 40 or n == 2)
    assert not b["loss_mask"][:, :start + 1].any()
  norms = rl.update.token_norms("token_mean", None)
  assert norms.host([b["loss_mask"] for b, _ in parts]) == norms.host([whole[0][0]["loss_mask"]])


# ------------------------------------------------------------------------------------ learners
def _config(algo: str, budget: int):
  c = arena.get_config("")
  c.rl.algo = algo
  c.rl.prompts_per_step, c.rl.group_size = 2, 2
  c.rl.pack_bucket = BUCKET
  c.rl.aggregation = "token_mean"
  c.rl.kl_beta = 0.04
  c.rl.micro_batches = 1
  c.rl.tokens_per_micro_batch = budget
  c.rl.steps = 3
  return c


def _episodes():
  rng = np.random.default_rng(1)
  rows = [(3, 30), (3, 2), (2, 4), (2, 1)]            # one long completion, three short
  eps = [Episode(example=None, prompt_ids=list(rng.integers(2, 64, size=p)),
                 completion_ids=list(rng.integers(2, 64, size=c)), loss_mask=[1] * c, text="")
         for p, c in rows]
  eps[0].loss_mask[5:9] = [0] * 4
  eps[1].prompt_ids, eps[3].prompt_ids = eps[0].prompt_ids, eps[2].prompt_ids   # two groups
  return eps


def _close(a, b, atol=1e-5):
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol)


def test_outcome_learner_with_a_token_budget_gives_the_one_batch_params():
  mesh = shd.make_mesh(data=1, fsdp=1, tensor=1)
  c = _config("grpo", 40)
  c.rl.mu = 2                                    # old log-probs per micro-batch, plan reused
  steps = trainer.Steps(c, CFG, mesh, 0, 3)
  params = random_params(steps.module, 0)
  scores = [{"total": s} for s in (1.0, 0.0, 0.5, 2.0)]
  out = {}
  for budget in (0, 40):
    c.rl.tokens_per_micro_batch = budget
    learner = learners.make_learner(c, steps, mesh, CFG, pad_id=0)
    state = steps.new_state(params, "rl")
    state, _, m = learner.update(state, None, batch_of(_episodes(), scores, 2), params,
                                 jax.random.PRNGKey(2))
    out[budget] = (jax.device_get(state.params), m)
  _close(out[40][0], out[0][0])
  for k, v in out[0][1].items():
    assert out[40][1][k] == pytest.approx(v, rel=1e-5, abs=1e-5), k


@pytest.mark.slow
def test_ppo_learner_with_a_token_budget_gives_the_one_batch_policy_and_critic():
  mesh = shd.make_mesh(data=1, fsdp=1, tensor=1)
  c = _config("ppo", 40)
  c.rl.mu = 2
  c.rl.ppo.update(dict(mini_batches=2, whiten=True, vf_clip=0.2, gamma=0.9, lam=0.8))
  steps = trainer.Steps(c, CFG, mesh, 0, 3)
  params = random_params(steps.module, 0)
  scores = [{"total": s} for s in (1.0, 0.0, 0.5, 2.0)]
  out = {}
  for budget in (0, 40):
    c.rl.tokens_per_micro_batch = budget
    learner = learners.make_learner(c, steps, mesh, CFG, pad_id=0)
    state = steps.new_state(params, "rl")
    critic = learner.init_critic(state.params, jax.random.PRNGKey(3))
    state, critic, m = learner.update(state, critic, batch_of(_episodes(), scores, 2), params,
                                      jax.random.PRNGKey(2))
    out[budget] = (jax.device_get(state.params), jax.device_get(critic.params), m)
  _close(out[40][0], out[0][0])
  _close(out[40][1], out[0][1])
  for k, v in out[0][2].items():
    assert out[40][2][k] == pytest.approx(v, rel=1e-4, abs=1e-5), k
