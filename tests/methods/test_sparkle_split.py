"""SPARKLE's validation split (appendix D.3: 9,000 sampled training questions -> 7,500 train and
1,500 validation): seeded, disjoint, nothing lost."""
from configs import sparkle
from rlrag_jax.methods.sparkle import task


def test_validation_split_is_seeded_disjoint_and_the_papers_sizes():
  qs = [f"q{i}" for i in range(9000)]
  train, valid = task.split_validation(qs, 1 / 6, seed=0)
  assert (len(train), len(valid)) == (7500, 1500)
  assert not set(train) & set(valid) and sorted(train + valid) == sorted(qs)
  held = set(valid)
  assert train == [q for q in qs if q not in held]          # training order kept
  assert task.split_validation(qs, 1 / 6, seed=0) == (train, valid)
  assert task.split_validation(qs, 1 / 6, seed=1)[1] != valid
  # 12 questions at 1/6: round(2.0) = 2 held out; 0: none (every preset but 'paper').
  assert [len(x) for x in task.split_validation(list(range(12)), 1 / 6, 3)] == [10, 2]
  assert task.split_validation(list(range(12)), 0.0, 3) == (list(range(12)), [])
  assert sparkle.get_config("paper").sparkle.valid_fraction == 1 / 6
  c = sparkle.get_config("")
  assert (c.sparkle.valid_fraction, c.sparkle.eval_on) == (0.0, "eval")
