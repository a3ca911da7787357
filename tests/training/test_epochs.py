"""`sft.epochs` / `rl.epochs`: a stage's steps computed at start-up from the data the run has
(training.stages.resolve_steps), against counts worked out by hand."""
import pytest

from rlrag_jax import config_base
from stub_task import StubTask
from rlrag_jax.training import stages


class SamplesTask(StubTask):
  """Two training examples of five SFT samples (model calls) each: 10 samples."""
  train = ["q1", "q2"]

  def sft_samples(self, ex):
    return [([1, 2], [3, 4, 5], None) for _ in range(5)]


def _config(**sections):
  c = config_base.trainer_config("stub", "/tmp/unused")
  for section, values in sections.items():
    c[section].update(values)
  return c


def test_epoch_steps_round_the_samples_up_to_whole_steps():
  assert stages.epoch_steps(10, 4, 3) == 8          # 30 samples / 4 = 7.5 -> 8 (32 trained on)
  assert stages.epoch_steps(12, 4, 3) == 9          # exact
  assert stages.epoch_steps(7500, 64, 1) == 118     # 117.19 -> 118
  assert stages.epoch_steps(10, 3, 0.3) == 1        # 0.3 * 10 / 3 is 1.0000000000000002 in floats
  assert stages.epoch_steps(10, 4, 0.1) == 1        # at least one step


def test_sft_epochs_count_samples_not_examples_and_rl_epochs_count_prompts():
  task = SamplesTask()
  c = _config(sft=dict(epochs=3.0, batch_size=4), rl=dict(epochs=1.5, prompts_per_step=1))
  items = stages.sft_samples(task, c)               # sft.steps is 0: epochs alone make SFT run
  assert len(items) == 10
  resolved, lengths = stages.resolve_steps(c, task.train, items, process_count=1)
  assert (resolved.sft.steps, resolved.rl.steps) == (8, 3)       # ceil(30/4), ceil(1.5*2/1)
  assert (c.sft.steps, c.rl.steps) == (0, 0)                     # the caller's config untouched
  assert lengths["sft"].metrics() == {"sft/samples": 10, "sft/batch": 4, "sft/epochs": 3.0,
                                      "sft/steps": 8}
  assert [end for _, end in stages.plan(resolved)] == [8, 11]    # global steps: SFT, then RL
  # The iterators are built over the samples at the computed length.
  sft_it, rl_it = stages.stage_iterators(task.train, resolved, sft_items=items)
  assert len(next(sft_it)) == 4 and len(next(rl_it)) == 1


def test_global_batch_counts_every_process():
  c = _config(sft=dict(epochs=3.0, batch_size=4))
  resolved, lengths = stages.resolve_steps(c, ["x"] * 20, [0] * 10, process_count=2)
  assert (lengths["sft"].global_batch, resolved.sft.steps) == (8, 4)   # ceil(30/8)


def test_without_epochs_the_config_is_returned_as_it_is():
  c = _config(sft=dict(steps=5), rl=dict(steps=7))
  resolved, lengths = stages.resolve_steps(c, ["x"] * 20, [0] * 10, process_count=1)
  assert resolved is c and lengths == {}


def test_steps_and_epochs_together_are_refused_naming_both_keys():
  c = _config(rl=dict(steps=5, epochs=2.0))
  with pytest.raises(ValueError, match=r"'rl.steps' = 5 and 'rl.epochs' = 2.0"):
    stages.resolve_steps(c, ["x"] * 20, None, process_count=1)


def test_too_few_samples_for_a_batch_names_the_epochs_key():
  c = _config(sft=dict(epochs=1.0, batch_size=16))
  resolved, _ = stages.resolve_steps(c, ["x"] * 20, [0] * 10, process_count=1)
  with pytest.raises(ValueError, match=r"10 SFT samples.*'sft.epochs=0'"):
    stages.stage_iterators(["x"] * 20, resolved, sft_items=[0] * 10)


def test_resume_refuses_a_different_computed_length():
  c = _config(sft=dict(epochs=3.0, batch_size=4))
  resolved, _ = stages.resolve_steps(c, ["x"], [0] * 10, process_count=1)
  stages.check_resumed_steps(resolved, {"sft": 8, "rl": 0})
  stages.check_resumed_steps(resolved, None)         # a checkpoint from before the record
  with pytest.raises(ValueError, match=r"'sft.epochs' = 3 gives 8 sft steps.*had 9"):
    stages.check_resumed_steps(resolved, {"sft": 9, "rl": 0})
  fixed = _config(sft=dict(steps=8))                 # fixed lengths are the fingerprint's job
  stages.check_resumed_steps(fixed, {"sft": 9, "rl": 0})
