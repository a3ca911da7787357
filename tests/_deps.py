"""`require(module)`: a declared dependency of the project, imported for a test.

  torch = require("torch")                  # in a test, or at module level

Absent outside CI the test (or module) is skipped, as `pytest.importorskip` would. Under CI=true
it fails instead, naming the module and what installs it (setup.cfg's install_requires:
`pip install -e .`; an extra: `pip install -e .[test]`): CI must not pass by skipping what the
project says it needs. A module that is present but breaks on import is an error everywhere.

Only for declared dependencies. A test that needs something deliberately optional (in no extra)
or a machine feature (a GPU) keeps `pytest.skip` / `pytest.importorskip` with a reason.
"""
from __future__ import annotations

import configparser
import importlib
import os
import pathlib
import re

import pytest

SETUP_CFG = pathlib.Path(__file__).resolve().parents[1] / "setup.cfg"

# Import name -> distribution name where the two differ beyond '_' vs '-'.
DISTRIBUTIONS = {"faiss": "faiss-cpu", "sklearn": "scikit-learn", "yaml": "pyyaml"}


def ci() -> bool:
  return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _norm(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_names(block: str) -> set:
  names = set()
  for line in block.splitlines():
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line)
    if m:
      names.add(_norm(m.group(1)))
  return names


def provided_by(module: str, setup_cfg: pathlib.Path = SETUP_CFG) -> list:
  """Where setup.cfg declares `module`'s distribution: ['install_requires'] and/or the names of
  the extras that list it ([] when undeclared)."""
  top = module.split(".")[0]
  dist = _norm(DISTRIBUTIONS.get(top, top))
  cfg = configparser.ConfigParser()
  cfg.read(setup_cfg)
  where = []
  if dist in _requirement_names(cfg.get("options", "install_requires", fallback="")):
    where.append("install_requires")
  if cfg.has_section("options.extras_require"):
    for extra, block in cfg.items("options.extras_require"):
      if dist in _requirement_names(block):
        where.append(extra)
  return where


def install_hint(module: str) -> str:
  where = provided_by(module)
  if not where:
    return f"{module} is not declared in {SETUP_CFG.name}"
  if "install_requires" in where:
    return f"a core dependency in {SETUP_CFG.name} install_requires: pip install -e ."
  extras = ", ".join(where)
  return f"from the {extras} extra of {SETUP_CFG.name}: pip install -e .[{where[0]}]"


def require(module: str):
  """Imports and returns `module`; skips when it is not installed, fails under CI=true."""
  try:
    return importlib.import_module(module)
  except ModuleNotFoundError as e:
    missing = e.name or ""
    # Only the module itself (or a package above it) counts as absent; a missing dependency of
    # an installed module is a broken install and raises.
    if not (module == missing or module.startswith(missing + ".")) or not missing:
      raise
  hint = install_hint(module)
  if ci():
    pytest.fail(f"{module} is not installed and CI=true requires it ({hint})", pytrace=False)
  pytest.skip(f"{module} is not installed ({hint}); under CI=true this fails",
              allow_module_level=True)
