"""The engine's shape that issue 33 asks for, checked from the source: no function in `training/`,
`rollout/` or `rl/` over 60 lines or nested deeper than 4; no task probed with hasattr/getattr;
no method or engine module importing upward (`trainer`, `training`, `experiments`)."""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "rlrag_jax"
NEST = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.TryStar)
DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _depth(node, d=0) -> int:
  """Statement nesting depth inside a function; nested defs and classes count on their own."""
  best = d
  for child in ast.iter_child_nodes(node):
    if isinstance(child, DEFS + (ast.ClassDef, ast.Lambda)):
      continue
    best = max(best, _depth(child, d + 1 if isinstance(child, NEST) else d))
  return best


def _functions(package):
  for path in sorted((ROOT / package).rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, DEFS):
        yield f"{path.relative_to(ROOT.parent)}:{node.lineno} {node.name}", node


def test_depth_counts_nesting_by_hand():
  src = ("def f(x):\n  if x:\n    for i in x:\n      with i:\n        try:\n          pass\n"
         "        except E:\n          pass\n  def g():\n    if 1:\n      if 2:\n        pass\n")
  f = ast.parse(src).body[0]
  assert _depth(f) == 4                       # if > for > with > try; g's ifs are g's own
  assert _depth(f.body[1]) == 2


@pytest.mark.parametrize("package", ["training", "rollout", "rl"])
def test_engine_functions_are_short_and_shallow(package):
  bad = [f"{name}: {node.end_lineno - node.lineno + 1} lines, depth {_depth(node)}"
         for name, node in _functions(package)
         if node.end_lineno - node.lineno + 1 > 60 or _depth(node) > 4]
  assert not bad, "over 60 lines or nested deeper than 4:\n" + "\n".join(bad)


def _imports(path):
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      yield from (a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      if node.level:                          # relative: resolve against the file's package
        base = path.relative_to(ROOT.parent).with_suffix("").parts[:-node.level]
        yield ".".join(base + (node.module,))
        continue
      yield node.module
      yield from (f"{node.module}.{a.name}" for a in node.names)


@pytest.mark.parametrize("package,forbidden", [
    ("methods", ("rlrag_jax.trainer", "rlrag_jax.training", "rlrag_jax.experiments")),
    ("training", ("rlrag_jax.trainer", "rlrag_jax.experiments")),
])
def test_no_upward_imports(package, forbidden):
  bad = [f"{p.relative_to(ROOT.parent)} imports {m}"
         for p in sorted((ROOT / package).rglob("*.py")) for m in _imports(p)
         if any(m == f or m.startswith(f + ".") for f in forbidden)]
  assert not bad, "\n".join(bad)


def test_no_task_is_probed():
  hits = [f"{p.relative_to(ROOT.parent)}:{i}" for p in sorted(ROOT.rglob("*.py"))
          for i, line in enumerate(p.read_text().splitlines(), 1)
          if any(s in line for s in ("hasattr(task", "hasattr(run.task", "getattr(task",
                                     "getattr(run.task"))]
  assert not hits, hits
