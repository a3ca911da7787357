"""Where the real dataset samples live: env RLRAG_DATA_DIR, default ../shared/data beside the repo."""
from __future__ import annotations

import os
import pathlib

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def data_dir() -> pathlib.Path:
  env = os.environ.get("RLRAG_DATA_DIR")
  if env:
    return pathlib.Path(env).expanduser().resolve()
  return (REPO_ROOT.parent / "shared" / "data").resolve()
