"""A new method needs no edit to the shared layers: a test-only task, found by the trainer's
ordinary `method` lookup, collects a tree of decisions (forced Yes/No at the root, then the
policy completes each branch), is rewarded by a frozen auxiliary LM (config `models.reader`), and
trains with PPO on one sample per decision grouped by its parent node."""
import json
import sys
import types

import jax
import numpy as np
import pytest

from hf_tiny import make_tiny_checkpoint
from rlrag_jax import config_base, run_dirs, trainer
from rlrag_jax.generate import byte_level_tokenizer
from rlrag_jax.rollout import tree
from rlrag_jax.rollout.single_turn import completion_ids, single_turn
from rlrag_jax.tasks import Episode, EvalRow, Group, RLTask

pytestmark = pytest.mark.slow


class ToyTreeTask(RLTask):
  name = "toy_tree"

  def __init__(self, config):
    self.config = config
    self.tokenizer = byte_level_tokenizer()
    self.train = [f"q{i}:" for i in range(6)]
    self.eval = self.train[:2]
    self.reader = None
    self.reader_calls = 0
    self.forests = []
    self.pool = []              # grows from the policy's own rollouts; saved in checkpoints
    self.eval_rollouts = 0
    self.prefilled = []         # (tokens prefilled, root tokens but the last) per collect

  def bind_models(self, models):
    self.reader = models["reader"]

  def _enc(self, text):
    return self.tokenizer(text, add_special_tokens=False)["input_ids"]

  def prompt_ids(self, ex):
    return self._enc(ex)

  def sft_samples(self, ex):
    # Two roles per example: the decision, then a continuation after it (first token masked).
    p = self.prompt_ids(ex)
    return [(p, self._enc("Y"), None), (p + self._enc("Y"), self._enc("ok"), [0, 1])]

  def state_dict(self):
    return {"pool": self.pool}

  def load_state_dict(self, state):
    self.pool = [list(x) for x in state["pool"]]

  def evaluate(self, policy, examples, rng):
    self.eval_rollouts += 1
    eps = single_turn(policy, examples, self.prompt_ids, lambda ids: "", rng, greedy=True)
    read = self._read([e.prompt_ids + e.completion_ids for e in eps])
    return [EvalRow(e.example, e.text, {"reward": r}) for e, r in zip(eps, read)]

  def _read(self, states):
    """The frozen reader's probability of 'Y' after each state (one batched forward)."""
    self.reader_calls += 1
    width = max(len(s) for s in states)
    ids = np.zeros((len(states), width), np.int32)
    mask = np.zeros_like(ids)
    for i, s in enumerate(states):
      ids[i, width - len(s):], mask[i, width - len(s):] = s, 1
    probs = jax.nn.softmax(self.reader.logits(ids, mask)[:, -1], axis=-1)
    return [float(p) for p in np.asarray(probs[:, self._enc("Y")[0]])]

  def collect(self, policy, examples, rng, *, group_size, want, step):
    level = [0]
    roots = [self.prompt_ids(ex) for ex in examples]
    ctx = policy.contexts()          # the roots' KV cache, forked to their branches
    ctx.prime(roots)

    def step_fn(nodes, actions):
      level[0] += 1
      out = [None] * len(nodes)
      free = [i for i, a in enumerate(actions) if a is None]
      for i, (n, a) in enumerate(zip(nodes, actions)):
        if a is not None:
          ids = self._enc(a)
          out[i] = tree.Step(state=n.state + ids, sample=(n.state, ids))
      if free:     # the forced branches (depth 1) continue their root's cached row
        gen = ctx.extend([nodes[i].tree for i in free],
                         [nodes[i].state[len(roots[nodes[i].tree]):] for i in free],
                         jax.random.fold_in(rng, level[0]), max_new_tokens=policy.max_new_tokens)
        for row, i in enumerate(free):
          comp = completion_ids(gen, row)
          out[i] = tree.Step(state=nodes[i].state + comp, sample=(nodes[i].state, comp),
                             done=True)
      return out

    forest = tree.expand([self.prompt_ids(ex) for ex in examples], step=step_fn,
                         branch=lambda n: ["Y", "N"], max_depth=1,
                         reward=lambda leaves: self._read([l.state for l in leaves]))
    self.forests.append(forest)
    self.prefilled.append((ctx.prefill_tokens, sum(len(r) - 1 for r in roots)))
    self.pool.append([step, max(l.reward for l in forest.leaves())])
    groups = {}      # parent node -> (episodes, rewards): a Group per decision's siblings
    for d in forest.decisions():
      prompt, comp = d.sample
      eps, rewards = groups.setdefault(d.group, ([], []))
      eps.append(Episode(example=examples[d.tree], prompt_ids=prompt, completion_ids=comp,
                         loss_mask=[1] * len(comp), text="", info={"action": d.action}))
      rewards.append({"total": d.ret})
    return [Group(eps, rewards) for eps, rewards in groups.values()]


def test_toy_tree_task_trains_with_ppo_and_a_frozen_reader(tmp_path, monkeypatch):
  made = []
  module = types.ModuleType("rlrag_jax.methods.toy_tree.task")
  module.make_task = lambda config: made.append(ToyTreeTask(config)) or made[-1]
  monkeypatch.setitem(sys.modules, "rlrag_jax.methods.toy_tree.task", module)

  c = config_base.trainer_config("toy_tree", str(tmp_path / "run"))
  config_base.use_hf_model(c)
  c.model.path = str(make_tiny_checkpoint(tmp_path, "qwen2", seed=0, name="policy"))
  c.model.dtype = "float32"
  c.models.reader = dict(path=str(make_tiny_checkpoint(tmp_path, "llama", seed=1,
                                                       name="reader")))
  c.rl.update(dict(algo="ppo", steps=2, prompts_per_step=2, group_size=1, max_new_tokens=4,
                   lr=1e-3, kl_beta=0.04, pack_bucket=8))
  c.rl.ppo.update(dict(vf_lr=1e-3, mini_batches=1))
  c.eval.update(dict(num_examples=2, max_new_tokens=4, batch_size=2))
  c.sft.update(dict(steps=1, batch_size=4, pack_bucket=8))
  c.checkpoint.every = 1
  c.export_hf = False
  before = run_dirs.load_trained(c.model.path).params
  # Killed after the first RL step (global step 2), then resumed: the pool comes back.
  assert trainer.run(c, progress=False, stop_after=2) is None
  pool_at_kill = [list(x) for x in made[-1].pool]
  assert len(pool_at_kill) == 1
  result = trainer.run(c, progress=False, resume=True)

  task = made[-1]
  assert task.pool[:1] == pool_at_kill and len(task.pool) == 2
  assert task.eval_rollouts > 0
  assert task.reader is not None and task.reader_calls > 0
  # Per prompt (two a step): two forced root decisions, then one sampled completion under each.
  assert len(task.forests) == 1          # the resumed process ran the second RL step
  # Each root prefilled once; each of its 2 branches then feeds 2 tokens (root's last, Y/N).
  assert task.prefilled == [(task.prefilled[0][1] + 4 * 2, task.prefilled[0][1])]
  for forest in task.forests:
    assert forest.counts()["nodes"] == 8 and forest.counts()["leaves"] == 4
    assert sorted(d.action or "-" for d in forest.decisions()) == ["-"] * 4 + ["N"] * 2 + [
        "Y"] * 2
    rets = {d.node: d.ret for d in forest.decisions()}
    for d in forest.decisions():       # a root decision's return is its one leaf's reward
      if d.action is not None:
        child = forest.nodes[d.node].children[0]
        assert rets[d.node] == pytest.approx(forest.nodes[child].reward)
  rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  sft = [r for r in rows if r["stage"] == "sft"]
  assert len(sft) == 1 and sft[0]["tokens"] == 4 + 0   # 4 samples, one loss token each
  rows = [r for r in rows if r["stage"] == "rl"]
  assert len(rows) == 2
  for r in rows:
    assert np.isfinite(r["vf/loss"]) and "vf/explained_variance" in r and r["tokens"] > 0
  changed = [not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in
             zip(jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(result.params))]
  assert any(changed)
