"""The package's layering, read from the source: every `import` of an rlrag_jax module, at the top
of a file or inside a function (ast), is an edge; no edge may form a cycle, and none may go from
a lower layer to a higher one, directly or through other modules. And no function of the engine
(training/, rollout/, rl/, sampling/, trainer.py) runs over 60 lines.

The layers, lowest first (`LAYERS`): a module may import its own layer and the ones below.

  base        leaf utilities that import nothing above them: the engine's settings and their
              allowed values (rlrag_jax.settings), run logs, the judge client, metrics,
              checkpoints, fingerprints, the compile cache
  models      the decoder LM, HF load/save, sharding
  data        datasets, the world, tokenizers (the models' tokenizer helpers below them)
  retrieval   passage stores, encoders, indexes
  sampling    prefill + decode
  config      config_base (the shared sections) and config_check (the table of allowed values):
              above what they name allowed values from (data sources, model dtypes, retrieval
              backends, attention kernels), below every layer that trains, so that a method's
              config_rules.py depends on no engine layer. The engine's own allowed values come
              from rlrag_jax.settings, in base.
  contract    the Task contract (tasks), run directories and auxiliary models (run_dirs), the
              evaluation loop over a Task (evaluation)
  rollout     policies and environments into trajectories
  rl          log-probs, advantages, losses, the train step
  training    the trainer's parts: stages, learners, collection, steps, reports
  trainer     the pipeline (rlrag_jax.trainer)
  methods     every method folder, its settings.py and config_rules.py included (they import
              config_base / config_check downward); the engine names a method only by string
              (tasks.get_task, config_check.MethodName), never by an import
  top         entry points (train, evaluate, export, generate), experiments and benchmarks
"""
from __future__ import annotations

import ast
import collections
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PKG = ROOT / "rlrag_jax"

LAYERS = (
    ("base", ("settings", "runlog", "judge", "metrics", "checkpoint", "fingerprint",
              "compile_cache")),
    ("models", ("models",)),
    ("data", ("data",)),
    ("retrieval", ("retrieval",)),
    ("sampling", ("sampling",)),
    ("config", ("config_base", "config_check")),
    ("contract", ("tasks", "run_dirs", "evaluation")),
    ("rollout", ("rollout",)),
    ("rl", ("rl",)),
    ("training", ("training",)),
    ("trainer", ("trainer",)),
    ("methods", ("methods",)),
    ("top", ("train", "evaluate", "export", "generate", "experiments", "bench")),
)


MAX_FUNCTION_LINES = 60
ENGINE = ("training", "rollout", "rl", "sampling", "trainer.py")


def modules() -> dict:
  """{dotted module name: path} of every rlrag_jax module (a package by its __init__)."""
  out = {}
  for p in PKG.rglob("*.py"):
    parts = list(p.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
      parts = parts[:-1]
    out[".".join(parts)] = p
  return out


def _resolve(name: str, mods: dict):
  while name and name not in mods:
    name = name.rpartition(".")[0]
  return name or None


def imports(mods: dict) -> dict:
  """{module: {rlrag_jax modules it imports}}, function-level imports included; `from pkg import
  name` is the submodule pkg.name when there is one, else pkg."""
  edges = collections.defaultdict(set)
  for m, p in mods.items():
    is_pkg = p.name == "__init__.py"
    for node in ast.walk(ast.parse(p.read_text(), str(p))):
      targets = []
      if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          parent = m.split(".") if is_pkg else m.split(".")[:-1]
          parent = parent[:len(parent) - (node.level - 1)]
          base = ".".join(parent + ([base] if base else []))
        targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                   for a in node.names]
      for t in targets:
        if t.startswith("rlrag_jax"):
          r = _resolve(t, mods)
          if r and r != m:
            edges[m].add(r)
  return edges


def layer_of(module: str) -> int:
  parts = module.split(".")
  if len(parts) == 1:                  # rlrag_jax/__init__.py
    return 0
  for i, (_, names) in enumerate(LAYERS):
    if parts[1] in names or parts[1] + ".py" in names:
      return i
  raise AssertionError(f"{module}: in no layer of tests/test_layering.py LAYERS; add it")


MODS = modules()
EDGES = imports(MODS)


def test_every_module_has_a_layer():
  for m in MODS:
    layer_of(m)


def _cycles(edges: dict) -> list:
  """The strongly connected components of more than one module (Tarjan, iterative)."""
  index, low, stack, on, out = {}, {}, [], set(), []
  counter = [0]

  def visit(v):
    work = [(v, iter(sorted(edges[v])))]
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    while work:
      node, it = work[-1]
      for w in it:
        if w not in index:
          index[w] = low[w] = counter[0]
          counter[0] += 1
          stack.append(w)
          on.add(w)
          work.append((w, iter(sorted(edges[w]))))
          break
        if w in on:
          low[node] = min(low[node], index[w])
      else:
        work.pop()
        if work:
          low[work[-1][0]] = min(low[work[-1][0]], low[node])
        if low[node] == index[node]:
          comp = set()
          while True:
            w = stack.pop()
            on.discard(w)
            comp.add(w)
            if w == node:
              break
          if len(comp) > 1:
            out.append(frozenset(comp))

  for v in sorted(MODS):
    if v not in index:
      visit(v)
  return out


def test_no_import_cycle():
  found = [sorted(c) for c in _cycles(EDGES)]
  assert not found, f"import cycles: {found}"


def test_the_config_check_circle_is_gone():
  """Issue 52: config_base -> config_check -> training.stages -> config_base."""
  for m in ("rlrag_jax.config_base", "rlrag_jax.config_check", "rlrag_jax.settings"):
    reach = _reachable(m)
    assert not {r for r in reach if r.startswith(("rlrag_jax.training", "rlrag_jax.rl",
                                                   "rlrag_jax.trainer", "rlrag_jax.rollout",
                                                   "rlrag_jax.methods"))}, (m, sorted(reach))
  assert not {e for e in EDGES["rlrag_jax.settings"]}          # a leaf


def test_a_methods_config_rules_depend_on_no_training_layer():
  """Issue 52: through config_check, every method's config_rules.py depended on training/. (A
  method's rules may import its own modules, and those the rollout layer.)"""
  for m in MODS:
    if m.startswith("rlrag_jax.methods.") and m.endswith((".config_rules", ".settings")):
      engine = {r for r in _reachable(m)
                if layer_of(r) >= layer_of("rlrag_jax.rl") and
                not r.startswith("rlrag_jax.methods")}
      assert not engine, (m, sorted(engine))


def _reachable(start: str) -> dict:
  """{module: the import path to it} of everything `start` imports, directly or not."""
  seen = {start: [start]}
  queue = collections.deque([start])
  while queue:
    m = queue.popleft()
    for t in sorted(EDGES[m]):
      if t not in seen:
        seen[t] = seen[m] + [t]
        queue.append(t)
  del seen[start]
  return seen


def test_no_import_from_a_lower_layer_to_a_higher_one():
  """Transitively: everything a module reaches through imports is in its layer or below."""
  bad = []
  for m in sorted(MODS):
    for t, path in _reachable(m).items():
      if layer_of(t) > layer_of(m):
        bad.append(f"{m} ({LAYERS[layer_of(m)][0]}) reaches {t} ({LAYERS[layer_of(t)][0]}): "
                   + " -> ".join(path))
  assert not bad, "\n".join(bad[:40])


def _functions():
  for name in ENGINE:
    path = PKG / name
    files = [path] if path.suffix == ".py" else sorted(path.rglob("*.py"))
    for p in files:
      for node in ast.walk(ast.parse(p.read_text(), str(p))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
          # from `def` to the last line of the body: decorators excluded
          yield f"{p.relative_to(ROOT)}:{node.name}", node.end_lineno - node.lineno + 1


def test_no_engine_function_runs_over_60_lines():
  long = {k: n for k, n in _functions() if n > MAX_FUNCTION_LINES}
  assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


@pytest.mark.parametrize("module,layer", [("rlrag_jax.config_check", "config"),
                                          ("rlrag_jax.methods.arena.config_rules", "methods"),
                                          ("rlrag_jax.settings", "base")])
def test_where_the_config_modules_sit(module, layer):
  assert LAYERS[layer_of(module)][0] == layer
