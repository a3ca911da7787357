"""The RR-Forest's level walk, bounds, pruning and JSON state; the oracle; tree inference."""
import json

import pytest

from rlrag_jax.data.schema import Step
from rlrag_jax.methods.r2ag import forest as F
from rlrag_jax.methods.r2ag import inference, parsing, prompts


def outcome(ctx, finished=False, verts=()):
  return F.Outcome(list(verts), tuple(ctx), finished)


def test_levels_continuations_and_bounds():
  f = F.Forest(5, F.ForestConfig(size=2, max_iterations=3, max_children=2, max_size=3), seed=0)
  items = f.take(2)
  assert [i.iteration for i in items] == [0, 0] and len({i.tree for i in items}) == 2
  a, b = items
  # tree a: three rollouts end at three contexts -> the two with most gold go on; one finishes.
  f.expand(a, [outcome(["g1"], verts=[("q1", "g1", "base", True)]),
               outcome(["g1", "g2"], verts=[("q1", "g1", "base", True),
                                            ("p", "g2", "pred", True)]),
               outcome([]), outcome(["g1", "g2", "g3"], finished=True)])
  # tree b: every rollout found nothing -> one continuation at the empty context (root only)
  f.expand(b, [outcome([]), outcome([])])
  nxt = f.take(3)
  assert {(i.tree, i.context) for i in nxt} == {(a.tree, ("g1", "g2")), (a.tree, ("g1",)),
                                                (b.tree, ())}
  assert all(i.iteration == 1 for i in nxt)
  tip = {i.context: i.tip for i in nxt}
  verts = f.trees[a.tree]["vertices"]
  assert verts[tip[("g1", "g2")]]["query"] == "p" and verts[tip[("g1",)]]["query"] == "q1"
  assert f.trees[a.tree]["complete"] and not f.trees[b.tree]["complete"]
  # the same (query, doc) under one tip is one vertex: root + q1/g1 + p/g2
  assert len(verts) == 3
  for it in nxt:
    f.expand(it, [outcome(it.context + ("z",))])
  last = f.take(3)
  assert all(i.iteration == 2 for i in last)
  for it in last:                                  # iteration 2 is the last (max_iterations 3)
    f.expand(it, [outcome(it.context + ("w",))])
  assert f.next == {}
  fresh = f.take(2)                                # spent: a new forest over the next questions
  assert f.forests == 2 and all(i.iteration == 0 for i in fresh)
  assert len(f.finished) == 2


def test_a_short_level_is_topped_up_with_repeats():
  f = F.Forest(3, F.ForestConfig(size=3), seed=1)
  first = f.take(2)
  rest = f.take(2)
  assert len(rest) == 2 and rest[0].key() not in {i.key() for i in first}
  assert rest[1].key() in {i.key() for i in first + rest[:1]}


def test_level_size_is_capped():
  f = F.Forest(4, F.ForestConfig(size=4, max_children=4, max_size=5), seed=0)
  for it in f.take(4):
    f.expand(it, [outcome([f"a{it.tree}"]), outcome([f"b{it.tree}"]), outcome([])])
  assert len(f.next) == 12
  f.take(1)
  assert len(f.level) == 5


def test_prune_keeps_positive_branches_bottom_up():
  v = [{"id": 0, "parent": -1, "weight": 0},
       {"id": 1, "parent": 0, "weight": 0},      # zero weight, but a positive descendant (3)
       {"id": 2, "parent": 0, "weight": 0},      # zero-weight leaf: pruned
       {"id": 3, "parent": 1, "weight": 1},
       {"id": 4, "parent": 3, "weight": 0},      # zero-weight leaf under a positive vertex
       {"id": 5, "parent": 0, "weight": 1}]
  assert [x["id"] for x in F.prune(v)] == [0, 1, 3, 5]
  assert [x["id"] for x in F.prune(v[:3])] == [0]


def test_state_round_trip_continues_exactly():
  def run(f, steps, start=0):
    seen = []
    for s in range(start, steps):
      items = f.take(3)
      seen.append([(i.tree, i.context, i.iteration) for i in items])
      for k, it in enumerate(items):
        f.expand(it, [outcome(it.context + (f"d{s}{k}",), verts=[(f"q{s}", f"d{s}{k}", "base",
                                                                   True)]),
                      outcome(it.context, finished=(s + k) % 4 == 0)])
    return seen
  cfg = F.ForestConfig(size=4, max_iterations=3, max_children=2, max_size=5)
  whole = run(F.Forest(9, cfg, seed=3), 12)
  f = F.Forest(9, cfg, seed=3)
  part = run(f, 5)
  g = F.Forest(9, cfg, seed=3)
  g.load_state_dict(json.loads(json.dumps(f.state_dict())))
  assert part + run(g, 12, start=5) == whole


def test_bad_bounds_are_errors():
  with pytest.raises(ValueError, match="r2ag.forest.max_children"):
    F.Forest(3, F.ForestConfig(max_children=0))
  with pytest.raises(ValueError, match="r2ag.forest.carry.*'all'"):
    F.Forest(3, F.ForestConfig(carry="all"))


def test_branch_contexts_rank_by_gold_found_then_length():
  """carry='branch': a context holds non-gold documents too, so the continuations kept are
  those with the most gold (`found`), then the longer context, not merely the longest."""
  f = F.Forest(2, F.ForestConfig(size=1, max_children=2, carry="branch"), seed=0)
  (it,) = f.take(1)
  f.expand(it, [F.Outcome([], ("x1", "x2", "x3"), False, found=0),   # longest, no gold
                F.Outcome([], ("g1", "x1"), False, found=1),
                F.Outcome([], ("g1",), False, found=1),
                F.Outcome([], ("g1", "g2"), False, found=2)])
  assert [i.context for i in f.take(2)] == [("g1", "g2"), ("g1", "x1")]


# ------------------------------------------------------------------------------ the oracle
BRIDGE = [Step("Who is the author of The Road?", "Ann Bel", ["b1"]),
          Step("Where was #1 born?", "Tarn", ["p1"])]
COMPARE = [Step("Who directed X?", "Ed", ["f1"]), Step("When was #1 born?", "1900", ["p1"]),
           Step("Who directed Y?", "Al", ["f2"]), Step("When was #3 born?", "1903", ["p2"]),
           Step("Who was born first, #1 (born #2) or #3 (born #4)?", "Ed", [])]


def test_oracle_chain_on_a_bridge_question():
  gold = ["b1", "p1"]
  assert prompts.oracle_contexts(BRIDGE, gold) == [(), ("b1",), ("b1", "p1")]
  s = parsing.parse(prompts.oracle_step(BRIDGE, gold, ()))
  assert s.base == ("Who is the author of The Road?",)
  assert s.predicted == ("Where was Ann Bel born?",)         # the oracle knows the next hop
  s = parsing.parse(prompts.oracle_step(BRIDGE, gold, ("b1",)))
  assert s.base == ("Where was Ann Bel born?",) and s.predicted == ()
  s = parsing.parse(prompts.oracle_step(BRIDGE, gold, ("b1", "p1")))
  assert s.stop and s.queries == ()
  assert parsing.parse(prompts.oracle_step(BRIDGE, gold, (), predicted=False)).predicted == ()


def test_oracle_asks_independent_chains_in_parallel():
  gold = ["f1", "p1", "f2", "p2"]
  assert prompts.oracle_contexts(COMPARE, gold) == [(), ("f1", "f2"), ("f1", "p1", "f2", "p2")]
  s = parsing.parse(prompts.oracle_step(COMPARE, gold, ()))
  assert s.base == ("Who directed X?", "Who directed Y?")
  assert s.predicted == ("When was Ed born?", "When was Al born?")


# ------------------------------------------------------------------------------ inference
def test_tree_expansion_with_stub_model_and_index():
  """q0 asks two base queries and one predicted; the children get base doc + predicted doc;
  one child stops, the other repeats a known document (not expanded further)."""
  index = {"a": ["A1", "A2"], "b": ["B1", "B2"], "p": ["P1", "P2"], "c": ["A1", "C2"]}

  def steer(reqs):
    outs = []
    for q, docs in reqs:
      if not docs:
        outs.append(parsing.render("", ["a", "b", "ignored by t"], ["p", "p2"]))
      elif "A1" in docs:
        outs.append(parsing.render("", [], stop=True))
      else:
        outs.append(parsing.render("", ["c"]))
    return outs

  def search(queries, k):
    return [index.get(q, ["N"])[:k] for q in queries]

  cfg = inference.TreeConfig(top_k=1, t_base=2, t_pred=1, max_iterations=5)
  res = inference.expand(["q0"], steer, search, cfg)[0]
  # round 1: a->A1, b->B1, p->P1; children (A1,P1) and (B1,P1)
  # round 2: (A1,P1) stops; (B1,P1) asks c->A1, child (B1,P1,A1) is new -> round 3 it stops
  assert res.docs == ["A1", "P1", "B1"]
  assert res.iterations == 3 and res.calls == 4 and res.stopped
  two = inference.expand(["q0"], steer, search, inference.TreeConfig(top_k=2, t_base=2,
                                                                      t_pred=1))[0]
  assert two.docs[:3] == ["A1", "A2", "P1"]
  base = inference.expand(["q0"], steer, search,
                          inference.TreeConfig(top_k=1, use_predicted=False))[0]
  assert "P1" not in base.docs


def test_tree_expansion_survives_garbage_and_bounds_rounds():
  res = inference.expand(["q", "r"], lambda reqs: ["garbage <base-Q>"] * len(reqs),
                         lambda qs, k: [["x"]] * len(qs), inference.TreeConfig())
  assert [r.docs for r in res] == [[], []] and all(r.iterations == 1 for r in res)
  loop = inference.expand(["q"], lambda reqs: [parsing.render("", [f"q{len(d)}"]) for _, d in
                                               reqs],
                          lambda qs, k: [[q] for q in qs], inference.TreeConfig(max_iterations=3))
  assert loop[0].iterations == 3 and loop[0].docs == ["q0", "q1", "q2"]


def test_later_step_counts_and_their_report_line():
  """Round-0 outputs are left out; a stop is premature when some gold is not on the branch;
  a branch is noisy when it holds a non-gold document."""
  from rlrag_jax.methods.r2ag import report
  from rlrag_jax.methods.r2ag.task import later_step_counts
  go = parsing.render("x", ["q"])
  stop = parsing.render("x", (), stop=True)
  outputs = [(0, [], stop),                    # round 0: not counted
             (1, ["g1"], stop),                # clean, premature (g2 missing)
             (1, ["g1", "x"], stop),           # noisy, premature
             (2, ["g1", "g2", "x"], stop),     # noisy, every gold found: not premature
             (2, ["x"], go),                   # noisy, goes on
             (3, ["g1", "g2"], "garbage")]     # clean, malformed: no stop
  c = later_step_counts(outputs, ("g1", "g2"))
  assert c == {"later_steps": 5.0, "later_noisy": 3.0, "later_premature_stops": 2.0,
               "later_noisy_premature_stops": 1.0}
  text = report.later_steps_text({"after": c})
  assert "0.600 with a non-gold document" in text
  assert "noisy 0.333, clean 0.500" in text
  assert report.later_steps_text({"after": {"later_steps": 0.0}}) == ""
