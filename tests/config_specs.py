"""The configs in configs/ and their presets, for tests that go over all of them.

A config's presets are the ones its docstring lists under "Presets (`get_config(arg)`):", one a
line as `  'name'  what it is` (tests/test_configs.py checks that this list is exactly the
names `get_config` accepts, less the aliases 'default' and 'cpu' of '')."""
import ast
import importlib
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = sorted(p.stem for p in (ROOT / "configs").glob("*.py") if not p.stem.startswith("_"))
ALIASES = ("default", "cpu")          # other spellings of '' that every config accepts


def docstring(name: str) -> str:
  return ast.get_docstring(ast.parse((ROOT / "configs" / f"{name}.py").read_text()))


def presets(name: str) -> tuple:
  """The presets `configs/<name>.py`'s docstring lists, in its order."""
  doc = docstring(name)
  section = doc.split("Presets (`get_config(arg)`):", 1)[1]
  return tuple(m.group(1) for m in re.finditer(r"^  '(\w*)'\s", section, re.M))


def specs() -> list:
  """Every 'configs/<name>.py[:preset]' the configs offer."""
  return [f"configs/{n}.py" + (f":{p}" if p else "") for n in CONFIGS for p in presets(n)]


def load(spec: str):
  """The ConfigDict of 'configs/<name>.py[:preset]'."""
  path, _, preset = spec.partition(":")
  return importlib.import_module(f"configs.{pathlib.Path(path).stem}").get_config(preset)
