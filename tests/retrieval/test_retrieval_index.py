"""Exact index against numpy; ScaNN against the exact index; ScaNN persistence."""
import logging
import os
import shutil

import numpy as np
import pytest

from retrieval_helpers import random_unit
from rlrag_jax.retrieval.index import ExactIndex, ScannIndex, scann_defaults


def _recall(found, truth):
  return float(np.mean([len(set(f) & set(t)) / len(t) for f, t in zip(found, truth)]))


@pytest.mark.parametrize("n,k,nq", [(3000, 10, 37), (50, 80, 5), (1, 3, 2)])
def test_exact_topk_matches_numpy_argsort(n, k, nq):
  db, q = random_unit(n, 24, 0), random_unit(nq, 24, 1)
  scores, ids = ExactIndex(db, query_batch=16).search(q, k)
  ref = q.astype(np.float64) @ db.astype(np.float64).T
  order = np.argsort(-ref, axis=1, kind="stable")[:, :min(k, n)]
  assert ids.shape == scores.shape == (nq, min(k, n)) and ids.dtype == np.int64
  np.testing.assert_array_equal(ids, order)
  np.testing.assert_allclose(scores, np.take_along_axis(ref, order, axis=1), atol=1e-5)


def test_exact_rejects_wrong_dimension():
  with pytest.raises(ValueError, match=r"d=8.*\(2, 9\)"):
    ExactIndex(random_unit(10, 8, 0)).search(random_unit(2, 9, 1), 3)


@pytest.mark.slow
def test_scann_recall_at_10_on_50k_random_unit_vectors():
  db, q = random_unit(50_000, 384, 0), random_unit(300, 384, 1)
  _, truth = ExactIndex(db).search(q, 10)
  # Random unit vectors have no cluster structure, so pruning leaves costs recall quickly; this
  # measures partition residuals + AH scoring + reorder, scanning every leaf.
  index = ScannIndex(db, num_leaves=100, num_leaves_to_search=100, training_sample_size=20_000,
                     reorder_k=300)
  assert not index.params()["brute_force"]
  scores, found = index.search(q, 10)
  assert _recall(found, truth) >= 0.95
  # scores are inner products of the returned rows
  np.testing.assert_allclose(scores, np.einsum("qd,qkd->qk", q, db[found]), atol=1e-4)


def test_scann_defaults_scale_with_n():
  small, big = scann_defaults(10_000), scann_defaults(1_000_000)
  assert small["num_leaves"] == 100 and big["num_leaves"] == 1000
  assert 1 <= small["num_leaves_to_search"] < small["num_leaves"]
  assert big["training_sample_size"] <= 1_000_000


def test_scann_small_corpus_is_brute_force_and_exact(caplog):
  db, q = random_unit(3000, 16, 2), random_unit(7, 16, 3)
  with caplog.at_level(logging.INFO, logger="rlrag_jax.retrieval"):
    index = ScannIndex(db)
  assert index.params()["brute_force"] and index.mode == "brute_force"
  # said once, as a warning: whoever chose ScaNN gets exact search
  said = [r for r in caplog.records if "ScaNN" in r.getMessage()]
  assert [(r.levelno, r.getMessage()) for r in said] == [
      (logging.WARNING, "ScaNN brute force (N=3000 < brute_force_below=16384): exact float "
       "search, no partitioning or quantisation")]
  s, i = index.search(q, 5)
  es, ei = ExactIndex(db).search(q, 5)
  np.testing.assert_array_equal(i, ei)
  np.testing.assert_allclose(s, es, atol=1e-5)
  with pytest.raises(ValueError, match="empty"):
    ScannIndex(np.zeros((0, 16), np.float32))


def _clustered_unit(n, d, centres, noise, seed):
  """Unit vectors around `centres` random directions: structure a partition can use."""
  rng = np.random.default_rng(seed)
  c = rng.standard_normal((centres, d))
  x = c[rng.integers(0, centres, n)] + noise * rng.standard_normal((n, d))
  return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_scann_partitioned_below_the_default_threshold_is_approximate_with_high_recall(caplog):
  """3,000 vectors, under the default brute_force_below: lowering it makes the tree +
  AH + reorder path run with its default search parameters (a quarter of the leaves). It is then
  not exact search (some top-10 lists differ from ExactIndex's) yet keeps recall@10 high.
  ScaNN's k-means is not reproducible from build to build (seeds in its config do not fix it):
  over 25 builds recall@10 was 0.87-0.94 and 67-80% of the lists equal exact search's."""
  db = _clustered_unit(3000, 32, centres=40, noise=0.5, seed=0)
  rng = np.random.default_rng(1)
  q = db[rng.integers(0, 3000, 300)] + 0.3 * rng.standard_normal((300, 32)).astype(np.float32)
  q /= np.linalg.norm(q, axis=1, keepdims=True)
  with caplog.at_level(logging.INFO, logger="rlrag_jax.retrieval"):
    index = ScannIndex(db, brute_force_below=1000)
  p = index.params()
  assert index.mode == "partitioned" and not p["brute_force"]
  assert (p["num_leaves"], p["num_leaves_to_search"]) == (55, 14)      # scann_defaults(3000)
  said = [r for r in caplog.records if "ScaNN" in r.getMessage()]
  assert [(r.levelno, r.getMessage()) for r in said] == [
      (logging.INFO, "ScaNN partitioned (N=3000 >= brute_force_below=1000): 55 leaves, 14 "
       "searched, AH 2 dims/block, reorder_k=200 over float32, trained on 3000")]
  _, found = index.search(q, 10)
  _, truth = ExactIndex(db).search(q, 10)
  same_rows = float(np.mean(np.all(found == truth, axis=1)))
  assert same_rows < 0.95                     # brute force gives 1.0
  assert _recall(found, truth) >= 0.8


@pytest.fixture(scope="module")
def small_scann():
  db = random_unit(6000, 32, 4)
  return db, ScannIndex(db, num_leaves=40, num_leaves_to_search=10, training_sample_size=6000,
                        brute_force_below=1000)


def test_scann_missing_slots_are_marked(small_scann):
  db, index = small_scann
  # one leaf holds ~150 points: asking for 1000 from one leaf leaves slots empty
  s, i = index.search(db[:3], 1000, leaves_to_search=1, reorder_k=1000)
  assert i.shape == (3, 1000)
  assert np.all((i == -1) == np.isneginf(s)) and (i == -1).any()
  for row in i:
    real = row[row >= 0]
    assert len(set(real.tolist())) == len(real)


def test_scann_save_load_moved_folder_with_absolute_asset_paths(small_scann, tmp_path):
  db, index = small_scann
  q = random_unit(20, 32, 5)
  before = index.search(q, 10)
  params = index.save(tmp_path / "a")
  # emulate serialize(relative_path=False): absolute paths to the original location
  pbtxt = tmp_path / "a" / "scann" / "scann_assets.pbtxt"
  text = pbtxt.read_text()
  for name in os.listdir(pbtxt.parent):
    text = text.replace(f'"{name}"', f'"{pbtxt.parent / name}"')
  assert str(tmp_path / "a") in text
  pbtxt.write_text(text)
  shutil.move(tmp_path / "a", tmp_path / "b")   # the absolute paths now point nowhere
  loaded = ScannIndex.load(tmp_path / "b", db, params)
  after = loaded.search(q, 10)
  np.testing.assert_array_equal(before[1], after[1])
  np.testing.assert_array_equal(before[0], after[0])
  (tmp_path / "b" / "scann" / "hashed_dataset.npy").unlink()
  with pytest.raises(FileNotFoundError, match=r"hashed_dataset\.npy"):
    ScannIndex.load(tmp_path / "b", db, params)
