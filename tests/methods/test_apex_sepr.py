"""SEPR against an independent computation: the best one-to-one matching found by brute force
over every injective assignment, and hand-computed F1 values."""
import itertools

import numpy as np
import pytest

from rlrag_jax.methods.apex import sepr


def brute_force_sepr(sim, threshold):
  """Enumerates every one-to-one assignment of the smaller side into the larger, keeps one of
  minimal total cost 1 - sim, counts its pairs at or above the threshold, returns the F1."""
  sim = np.asarray(sim, float)
  p, g = sim.shape
  if p == 0 or g == 0:
    return 0.0
  best_cost, best_pairs = None, None
  if p <= g:
    for cols in itertools.permutations(range(g), p):
      pairs = list(zip(range(p), cols))
      cost = sum(1 - sim[i, j] for i, j in pairs)
      if best_cost is None or cost < best_cost - 1e-12:
        best_cost, best_pairs = cost, pairs
  else:
    for rows in itertools.permutations(range(p), g):
      pairs = list(zip(rows, range(g)))
      cost = sum(1 - sim[i, j] for i, j in pairs)
      if best_cost is None or cost < best_cost - 1e-12:
        best_cost, best_pairs = cost, pairs
  m = sum(sim[i, j] >= threshold for i, j in best_pairs)
  if m == 0:
    return 0.0
  prec, rec = m / p, m / g
  return 2 * prec * rec / (prec + rec)


def test_matches_brute_force_on_random_small_cases():
  rng = np.random.default_rng(0)
  for _ in range(300):
    p, g = rng.integers(1, 5, size=2)
    # Distinct values: the optimal assignment is unique, so the kept-pair count is too.
    sim = rng.uniform(0.3, 1.0, size=(p, g)) + rng.uniform(0, 1e-6, size=(p, g))
    tau = rng.uniform(0.5, 0.95)
    assert sepr.sepr_from_similarity(sim, tau) == pytest.approx(brute_force_sepr(sim, tau))


def test_hand_computed_values():
  # Two predicted, three gold: one pair above the threshold -> P 1/2, R 1/3, F1 0.4.
  sim = np.array([[0.95, 0.10, 0.20],
                  [0.30, 0.60, 0.50]])
  assert sepr.sepr_from_similarity(sim, 0.9) == pytest.approx(0.4)
  # The same with a lower threshold: both assigned pairs count -> P 1, R 2/3, F1 0.8.
  assert sepr.sepr_from_similarity(sim, 0.55) == pytest.approx(0.8)
  # A perfect plan.
  assert sepr.sepr_from_similarity(np.eye(3), 0.9) == 1.0


def test_hungarian_not_greedy():
  # Greedy on the best cell takes (0, 0) = 0.95 and leaves row 1 with 0.1; the optimal
  # assignment takes 0.9 + 0.92 and both pairs clear 0.85.
  sim = np.array([[0.95, 0.90],
                  [0.92, 0.10]])
  assert sepr.sepr_from_similarity(sim, 0.85) == 1.0
  assert sorted(sepr.match_pairs(sim, 0.85)) == [(0, 1), (1, 0)]


def test_order_invariance():
  rng = np.random.default_rng(1)
  sim = rng.uniform(0.5, 1.0, size=(4, 3))
  base = sepr.sepr_from_similarity(sim, 0.8)
  for perm_r in itertools.permutations(range(4)):
    for perm_c in itertools.permutations(range(3)):
      assert sepr.sepr_from_similarity(sim[list(perm_r)][:, list(perm_c)], 0.8) == base


def test_just_below_threshold_does_not_match():
  tau = 0.9
  assert sepr.sepr_from_similarity(np.array([[tau]]), tau) == 1.0
  assert sepr.sepr_from_similarity(np.array([[np.nextafter(tau, 0)]]), tau) == 0.0


def test_unequal_lengths_and_empty_plans():
  # Three predicted, one gold, all matched as well as possible: P 1/3, R 1 -> F1 0.5.
  assert sepr.sepr_from_similarity(np.full((3, 1), 0.99), 0.9) == pytest.approx(0.5)
  assert sepr.sepr_from_similarity(np.full((1, 4), 0.99), 0.9) == pytest.approx(0.4)
  assert sepr.sepr_from_similarity(np.zeros((0, 3)), 0.9) == 0.0
  assert sepr.sepr_from_similarity(np.zeros((2, 0)), 0.9) == 0.0
  with pytest.raises(ValueError):
    sepr.sepr_from_similarity(np.array([[np.nan]]), 0.9)


class _TableEncoder:
  """A stand-in encoder: fixed unit vectors per text; counts calls."""

  def __init__(self, table):
    self.table = {k: np.asarray(v, float) / np.linalg.norm(v) for k, v in table.items()}
    self.calls = []

  # queries and passages without prefixes, as the packaged MiniLM
  encode_queries = encode_passages = property(lambda self: self.encode)

  def encode(self, texts, batch_size=64):
    self.calls.append(list(texts))
    return np.stack([self.table[t] for t in texts])


def test_scorer_batches_one_encode_call_and_dedups_texts():
  enc = _TableEncoder({"a": [1, 0, 0], "a'": [0.99, 0.14, 0], "b": [0, 1, 0], "c": [0, 0, 1]})
  scorer = sepr.SEPRScorer(enc, threshold=0.9)
  out = scorer([["a'", "b"], ["c"], [], ["a", "a"]], [["a", "b"], ["b"], ["a"], ["a"]])
  assert len(enc.calls) == 1 and sorted(enc.calls[0]) == ["a", "a'", "b", "c"]
  assert out == pytest.approx([1.0, 0.0, 0.0, 2 * 0.5 * 1 / 1.5])
  with pytest.raises(ValueError):
    scorer([["a"]], [])


def test_real_encoder_paraphrase_above_threshold_and_other_steps_below():
  from rlrag_jax.retrieval.encoder import Encoder
  scorer = sepr.SEPRScorer(Encoder.from_pretrained(max_length=64))
  gold = [["Who directed The Glass Harbour?", "In which city was #1 born?"]]
  paraphrased = [["In which city was #1 born?", "Who was the director of The Glass Harbour?"]]
  wrong_entity = [["Who directed The Stone Crown?", "In which city was #1 born?"]]
  assert scorer(paraphrased, gold) == [1.0]               # order and wording do not matter
  assert scorer(wrong_entity, gold) == [pytest.approx(0.5)]
  assert scorer([["Who directed The Glass Harbour?"]], gold) == [pytest.approx(2 / 3)]
