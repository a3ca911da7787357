"""Tree rollouts: level-by-level expansion of a frontier, branching on chosen decisions, pruning,
a depth limit followed by linear completion, leaf rewards and Monte-Carlo returns.

The tree knows nothing of models or methods. A method supplies four callbacks:

  branch(node) -> list of forced actions for the node's children: e.g. ['Yes', 'No'] to expand
      a decision both ways, or [None] for one child whose action the policy samples. Called only
      while node.depth < max_depth; deeper nodes get [None] (linear completion).
  step(nodes, actions) -> list of Step, one per (node, action) pair, computed in ONE batched call
      for the whole level (the sampler runs once per level, not once per node).
  prune(parent, child) -> bool: drop a child (e.g. a retrieval branch whose document is already
      in context). A node whose children are all pruned is finished as a leaf.
  reward(leaves) -> list of floats, batched over every leaf of every tree.

Each non-root node is one decision. Its Monte-Carlo return is the mean reward of the leaves below
it (itself, if it is a leaf); `decisions()` gives one training sample per decision with that
return, a group key (the parent node), so siblings can be compared as a group, and the parent's
own return (`base`: a Monte-Carlo value of the state the decision was taken in; a decision
without siblings has base == ret).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence


@dataclasses.dataclass
class Step:
  """What `step` returns for one (node, action): the child's state, the decision's training
  sample (e.g. prompt / completion ids and loss mask; opaque here), and whether it ends."""
  state: Any
  sample: Any = None
  done: bool = False


@dataclasses.dataclass
class Node:
  id: int
  tree: int                      # index of the root example
  parent: Optional[int]
  depth: int                     # root 0; a decision's node has its parent's depth + 1
  state: Any
  action: Any = None             # the forced action that led here (None: sampled / root)
  sample: Any = None
  done: bool = False
  children: list = dataclasses.field(default_factory=list)
  pruned: bool = False
  reward: Optional[float] = None       # leaves only
  ret: Optional[float] = None          # Monte-Carlo return: mean leaf reward below


@dataclasses.dataclass
class Decision:
  sample: Any
  ret: float                     # the child's Monte-Carlo return
  group: int                     # the parent node's id: siblings share it
  node: int
  tree: int
  depth: int
  action: Any
  base: float = 0.0              # the parent node's Monte-Carlo return: the value of the state
                                 # the decision was taken in, estimated by the tree itself


@dataclasses.dataclass
class Forest:
  nodes: list                    # every node (pruned ones included, flagged), ids = positions
  roots: list

  def leaves(self) -> list:
    return [n for n in self.nodes if not n.pruned and n.reward is not None]

  def decisions(self) -> list:
    """One sample per decision (every kept non-root node), in node order."""
    return [Decision(sample=n.sample, ret=n.ret, group=n.parent, node=n.id, tree=n.tree,
                     depth=n.depth, action=n.action, base=self.nodes[n.parent].ret)
            for n in self.nodes if n.parent is not None and not n.pruned]

  def counts(self) -> dict:
    kept = [n for n in self.nodes if not n.pruned]
    return {"nodes": len(kept) - len(self.roots), "leaves": len(self.leaves()),
            "pruned": sum(n.pruned for n in self.nodes),
            "max_depth": max((n.depth for n in kept), default=0)}


def expand(root_states: Sequence, *, step: Callable, branch: Callable, reward: Callable,
           prune: Optional[Callable] = None, max_depth: int, max_steps: int = 64) -> Forest:
  """Grows one tree per root state; returns the Forest with rewards and returns filled.

  `max_depth` bounds branching; `max_steps` bounds any path's length (a node still open at that
  depth is finished as a leaf), so the expansion always ends.
  """
  if max_depth < 0 or max_steps < 1:
    raise ValueError(f"rollout.tree.expand: max_depth must be >= 0 and max_steps >= 1; got "
                     f"{max_depth}, {max_steps}")
  nodes = []
  for i, s in enumerate(root_states):
    nodes.append(Node(id=len(nodes), tree=i, parent=None, depth=0, state=s))
  roots = [n.id for n in nodes]
  frontier = list(roots)
  while frontier:
    pairs = []
    for nid in frontier:
      node = nodes[nid]
      actions = list(branch(node)) if node.depth < max_depth else [None]
      if not actions:
        raise ValueError(f"rollout.tree.expand: branch() returned no action for node {nid}")
      pairs += [(node, a) for a in actions]
    results = list(step([p[0] for p in pairs], [p[1] for p in pairs]))
    if len(results) != len(pairs):
      raise ValueError(f"rollout.tree.expand: step() returned {len(results)} results for "
                       f"{len(pairs)} (node, action) pairs")
    nxt = []
    for (parent, action), res in zip(pairs, results):
      child = Node(id=len(nodes), tree=parent.tree, parent=parent.id, depth=parent.depth + 1,
                   state=res.state, action=action, sample=res.sample, done=bool(res.done))
      nodes.append(child)
      if prune is not None and prune(parent, child):
        child.pruned = True
        continue
      parent.children.append(child.id)
      if not child.done and child.depth < max_steps:
        nxt.append(child.id)
    for nid in frontier:                 # every child pruned: the node ends here
      if not nodes[nid].children:
        nodes[nid].done = True
    frontier = nxt
  leaves = [n for n in nodes if not n.pruned and not n.children]
  values = list(reward(leaves))
  if len(values) != len(leaves):
    raise ValueError(f"rollout.tree.expand: reward() returned {len(values)} values for "
                     f"{len(leaves)} leaves")
  for n, v in zip(leaves, values):
    n.reward = float(v)
  total, count = {}, {}
  for n in reversed(nodes):              # children have larger ids than their parent
    if n.pruned:
      continue
    if n.children:
      total[n.id] = sum(total[c] for c in n.children)
      count[n.id] = sum(count[c] for c in n.children)
    else:
      total[n.id], count[n.id] = n.reward, 1
    n.ret = total[n.id] / count[n.id]
  return Forest(nodes=nodes, roots=roots)
