"""Collecting a step's episodes: batched rewards, a task's own collect hook, dynamic sampling
padded back to a fixed batch, the engine's group ids; per-token rewards in the learners."""
import itertools

import jax
import numpy as np
import pytest

from configs import arena
from stub_task import StubTask
from rlrag_jax.rl.packing import pack
from rlrag_jax.tasks import Episode, Group
from rlrag_jax.training import collection, learners


def _ep(tag, value, n=2):
  return Episode(example=tag, prompt_ids=[1, 2], completion_ids=[3] * n, loss_mask=[1] * n,
                 text=tag, info={"value": value})


def _config(**rl):
  c = arena.get_config("")
  c.rl.group_size, c.rl.prompts_per_step = 2, 2
  c.rl.update(rl)
  return c


def test_batched_rewards_are_asked_once_per_draw():
  calls = []

  class Task(StubTask):
    def rollout(self, policy, exs, key, group_size):
      return [_ep("a", 1.0), _ep("a", 0.0), _ep("b", 2.0), _ep("b", 2.0)]

    def rewards(self, episodes, step):
      calls.append(len(episodes))
      return [{"total": e.info["value"]} for e in episodes]

  batch, _ = collection.collect(Task(), None, itertools.repeat(["x", "y"]),
                                jax.random.PRNGKey(0), _config(), 1)
  assert calls == [4] and [s["total"] for s in batch.rewards] == [1.0, 0.0, 2.0, 2.0]
  assert list(batch.group_ids) == [0, 0, 1, 1] and batch.live.all()


def test_dynamic_sampling_pads_to_a_fixed_batch_with_silenced_groups():
  task = StubTask(
      rollout=lambda policy, exs, key, group_size: [_ep("a", 1.0), _ep("a", 0.0),
                                                    _ep("f", 3.0), _ep("f", 3.0)],
      rewards=lambda eps, step: [{"total": e.info["value"]} for e in eps])
  c = _config(dynamic_sampling=True, dynamic_max_tries=2, prompts_per_step=3)
  batch, fill = collection.collect(task, None, itertools.repeat(["x", "y"]),
                                   jax.random.PRNGKey(0), c, 1)
  eps = batch.episodes
  # Two draws keep 'a' twice (3 wanted); one flat group 'f' pads the batch, silenced, under an
  # id of its own.
  assert [e.example for e in eps] == ["a", "a", "a", "a", "f", "f"]
  assert list(batch.group_ids) == [0, 0, 1, 1, 2, 2]
  assert list(batch.live) == [True] * 4 + [False] * 2
  assert fill == {"tries": 2.0, "dropped_groups": 2.0, "padded_groups": 1.0,
                  "padded_episodes": 0.0}
  assert [sum(e.loss_mask) for e in eps] == [2, 2, 2, 2, 0, 0]
  assert not hasattr(eps[4], "padding") and not hasattr(eps[4], "group")


def _tree_groups(sizes_values):
  """Groups of the given sizes, each episode named by its group (as a tree's decisions)."""
  groups = []
  for gid, values in sizes_values:
    eps = [_ep(f"t{gid}", v) for v in values]
    groups.append(Group(eps, [{"total": v} for v in values]))
  return groups


def test_a_task_collect_hook_replaces_the_rollout_and_its_count_is_padded_to_a_bucket():
  asked = []

  class Task(StubTask):
    def collect(self, policy, exs, key, *, group_size, want, step):
      asked.append((list(exs), group_size, want, step))
      return _tree_groups([(7, (1.0, 0.0)), (9, (5.0,))])

  batch, fill = collection.collect(Task(), None, itertools.repeat(["x"]),
                                   jax.random.PRNGKey(0), _config(), 1)
  eps = batch.episodes
  assert asked == [(["x"], 2, 2, 1)]
  # 3 episodes against a nominal 2 x 2: padded to the bucket of 8 with silenced copies of the
  # first ones (rewards as drawn), so that the update sees a bounded set of shapes; the
  # padding is two whole groups of rl.group_size 2 and one of one, under fresh ids.
  assert collection.batch_size(3, _config().rl) == 8
  assert len(eps) == 8 and fill["padded_episodes"] == 5.0
  assert list(batch.group_ids) == [0, 0, 1, 2, 2, 3, 3, 4]
  assert list(batch.live) == [True] * 3 + [False] * 5
  assert [sum(e.loss_mask) for e in eps] == [2] * 3 + [0] * 5
  assert [e.example for e in eps[3:]] == ["t7", "t7", "t9", "t7", "t7"]
  assert [s["total"] for s in batch.rewards] == [1.0, 0.0, 5.0, 1.0, 0.0, 5.0, 1.0, 0.0]
  # micro-batches: the bucket is a multiple of the episode unit, and a nominal count that the
  # micro-batches do not divide (4 episodes, 16 micro-batches) is padded to it too
  assert collection.batch_size(3, _config(micro_batches=16).rl) == 16
  batch, fill = collection.collect(
      Task(), None, itertools.repeat(["x"]), jax.random.PRNGKey(0),
      _config(micro_batches=16, group_size=1, prompts_per_step=3), 1)
  assert len(batch) == 16 and fill["padded_episodes"] == 13.0
  assert list(batch.group_ids) == [0, 0, 1] + list(range(2, 15))
  assert collection.batch_size(40, _config().rl) == 48


def test_dynamic_sampling_drops_a_task_s_flat_groups_of_any_size():
  draws = iter([_tree_groups([(1, (1.0, 1.0, 1.0)), (2, (0.0, 1.0))]),
                _tree_groups([(3, (2.0,)), (4, (0.0, 0.5, 0.0))])])
  asked = []

  class Task(StubTask):
    def collect(self, policy, exs, key, *, group_size, want, step):
      asked.append(want)
      return next(draws)

  batch, fill = collection.collect(Task(), None, itertools.repeat(["x"]),
                                   jax.random.PRNGKey(0),
                                   _config(dynamic_sampling=True, dynamic_max_tries=2), 1)
  eps = batch.episodes
  # Kept: group 2 (first draw) and group 4 (second); the flat groups 1 and 3 are dropped.
  assert asked == [2, 1] and [e.example for e in eps[:5]] == ["t2", "t2", "t4", "t4", "t4"]
  assert fill == {"tries": 2.0, "dropped_groups": 2.0, "padded_groups": 0.0,
                  "padded_episodes": 3.0}
  assert batch.live[:5].all() and not batch.live[5:].any()

  class Padded(StubTask):
    def collect(self, policy, exs, key, *, group_size, want, step):
      return [Group([_ep("a", 1.0)], [{"total": 1.0}], padding=True)]

  with pytest.raises(ValueError, match="item 0 is a padding Group; expected drawn"):
    collection.collect(Padded(), None, itertools.repeat(["x"]), jax.random.PRNGKey(0),
                       _config(), 1)


def test_token_rewards_land_on_their_completion_tokens():
  eps = [Episode(None, [5, 6, 7], [10, 11, 12], [1, 0, 1], "", token_rewards=[0.5, 9.0, 2.0]),
         Episode(None, [8], [13, 14], [1, 1], "")]
  host = pack([e.prompt_ids for e in eps], [e.completion_ids for e in eps],
              [e.loss_mask for e in eps], bucket=4)
  mask = host["loss_mask"].astype(np.float32)
  got = np.asarray(learners._token_rewards(eps, np.array([1.0, 3.0], np.float32), host, mask))
  # Completions start at column 3; the environment token (mask 0) carries no reward; the
  # episode without per-token rewards gets its total on its last policy token.
  np.testing.assert_allclose(got, [[0, 0, 0, 0.5, 0, 2.0, 0, 0],
                                   [0, 0, 0, 0, 3.0, 0, 0, 0]])
  bad = [Episode(None, [1], [2, 3], [1, 1], "", token_rewards=[1.0])]
  with pytest.raises(ValueError, match="1 entries for 2 completion tokens"):
    learners._token_rewards(bad, np.zeros(1, np.float32),
                            pack([[1]], [[2, 3]], bucket=4), np.ones((1, 4), np.float32))


def test_dynamic_sampling_with_every_group_flat_trains_on_the_last_draw():
  draws = iter([[_ep("p", 1.0), _ep("p", 1.0), _ep("q", 0.0), _ep("q", 0.0)],
                [_ep("r", 2.0), _ep("r", 2.0), _ep("s", 0.0), _ep("s", 0.0)]])
  task = StubTask(rollout=lambda policy, exs, key, group_size: next(draws),
                  rewards=lambda eps, step: [{"total": e.info["value"]} for e in eps])
  c = _config(dynamic_sampling=True, dynamic_max_tries=2)
  batch, fill = collection.collect(task, None, itertools.repeat(["x", "y"]),
                                   jax.random.PRNGKey(0), c, 1)
  eps = batch.episodes
  assert [e.example for e in eps] == ["r", "r", "s", "s"]
  assert all(sum(e.loss_mask) == 2 for e in eps) and fill["padded_groups"] == 0.0
