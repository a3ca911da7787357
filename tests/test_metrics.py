"""rlrag_jax.metrics against hand-computed values."""
import pytest

from rlrag_jax.metrics import (average_precision, exact_match, f1, full_recall_at_k,
                               normalize_answer, recall_at_k)


@pytest.mark.parametrize("raw,normalized", [
    ("The Eiffel Tower!", "eiffel tower"),
    ("An_apple, a day.", "apple day"),          # underscore -> space, articles dropped
    ("new_york", "new york"),                   # underscore splits, not joins
    ("U.S.A.", "usa"),                          # punctuation removed inside tokens
    ("Theater of the Absurd", "theater of absurd"),   # 'the' only as a whole word
    ("  A   an  THE  ", ""),
    ("Rock-'n'-roll", "rocknroll"),
])
def test_normalize_answer(raw, normalized):
  assert normalize_answer(raw) == normalized


def test_exact_match():
  assert exact_match("the  Eiffel_Tower.", ["Eiffel Tower"]) == 1.0
  assert exact_match("Eiffel", ["Eiffel Tower"]) == 0.0
  assert exact_match("New_York", "new york") == 1.0            # a single string is one alias
  assert exact_match("NYC", ["New York City", "nyc"]) == 1.0   # best over aliases
  assert exact_match("no", ["yes"]) == 0.0
  assert exact_match("anything", []) == 0.0


def test_f1_partial_overlap():
  # pred -> [quick, brown, fox] (3), gold -> [quick, red, fox, jumps] (4), common 2:
  # P = 2/3, R = 1/2, F1 = 2PR / (P + R) = 4/7.
  assert f1("The quick brown fox", "quick red fox jumps") == pytest.approx(4 / 7)
  # Repeated tokens count with multiplicity: pred [a1, a1, b] vs gold [a1, b, b]: common 2,
  # P = R = 2/3 -> F1 = 2/3.
  assert f1("a1 a1 b", "a1 b b") == pytest.approx(2 / 3)
  # Best over aliases: 'paris' vs ['paris france' (F1 2/3), 'paris' (1.0)].
  assert f1("Paris", ["Paris, France", "paris"]) == 1.0
  assert f1("Paris", ["Paris, France"]) == pytest.approx(2 / 3)
  assert f1("london", ["paris"]) == 0.0
  assert f1("the", "a") == 1.0          # both normalise to nothing
  assert f1("x", "the") == 0.0
  assert f1("x", []) == 0.0


RANKED = ["d3", "d1", "d7", "d2", "d5"]


def test_recall_and_full_recall():
  gold = {"d1", "d2", "d9"}
  assert recall_at_k(RANKED, gold, 1) == 0.0
  assert recall_at_k(RANKED, gold, 2) == pytest.approx(1 / 3)
  assert recall_at_k(RANKED, gold, 4) == pytest.approx(2 / 3)
  assert recall_at_k(RANKED, gold, 10) == pytest.approx(2 / 3)
  assert recall_at_k(RANKED, [], 3) == 0.0
  assert full_recall_at_k(RANKED, gold, 5) == 0.0
  assert full_recall_at_k(RANKED, ["d1", "d2"], 3) == 0.0
  assert full_recall_at_k(RANKED, ["d1", "d2"], 4) == 1.0
  assert full_recall_at_k(RANKED, [], 4) == 0.0


def test_average_precision():
  # Hits at ranks 2 and 4: precisions 1/2 and 2/4; d9 never retrieved -> divide by 3.
  assert average_precision(RANKED, {"d1", "d2", "d9"}) == pytest.approx((1 / 2 + 2 / 4) / 3)
  assert average_precision(RANKED, {"d3", "d1"}) == 1.0
  # Hits at ranks 3 and 5: (1/3 + 2/5) / 2.
  assert average_precision(RANKED, ["d7", "d5"]) == pytest.approx((1 / 3 + 2 / 5) / 2)
  # A repeated id is counted once: hits at ranks 1 and 3 -> (1 + 2/3) / 2.
  assert average_precision(["d1", "d1", "d2"], {"d1", "d2"}) == pytest.approx(5 / 6)
  assert average_precision(RANKED, []) == 0.0
  assert average_precision([], {"d1"}) == 0.0
