"""A task that implements only the abstract members of `rlrag_jax.tasks.RLTask` (its SFT
samples, its evaluation, its collection) trains through the real trainer: one SFT step (one
sample per example, no loss mask), GRPO steps on the engine's own collection (one `Group` per
prompt), greedy evaluations (`EvalRow`s), checkpoints with no task state.

The reward is 1 when the first generated token has an even id. What RL must move is the
policy's probability of an even first token after the training prompts, read straight from
the params (softmax of the last prompt position's logits, summed over even ids), after SFT
(checkpoint of step 1) and after RL. SFT teaches the odd token 'a', so a rise is RL's."""
import json
import sys
import types

import jax
import numpy as np

from hf_tiny import make_tiny_checkpoint
from rlrag_jax import config_base, run_dirs, trainer
from rlrag_jax.generate import byte_level_tokenizer
from rlrag_jax.rollout.single_turn import single_turn
from rlrag_jax.tasks import EvalRow, Group, RLTask

SFT, RL = 1, 4


def _even(episode) -> float:
  c = episode.completion_ids
  return float(bool(c) and c[0] % 2 == 0)


class EvenFirstToken(RLTask):
  """The required members and nothing else."""
  name = "even_first_token"

  def __init__(self, config):
    self.tokenizer = byte_level_tokenizer()
    self.train = [f"q{i:02d}:" for i in range(8)]         # 4 tokens each
    self.eval = self.train[:4]

  def _ids(self, text):
    return self.tokenizer(text, add_special_tokens=False)["input_ids"]

  def sft_samples(self, example):
    return [(self._ids(example), self._ids("a") + [self.tokenizer.eos_token_id], None)]  # odd 'a'

  def collect(self, policy, examples, rng, *, group_size, want, step):
    eps = single_turn(policy, examples, self._ids, self.tokenizer.decode, rng,
                      group_size=group_size)
    return [Group(eps[i:i + group_size], [{"total": _even(e)} for e in eps[i:i + group_size]])
            for i in range(0, len(eps), group_size)]

  def evaluate(self, policy, examples, rng):
    eps = single_turn(policy, examples, self._ids, self.tokenizer.decode, rng, greedy=True)
    return [EvalRow(e.example, e.text, {"even": _even(e)}) for e in eps]


def even_mass(lm, prompts) -> float:
  """Mean over `prompts` (equal lengths) of the probability that the next token's id is even."""
  ids = np.asarray(prompts, np.int32)
  probs = np.asarray(jax.nn.softmax(lm.logits(ids, np.ones_like(ids))[:, -1], axis=-1))
  return float(probs[:, 0::2].sum(axis=1).mean())


def test_a_task_of_only_the_required_members_trains(tmp_path, monkeypatch):
  assert not RLTask.__abstractmethods__ - set(vars(EvenFirstToken))
  assert {k for k in vars(EvenFirstToken) if not k.startswith("_")} == {
      "name", *RLTask.__abstractmethods__}
  module = types.ModuleType("rlrag_jax.methods.even_first_token.task")
  module.make_task = EvenFirstToken
  monkeypatch.setitem(sys.modules, "rlrag_jax.methods.even_first_token.task", module)
  c = config_base.trainer_config("even_first_token", str(tmp_path / "run"))
  config_base.use_hf_model(c)
  c.model.path = str(make_tiny_checkpoint(tmp_path, "qwen2", seed=0, name="policy"))
  c.model.dtype = "float32"
  c.sft.update(dict(steps=SFT, batch_size=4, lr=1e-3, pack_bucket=8))
  c.rl.update(dict(steps=RL, prompts_per_step=4, group_size=8, max_new_tokens=2, lr=3e-3,
                   kl_beta=0.0, temperature=1.0, pack_bucket=8))
  c.eval.update(dict(num_examples=4, max_new_tokens=2, batch_size=4))
  c.checkpoint.update(dict(every=1, keep=SFT + RL))     # step 1's params are read below
  c.export_hf = False
  result = trainer.run(c, progress=False)

  rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  by_stage = lambda s: [r for r in rows if r["stage"] == s]
  assert [r["step"] for r in by_stage("sft")] == [1]
  assert [r["step"] for r in by_stage("rl")] == list(range(SFT + 1, SFT + RL + 1))
  for r in by_stage("sft") + by_stage("rl"):
    assert np.isfinite(r["loss"]) and np.isfinite(r["grad_norm"]) and r["skipped"] == 0
  for r in by_stage("rl"):
    assert 0.0 <= r["reward/total"] <= 1.0 and r["dynamic/tries"] == 1.0
  assert len(by_stage("eval_before")) == 1 and len(by_stage("eval_after")) == 1
  assert result.after["all"]["n"] == 4 and "even" in result.after["all"]

  task = EvenFirstToken(c)
  prompts = [task._ids(ex) for ex in task.train]
  after_sft = even_mass(run_dirs.load_trained(tmp_path / "run", step=SFT), prompts)
  after_rl = even_mass(run_dirs.load_trained(tmp_path / "run"), prompts)
  print(f"P(even first token): after SFT {after_sft:.3f}, after {RL} RL steps {after_rl:.3f}; "
        "reward/total per step", [round(r["reward/total"], 3) for r in by_stage("rl")])
  assert 0.1 < after_sft < 0.9                  # room to move either way
  assert after_rl > after_sft + 0.1
