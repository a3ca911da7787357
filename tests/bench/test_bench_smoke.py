"""Every documented command runs (issue 53 item 10): each `rlrag_jax/bench/*` module with a
`main` finishes its smallest run (`--smoke`, the same code path at tiny shapes), and every
`python -m rlrag_jax...` command README.md names answers `--help`.

Both lists are read from the tree (the bench folder's files, README's text), so a new benchmark
or a newly documented command is covered without touching this file."""
import ast
import importlib
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = ROOT / "rlrag_jax" / "bench"

# Extra flags beside --smoke, each with why. test_accelerator_bench.py already runs the
# accelerator's hf, sampler and update sections in reduced mode, so here it runs only the two
# sections that test leaves out (the main job, once, ~30 s; the memory plan).
EXTRA = {"accelerator": ["--sections", "main,memory"]}
SLOW = {"accelerator"}


def _has_main(path: pathlib.Path) -> bool:
  tree = ast.parse(path.read_text())
  return any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body)


BENCH_MAINS = sorted(p.stem for p in BENCH.glob("*.py") if _has_main(p))


def test_the_bench_list_is_read_from_the_folder():
  assert {"memory", "rl_step", "sampling", "rollout"} <= set(BENCH_MAINS)
  assert "gpu_plan" not in BENCH_MAINS and "__init__" not in BENCH_MAINS


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n
                                  for n in BENCH_MAINS])
def test_every_bench_main_runs_its_smoke_mode(name, tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)                   # anything a bench writes lands here
  mod = importlib.import_module(f"rlrag_jax.bench.{name}")
  rc = mod.main(["--smoke", *EXTRA.get(name, [])])
  out = capsys.readouterr().out
  # mains return an exit status (0), the rows they printed, or None
  assert not isinstance(rc, int) or rc == 0, f"bench.{name} --smoke exited {rc}:\n{out[-3000:]}"
  assert out.strip(), f"bench.{name} --smoke printed nothing"


# ------------------------------------------------------------------ README commands, --help
def readme_commands(text: str) -> list:
  """The module names of `python -m rlrag_jax.X` / `python3 -m rlrag_jax.X` in `text`."""
  found = re.findall(r"\bpython3? -m (rlrag_jax(?:\.\w+)*)", text)
  return sorted({m.rstrip(".") for m in found})


def test_readme_commands_are_found():
  text = "run `python -m rlrag_jax.train --config=x` or python3 -m rlrag_jax.bench.memory."
  assert readme_commands(text) == ["rlrag_jax.bench.memory", "rlrag_jax.train"]


README_COMMANDS = readme_commands((ROOT / "README.md").read_text())


def test_the_readme_names_its_commands():
  assert len(README_COMMANDS) >= 10 and "rlrag_jax.train" in README_COMMANDS


@pytest.mark.parametrize("name", README_COMMANDS)
def test_every_readme_command_answers_help(name):
  """`python -m NAME --help` prints how to call it, with no traceback; its own interpreter each,
  since absl's flags are process-global (two entry points define --config). absl's `app.run`
  answers --help with its usage and exit status 1, by design (absl/app.py): that passes too."""
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  proc = subprocess.run([sys.executable, "-m", name, "--help"], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)
  text = proc.stdout + proc.stderr
  absl_help = proc.returncode == 1 and "Try --helpfull to get a list of all flags." in text
  assert proc.returncode == 0 or absl_help, f"exit {proc.returncode}:\n{text[-3000:]}"
  assert "Traceback" not in text and ("usage" in text.lower() or "--" in text), text[-3000:]
