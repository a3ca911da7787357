"""The step's batch (`training.batch`): the padding arithmetic, whole silenced groups under
fresh ids, and a padded step whose real advantages are the unpadded ones, through the
collection and the learner, for flat groups and for a tree's uneven, task-named groups."""
import itertools

import jax
import numpy as np
import pytest

from configs import arena
from stub_task import StubTask
from rlrag_jax.models import ModelConfig, init_params, sharding
from rlrag_jax import trainer
from rlrag_jax.rl import batching
from rlrag_jax.tasks import Episode, Group
from rlrag_jax.training import batch as batch_lib
from rlrag_jax.training import collection, learners

CFG = ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                  num_kv_heads=1, head_dim=8, max_position_embeddings=64, model_type="llama",
                  tie_word_embeddings=True, eos_token_id=(1,), pad_token_id=0)


# ---------------------------------------------------------------- arithmetic
def test_padded_size_is_the_smallest_multiple_of_the_unit():
  for n in range(1, 200):
    for unit in (1, 3, 8, 48):
      want = next(m for m in itertools.count(n) if m % unit == 0)     # by search
      assert batch_lib.padded_size(n, unit) == want
  with pytest.raises(ValueError, match="must be >= 1"):
    batch_lib.padded_size(0, 8)


def test_arena_paper_with_48_micro_batches_pads_1792_to_1824():
  """ARENA ':paper': 256 prompts x 7 samples = 1,792 episodes; 48 micro-batches make the unit
  48. 1,824 = 38 x 48 is the next multiple: 32 padding episodes, 4 groups of 7 and 4 of one.
  Before, the count went to the varying-count bucket 2,304 (2,304 % 7 = 1)."""
  c = arena.get_config("paper")
  c.rl.micro_batches = 48
  n = int(c.rl.prompts_per_step) * int(c.rl.group_size)
  unit = batching.episode_unit(c.rl)
  assert (n, unit) == (1792, 48) and n % unit == 16
  assert batch_lib.padded_size(n, unit) == 1824 == 38 * 48
  assert batch_lib.padding_groups(1824 - 1792, 7) == (4, 4)
  assert collection.batch_size(n, c.rl) == 2304
  # whole groups of 7 alone: 7k = 32 (mod 48) first at k = 32, 224 episodes
  assert min(k for k in range(1, 49) if (n + 7 * k) % 48 == 0) == 32


def test_padding_groups_splits_into_whole_groups_then_singletons():
  assert batch_lib.padding_groups(0, 3) == (0, 0)
  assert batch_lib.padding_groups(4, 3) == (1, 1)
  assert batch_lib.padding_groups(5, 1) == (5, 0)
  assert batch_lib.padding_groups(14, 7) == (2, 0)
  for n_pad in range(40):
    for g in (1, 2, 5, 7):
      whole, single = batch_lib.padding_groups(n_pad, g)
      assert whole * g + single == n_pad and 0 <= single < g


# ---------------------------------------------------------------- silencing and ids
def _ep(tag, n=2):
  return Episode(example=tag, prompt_ids=[1], completion_ids=[2] * n, loss_mask=[1] * n,
                 text=tag, info={"k": tag})


def test_silenced_copies_are_their_own_and_the_originals_untouched():
  grp = Group([_ep("x"), _ep("x")], [{"total": 1.0}, {"total": 0.0}])
  got = batch_lib.silence_group(grp)
  assert got.padding and not grp.padding
  assert all(e.loss_mask == [0, 0] and e.completion_ids == [2, 2] for e in got.episodes)
  assert got.rewards == grp.rewards
  got.episodes[0].info["k"] = "changed"
  got.rewards[0]["total"] = 9.0
  assert grp.episodes[0].info["k"] == "x" and grp.rewards[0]["total"] == 1.0
  assert not any(e.loss_mask != [1, 1] for e in grp.episodes)


def test_groups_get_ids_in_order_and_padding_fresh_ids():
  groups = [Group([_ep("a"), _ep("a")], [{"total": 1.0}] * 2),
            Group([_ep("b")], [{"total": 2.0}])]
  b = batch_lib.from_groups(groups, silenced=[Group([_ep("f")], [{"total": 3.0}])])
  assert list(b.group_ids) == [0, 0, 1, 2] and list(b.live) == [True, True, True, False]
  assert sum(b.episodes[3].loss_mask) == 0 and sum(b.episodes[0].loss_mask) == 2
  p = batch_lib.pad(b, 10, group_size=4)       # 6 more: one group of 4, two of one
  assert list(p.group_ids) == [0, 0, 1, 2, 3, 3, 3, 3, 4, 5]
  assert list(p.live) == [True] * 3 + [False] * 7
  assert [e.example for e in p.episodes[4:]] == ["a", "a", "b", "f", "a", "a"]
  assert [s["total"] for s in p.rewards[4:]] == [1.0, 1.0, 2.0, 3.0, 1.0, 1.0]
  assert all(sum(e.loss_mask) == 0 for e in p.episodes[3:])
  assert batch_lib.pad(b, 4, 4).group_ids.tolist() == [0, 0, 1, 2]
  with pytest.raises(ValueError, match="cannot be padded to 3"):
    batch_lib.pad(b, 3, 4)


# ---------------------------------------------------------------- a padded step
def _config(**rl):
  c = arena.get_config("")
  c.rl.group_size, c.rl.prompts_per_step, c.rl.micro_batches = 3, 4, 8
  c.rl.kl_beta, c.rl.mu, c.rl.pack_bucket = 0.0, 1, 8
  c.rl.update(rl)
  return c


def _recorded_advantages(c, batch):
  """The advantages and loss mask the learner hands its update step for `batch`."""
  mesh = sharding.make_mesh(data=1, fsdp=1, tensor=1)
  steps = trainer.Steps(c, CFG, mesh, 0, 2)
  learner = learners.make_learner(c, steps, mesh, CFG, pad_id=0)
  seen = {}
  steps.rl_step = lambda st, b, start: (seen.update(
      {k: np.asarray(v) for k, v in b.items()}) or st, {"loss": 0.0})
  state = steps.new_state(init_params(steps.module, jax.random.PRNGKey(0)), "rl")
  learner.update(state, None, batch, None, jax.random.PRNGKey(1))
  return seen["advantages"], seen["loss_mask"]


def _np_advantages(totals, ids, scale_std=True, eps=1e-4):
  """GRPO per group by a plain loop (float64): (r - mean) / (sample std + eps), 0 alone."""
  totals, ids = np.asarray(totals, np.float64), np.asarray(ids)
  out = np.zeros_like(totals)
  for g in set(ids.tolist()):
    m = ids == g
    r = totals[m]
    a = r - r.mean()
    if scale_std:
      a = a / ((r.std(ddof=1) if r.size > 1 else 0.0) + eps)
    out[m] = a
  return out


def _rollout_task(values):
  """4 prompts x 3 samples of the default collect; episode i's reward is values[i]."""
  def rollout(policy, exs, key, group_size):
    return [Episode(example=ex, prompt_ids=[3, 4 + i % 5], completion_ids=[5 + i % 7, 6],
                    loss_mask=[1, 1], text="", info={"v": values[i]})
            for i, ex in enumerate(e for e in exs for _ in range(group_size))]
  return StubTask(rollout=rollout,
                  rewards=lambda eps, step: [{"total": e.info["v"]} for e in eps])


def _tree_task(sizes, values):
  """A tree's decisions: Groups of uneven sizes (SPARKLE / R2AG style), rewards `values` in
  order."""
  class Tree(StubTask):
    def collect(self, policy, exs, key, *, group_size, want, step):
      groups, k = [], 0
      for j, size in enumerate(sizes):
        eps = [Episode(example=j, prompt_ids=[3, 4 + j], completion_ids=[5 + i, 6],
                       loss_mask=[1, 1], text="", info={"v": values[k + i]})
               for i in range(size)]
        groups.append(Group(eps, [{"total": e.info["v"]} for e in eps]))
        k += size
      return groups
  return Tree()


@pytest.mark.parametrize("algo", ["grpo", "dr_grpo", "rloo"])
@pytest.mark.parametrize("kind", ["flat", "tree"])
def test_padded_step_keeps_the_real_advantages(kind, algo):
  """Group size 3, 4 prompts, 8 micro-batches: 12 episodes pad to 16 (one silenced group of
  3, one of 1, fresh ids); a tree's 11 decisions in groups 4, 1, 3, 2, 1 pad to 16 (one group
  of 3, two of 1). The real episodes' advantages are those of the same step unpadded (1
  micro-batch), exactly, and a per-group reference; the padding has advantage 0, loss mask 0."""
  rng = np.random.default_rng(0)
  if kind == "flat":
    values = rng.integers(0, 3, 12).astype(float).tolist()
    task, n, ids = _rollout_task(values), 12, np.repeat(np.arange(4), 3)
    want_ids = list(ids) + [4, 4, 4, 5]
  else:
    sizes = (4, 1, 3, 2, 1)
    values = rng.normal(size=11).round(3).tolist()
    task, n, ids = _tree_task(sizes, values), 11, np.repeat(np.arange(5), sizes)
    want_ids = list(ids) + [5, 5, 5, 6, 7]
  c = _config(algo=algo)
  batch, fill = collection.collect(task, None, itertools.repeat(list("wxyz")),
                                   jax.random.PRNGKey(0), c, 1)
  assert len(batch) == 16 and fill["padded_episodes"] == 16 - n
  assert list(batch.group_ids) == want_ids and list(batch.live) == [True] * n + [False] * (16 - n)
  adv, mask = _recorded_advantages(c, batch)

  # the same groups unpadded, in one micro-batch
  plain = batch_lib.from_groups(task.collect(None, list("wxyz"), None, group_size=3, want=4,
                                             step=1))
  assert len(plain) == n
  adv1, _ = _recorded_advantages(_config(algo=algo, micro_batches=1), plain)
  np.testing.assert_array_equal(adv[:n], adv1)
  np.testing.assert_array_equal(adv[n:], 0.0)
  assert mask[:n].sum() == 2 * n and not mask[n:].any()
  if algo == "rloo":
    ref = np.zeros(n)
    for g in set(ids.tolist()):
      m = ids == g
      r = np.asarray(values)[m]
      ref[m] = (r - (r.sum() - r) / (r.size - 1)) if r.size > 1 else 0.0
  else:
    ref = _np_advantages(values, ids, scale_std=algo == "grpo")
  np.testing.assert_allclose(adv[:n], ref, rtol=1e-5, atol=1e-5)
