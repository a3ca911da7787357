"""Tree rollouts checked by hand on a tiny string tree: branching, batching per level, pruning,
linear completion after the depth limit, leaf rewards and Monte-Carlo returns."""
import pytest

from rlrag_jax.rollout import tree


def _expand(roots, prune=True, max_depth=2, max_steps=64):
  calls = []

  def step(nodes, actions):
    calls.append(len(nodes))
    out = []
    for n, a in zip(nodes, actions):
      s = n.state + (a or "c")
      out.append(tree.Step(state=s, sample=(n.state, a), done=len(s) >= 3))
    return out

  forest = tree.expand(
      roots, step=step, branch=lambda n: ["Y", "N"],
      prune=(lambda parent, child: child.state.endswith("YY")) if prune else None,
      reward=lambda leaves: [float(l.state.count("Y")) for l in leaves],
      max_depth=max_depth, max_steps=max_steps)
  return forest, calls


def test_tiny_tree_by_hand():
  forest, calls = _expand(["", "N"])
  # One batched step call per level: 2 roots x 2 actions; 4 nodes x 2; then 3 linear completions.
  assert calls == [4, 8, 3]
  by_state = {(n.tree, n.state): n for n in forest.nodes if not n.pruned}
  leaves = sorted((l.tree, l.state, l.reward) for l in forest.leaves())
  assert leaves == [(0, "NNc", 0.0), (0, "NYc", 1.0), (0, "YNc", 1.0),
                    (1, "NNN", 0.0), (1, "NNY", 1.0), (1, "NYN", 1.0)]
  want = {(0, ""): 2 / 3, (0, "Y"): 1.0, (0, "N"): 0.5, (0, "YN"): 1.0, (0, "NN"): 0.0,
          (0, "NY"): 1.0, (1, "N"): 2 / 3, (1, "NY"): 1.0, (1, "NN"): 0.5}
  for key, ret in want.items():
    assert by_state[key].ret == pytest.approx(ret), key
  assert forest.counts() == {"nodes": 13, "leaves": 6, "pruned": 2, "max_depth": 3}
  decisions = forest.decisions()
  assert len(decisions) == 13
  # Siblings share their parent as the group; the forced action is recorded with the sample.
  root0 = forest.roots[0]
  first = [d for d in decisions if d.group == root0]
  assert sorted((d.action, d.ret) for d in first) == [("N", 0.5), ("Y", 1.0)]
  assert all(d.sample == (forest.nodes[d.group].state, d.action) for d in decisions)
  # Each decision's base is its parent's return: the root's for the first level, and a
  # decision without siblings (linear completion) has base == ret.
  assert all(d.base == pytest.approx(2 / 3) for d in first)
  assert {(forest.nodes[d.group].state, d.base) for d in decisions if d.tree == 0
          and d.depth == 2} == {("Y", 1.0), ("N", 0.5)}
  assert all(d.base == pytest.approx(d.ret) for d in decisions if d.depth == 3)
  # Past the depth limit the policy samples (action None): one child per node.
  linear = [d for d in decisions if d.depth == 3]
  assert len(linear) == 3 and all(d.action is None for d in linear)


def test_without_pruning_every_branch_is_kept():
  forest, _ = _expand([""], prune=False)
  assert forest.counts()["pruned"] == 0
  assert len(forest.leaves()) == 4               # YYc, YNc, NYc, NNc
  assert forest.nodes[forest.roots[0]].ret == pytest.approx((2 + 1 + 1 + 0) / 4)


def test_a_node_whose_children_are_all_pruned_is_a_leaf():
  forest = tree.expand(["a"], step=lambda ns, acts: [tree.Step(state=n.state + "x")
                                                      for n in ns],
                       branch=lambda n: ["p", "q"], prune=lambda p, c: True,
                       reward=lambda leaves: [5.0 for _ in leaves], max_depth=1)
  root = forest.nodes[forest.roots[0]]
  assert root.done and root.reward == 5.0 and root.ret == 5.0
  assert forest.decisions() == []


def test_max_steps_ends_paths_that_never_finish():
  forest = tree.expand([""], step=lambda ns, acts: [tree.Step(state=n.state + "c") for n in ns],
                       branch=lambda n: [None], reward=lambda leaves: [len(l.state)
                                                                       for l in leaves],
                       max_depth=0, max_steps=5)
  assert [l.state for l in forest.leaves()] == ["ccccc"]


def test_callback_errors_are_named():
  with pytest.raises(ValueError, match="step\\(\\) returned 1 results for 2"):
    tree.expand([""], step=lambda ns, acts: [tree.Step(state="x")], branch=lambda n: ["a", "b"],
                reward=lambda leaves: [0.0] * len(leaves), max_depth=1)
  with pytest.raises(ValueError, match="branch\\(\\) returned no action"):
    tree.expand([""], step=lambda ns, acts: [], branch=lambda n: [],
                reward=lambda leaves: [], max_depth=1)
  with pytest.raises(ValueError, match="max_depth must be >= 0"):
    tree.expand([""], step=None, branch=None, reward=None, max_depth=-1)
