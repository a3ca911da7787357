"""Retriever: build/search/exclude, save -> load, refusal of broken folders, a real corpus."""
import json
import shutil

import numpy as np
import pytest

from retrieval_helpers import HashEncoder, random_unit
from rlrag_jax.data.schema import CorpusRecord
from rlrag_jax.retrieval import Hit, Retriever, RetrieverFormatError
from rlrag_jax.retrieval.index import ExactIndex
from rlrag_jax.retrieval.retriever import as_record, numbered_passages, passage_text

N, D = 5000, 32


def _corpus(n=N):
  return [CorpusRecord(id=f"p{i}", title=f"Title {i}", text=f"text of passage {i}")
          for i in range(n)]


@pytest.fixture(scope="module")
def vectors():
  return random_unit(N, D, 10), random_unit(12, D, 11)


@pytest.fixture(scope="module")
def scann_retriever(vectors):
  db, _ = vectors
  return Retriever.from_embeddings(_corpus(), db, "scann", num_leaves=50, num_leaves_to_search=50,
                                   training_sample_size=N, brute_force_below=1000)


def _ids(hits):
  return [[h.id for h in row] for row in hits]


def test_exact_search_matches_numpy_and_returns_hits(vectors):
  db, q = vectors
  r = Retriever.from_embeddings(_corpus(), db, "exact")
  hits = r.search_embeddings(q, k=7)
  order = np.argsort(-(q @ db.T), axis=1)[:, :7]
  assert _ids(hits) == [[f"p{j}" for j in row] for row in order]
  h = hits[0][0]
  assert isinstance(h, Hit) and h.title == f"Title {order[0, 0]}" and h.text.startswith("text of")
  assert h.score == pytest.approx(float(q[0] @ db[order[0, 0]]), abs=1e-5)


@pytest.mark.parametrize("backend", ["exact", "scann"])
def test_exclude_skips_ids_and_still_returns_k(vectors, scann_retriever, backend):
  db, q = vectors
  r = scann_retriever if backend == "scann" else Retriever.from_embeddings(_corpus(), db, "exact")
  k = 5
  full = _ids(r.search_embeddings(q, k=k + 20))
  exclude = [set(row[:3]) | {"not-in-corpus"} for row in full]   # drop each query's top 3
  exclude[1] = None                                               # no exclusion for query 1
  got = _ids(r.search_embeddings(q, k=k, exclude=exclude))
  truth = np.argsort(-(q @ db.T), axis=1)
  for qi, row in enumerate(got):
    skip = exclude[qi] or set()
    assert len(row) == k and not skip & set(row)
    expect = [f"p{j}" for j in truth[qi] if f"p{j}" not in skip][:k]
    assert len(set(row) & set(expect)) >= k - 1   # scann is approximate; exact must be equal
    if backend == "exact":
      assert row == expect


def test_exclude_almost_everything_returns_the_rest():
  db = random_unit(40, 8, 12)
  r = Retriever.from_embeddings(_corpus(40), db, "scann")
  keep = {"p3", "p17"}
  got = r.search_embeddings(db[:1], k=5, exclude=[{f"p{i}" for i in range(40)} - keep])
  assert {h.id for h in got[0]} == keep
  with pytest.raises(ValueError, match="one collection of ids per query"):
    r.search_embeddings(db[:2], k=5, exclude=[{"p1"}])


def test_scann_shortfall_falls_back_to_exact(vectors):
  db, q = vectors
  # one leaf of 100 holds ~50 points: 60 results after excluding 30 need more than most have
  r = Retriever.from_embeddings(_corpus(), db, "scann", num_leaves=100, num_leaves_to_search=1,
                                training_sample_size=N, brute_force_below=1000)
  top = _ids(r.search_embeddings(q, k=30))
  got = r.search_embeddings(q, k=60, exclude=[set(t) for t in top])
  ran_dry = (r.index.search(q, 90)[1] < 0).any(axis=1)
  assert ran_dry.any()
  truth = np.argsort(-(q @ db.T), axis=1)
  for qi, (row, t) in enumerate(zip(got, top)):
    ids = [h.id for h in row]
    assert len(ids) == len(set(ids)) == 60 and not set(ids) & set(t)
    if ran_dry[qi]:   # answered exactly
      assert ids == [f"p{j}" for j in truth[qi] if f"p{j}" not in set(t)][:60]


@pytest.mark.parametrize("backend", ["exact", "scann"])
def test_save_load_identical_results(tmp_path, vectors, scann_retriever, backend):
  db, q = vectors
  r = scann_retriever if backend == "scann" else Retriever.from_embeddings(_corpus(), db, "exact")
  before = r.search_embeddings(q, k=10)
  r.save(tmp_path / "orig")
  if backend == "scann":   # ScaNN's float copy is deduplicated against embeddings.npy
    assert not (tmp_path / "orig" / "scann" / "dataset.npy").exists()
  shutil.move(tmp_path / "orig", tmp_path / "moved")
  loaded = Retriever.load(tmp_path / "moved")
  assert loaded.backend == backend and len(loaded) == N and loaded.dim == D
  mode = "partitioned" if backend == "scann" else "exact"   # the fixture lowers the threshold
  assert loaded.index.mode == mode
  assert json.loads((tmp_path / "moved" / "manifest.json").read_text())["index_mode"] == mode
  assert loaded.search_embeddings(q, k=10) == before
  with pytest.raises(ValueError, match="no encoder"):
    loaded.search(["a query"], k=3)


def test_a_relative_folder_loads(tmp_path, vectors, scann_retriever, monkeypatch):
  db, q = vectors
  scann_retriever.save(tmp_path / "rel")
  monkeypatch.chdir(tmp_path)          # ScaNN once read a relative asset path as an empty file
  loaded = Retriever.load("rel")
  assert loaded.index.mode == "partitioned"
  assert _ids(loaded.search_embeddings(q, 5)) == _ids(scann_retriever.search_embeddings(q, 5))


def test_build_search_with_an_encoder(tmp_path):
  enc = HashEncoder(dim=D)
  corpus = [{"id": "a", "title": "Paris", "text": "capital of france on the seine"},
            {"id": "b", "title": "Berlin", "text": "capital of germany on the spree"},
            {"id": "c", "title": "Madrid", "text": "capital of spain"}]
  r = Retriever.build(corpus, enc, backend="exact")
  emb = enc.encode([passage_text(c["title"], c["text"]) for c in corpus])
  np.testing.assert_allclose(r.embeddings, emb)
  assert r.search(["germany spree"], k=1)[0][0].id == "b"
  r.save(tmp_path)
  assert Retriever.load(tmp_path, encoder=enc).search(["germany spree"], k=1)[0][0].id == "b"
  with pytest.raises(RetrieverFormatError, match=r"manifest\.json.*'d' is 32.*16-d"):
    Retriever.load(tmp_path, encoder=HashEncoder(dim=16))
  other = HashEncoder(dim=D)
  other.id = "other@ffffffffffffffff"
  with pytest.raises(RetrieverFormatError, match=r"field 'encoder'"):
    Retriever.load(tmp_path, encoder=other)
  assert len(Retriever.load(tmp_path, encoder=other, check_encoder=False)) == 3
  with pytest.raises(ValueError, match="unique"):
    Retriever.build(corpus + [corpus[0]], enc, backend="exact")


def test_as_record_formats():
  r = as_record({"id": 7, "contents": '"Evan Morris"\nEvan L. Morris was a lobbyist.'}, 0)
  assert (r.id, r.title, r.text) == ("7", "Evan Morris", "Evan L. Morris was a lobbyist.")
  r = as_record({"title": "T", "text": "body"}, 4)
  assert (r.id, r.title, r.text) == ("4", "T", "body")
  with pytest.raises(ValueError, match=r"row 2.*'text'"):
    as_record({"id": "x", "body": "?"}, 2)


# ------------------------------------------------------------------------------- refusals
@pytest.fixture()
def saved(tmp_path, scann_retriever):
  scann_retriever.save(tmp_path / "r")
  return tmp_path / "r"


def _manifest(folder):
  return json.loads((folder / "manifest.json").read_text())


def _write_manifest(folder, m):
  (folder / "manifest.json").write_text(json.dumps(m))


def test_refuses_corrupt_embeddings(saved):
  p = saved / "embeddings.npy"
  raw = bytearray(p.read_bytes())
  raw[-5] ^= 0xFF
  p.write_bytes(bytes(raw))
  with pytest.raises(RetrieverFormatError, match=r"embeddings\.npy: checksum mismatch"):
    Retriever.load(saved)


def test_refuses_missing_scann_asset(saved):
  (saved / "scann" / "ah_codebook.pb").unlink()
  with pytest.raises(RetrieverFormatError, match=r"scann/ah_codebook\.pb: missing"):
    Retriever.load(saved)


def test_refuses_missing_manifest_and_wrong_version(saved):
  m = _manifest(saved)
  m["format_version"] = 99
  _write_manifest(saved, m)
  with pytest.raises(RetrieverFormatError, match=r"manifest\.json: field 'format_version' is 99"):
    Retriever.load(saved)
  (saved / "manifest.json").unlink()
  with pytest.raises(RetrieverFormatError, match=r"manifest\.json: missing"):
    Retriever.load(saved)


def test_refuses_dimension_mismatch(saved):
  # a consistent-looking folder whose embeddings have the wrong width
  np.save(saved / "embeddings.npy", random_unit(N, D + 1, 0))
  m = _manifest(saved)
  from rlrag_jax.retrieval.retriever import file_digest
  m["files"]["embeddings.npy"] = file_digest(saved / "embeddings.npy")
  _write_manifest(saved, m)
  with pytest.raises(RetrieverFormatError, match=rf"embeddings\.npy: expected float32 \[{N}, {D}\]"):
    Retriever.load(saved)


def test_refuses_corpus_count_mismatch(saved):
  from rlrag_jax.retrieval import store as store_lib
  store_lib.write_records(_corpus(N - 1), saved / "store")
  m = _manifest(saved)
  from rlrag_jax.retrieval.retriever import file_digest
  for name in list(m["files"]):
    if name.startswith("store/"):
      m["files"][name] = file_digest(saved / name)
  _write_manifest(saved, m)
  with pytest.raises(RetrieverFormatError, match=rf"store: {N - 1} passages.*'n' says {N}"):
    Retriever.load(saved)


def test_refuses_an_encoder_of_other_conventions(tmp_path):
  Retriever.build(_corpus(20), HashEncoder(D), backend="exact").save(tmp_path)
  enc = HashEncoder(D)
  enc.conventions = lambda: {"pooling": "bag-of-words", "normalize": True,
                             "query_prefix": "query: ", "passage_prefix": ""}
  with pytest.raises(RetrieverFormatError,
                     match=r"manifest\.json: field 'conventions.query_prefix' is ''.*'query: '"):
    Retriever.load(tmp_path, enc)
  assert len(Retriever.load(tmp_path, HashEncoder(D))) == 20


def test_a_store_backed_retriever_equals_the_list_backed_one(saved, vectors):
  db, q = vectors
  loaded = Retriever.load(saved)
  assert loaded.records.__class__.__name__ == "PassageStore"
  assert loaded.record_of("p17") == _corpus()[17] and loaded.record_of("nope") is None
  ref = Retriever.from_embeddings(_corpus(), db, "exact")
  exclude = [{"p1", "p2"}] * len(q)
  assert _ids(loaded.search_embeddings(q, 5, exclude)) == _ids(ref.search_embeddings(q, 5,
                                                                                     exclude))


# ------------------------------------------------------------------------------- real corpus
@pytest.mark.data
@pytest.mark.slow
def test_title_query_finds_its_passage_on_wiki18(shared_data_dir):
  from rlrag_jax.retrieval import Encoder
  rows = [json.loads(line) for line in
          (shared_data_dir / "corpus" / "wiki18_flashrag_sample.jsonl").read_text().splitlines()]
  corpus = [as_record(x, i) for i, x in enumerate(rows[:150])]
  enc = Encoder.from_pretrained(max_length=128)   # shorter than 256 keeps the test quick
  r = Retriever.build(corpus, enc, backend="scann")
  probe = corpus[::10]
  hits = r.search([c.title for c in probe], k=5)
  found = [c.id in {h.id for h in row} for c, row in zip(probe, hits)]
  assert all(found), [c.title for c, ok in zip(probe, found) if not ok]
  # and the index agrees with exact search on the same embeddings
  _, exact = ExactIndex(r.embeddings).search(enc.encode([c.title for c in probe]), 5)
  assert [[h.id for h in row] for row in hits] == [[corpus[j].id for j in row] for row in exact]


def test_numbered_passages_cut_each_text_to_its_first_words():
  docs = [("Alpha", "one two three four"), ("Beta", "five six")]
  assert numbered_passages(docs) == "[1] Alpha: one two three four\n[2] Beta: five six"
  assert numbered_passages(docs, passage_words=2) == "[1] Alpha: one two\n[2] Beta: five six"
  assert numbered_passages([]) == "(none)"
