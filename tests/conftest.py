"""Shared fixtures: the real-data folder (skip when absent, fail under CI=true)."""
import os
import pathlib

import pytest

from rlrag_jax.data.paths import data_dir


def _ci() -> bool:
  return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def shared_data_dir() -> pathlib.Path:
  """The folder with the real HotpotQA/2Wiki/MuSiQue/Bamboogle samples."""
  d = data_dir()
  if not d.is_dir():
    msg = f"real data samples not found at {d} (set RLRAG_DATA_DIR)"
    if _ci():
      pytest.fail(msg + "; under CI=true they are required")
    pytest.skip(msg)
  return d
