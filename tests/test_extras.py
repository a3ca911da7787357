"""setup.cfg's accelerator extras: `pip install -e ".[cuda]"` must give JAX's CUDA 13 plugin
(the lent GPU machines run a CUDA 13 driver), through jax's own extra so that the plugin's
version is pinned to jax's; `cuda12` stays for older drivers."""
import configparser
import pathlib

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _extras() -> dict:
  cfg = configparser.ConfigParser()
  cfg.read(ROOT / "setup.cfg")
  raw = cfg["options.extras_require"]
  return {name: [Requirement(line) for line in raw[name].splitlines()
                 if line.strip() and not line.strip().startswith("#")] for name in raw}


def test_the_cuda_extra_asks_for_the_cuda13_plugin_through_jax():
  (req,) = _extras()["cuda"]
  assert req.name == "jax" and req.extras == {"cuda13"}, req
  # jax-cuda13-plugin exists from 0.7.2; an older jax would install no plugin at all
  assert req.specifier and all(Version("0.7.2") <= Version(s.version) for s in req.specifier
                               if s.operator in (">=", "=="))
  assert Version("0.7.1") not in req.specifier and Version("0.10.2") in req.specifier


def test_cuda12_remains_for_older_drivers_and_the_base_jax_bound_is_kept():
  (req,) = _extras()["cuda12"]
  assert req.name == "jax" and req.extras == {"cuda12"}, req
  cfg = configparser.ConfigParser()
  cfg.read(ROOT / "setup.cfg")
  base = [Requirement(x) for x in cfg["options"]["install_requires"].split("\n") if x.strip()]
  (jax,) = [r for r in base if r.name == "jax"]
  assert Version("0.4.30") in jax.specifier and Version("0.4.29") not in jax.specifier
