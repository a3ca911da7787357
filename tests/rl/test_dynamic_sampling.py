"""DAPO dynamic sampling: the zero-spread filter, the fill-until-full driver and the padding
with silenced groups."""
import numpy as np
import pytest

from rlrag_jax import rl
from rlrag_jax.tasks import Episode


def test_filter_zero_spread_groups():
  r = np.array([1, 1, 1, 0, 1, 1, 1, 1, 0.5, 0.5, 0.5, 0.5])
  np.testing.assert_array_equal(rl.filter_zero_spread_groups(r, 4), [True, False, False])
  np.testing.assert_array_equal(rl.filter_zero_spread_groups(r.reshape(3, 4), 4),
                                [True, False, False])
  np.testing.assert_array_equal(rl.filter_zero_spread_groups([0, 1e-9, 0, 1], 2, tol=1e-6),
                                [False, True])
  with pytest.raises(ValueError, match="group_size=5"):
    rl.filter_zero_spread_groups(r, 5)


class _Sampler:
  """Scripted draws: each call returns the next batch of (payloads, rewards [n, G])."""

  def __init__(self, draws):
    self.draws = list(draws)
    self.needed = []

  def __call__(self, needed):
    self.needed.append(needed)
    return self.draws.pop(0)


def test_fill_groups_collects_until_full():
  s = _Sampler([
      (["a", "b", "c"], [[1, 1], [0, 1], [0, 0]]),   # keeps b
      (["d", "e"], [[1, 0], [1, 1]]),                # keeps d
      (["f", "g", "h"], [[0, 1], [1, 0], [0, 1]]),   # keeps f; g, h are beyond the target
  ])
  res = rl.fill_groups(s, target_groups=3, max_tries=10)
  assert res.groups == ["b", "d", "f"]
  np.testing.assert_array_equal(res.rewards, [[0, 1], [1, 0], [0, 1]])
  assert (res.tries, res.drawn, res.discarded, res.complete) == (3, 8, 3, True)
  assert s.needed == [3, 2, 1]
  assert res.metrics()["dynamic_sampling/kept_groups"] == 3


def test_fill_groups_runs_out_of_tries():
  s = _Sampler([(["a"], [1, 1, 1]), (["b"], [0, 1, 0]), (["c"], [0, 0, 0])])
  res = rl.fill_groups(s, target_groups=4, max_tries=3)
  assert res.groups == ["b"] and not res.complete
  assert (res.tries, res.drawn, res.discarded) == (3, 3, 2)
  assert res.rewards.shape == (1, 3)


def test_fill_groups_rejects_changing_group_size():
  s = _Sampler([(["a"], [[0, 1]]), (["b"], [[0, 1, 1]])])
  with pytest.raises(ValueError, match="groups of 3 samples"):
    rl.fill_groups(s, target_groups=2, max_tries=2)


def test_pad_groups_fills_with_silenced_dropped_groups_in_order():
  def group(tag, n=2):
    return ([Episode(tag, [1], [2, 3], [1, 1], tag, {"k": tag}) for _ in range(n)],
            [{"total": 0.0}] * n)

  kept, dropped = [group("a")], [group("x"), group("y"), group("z")]
  out, padded = rl.pad_groups(kept, dropped, 3)
  assert padded == 2 and [eps[0].example for eps, _ in out] == ["a", "x", "y"]
  assert out[0] is kept[0]                                   # kept groups are not copied
  for (eps, scores), (_, drawn_scores) in zip(out[1:], dropped):
    assert all(e.padding and e.loss_mask == [0, 0] and e.completion_ids == [2, 3]
               for e in eps)
    assert scores is drawn_scores                           # rewards as drawn
  # the originals are untouched, and a copy's info is its own
  assert not any(e.padding or e.loss_mask != [1, 1] for eps, _ in dropped for e in eps)
  out[1][0][0].info["k"] = "changed"
  assert dropped[0][0][0].info["k"] == "x"
  # enough kept: cut to the target, nothing padded
  assert rl.pad_groups(kept * 4, dropped, 3) == (kept * 3, 0)
