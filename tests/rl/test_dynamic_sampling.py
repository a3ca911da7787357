"""DAPO dynamic sampling: the zero-spread filter, the fill-until-full driver and the dropped
groups it pads with (silenced by the engine: tests/training/test_batch.py)."""
import numpy as np
import pytest

from rlrag_jax import rl


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
  np.testing.assert_array_equal(np.stack(res.rewards), [[0, 1], [1, 0], [0, 1]])
  assert (res.tries, res.drawn, res.discarded, res.complete) == (3, 8, 3, True)
  assert s.needed == [3, 2, 1]
  assert res.metrics()["dynamic_sampling/kept_groups"] == 3


def test_fill_groups_runs_out_of_tries():
  s = _Sampler([(["a"], [1, 1, 1]), (["b"], [0, 1, 0]), (["c"], [0, 0, 0])])
  res = rl.fill_groups(s, target_groups=4, max_tries=3)
  assert res.groups == ["b"] and not res.complete
  assert (res.tries, res.drawn, res.discarded) == (3, 3, 2)
  assert [r.shape for r in res.rewards] == [(3,)]


def test_fill_groups_takes_groups_of_any_size():
  # A tree's decisions: groups of 3, 1 and 2 siblings; the one-member group has no spread.
  s = _Sampler([(["a", "b", "c"], [[0, 0, 1], [5], [2, 2]]), (["d"], [[1, 0, 0, 0]])])
  res = rl.fill_groups(s, target_groups=2, max_tries=2)
  assert res.groups == ["a", "d"] and res.discarded == 2 and res.complete
  # equal rewards whose np.std is 1.4e-17, not 0, are a flat group
  s = _Sampler([(["e", "f"], [[0.1, 0.1, 0.1], [0.1, 0.1, 0.2]])])
  assert rl.fill_groups(s, target_groups=2, max_tries=1).groups == ["f"]
  assert [list(r) for r in res.rewards] == [[0, 0, 1], [1, 0, 0, 0]]
  with pytest.raises(ValueError, match="5 rewards do not split into 2 groups"):
    rl.group_rewards([1, 2, 3, 4, 5], 2)
  with pytest.raises(ValueError, match="a group without rewards"):
    rl.group_rewards([[1.0], []], 2)


def test_pad_groups_fills_with_dropped_groups_in_order():
  kept, dropped = ["a"], ["x", "y", "z"]
  out, fill = rl.pad_groups(kept, dropped, 3)
  assert out == ["a"] and fill == ["x", "y"]
  # enough kept: cut to the target, nothing to pad with
  assert rl.pad_groups(kept * 4, dropped, 3) == (kept * 3, [])
