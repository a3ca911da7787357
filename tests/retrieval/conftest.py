"""Fixtures for the retrieval tests: the packaged MiniLM encoder and its tokenizer."""
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")          # nothing here may reach a hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def minilm_dir():
  from rlrag_jax.retrieval.encoder import default_model_dir
  return default_model_dir()


@pytest.fixture(scope="session")
def minilm(minilm_dir):
  from rlrag_jax.retrieval import Encoder
  return Encoder.from_pretrained()


@pytest.fixture(scope="session")
def minilm_tokenizer(minilm_dir):
  from transformers import AutoTokenizer
  return AutoTokenizer.from_pretrained(str(minilm_dir), local_files_only=True)
