"""Every config in configs/ builds its presets, names an unknown preset in its error, and lists
its differences from the paper in its docstring."""
import importlib
import pathlib

import pytest

CONFIGS = sorted(p.stem for p in (pathlib.Path(__file__).parents[1] / "configs").glob("*.py")
                 if not p.stem.startswith("_"))


@pytest.mark.parametrize("name", CONFIGS)
def test_presets_build_and_document_differences(name):
  mod = importlib.import_module(f"configs.{name}")
  assert "Differences from the paper" in mod.__doc__
  for preset in ("", "paper"):
    c = mod.get_config(preset)
    assert c.method and c.workdir
    if preset == "paper":
      assert c.model.init == "hf" and c.data.source == "files"
    else:
      assert c.data.source == "world"
  with pytest.raises(ValueError, match="nonsense"):
    mod.get_config("nonsense")


def test_apex_executor_is_sft_only():
  from configs import apex_executor
  for preset in ("", "paper"):
    c = apex_executor.get_config(preset)
    assert c.rl.steps == 0 and c.rl.epochs == 0 and tuple(c.stages) == ("sft",)
    assert c.sft.steps > 0 or c.sft.epochs > 0      # ':paper' counts epochs (sft.epochs)


def test_commands_that_tests_import_load_together_with_the_trainer():
  """Commands that tests import define their absl flags only when run (a second 'config' flag
  in one process is a DuplicateFlagError at collection): after importing them all, no module has
  flags; the trainer's entry point defines its own only when asked (`define_flags`)."""
  import importlib
  from absl import flags
  others = ("rlrag_jax.experiments.headroom", "rlrag_jax.experiments.grad_noise",
            "rlrag_jax.methods.apex.pipeline", "rlrag_jax.methods.apex.self_instruct",
            "rlrag_jax.methods.apex.rewrite", "rlrag_jax.methods.apex.calibrate")
  for mod in ("rlrag_jax.train",) + others:
    assert callable(importlib.import_module(mod).main), mod
  by_module = {m: sorted(f.name for f in fl)
               for m, fl in flags.FLAGS.flags_by_module_dict().items()}
  assert [m for m in ("rlrag_jax.train",) + others if m in by_module] == []
  from rlrag_jax import train
  own = flags.FlagValues()
  train.define_flags(own)
  assert sorted(f.name for f in own.flags_by_module_dict()["rlrag_jax.train"]) == [
      "config", "force", "quiet", "resume", "workdir"]


def _accepted_presets(mod) -> set:
  """The preset names `get_config(arg)` compares `arg` with (string constants, tuples of them,
  or module-level tuples such as PAPER_PRESETS)."""
  import ast
  import inspect
  fn = next(n for n in ast.parse(inspect.getsource(mod)).body
            if isinstance(n, ast.FunctionDef) and n.name == "get_config")
  names = set()
  for node in ast.walk(fn):
    if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == "arg":
      for comp in node.comparators:
        if isinstance(comp, ast.Constant):
          names.add(comp.value)
        elif isinstance(comp, ast.Tuple):
          names |= {e.value for e in comp.elts}
        elif isinstance(comp, ast.Name):
          names |= set(getattr(mod, comp.id))
  return names


@pytest.mark.parametrize("name", CONFIGS)
def test_the_docstring_lists_every_preset_and_each_builds(name):
  """config_specs.presets (what the config tests go over) is the docstring's list; it must be
  exactly what get_config accepts, less the aliases of ''."""
  import config_specs
  mod = importlib.import_module(f"configs.{name}")
  listed = config_specs.presets(name)
  assert set(listed) == _accepted_presets(mod) - set(config_specs.ALIASES)
  for preset in listed + config_specs.ALIASES:
    assert mod.get_config(preset).method


def test_r2ag_long_warmup_differs_from_the_default_only_in_its_two_keys():
  from configs import r2ag

  def flat(d, prefix=""):
    out = {}
    for k, v in d.items():
      out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out
  default = flat(r2ag.get_config("").to_dict())
  long = flat(r2ag.get_config("long_warmup").to_dict())
  assert {k for k in default if default[k] != long[k]} == {"sft.steps", "r2ag.forest.carry"}
  assert (long["sft.steps"], long["r2ag.forest.carry"]) == (1200, "branch")
  assert default["r2ag.forest.carry"] == r2ag.get_config("paper").r2ag.forest.carry == "gold"
