"""The RR-Forest of progressive iterative training (the paper's Algorithm 1).

A forest holds one retrieval tree per training question. Training walks it level by level: at
iteration j every pending expansion (a tree at a context) is expanded once by G rollouts of the
steering model; each rollout hangs its query/document vertices under the expansion's tip. A
rollout that has not finished (gold incomplete, or no stop signal) carries its branch on to
iteration j + 1 with only the gold documents found so far as context (the paper's pruning
d^{j+1} = g~, `carry='gold'`); a rollout that found nothing carries the empty context on (the
"root only" trees are kept too). With `carry='branch'` the context carried on is every document
the branch retrieved, gold or not, as inference sees it (the task builds the contexts; the
forest only ranks them). Rollouts of one expansion that end at the same context are one
continuation.

Bounds, all config keys: `max_iterations` (L_MAX-I), `max_children` continuations per expansion
(most gold found first, then the longer context) and `max_size` expansions per level (a seeded
sample beyond it), so the fan-out of G stays bounded. A level's expansions are handed out in
fixed-size batches; the last batch of a level is topped up with seeded repeats of that level's
expansions (more samples of the same state), so every update has the same shape. When a forest
is spent (iteration limit or an empty level) the next one starts from the next questions of a
seeded order over the training set.

`prune` keeps, bottom up, the vertices on branches with a positive weight (a newly found gold
document); finished forests keep only their pruned trees. `state_dict` is plain JSON: the forest is
part of the checkpoint, so a killed run resumes it exactly.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Optional, Sequence


CARRIES = ("gold", "branch")          # ForestConfig.carry


@dataclasses.dataclass(frozen=True)
class ForestConfig:
  size: int = 32                 # questions per forest
  max_iterations: int = 5        # L_MAX-I
  max_children: int = 2          # continuations kept per expansion
  max_size: int = 64             # expansions per level
  carry: str = "gold"            # context carried on: 'gold' (the paper) or 'branch' (all docs)


@dataclasses.dataclass
class Item:
  """One pending expansion: tree `tree` at `context` (sorted gold ids), hung under vertex `tip`."""
  tree: int
  tip: int
  context: tuple
  iteration: int

  def key(self) -> tuple:
    return (self.tree, self.context)


@dataclasses.dataclass
class Outcome:
  """What one rollout of an expansion did: its vertices (query, doc, kind, new gold?), the
  context it would carry on, whether it finished (every gold found and stop emitted) and how
  many gold documents that context holds (None: all of it, as with `carry='gold'`)."""
  vertices: list                  # [(query, doc id, 'base' | 'pred', is_new_gold)]
  context: tuple
  finished: bool
  found: Optional[int] = None


def prune(vertices: Sequence[dict]) -> list:
  """The vertices on positive-weight branches (root kept), bottom up: a vertex stays when its
  weight is positive or a descendant of it stays."""
  keep = {0}
  for v in reversed(vertices):      # children come after their parents
    if v["id"] == 0:
      continue
    if v["weight"] > 0 or v["id"] in keep:
      keep.add(v["id"])
      keep.add(v["parent"])
  return [v for v in vertices if v["id"] in keep]


class Forest:
  def __init__(self, num_examples: int, cfg: ForestConfig, seed: int = 0):
    if num_examples < 1:
      raise ValueError("r2ag forest: no training examples")
    for key in ("size", "max_iterations", "max_children", "max_size"):
      if getattr(cfg, key) < 1:
        raise ValueError(f"config key 'r2ag.forest.{key}' is {getattr(cfg, key)}; expected >= 1")
    if cfg.carry not in CARRIES:
      raise ValueError(f"config key 'r2ag.forest.carry' is {cfg.carry!r}; expected one of "
                       f"{CARRIES}")
    self.cfg, self.n, self.seed = cfg, num_examples, seed
    self.order = list(range(num_examples))
    random.Random(seed).shuffle(self.order)
    self.cursor = 0                 # next position in `order`
    self.forests = 0                # forests started
    self.draws = 0                  # top-up draws so far (seeds them)
    self.trees = []                 # current forest: [{'example': i, 'vertices': [...], ...}]
    self.level, self.pos, self.iteration = [], 0, 0
    self.next = {}                  # key -> Item for iteration + 1
    self.finished = []              # pruned trees of spent forests
    self.history = []               # per spent level: dict of counts

  # ------------------------------------------------------------------ forests and levels
  def _new_forest(self) -> None:
    roots = []
    for _ in range(min(self.cfg.size, self.n)):
      roots.append(self.order[self.cursor % self.n])
      self.cursor += 1
    self.forests += 1
    self.trees = [{"example": ex, "complete": False,
                   "vertices": [{"id": 0, "parent": -1, "query": "", "doc": "", "kind": "root",
                                 "weight": 0, "iteration": 0}]} for ex in roots]
    self.level = [Item(t, 0, (), 0) for t in range(len(self.trees))]
    self.pos, self.iteration, self.next = 0, 0, {}

  def _spend(self) -> None:
    for t in self.trees:
      self.finished.append({"example": t["example"], "complete": t["complete"],
                            "vertices": prune(t["vertices"]), "all_vertices": len(t["vertices"])})

  def _advance(self) -> None:
    """The next level, or a new forest when this one is spent."""
    self.history.append({"forest": self.forests, "iteration": self.iteration,
                         "expansions": len(self.level), "continuing": len(self.next)})
    items = list(self.next.values())
    if len(items) > self.cfg.max_size:
      rng = random.Random(f"{self.seed}/{self.forests}/{self.iteration}")
      keep = sorted(rng.sample(range(len(items)), self.cfg.max_size))
      items = [items[i] for i in keep]
    if not items or self.iteration + 1 >= self.cfg.max_iterations:
      self._spend()
      self._new_forest()
      return
    self.level, self.pos, self.next = items, 0, {}
    self.iteration += 1

  def take(self, n: int) -> list:
    """`n` expansions of the current level (topped up with repeats at the level's end)."""
    if not self.trees:
      self._new_forest()
    elif self.pos >= len(self.level):
      self._advance()
    out = self.level[self.pos:self.pos + n]
    self.pos += len(out)
    if len(out) < n:
      self.draws += 1
      rng = random.Random(f"{self.seed}/draw/{self.draws}")
      out += [self.level[rng.randrange(len(self.level))] for _ in range(n - len(out))]
    return [dataclasses.replace(it) for it in out]

  # ------------------------------------------------------------------ growing trees
  def expand(self, item: Item, outcomes: Sequence[Outcome]) -> None:
    """Adds the rollouts' vertices under the item's tip and queues their continuations."""
    tree = self.trees[item.tree]
    verts = tree["vertices"]
    have = {(v["parent"], v["query"], v["doc"]) for v in verts}
    by_context = {}
    for o in outcomes:
      tip = item.tip
      for query, doc, kind, new in o.vertices:
        if (item.tip, query, doc) in have:
          if new:
            tip = next(v["id"] for v in verts if (v["parent"], v["query"], v["doc"]) ==
                       (item.tip, query, doc))
          continue
        vid = len(verts)
        verts.append({"id": vid, "parent": item.tip, "query": query, "doc": doc, "kind": kind,
                      "weight": int(bool(new)), "iteration": item.iteration + 1})
        have.add((item.tip, query, doc))
        if new:
          tip = vid
      if o.finished:
        tree["complete"] = True
        continue
      ctx = tuple(sorted(o.context))
      found = len(ctx) if o.found is None else int(o.found)
      by_context.setdefault(ctx, (tip, found))
    if item.iteration + 1 >= self.cfg.max_iterations:
      return
    ranked = sorted(by_context.items(), key=lambda kv: (-kv[1][1], -len(kv[0])))
    for ctx, (tip, _) in ranked[:self.cfg.max_children]:
      child = Item(item.tree, tip, ctx, item.iteration + 1)
      self.next.setdefault(child.key(), child)

  def example_of(self, item: Item) -> int:
    return self.trees[item.tree]["example"]

  # ------------------------------------------------------------------ reporting and state
  def summary(self, trees: Optional[list] = None) -> dict:
    """Counts over pruned trees (default: every spent forest's)."""
    trees = self.finished if trees is None else trees
    if not trees:
      return {"trees": 0}
    kept = [len(t["vertices"]) - 1 for t in trees]
    depth = []
    for t in trees:
      d = {0: 0}
      for v in t["vertices"][1:]:
        d[v["id"]] = d.get(v["parent"], 0) + 1
      depth.append(max(d.values()))
    return {"trees": len(trees),
            "complete": sum(t["complete"] for t in trees) / len(trees),
            "root_only": sum(k == 0 for k in kept) / len(trees),
            "vertices_before_pruning": sum(t["all_vertices"] - 1 for t in trees) / len(trees),
            "vertices_after_pruning": sum(kept) / len(trees),
            "max_depth_after_pruning": sum(depth) / len(trees)}

  def state_dict(self) -> dict:
    return {"cursor": self.cursor, "forests": self.forests, "draws": self.draws,
            "trees": self.trees, "iteration": self.iteration, "pos": self.pos,
            "level": [dataclasses.astuple(i) for i in self.level],
            "next": [dataclasses.astuple(i) for i in self.next.values()],
            "finished": self.finished, "history": self.history, "order": self.order}

  def load_state_dict(self, s: dict) -> None:
    def item(t):
      return Item(int(t[0]), int(t[1]), tuple(t[2]), int(t[3]))
    self.cursor, self.forests, self.draws = int(s["cursor"]), int(s["forests"]), int(s["draws"])
    self.trees, self.iteration, self.pos = s["trees"], int(s["iteration"]), int(s["pos"])
    self.level = [item(t) for t in s["level"]]
    self.next = {i.key(): i for i in map(item, s["next"])}
    self.finished, self.history, self.order = s["finished"], s["history"], list(s["order"])
