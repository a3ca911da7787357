"""Experiments built on `trainer.run`: each runs several configurations and compares them.

  python -m rlrag_jax.experiments.kl_stability     # k2 vs k3 KL loss at an aggressive lr

The checkpoint diagnostics (`headroom`, `grad_noise`) and `rlrag_jax.evaluate` share the two
helpers below: loading a checkpoint for a command, and writing its table and JSON.
"""
import json
import pathlib
import sys
from typing import Optional


def load_checkpoint(command: str, config, path: str, step: Optional[int] = None):
  """(task, lm) of the checkpoint at `path` under `config` (`trainer.task_for_checkpoint`), or
  None after printing "<command>: <why>" to stderr when `path` holds no checkpoint."""
  from rlrag_jax.trainer import task_for_checkpoint
  try:
    return task_for_checkpoint(config, path, step=step)
  except FileNotFoundError as e:
    print(f"{command}: {e}", file=sys.stderr)
    return None


def write_report(out: str, stem: str, table: str, payload: dict) -> None:
  """`out/<stem>.txt` (the printed table) and `out/<stem>.json`; `out` is created."""
  d = pathlib.Path(out)
  d.mkdir(parents=True, exist_ok=True)
  from rlrag_jax.runlog import write_atomic
  write_atomic(d / f"{stem}.txt", table + "\n")
  write_atomic(d / f"{stem}.json", json.dumps(payload, indent=2))
