"""Reading the SFT trajectory files that `python -m rlrag_jax.methods.sparkle.trajectories`
writes (one JSON line per question: {"id", "question", "prediction", "f1", "correct",
"samples": [{"role", "prompt", "target"}, ...]}): the task's side of that file, kept apart
from the collector, which builds the task."""
from __future__ import annotations

import json
import pathlib


def read_trajectories(path) -> dict:
  """{example id: [(role, prompt, target)]} of the correct trajectories in a file that
  trajectories.py wrote; a malformed line names file and line."""
  out = {}
  p = pathlib.Path(path).expanduser()
  if not p.exists():
    raise FileNotFoundError(f"config key 'sparkle.sft_trajectories': {p} does not exist (write "
                            "it with python -m rlrag_jax.methods.sparkle.trajectories)")
  for n, line in enumerate(p.read_text().splitlines(), start=1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
      if row["correct"]:
        out[str(row["id"])] = [(str(s["role"]), str(s["prompt"]), str(s["target"]))
                               for s in row["samples"]]
    except (ValueError, KeyError, TypeError) as e:
      raise ValueError(f"{p}:{n}: expected {{'id', 'correct', 'samples': [{{'role', 'prompt', "
                       f"'target'}}]}} ({e})") from None
  return out
