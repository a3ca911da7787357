"""Shared fixtures: the real-data folder (skip when absent, fail under CI=true)."""
import pathlib

import pytest

from _deps import ci
from rlrag_jax.data.paths import data_dir


@pytest.fixture(scope="session")
def shared_data_dir() -> pathlib.Path:
  """The folder with the real HotpotQA/2Wiki/MuSiQue/Bamboogle samples."""
  d = data_dir()
  if not d.is_dir():
    msg = f"real data samples not found at {d} (set RLRAG_DATA_DIR)"
    if ci():
      pytest.fail(msg + "; under CI=true they are required")
    pytest.skip(msg)
  return d
