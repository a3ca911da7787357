"""The engine's shape that issue 33 asks for, checked from the source: no function in `training/`,
`rollout/` or `rl/` over 60 lines or nested deeper than 4; no task probed with hasattr/getattr;
no method or engine module importing upward (`trainer`, `training`, `experiments`); no engine
module reading `Episode.info` for what travels in Episode's typed fields; no config key read
with a default in code (`config...get(key, default)`) in `methods/` or `training/`."""
import ast
import pathlib
import re

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


# The engine's typed fields (Episode's, and the group facts a Group / Batch holds); `info` is the
# method's own. The engine's modules:
ENGINE_FIELDS = ("group", "token_rewards", "baseline", "padding")
ENGINE = ("training", "rollout", "rl", "sampling", "experiments", "evaluation.py", "trainer.py")


def _is_info(node) -> bool:
  """`info`, `x.info` or `getattr(x, "info", ...)`."""
  if isinstance(node, ast.Call):
    return (isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
            and node.args[1].value == "info")
  return (isinstance(node, ast.Name) and node.id == "info"
          or isinstance(node, ast.Attribute) and node.attr == "info")


def _info_reads(src: str, keys=ENGINE_FIELDS) -> list:
  """(line, key) of every `info[key]` (read or written), `info.get(key)` (or pop,
  setdefault), `key in info` and `info={key: ...}` in `src`, for the given string keys."""
  key_of = lambda n: n.value if isinstance(n, ast.Constant) and n.value in keys else None
  hits = []
  for node in ast.walk(ast.parse(src)):
    if isinstance(node, ast.Subscript) and _is_info(node.value):
      k = key_of(node.slice)
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and node.func.attr in ("get", "pop", "setdefault") and _is_info(node.func.value)
          and node.args):
      k = key_of(node.args[0])
    elif (isinstance(node, ast.Compare) and len(node.ops) == 1
          and isinstance(node.ops[0], (ast.In, ast.NotIn)) and _is_info(node.comparators[0])):
      k = key_of(node.left)
    elif isinstance(node, ast.keyword) and node.arg == "info" and isinstance(node.value, ast.Dict):
      k = next((key_of(n) for n in node.value.keys if key_of(n)), None)
      node = node.value
    else:
      continue
    if k is not None:
      hits.append((node.lineno, k))
  return sorted(hits)


def test_info_reads_are_found_by_hand():
  # The reads the engine made before the typed fields (training/learners.py, collection.py).
  src = ("keys = [getattr(e, 'info', {}).get('group') for e in episodes]\n"
         "per = getattr(e, 'info', {}).get('token_rewards')\n"
         "if 'baseline' not in info:\n  base.append(float(info['baseline']))\n"
         "x = e.info['padding']\n"
         "y = e.info['role'] + e.group + info.get(key) + other['baseline']\n"
         "c = replace(e, loss_mask=m, info={**e.info, 'padding': True})\n")
  assert _info_reads(src) == [(1, "group"), (2, "token_rewards"), (3, "baseline"),
                              (4, "baseline"), (5, "padding"), (7, "padding")]


@pytest.mark.parametrize("where", ["engine", "methods"])
def test_no_typed_field_travels_in_info(where):
  """The engine reads them from Episode's fields, so a method that still wrote them into info
  would be ignored without a word (its groups, say): neither side may use those info keys."""
  names = ENGINE if where == "engine" else ("methods", "tasks.py")
  paths = [p for name in names if (ROOT / name).is_dir()
           for p in sorted((ROOT / name).rglob("*.py"))] + \
      [ROOT / n for n in names if n.endswith(".py")]
  assert len(paths) > 20
  bad = [f"{p.relative_to(ROOT.parent)}:{line}: info[{k!r}]; the field is Episode.{k}"
         for p in paths for line, k in _info_reads(p.read_text())]
  assert not bad, "\n".join(bad)


# A config value read with a default in code (`config.rl.get('entropy_coef', 0.0)`): the config
# file cannot show it (STYLE.md). Sections are parsed once (config_base.section) or read as
# declared; a saved config's missing keys are filled where it is loaded (ADDED_LATER tables).
CONFIG_GET = re.compile(r"\b(config|cfg)(\.[A-Za-z_]\w*)*\.get\(")


def test_config_default_reads_are_found_by_hand():
  for src in ("config.get('stages', ())", "self.config.sparkle.eval.get('baselines', True)",
              "cfg.rl.ppo.get('whiten_by')"):
    assert CONFIG_GET.search(src), src
  for src in ("episode.info.get('state')", "config.rl.entropy_coef", "summary.get('before')"):
    assert not CONFIG_GET.search(src), src


@pytest.mark.parametrize("package", ["methods", "training"])
def test_no_config_default_in_code(package):
  found = [f"{path.relative_to(ROOT.parent)}:{i}: {line.strip()}"
           for path in sorted((ROOT / package).rglob("*.py"))
           for i, line in enumerate(path.read_text().splitlines(), 1)
           if CONFIG_GET.search(line)]
  assert not found, "config keys read with a default in code:\n" + "\n".join(found)
