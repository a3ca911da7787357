"""The RL loop learns: on a bandit whose reward is a property of the first sampled token, GRPO
through the ordinary trainer raises the mean training reward far beyond its start. A wrong
advantage sign, a misaligned group or loss mask, or updates that do not reach the sampler
would leave it flat."""
import json
import sys
import types

import numpy as np
import pytest

from hf_tiny import make_tiny_checkpoint
from rlrag_jax import config_base, trainer
from rlrag_jax.generate import byte_level_tokenizer
from rlrag_jax.rollout.single_turn import single_turn
from rlrag_jax.tasks import SingleStreamTask

pytestmark = pytest.mark.slow


class EvenFirstByte(SingleStreamTask):
  """Reward 1 when the first generated token is an even byte, else 0 (about 1/2 at random)."""
  name = "even_first_byte"

  def __init__(self, config):
    self.config = config
    self.tokenizer = byte_level_tokenizer()
    self.train = [f"question {i}:" for i in range(16)]
    self.eval = self.train[:4]

  def prompt_ids(self, ex):
    return self.tokenizer(ex, add_special_tokens=False)["input_ids"]

  def sft_target_ids(self, ex):
    return self.prompt_ids("b")

  def rollout(self, policy, examples, rng, *, group_size=1, greedy=False):
    return single_turn(policy, examples, self.prompt_ids, lambda ids: "", rng,
                       group_size=group_size, greedy=greedy)

  def rewards(self, episodes, step=0):
    return [{"total": float(bool(e.completion_ids) and e.completion_ids[0] % 2 == 0)}
            for e in episodes]

  def eval_metrics(self, episodes):
    return [{"reward": r["total"]} for r in self.rewards(episodes)]


def test_grpo_raises_the_reward_of_a_bandit(tmp_path, monkeypatch):
  module = types.ModuleType("rlrag_jax.methods.even_first_byte.task")
  module.make_task = EvenFirstByte
  monkeypatch.setitem(sys.modules, "rlrag_jax.methods.even_first_byte.task", module)
  c = config_base.trainer_config("even_first_byte", str(tmp_path / "run"))
  config_base.use_hf_model(c)
  c.model.path = str(make_tiny_checkpoint(tmp_path, "qwen2", seed=0, name="policy"))
  c.model.dtype = "float32"
  c.rl.update(dict(steps=24, prompts_per_step=4, group_size=8, max_new_tokens=2, lr=3e-3,
                   kl_beta=0.0, temperature=1.0, pack_bucket=8))
  c.eval.update(dict(num_examples=4, max_new_tokens=2, batch_size=4))
  c.sft.steps = 0
  c.checkpoint.every = 1000
  c.export_hf = False
  trainer.run(c, progress=False)
  rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  reward = [r["reward/total"] for r in rows if r["stage"] == "rl"]
  assert len(reward) == 24
  first, last = np.mean(reward[:6]), np.mean(reward[-6:])
  assert 0.2 < first < 0.8            # a random policy: about half even
  print("bandit reward per RL step:", [round(r, 2) for r in reward])
  assert last > 0.9 and last - first > 0.25, reward
