"""The index build CLI, its passage store and the index folder, against independent references:
`loaders.load_corpus` for the store, an uninterrupted single-process build for the resumed and the
two-process ones, exact search for ScaNN, FAISS's own vectors for the import."""
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest

from retrieval_helpers import tiny_torch_model
from rlrag_jax.data import loaders
from rlrag_jax.retrieval import build, store as store_lib
from rlrag_jax.retrieval.index import ExactIndex
from rlrag_jax.retrieval.retriever import Retriever, RetrieverFormatError

REPO = pathlib.Path(__file__).resolve().parents[2]
N, SHARD = 20_000, 2_000
WORDS = [f"w{i}" for i in range(400)]


def _env():
  return {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  """A tiny random BERT (the packaged MiniLM's tokenizer) and a 20k-passage FlashRAG corpus."""
  from transformers import AutoTokenizer
  from rlrag_jax.retrieval.encoder import default_model_dir
  root = tmp_path_factory.mktemp("build")
  enc = root / "tiny-bert"
  tiny_torch_model("bert", seed=0).save_pretrained(enc)
  AutoTokenizer.from_pretrained(str(default_model_dir()), local_files_only=True).save_pretrained(enc)
  rng = np.random.default_rng(0)
  corpus = root / "corpus.jsonl"
  with open(corpus, "w") as f:
    for i in range(N):
      text = " ".join(rng.choice(WORDS, 12))
      f.write(json.dumps({"id": f"d{i}", "contents": f'"Title {i % 997}"\n{text}'}) + "\n")
  return root, enc, corpus


def _args(world, out, *extra):
  _, enc, corpus = world
  return ["--corpus", str(corpus), "--out", str(out), "--encoder", str(enc), "--shard-size",
          str(SHARD), "--quiet", *extra]


@pytest.fixture(scope="module")
def reference(world):
  """An uninterrupted single-process build (exact backend: its search is deterministic)."""
  out = world[0] / "reference"
  assert build.main(_args(world, out, "--backend", "exact")) == 0
  return out


def _queries(k=40):
  rng = np.random.default_rng(1)
  return [" ".join(rng.choice(WORDS, 4)) for _ in range(k)]


def _hits(folder, enc_dir, queries, k=10):
  from rlrag_jax.retrieval import Encoder
  r = Retriever.load(folder, Encoder.from_pretrained(enc_dir))
  return [[(h.id, round(h.score, 5)) for h in row] for row in r.search(queries, k)]


# ------------------------------------------------------------------------------ the store
def test_the_store_reads_three_layouts_like_the_loader(tmp_path):
  flash = tmp_path / "flash.jsonl"
  flash.write_text('{"id": "7", "contents": "\\"Alpha\\"\\nfirst text"}\n\n'
                   '{"id": "x9", "contents": "no title line"}\n')
  plain = tmp_path / "plain.jsonl"
  plain.write_text('{"title": "A", "text": " one "}\n{"title": "B", "text": "two"}\n')
  tsv = tmp_path / "psgs.tsv"
  tsv.write_text('id\ttext\ttitle\n1\t"a ""quoted"" text"\tT1\n2\tplain\tT2\n')
  for path in (flash, plain, tsv):
    store = store_lib.write_store(path, tmp_path / f"store-{path.stem}", progress=False)
    ref = loaders.load_corpus(path)
    assert list(store) == ref and len(store) == len(ref)
    for row, r in enumerate(ref):
      assert store[row] == r and store.row_of(r.id) == row
    assert store.row_of("absent") is None
  assert store_lib.PassageStore(tmp_path / "store-psgs")[0].text == 'a "quoted" text'
  assert store_lib.PassageStore(tmp_path / "store-plain").ids_are_rows      # ids = rows
  assert not store_lib.PassageStore(tmp_path / "store-flash").ids_are_rows  # ids hashed


def test_a_malformed_row_is_named_and_skipped_only_when_asked(tmp_path, world):
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"id": "a", "contents": "\\"T\\"\\nok"}\n{"id": "b", "content": "typo"}\n'
                 '{"id": "c", "contents": "\\"T\\"\\nok too"}\n')
  with pytest.raises(loaders.DataError, match=r"bad\.jsonl:2: field 'title': missing"):
    store_lib.write_store(bad, tmp_path / "s", progress=False)
  assert not (tmp_path / "s").exists() and not (tmp_path / "s.partial").exists()
  store = store_lib.write_store(bad, tmp_path / "s", skip_invalid=True, progress=False)
  assert [r.id for r in store] == ["a", "c"] and store.manifest["skipped"] == 1
  dup = tmp_path / "dup.jsonl"
  dup.write_text('{"id": "a", "contents": "x"}\n{"id": "b", "contents": "y"}\n'
                 '{"id": "a", "contents": "z"}\n')
  with pytest.raises(loaders.DataError, match=r"dup\.jsonl:3: field 'id': id 'a' appears twice, "
                                              r"on lines 1 and 3"):
    store_lib.write_store(dup, tmp_path / "d", progress=False)


def test_a_decoder_folder_is_refused_in_one_line(tmp_path, world, capsys):
  import transformers
  folder = tmp_path / "qwen"
  transformers.Qwen2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                           intermediate_size=64).save_pretrained(folder)
  _, _, corpus = world
  assert build.main(["--corpus", str(corpus), "--out", str(tmp_path / "o"), "--encoder",
                     str(folder), "--quiet"]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "model_type" in err and "qwen2" in err


# ------------------------------------------------------------------------------ the build
@pytest.mark.slow
def test_a_sigkilled_build_resumes_to_the_uninterrupted_index(world, reference):
  out = world[0] / "killed"
  env = {**_env(), build.SIGKILL_AT_SHARD_ENV: "3"}
  proc = subprocess.run([sys.executable, "-m", "rlrag_jax.retrieval.build",
                         *_args(world, out, "--backend", "exact")], env=env,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
  names = sorted(p.name for p in (out / "shards").iterdir())
  assert [n for n in names if not n.startswith(".")] == [f"emb-0000{i}.npy" for i in range(3)]
  assert [n for n in names if n.startswith(".emb-00003.npy.")]      # the unrenamed write
  assert not (out / "manifest.json").exists()
  assert build.main(_args(world, out, "--backend", "exact")) == 0
  ref_emb = np.load(reference / "embeddings.npy")
  assert np.array_equal(np.load(out / "embeddings.npy"), ref_emb)
  q = _queries()
  assert _hits(out, world[1], q) == _hits(reference, world[1], q)
  ref_m, m = (json.loads((p / "manifest.json").read_text()) for p in (reference, out))
  assert m["files"] == ref_m["files"] and m["conventions"] == ref_m["conventions"]
  # a resumed build with other settings is refused, naming the field
  assert build.main(_args(world, out, "--backend", "exact", "--pooling", "cls")) == 2


@pytest.mark.slow
def test_a_two_process_distributed_build_equals_the_one_process_build(world, reference):
  out = world[0] / "two"
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  procs = [subprocess.Popen([sys.executable, "-m", "rlrag_jax.retrieval.build",
                             *_args(world, out, "--backend", "exact", "--coordinator",
                                    f"127.0.0.1:{port}", "--num-processes", "2", "--process-id",
                                    str(i), "--wait-s", "500")],
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(2)]
  logs = [p.communicate(timeout=600)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], logs
  assert np.array_equal(np.load(out / "embeddings.npy"), np.load(reference / "embeddings.npy"))
  q = _queries()
  assert _hits(out, world[1], q) == _hits(reference, world[1], q)


@pytest.mark.slow
def test_the_scann_index_of_a_build_agrees_with_exact_search(world, tmp_path):
  # Spread-out vectors (the tiny random BERT's crowd within cosine 0.99 of their mean, closer than
  # a bfloat16 reorder can rank), imported, indexed in two slices by ScaNN and searched with
  # every leaf: what is left to differ from exact search is the hashing and the reorder, so a
  # row mixed up between the store, the slices and the merge would show.
  rng = np.random.default_rng(3)
  centres = rng.standard_normal((50, 32))
  emb = centres[rng.integers(0, 50, N)] + 0.7 * rng.standard_normal((N, 32))
  emb = (emb / np.linalg.norm(emb, axis=1, keepdims=True)).astype(np.float16)
  (tmp_path / "npy").mkdir()
  np.save(tmp_path / "npy" / "all.npy", emb)
  out = tmp_path / "scann"
  assert build.main(_args(world, out, "--backend", "scann", "--from-embeddings",
                          str(tmp_path / "npy"), "--scann-slices", "2")) == 0
  m = json.loads((out / "manifest.json").read_text())
  assert m["backend"] == "scann" and m["index_mode"] == "partitioned"
  assert m["index_params"]["reorder_dtype"] == "bfloat16" and m["embedding_dtype"] == "float16"
  assert m["index_params"]["slices"] == [[0, N // 2], [N // 2, N]]
  r = Retriever.load(out)
  q = emb[::100].astype(np.float32) + 0.1 * rng.standard_normal((N // 100, 32))
  q = (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)
  _, truth = ExactIndex(emb.astype(np.float32)).search(q, 10)
  leaves = m["index_params"]["num_leaves"]
  found = [[r.passages.row_of(h.id) for h in row]
           for row in r.search_embeddings(q, 10, leaves_to_search=leaves)]
  recall = np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, truth.tolist())])
  assert recall >= 0.97


# ------------------------------------------------------------------------------ imports
def test_prebuilt_vectors_are_imported_without_encoding(world, reference, tmp_path):
  import faiss   # a declared test dependency (setup.cfg [test])
  vectors = np.load(reference / "embeddings.npy").astype(np.float32)
  flat = faiss.IndexFlatIP(vectors.shape[1])
  flat.add(vectors)
  faiss.write_index(flat, str(tmp_path / "flat.index"))
  npy = tmp_path / "npy"
  npy.mkdir()
  for i, start in enumerate(range(0, N, 7_000)):
    np.save(npy / f"part-{i}.npy", vectors[start:start + 7_000])
  q = _queries(12)
  want = _hits(reference, world[1], q)
  for flag, src in (("--from-faiss", tmp_path / "flat.index"), ("--from-embeddings", npy)):
    out = tmp_path / flag.strip("-")
    assert build.main(_args(world, out, "--backend", "exact", flag, str(src))) == 0
    assert np.array_equal(np.load(out / "embeddings.npy"), np.load(reference / "embeddings.npy"))
    assert _hits(out, world[1], q) == want
    assert not (out / "shards").exists()      # nothing was encoded


def test_an_import_that_does_not_fit_is_one_line_before_any_work(world, tmp_path, capsys):
  npy = tmp_path / "npy"
  npy.mkdir()
  np.save(npy / "a.npy", np.zeros((N - 1, 32), np.float32))
  out = tmp_path / "o"
  assert build.main(_args(world, out, "--from-embeddings", str(npy))) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and f"{N - 1} vectors" in err and f"{N} passages" in err
  assert not (out / "store").exists()
  np.save(npy / "a.npy", np.zeros((N, 24), np.float32))
  assert build.main(_args(world, out, "--from-embeddings", str(npy))) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "dimension 24" in err and "gives 32" in err


# ------------------------------------------------------------------------------ plan, search
def test_plan_prints_sizes_and_the_wiki18_extrapolation(world, tmp_path, capsys):
  assert build.main(_args(world, tmp_path / "p", "--plan", "--plan-sample", "32")) == 0
  out = capsys.readouterr().out
  assert f"passages            {N:,}" in out and "10 shards" in out
  assert "wiki-18 scale (21,015,324 passages x intfloat/e5-base-v2, d=768" in out
  assert "embeddings float16  30.1 GiB" in out       # 21,015,324 x 768 x 2 bytes
  assert "passages/s here" in out
  assert not (tmp_path / "p").exists()                # --plan builds nothing


def test_the_search_cli_prints_what_the_retriever_finds(world, reference, capsys):
  from rlrag_jax.retrieval import search
  q = _queries(3)
  assert search.main(["--index", str(reference), "--encoder", str(world[1]), "--topk", "4",
                      "--json", *q]) == 0
  lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
  want = _hits(reference, world[1], q, k=4)
  assert [x["query"] for x in lines] == q
  assert [[(h["id"], round(h["score"], 5)) for h in x["hits"]] for x in lines] == want
  store = store_lib.PassageStore(reference / "store")
  first = store[store.row_of(lines[0]["hits"][0]["id"])]
  assert lines[0]["hits"][0]["contents"] == f'"{first.title}"\n{first.text}'


def test_a_run_uses_a_prebuilt_index_and_refuses_other_conventions(world, reference):
  import ml_collections
  from rlrag_jax import config_base
  from rlrag_jax.retrieval import from_config
  c = ml_collections.ConfigDict(dict(method="t", workdir=str(world[0] / "run"),
                                     retrieval=config_base.retrieval_config(
                                         index=str(reference), encoder_path=str(world[1]))))
  corpus = from_config.corpus_for(c, selection=None)
  assert len(corpus) == N and corpus[5].id == "d5"
  _, r, folder = from_config.retriever_for(c, corpus)
  assert folder == reference
  assert [[h.id for h in row] for row in r.search(_queries(5), 3)] == [
      [i for i, _ in row] for row in _hits(reference, world[1], _queries(5), k=3)]
  c.retrieval.pooling = "cls"
  with pytest.raises(RetrieverFormatError,
                     match=r"retrieval\.index=.*'conventions\.pooling' is 'mean' but the query "
                           r"encoder's is 'cls'"):
    from_config.retriever_for(c, corpus)
