"""retriever_for: retrieval.scann_brute_force_below decides which ScaNN runs, is part of the
index cache's fingerprint, and the mode is logged and written beside the index."""
import json
import logging

import ml_collections
import numpy as np
import pytest

from retrieval_helpers import HashEncoder
from rlrag_jax.data.schema import CorpusRecord
from rlrag_jax.retrieval import from_config
from rlrag_jax.retrieval.index import BRUTE_FORCE_BELOW

N = 800
WORDS = [f"w{i}" for i in range(60)]


def _corpus():
  rng = np.random.default_rng(0)
  return [CorpusRecord(id=f"p{i}", title=f"T{i}", text=" ".join(rng.choice(WORDS, 6)))
          for i in range(N)]


def _config(tmp_path, backend, **retrieval):
  c = ml_collections.ConfigDict(dict(method="t", workdir=str(tmp_path), retrieval=dict(
      backend=backend, corpus="", index="", encoder_path="", pooling="", query_prefix="auto",
      passage_prefix="auto", cache_dir="", url="")))
  c.retrieval.update(retrieval)
  return c


def test_the_threshold_selects_brute_force_or_partitioned_and_keys_the_cache(tmp_path, caplog):
  corpus, enc = _corpus(), HashEncoder(dim=16)
  with caplog.at_level(logging.INFO, logger="rlrag_jax.retrieval"):
    _, brute, brute_dir = from_config.retriever_for(
        _config(tmp_path, "scann", scann_brute_force_below=BRUTE_FORCE_BELOW), corpus, enc)
    _, part, part_dir = from_config.retriever_for(
        _config(tmp_path, "scann", scann_brute_force_below=100), corpus, enc)
  assert brute.index.mode == "brute_force" and part.index.mode == "partitioned"
  assert brute_dir != part_dir                   # a cached brute-force index is not reused
  said = [(r.levelname, r.getMessage()) for r in caplog.records if "ScaNN" in r.getMessage()]
  assert said[0] == ("WARNING", f"ScaNN brute force (N={N} < brute_force_below="
                     f"{BRUTE_FORCE_BELOW}): exact float search, no partitioning or quantisation")
  assert said[1][0] == "INFO" and said[1][1].startswith(
      f"ScaNN partitioned (N={N} >= brute_force_below=100): 28 leaves, 7 searched")
  for folder, mode in ((brute_dir, "brute_force"), (part_dir, "partitioned")):
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["index_mode"] == mode and manifest["built_by"] == {"corpus": "selection",
                                                                       "n": N}
  # the cache hit loads the partitioned index back, and says so again
  caplog.clear()
  with caplog.at_level(logging.INFO, logger="rlrag_jax.retrieval"):
    _, again, again_dir = from_config.retriever_for(
        _config(tmp_path, "scann", scann_brute_force_below=100), corpus, enc)
  assert again_dir == part_dir and again.index.mode == "partitioned"
  assert any(m.startswith("ScaNN partitioned") for m in caplog.messages)


def test_a_saved_config_without_the_key_gets_the_default_and_exact_ignores_it(tmp_path):
  from rlrag_jax import config_base
  corpus, enc = _corpus(), HashEncoder(dim=16)
  saved = _config(tmp_path, "scann")             # a run's config.json from before the key
  assert config_base.ADDED_LATER["retrieval.scann_brute_force_below"] == BRUTE_FORCE_BELOW
  assert "retrieval.scann_brute_force_below" in config_base.fill_added_later(
      saved, config_base.ADDED_LATER)
  _, old, old_dir = from_config.retriever_for(saved, corpus, enc)
  _, _, new_dir = from_config.retriever_for(
      _config(tmp_path, "scann", scann_brute_force_below=BRUTE_FORCE_BELOW), corpus, enc)
  assert old.index.mode == "brute_force" and old_dir == new_dir
  _, ex, ex_dir = from_config.retriever_for(
      _config(tmp_path, "exact", scann_brute_force_below=100), corpus, enc)
  _, _, ex_dir2 = from_config.retriever_for(
      _config(tmp_path, "exact", scann_brute_force_below=5), corpus, enc)
  assert ex.index.mode == "exact" and ex_dir == ex_dir2


@pytest.mark.parametrize("name", ["apex_executor", "r2ag", "r2ag_generator", "search", "sparkle"])
def test_configs_that_can_choose_scann_declare_todays_threshold(name):
  import importlib
  mod = importlib.import_module(f"configs.{name}")
  for preset in ("", "paper"):
    c = mod.get_config(preset)
    assert c.retrieval.scann_brute_force_below == BRUTE_FORCE_BELOW
  assert mod.get_config("paper").retrieval.backend == "scann"
