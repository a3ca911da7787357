"""Planner output parsing (never raises; falls back to the question), gold plans, references,
and the threshold calibration's pair building."""
import random
import string

import numpy as np

from rlrag_jax.data import world as world_lib
from rlrag_jax.methods.apex import calibrate, plans

Q = "Where was the director of The Glass Harbour born?"


def test_parse_numbered_plan():
  text = "1. Who directed The Glass Harbour?\n2) In which city was #1 born?\n"
  p = plans.parse(text, Q, max_steps=4)
  assert p.steps == ("Who directed The Glass Harbour?", "In which city was #1 born?")
  assert not p.fallback
  assert plans.parse(plans.render(p.steps), Q, 4) == p       # render and parse round trip


def test_parse_ignores_unnumbered_lines():
  text = "Plan:\n1. Who directed X?\nsome note\n2. Where was #1 born?"
  assert plans.parse(text, Q, 4).steps == ("Who directed X?", "Where was #1 born?")


def test_malformed_plans_fall_back_to_the_question():
  cases = {
      "": "no numbered step",
      "no steps here": "no numbered step",
      "1. a?\n3. b?": "numbering",
      "2. a?": "numbering",
      "1. a?\n1. b?": "numbering",
      "1. Who is #1?": "refers to #1",
      "1. a?\n2. b about #3?": "refers to #3",
      "1. a?\n2. b about #0?": "refers to #0",
      "1. a\n2. b\n3. c\n4. d\n5. e": "more than 4",
  }
  for text, reason in cases.items():
    p = plans.parse(text, Q, max_steps=4)
    assert p.fallback and p.steps == (Q,), text
    assert reason in p.reason, (text, p.reason)
  assert plans.parse(None, Q, 4).fallback
  assert plans.parse(b"1. bytes", Q, 4).fallback


def test_parse_never_raises_on_random_text():
  rng = random.Random(0)
  alphabet = string.printable + "#１２é\u2028"
  for _ in range(2000):
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80)))
    p = plans.parse(text, Q, max_steps=3)
    assert 1 <= len(p.steps) <= 3 and all(isinstance(s, str) and s for s in p.steps)


def test_gold_steps_and_reference_resolution():
  w = world_lib.build(seed=0, num_questions=60)
  ex = next(e for e in w.train if len(e.decomposition) >= 3)
  gold = plans.gold_steps(ex)
  assert gold == [s.question for s in ex.decomposition]
  assert not plans.parse(plans.render(gold), ex.question, 6).fallback   # gold plans parse
  answers = [s.answer for s in ex.decomposition]
  for k, step in enumerate(gold):
    assert all(r <= k for r in plans.references(step))
    assert "#" not in plans.resolve(step, answers[:k])
  assert plans.resolve("Who is #2 and #12?", ["a", "b"]) == "Who is b and #12?"
  assert plans.resolve("Who is #1?", [""]) == "Who is #1?"
  no_dec = world_lib.build(seed=0, num_questions=60).train[0]
  no_dec.decomposition = []
  assert plans.gold_steps(no_dec) == [no_dec.question]


def test_calibration_pairs_are_what_they_say():
  w = world_lib.build(seed=0, num_questions=200)
  pairs = calibrate.build_pairs(w, max_per_kind=50)
  assert all(len(pairs[k]) > 10 for k in calibrate.KINDS)
  rx = calibrate._template_regexes()          # pylint: disable=protected-access

  def parse(text):
    for rel, i, r in rx:
      m = r.match(text)
      if m:
        return rel, i, m.group("x")
    raise AssertionError(text)

  for a, b in pairs["paraphrase"]:
    (ra, ia, xa), (rb, ib, xb) = parse(a), parse(b)
    assert ra == rb and xa == xb and ia != ib
  for a, b in pairs["other relation, same subject"]:
    (ra, _, xa), (rb, _, xb) = parse(a), parse(b)
    assert ra != rb and xa == xb
  for a, b in pairs["same relation, other subject"]:
    (ra, _, xa), (rb, _, xb) = parse(a), parse(b)
    assert ra == rb and xa != xb


def test_choose_threshold_hand_case():
  pos = np.array([0.95, 0.92, 0.88])
  neg = np.array([0.5, 0.86, 0.91])
  best = calibrate.choose_threshold(pos, neg, grid=[0.85, 0.87, 0.9, 0.93])
  # 0.85: TPR 1, TNR 1/3; 0.87: 1, 2/3; 0.9: 2/3, 2/3; 0.93: 1/3, 1 -> 0.87.
  assert best["threshold"] == 0.87
  assert best["tpr"] == 1.0 and abs(best["tnr"] - 2 / 3) < 1e-12
