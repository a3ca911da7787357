"""Tiny random Qwen2 / Llama / Qwen3 checkpoints (built with transformers + CPU torch), shared per session."""
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))   # tests/ for hf_tiny

from hf_tiny import load_reference, make_tiny_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
  """{model_type: (lm, reference transformers model, checkpoint dir)}; same shapes for both, so
  compiled sampler programs are shared between tests."""
  from rlrag_jax.models import load_hf
  out = {}
  for model_type in ("qwen2", "llama", "qwen3"):
    path = make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt"), model_type)
    out[model_type] = (load_hf(path), load_reference(path), path)
  return out


@pytest.fixture(params=["qwen2", "llama", "qwen3"])
def tiny(request, tiny_models):
  return tiny_models[request.param]


@pytest.fixture
def tiny_qwen(tiny_models):
  return tiny_models["qwen2"]
