"""A `SingleStreamTask` for tests that exercise one part of the engine: the members the test
gives (as keyword arguments, or by overriding in a subclass) plus the kit's defaults; a member
the test did not give raises when called."""
from rlrag_jax.tasks import SingleStreamTask


class StubTask(SingleStreamTask):
  name = "stub"
  tokenizer = None
  train = eval = ()

  def __init__(self, **members):
    for key, value in members.items():
      setattr(self, key, value)

  def _missing(self, member):
    raise NotImplementedError(f"{type(self).__name__}: this test gave no {member}")

  def prompt_ids(self, example):
    self._missing("prompt_ids")

  def sft_target_ids(self, example):
    self._missing("sft_target_ids")

  def rollout(self, policy, examples, rng, *, group_size=1, greedy=False):
    self._missing("rollout")

  def rewards(self, episodes, step=0):
    self._missing("rewards")

  def eval_metrics(self, episodes):
    self._missing("eval_metrics")


def batch_of(episodes, scores, group_size):
  """The `training.batch.Batch` of a group-major rollout (`group_size` consecutive episodes
  per example, as `SingleStreamTask.collect` groups them), for tests that call a learner."""
  from rlrag_jax.tasks import Group
  from rlrag_jax.training.batch import from_groups
  return from_groups([Group(list(episodes[i:i + group_size]), list(scores[i:i + group_size]))
                      for i in range(0, len(episodes), group_size)])
