"""BatchIterator: coverage per epoch across processes, determinism, resume equality."""
import itertools
import json

import numpy as np
import pytest

from rlrag_jax.data import BatchIterator


def _iters(n, batch_size, count, **kw):
  items = [f"ex{i}" for i in range(n)]
  return [BatchIterator(items, batch_size, process_index=p, process_count=count, **kw)
          for p in range(count)]


def _take(it, k):
  return list(itertools.islice(it, k))


@pytest.mark.parametrize("n,batch_size,count", [(23, 4, 1), (23, 4, 2), (23, 4, 3), (10, 3, 4),
                                                (5, 2, 4)])
def test_every_example_once_per_epoch_across_processes(n, batch_size, count):
  its = _iters(n, batch_size, count, seed=3, drop_remainder=False)
  steps = its[0].steps_per_epoch
  assert steps == -(-n // (batch_size * count))
  for epoch in range(3):
    seen = []
    for it in its:
      batches = _take(it, steps)
      assert all(len(b) <= batch_size for b in batches)
      seen += [x for b in batches for x in b]
      assert it.state_dict()["epoch"] == epoch + 1 and it.position == 0
    assert sorted(seen) == sorted(f"ex{i}" for i in range(n))   # each exactly once


@pytest.mark.parametrize("count", [1, 2, 3])
def test_drop_remainder_full_batches_no_duplicates(count):
  n, batch_size = 23, 3
  its = _iters(n, batch_size, count, seed=0, drop_remainder=True)
  steps = n // (batch_size * count)
  assert its[0].steps_per_epoch == steps
  seen = []
  for it in its:
    batches = _take(it, steps)
    assert all(len(b) == batch_size for b in batches)
    seen += [x for b in batches for x in b]
    assert it.epoch == 1
  assert len(seen) == len(set(seen)) == steps * batch_size * count


def test_global_batches_do_not_depend_on_process_count():
  """Step s's global batch is the same whether 1 process takes it all or 3 split it."""
  one = _iters(30, 6, 1, seed=5)[0]
  three = _iters(30, 2, 3, seed=5)
  for _ in range(12):   # crosses two epoch boundaries
    assert next(one) == [x for it in three for x in next(it)]


def test_reshuffles_each_epoch_and_is_deterministic_by_seed():
  n = 50
  a = _iters(n, 10, 1, seed=7)[0]
  b = _iters(n, 10, 1, seed=7)[0]
  c = _iters(n, 10, 1, seed=8)[0]
  ea, eb, ec = (sum(_take(x, 10), []) for x in (a, b, c))   # two epochs each
  assert ea == eb
  assert ea != ec
  first, second = ea[:n], ea[n:]
  assert sorted(first) == sorted(second) == sorted(f"ex{i}" for i in range(n))
  assert first != second
  assert first != [f"ex{i}" for i in range(n)]


def test_no_shuffle_keeps_order_and_num_epochs_stops():
  it = _iters(7, 3, 1, shuffle=False, drop_remainder=False, num_epochs=2)[0]
  assert list(it) == [["ex0", "ex1", "ex2"], ["ex3", "ex4", "ex5"], ["ex6"]] * 2
  assert it.state_dict()["epoch"] == 2
  with pytest.raises(StopIteration):
    next(it)


def test_last_batch_split_evenly_may_be_empty():
  its = _iters(9, 2, 4, shuffle=False, drop_remainder=False)   # global batch 8, remainder 1
  assert [next(it) for it in its] == [["ex0", "ex1"], ["ex2", "ex3"], ["ex4", "ex5"],
                                      ["ex6", "ex7"]]
  assert [next(it) for it in its] == [["ex8"], [], [], []]


@pytest.mark.parametrize("drop_remainder", [True, False])
@pytest.mark.parametrize("count", [1, 3])
def test_resume_yields_the_uninterrupted_stream(drop_remainder, count):
  kw = dict(seed=11, drop_remainder=drop_remainder)
  reference = [_take(it, 20) for it in _iters(17, 2, count, **kw)]
  for cut in (0, 1, 2, 3, 5, 9, 19):
    states = []
    for p, it in enumerate(_iters(17, 2, count, **kw)):
      assert _take(it, cut) == reference[p][:cut]
      states.append(json.loads(json.dumps(it.state_dict())))   # through JSON, like a checkpoint
    assert all(s == states[0] for s in states)                  # identical on every process
    for p, it in enumerate(_iters(17, 2, count, **kw)):
      it.load_state_dict(states[p])
      assert _take(it, 20 - cut) == reference[p][cut:]


def test_collate_and_defaults_from_jax():
  it = BatchIterator(list(range(6)), 2, seed=0, collate=sum)
  assert (it.process_index, it.process_count) == (0, 1)   # jax on one CPU host
  assert sum(_take(it, 3)) == 15


def test_bad_arguments_and_state():
  with pytest.raises(ValueError, match="no batch per epoch"):
    BatchIterator([1, 2, 3], 2, process_index=0, process_count=2)
  with pytest.raises(ValueError, match="process_index"):
    BatchIterator([1, 2, 3], 1, process_index=2, process_count=2)
  it = BatchIterator(list(range(10)), 2, seed=1, process_index=0, process_count=1)
  state = it.state_dict()
  other = BatchIterator(list(range(10)), 2, seed=2, process_index=0, process_count=1)
  with pytest.raises(ValueError, match="'seed'"):
    other.load_state_dict(state)
  shorter = BatchIterator(list(range(9)), 2, seed=1, process_index=0, process_count=1)
  with pytest.raises(ValueError, match="'num_items'"):
    shorter.load_state_dict(state)
  with pytest.raises(ValueError, match="'position'"):
    it.load_state_dict({**state, "position": 3})


def test_length_grouping_keeps_every_item_and_narrows_batches():
  rng = np.random.default_rng(0)
  lengths = rng.integers(10, 200, size=96)
  items = list(range(96))
  plain = BatchIterator(items, batch_size=8, seed=3, process_index=0, process_count=1)
  grouped = BatchIterator(items, batch_size=8, seed=3, process_index=0, process_count=1,
                          lengths=lengths, length_window=4)
  spread = lambda it: np.mean([np.ptp(lengths[next(it)]) for _ in range(12)])
  assert spread(grouped) < 0.5 * spread(plain)        # one epoch each: 12 batches of 8
  for epoch in range(2):                               # each epoch: every item exactly once
    seen = sorted(i for b in range(12) for i in grouped.local_indices(epoch, b * 8))
    assert seen == items
  # deterministic by (seed, epoch), so a resumed iterator continues the same stream
  first = [next(grouped) for _ in range(5)]
  again = BatchIterator(items, batch_size=8, seed=3, process_index=0, process_count=1,
                        lengths=lengths, length_window=4)
  again.load_state_dict({**grouped.state_dict(), "position": 0, "epoch": 1})
  assert [next(again) for _ in range(5)] == first
  with pytest.raises(ValueError, match="length_window"):
    plain.load_state_dict(grouped.state_dict())
  with pytest.raises(ValueError, match="lengths has 3"):
    BatchIterator(items, batch_size=8, lengths=[1, 2, 3], length_window=2, process_index=0,
                  process_count=1)
