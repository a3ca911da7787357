"""launch/gpu_check.sh, the one command of a GPU session: its plan (--dry-run) and its steps
end to end at CPU size (--reduced): the environment's versions, the install check, the
accelerator bench's records and the main job, each step's status in summary.txt."""
import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "launch" / "gpu_check.sh"


def _run(tmp_path, *args, **env):
  proc = subprocess.run(["bash", str(SCRIPT), "--out", str(tmp_path / "out"), *args],
                        cwd=ROOT, capture_output=True, text=True, timeout=1500,
                        env=dict(os.environ, **env))
  return proc, tmp_path / "out"


def test_dry_run_names_every_step_and_runs_none(tmp_path):
  proc, out = _run(tmp_path, "--dry-run")
  assert proc.returncode == 0, proc.stderr
  text = proc.stdout
  assert "-m rlrag_jax.bench.accelerator --budget-s 250 --sections update,sampler" in text
  assert "-m rlrag_jax.train --config=configs/arena.py:gpu --config.seed=0" in text
  steps = (out / "summary.txt").read_text().split("\n")
  assert [l.split()[0] for l in steps if l] == ["env", "install", "accelerator", "arena_seed0"]
  assert not (out / "accelerator").exists()


def test_unknown_arguments_are_refused(tmp_path):
  proc, _ = _run(tmp_path, "--budget", "3")
  assert proc.returncode == 2 and "unknown argument '--budget'" in proc.stderr


@pytest.mark.slow
def test_reduced_run_writes_every_step_under_one_folder(tmp_path):
  proc, out = _run(tmp_path, "--reduced", ACCEL_BUDGET_S="300", ARENA_LIMIT_S="1200")
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
  summary = (out / "summary.txt").read_text()
  for step in ("env", "install", "accelerator", "arena_seed0"):
    assert f"{step} exit 0 " in summary, summary
  env = (out / "env.log").read_text()
  assert "jax:" in env and "jaxlib:" in env and "python" in env
  recs = [json.loads(l) for l in (out / "accelerator" / "sections.jsonl").read_text().split("\n")
          if l]
  # off a GPU the Pallas section is recorded as skipped (its kernel would be interpreted)
  assert {r["section"]: r["status"] for r in recs} == dict(device="ok", sampler_xla="ok",
                                                          sampler_pallas="skipped")
  assert "XLA compiles over the run" in (out / "arena_seed0.log").read_text()
