"""Where the real dataset samples live: env RLRAG_DATA_DIR, default ../shared/data beside the repo
(a run's config key `data.dir` replaces both for its data mix: `rlrag_jax.data.sources`)."""
from __future__ import annotations

import os
import pathlib

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def data_dir() -> pathlib.Path:
  env = os.environ.get("RLRAG_DATA_DIR")
  if env:
    return pathlib.Path(env).expanduser().resolve()
  return (REPO_ROOT.parent / "shared" / "data").resolve()


def data_dir_origin() -> str:
  """Where `data_dir()` comes from, for error messages: the variable as set, or the default and
  how to change it."""
  env = os.environ.get("RLRAG_DATA_DIR")
  if env:
    return f"data dir {data_dir()} from RLRAG_DATA_DIR={env}"
  return f"data dir {data_dir()}, the default: set RLRAG_DATA_DIR (or config key data.dir)"
