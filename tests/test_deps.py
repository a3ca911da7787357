"""tests/_deps.require: a missing dependency skips outside CI and fails under CI=true, naming the
module and what installs it; setup.cfg is where it looks."""
import pathlib
import re
import sys

import pytest

import _deps

ABSENT = "rlrag_jax_no_such_module_8c1f"


@pytest.mark.parametrize("value", ["", "0", "false"])
def test_absent_module_skips_outside_ci(monkeypatch, value):
  monkeypatch.setenv("CI", value)
  with pytest.raises(pytest.skip.Exception, match=f"{ABSENT} is not installed"):
    _deps.require(ABSENT)


@pytest.mark.parametrize("value", ["true", "1", "TRUE"])
def test_absent_module_fails_under_ci(monkeypatch, value):
  monkeypatch.setenv("CI", value)
  with pytest.raises(pytest.fail.Exception, match=f"{ABSENT} is not installed and CI=true "
                     f"requires it .{ABSENT} is not declared in setup.cfg"):
    _deps.require(ABSENT)
  with pytest.raises(pytest.fail.Exception, match=f"{ABSENT}.sub"):
    _deps.require(f"{ABSENT}.sub")


@pytest.mark.parametrize("module,hint", [
    ("torch", r"from the test, bench extra of setup.cfg: pip install -e \.\[test\]"),
    ("nbclient", r"from the test extra of setup.cfg: pip install -e \.\[test\]"),
    ("faiss", r"from the test, bench extra"),
    ("tensorflow_datasets", r"a core dependency in setup.cfg install_requires: pip install -e \.\)"),
])
def test_a_declared_module_is_named_with_its_extra(monkeypatch, module, hint):
  monkeypatch.setenv("CI", "true")
  monkeypatch.setitem(sys.modules, module, None)     # `import module` now raises ImportError
  with pytest.raises(pytest.fail.Exception, match=hint):
    _deps.require(module)


def test_present_module_is_returned_under_ci(monkeypatch):
  monkeypatch.setenv("CI", "true")
  assert _deps.require("json.decoder") is sys.modules["json.decoder"]


def test_a_broken_install_raises_instead_of_skipping(monkeypatch, tmp_path):
  """The module exists but one of its own imports is missing: an error, not a skip."""
  (tmp_path / "rlrag_broken_pkg_8c1f.py").write_text(f"import {ABSENT}\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setenv("CI", "")
  with pytest.raises(ModuleNotFoundError, match=ABSENT):
    _deps.require("rlrag_broken_pkg_8c1f")


def test_every_require_names_a_declared_dependency_and_no_importorskip_hides_one():
  """require() of an undeclared module would fail CI for a package that nothing installs
  (declare it in setup.cfg, or keep a skip with its reason); pytest.importorskip of a declared
  one (or of this package's own module) would skip under CI."""
  required, skipped = set(), set()
  for path in pathlib.Path(__file__).parent.rglob("*.py"):
    if path.name in ("_deps.py", "test_deps.py"):
      continue
    text = path.read_text()
    required |= set(re.findall(r"\brequire\(\"([\w.]+)\"\)", text))
    skipped |= {(path.name, m) for m in re.findall(r"importorskip\(\"([\w.]+)\"", text)}
  assert required, "no test calls require(...)"
  assert [m for m in sorted(required) if not _deps.provided_by(m)] == []
  assert [(f, m) for f, m in sorted(skipped)
          if _deps.provided_by(m) or m.split(".")[0] == "rlrag_jax"] == []
