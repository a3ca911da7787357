"""Tiny random Qwen2 / Llama checkpoints (built with transformers + CPU torch), shared per session."""
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))   # tests/ for hf_tiny

from hf_tiny import load_reference, make_tiny_checkpoint  # noqa: E402


@pytest.fixture(scope="session", params=["qwen2", "llama"])
def tiny(request, tmp_path_factory):
  """(lm, reference transformers model, checkpoint dir) for each model type."""
  from rlrag_jax.models import load_hf
  path = make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt"), request.param)
  return load_hf(path), load_reference(path), path


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory):
  from rlrag_jax.models import load_hf
  path = make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt_q"), "qwen2", seed=1)
  return load_hf(path), load_reference(path), path
