"""Retrieval at scale (`python -m rlrag_jax.bench.retrieval --scale`): the index build CLI, its
memory bound, and ScaNN against FAISS HNSW and exact search, in one run on this machine.

  python -m rlrag_jax.bench.retrieval --scale [--n 1000000] [--dim 768] [--queries 1000]
      [--tiny-sizes 100000,800000] [--workdir /tmp/rlrag_scale] [--out docs/results/retrieval_scale]

1. Vectors: N float16 unit vectors of dimension d with structure (a mixture of `--clusters`
   Gaussian clusters around random centres; not uniform noise, where no tree or graph helps),
   and a FlashRAG-layout corpus of N synthetic passages to go with them.
2. Build: `retrieval.build --from-embeddings --backend scann` in a child process, its private
   (anonymous) memory sampled from /proc every 20 ms: seconds and peak, against the bound
   3 x float16 bytes + 1 GiB. Then a child that loads the index and searches: its peak against
   1.5 x + 1 GiB.
3. Search: recall@k against exact search over the same float16 vectors (float32 scores), for
   ScaNN with the build's parameters (leaves searched raised until recall >= the target, then
   bisected) and FAISS HNSW (M 32; efSearch likewise), each in its own child (build seconds and
   peak memory too); queries/s at the setting that reaches the target, exact search's beside.
4. The store: open time and random-access latency (by row, and by id through the hashes) over
   the N-passage corpus.
5. The full build with a tiny random BERT (`--tiny-sizes`): encode + store + ScaNN, its private
   peak against the bound at each size.
6. The plan's extrapolation to wiki-18 x e5-base-v2 from the measured factors.

Everything is written to `--out` as results.json and README.md (a table), with the host.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys
import threading
import time

import numpy as np

GiB = 2**30


# ------------------------------------------------------------------------------ measuring
def anon_bytes(pid: int) -> int:
  try:
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        if line.startswith("RssAnon:"):
          return int(line.split()[1]) * 1024
  except (FileNotFoundError, ProcessLookupError):
    pass
  return 0


def run_measured(cmd, env=None, timeout_s: float = 7200) -> dict:
  """Runs `cmd`, sampling its private memory every 20 ms: rc, seconds, peak bytes, output."""
  t = time.perf_counter()
  proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
  peak = [0]
  done = threading.Event()

  def watch():
    while not done.is_set():
      peak[0] = max(peak[0], anon_bytes(proc.pid))
      time.sleep(0.02)
  th = threading.Thread(target=watch, daemon=True)
  th.start()
  try:
    out, _ = proc.communicate(timeout=timeout_s)
  finally:
    done.set()
    th.join()
  return {"rc": proc.returncode, "seconds": time.perf_counter() - t, "peak_private": peak[0],
          "output": out[-4000:]}


def _env():
  repo = pathlib.Path(__file__).resolve().parents[2]
  return {**os.environ, "PYTHONPATH": str(repo), "JAX_PLATFORMS": "cpu",
          "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


# ------------------------------------------------------------------------------ data
def clustered_vectors(path: pathlib.Path, n: int, d: int, clusters: int, seed: int = 0):
  """[n, d] float16 unit vectors around `clusters` random centres, written in chunks."""
  if path.is_file():
    return np.load(path, mmap_mode="r")
  rng = np.random.default_rng(seed)
  centres = rng.standard_normal((clusters, d)).astype(np.float32)
  mm = np.lib.format.open_memmap(path.with_suffix(".tmp.npy"), "w+", np.float16, (n, d))
  for s in range(0, n, 50_000):
    m = min(50_000, n - s)
    x = centres[rng.integers(0, clusters, m)] + 0.9 * rng.standard_normal((m, d),
                                                                          dtype=np.float32)
    mm[s:s + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
  mm.flush()
  del mm
  path.with_suffix(".tmp.npy").replace(path)
  return np.load(path, mmap_mode="r")


def synthetic_corpus(path: pathlib.Path, n: int, words_per_passage: int = 80, seed: int = 0):
  """FlashRAG-layout passages with ids 'doc-<i>' (not row numbers: the id hashes are used)."""
  if path.is_file():
    return path
  rng = np.random.default_rng(seed)
  vocab = np.array([f"w{i}" for i in range(5000)])
  tmp = path.with_suffix(".tmp")
  with open(tmp, "w") as f:
    for s in range(0, n, 10_000):
      m = min(10_000, n - s)
      picks = vocab[rng.integers(0, len(vocab), (m, words_per_passage))]
      for i in range(m):
        f.write(json.dumps({"id": f"doc-{s + i}",
                            "contents": f'"Title {s + i}"\n' + " ".join(picks[i])}) + "\n")
  tmp.replace(path)
  return path


def head_lines(src: pathlib.Path, dst: pathlib.Path, n: int) -> pathlib.Path:
  if not dst.is_file():
    with open(src) as f, open(dst, "w") as g:
      for i, line in enumerate(f):
        if i >= n:
          break
        g.write(line)
  return dst


def tiny_encoder(folder: pathlib.Path) -> pathlib.Path:
  """A random 2-layer BERT of hidden size 64 with the packaged MiniLM's tokenizer."""
  if (folder / "config.json").is_file():
    return folder
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from rlrag_jax.retrieval.encoder import default_model_dir  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=128, max_position_embeddings=128)
  transformers.BertModel(cfg).eval().save_pretrained(folder)
  transformers.AutoTokenizer.from_pretrained(str(default_model_dir()),
                                             local_files_only=True).save_pretrained(folder)
  return folder


# ------------------------------------------------------------------------------ children
SEARCH_CHILD = r'''
import json, sys, time, numpy as np
from rlrag_jax.retrieval.retriever import Retriever
index, queries, k, lts, rk = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
t = time.perf_counter(); r = Retriever.load(index, verify=False); t_load = time.perf_counter() - t
q = np.load(queries)
kw = {} if lts <= 0 else {"leaves_to_search": lts, "reorder_k": rk}
t = time.perf_counter(); s, ids = r.index.search(q, k, **kw); dt = time.perf_counter() - t
np.save(sys.argv[6], ids)
print(json.dumps({"load_s": t_load, "search_s": dt}))
'''

HNSW_CHILD = r'''
import json, sys, time, numpy as np, faiss
from rlrag_jax.bench.ann_tuning import tune as _tune, recall as _recall
vec, queries, truth, k, m, efc, target = sys.argv[1:8]
k, m, efc, target = int(k), int(m), int(efc), float(target)
db = np.load(vec, mmap_mode="r"); q = np.load(queries); truth = np.load(truth)
index = faiss.IndexHNSWFlat(db.shape[1], m, faiss.METRIC_INNER_PRODUCT)
index.hnsw.efConstruction = efc
t = time.perf_counter()
for s in range(0, db.shape[0], 100_000):
  index.add(np.asarray(db[s:s + 100_000], np.float32))
build_s = time.perf_counter() - t
tried = []
def ev(ef):
  index.hnsw.efSearch = ef
  t = time.perf_counter(); _, ids = index.search(q, k); dt = time.perf_counter() - t
  rec = _recall(ids, truth); tried.append({"efSearch": ef, "recall": rec, "qps": len(q) / dt})
  print(f"  HNSW efSearch={ef:<6} recall@{k}={rec:.4f} {len(q) / dt:9,.0f} q/s", flush=True)
  return rec, dt
hit = _tune(ev, [16 << i for i in range(10)], target)
best = None
if hit:
  index.hnsw.efSearch = hit[0]
  t = time.perf_counter(); index.search(q, k); dt = time.perf_counter() - t
  best = {"efSearch": hit[0], "recall": hit[1], "qps": len(q) / dt}
print("RESULT " + json.dumps({"build_s": build_s, "tried": tried, "best": best}))
'''


def _child_json(res: dict, tag: str = "") -> dict:
  lines = [x for x in res["output"].splitlines() if x.startswith(tag)] if tag else \
      [x for x in res["output"].splitlines() if x.startswith("{")]
  if res["rc"] != 0 or not lines:
    raise RuntimeError(f"child failed (rc {res['rc']}):\n{res['output'][-3000:]}")
  return json.loads(lines[-1][len(tag):])


# ------------------------------------------------------------------------------ the phases
def bench_ann(args, work: pathlib.Path, results: dict) -> None:
  from rlrag_jax.bench.ann_tuning import (  # pylint: disable=g-import-not-at-top
      recall as _recall, tune as _tune)
  from rlrag_jax.retrieval.index import ExactIndex  # pylint: disable=g-import-not-at-top
  n, d, k = args.n, args.dim, args.k
  vec_dir = work / f"vectors_{n}_{d}"
  vec_dir.mkdir(exist_ok=True)
  t = time.perf_counter()
  db = clustered_vectors(vec_dir / "all.npy", n, d, args.clusters)
  corpus = synthetic_corpus(work / f"corpus_{n}.jsonl", n)
  print(f"data: {n:,} x {d} float16 clustered vectors, {corpus.stat().st_size / 2**20:,.0f} MiB "
        f"corpus ({time.perf_counter() - t:.0f} s)", flush=True)
  rng = np.random.default_rng(7)
  q = np.asarray(db[rng.integers(0, n, args.queries)], np.float32)
  q += 0.3 * rng.standard_normal(q.shape).astype(np.float32) / np.sqrt(d)
  q /= np.linalg.norm(q, axis=1, keepdims=True)
  qfile, tfile = work / f"queries_{n}_{d}.npy", work / f"truth_{n}_{d}.npy"
  np.save(qfile, q)
  exact = ExactIndex(db)
  exact.search(q[:8], k)
  t = time.perf_counter()
  _, truth = exact.search(q, k)
  t_exact = time.perf_counter() - t
  del exact
  np.save(tfile, truth)
  f16 = n * d * 2
  results["ann"] = {"n": n, "d": d, "queries": len(q), "k": k, "target": args.target_recall,
                    "float16_bytes": f16, "exact_qps": len(q) / t_exact}
  print(f"exact (JAX, float16 blocks widened to float32): {len(q) / t_exact:,.0f} q/s", flush=True)

  # ScaNN through the build CLI (its memory), then its search in a child (its memory)
  index = work / f"index_{n}_{d}"
  build = run_measured([sys.executable, "-m", "rlrag_jax.retrieval.build", "--corpus",
                        str(corpus), "--out", str(index), "--from-embeddings", str(vec_dir),
                        "--encoder", args.encoder_for_dim, "--backend", "scann", "--quiet",
                        "--restart"], env=_env())
  if build["rc"] != 0:
    raise RuntimeError(f"build failed:\n{build['output']}")
  manifest = json.loads((index / "manifest.json").read_text())
  results["ann"]["scann_build"] = {
      "seconds": build["seconds"], "peak_private": build["peak_private"],
      "bound": 3 * f16 + GiB, "params": manifest["index_params"],
      "description": manifest.get("index_description")}
  print(f"ScaNN build (CLI, from embeddings): {build['seconds']:.0f} s, private peak "
        f"{build['peak_private'] / GiB:.2f} GiB (bound {(3 * f16 + GiB) / GiB:.2f})", flush=True)

  from rlrag_jax.retrieval.retriever import Retriever  # pylint: disable=g-import-not-at-top
  r = Retriever.load(index, verify=False)
  nl = manifest["index_params"]["num_leaves"]

  def scann_eval(lts, rk):
    t = time.perf_counter()
    _, ids = r.index.search(q, k, leaves_to_search=lts, reorder_k=rk)
    dt = time.perf_counter() - t
    rec = _recall(ids, truth)
    print(f"  ScaNN leaves_to_search={lts:<5} reorder={rk:<4} recall@{k}={rec:.4f} "
          f"{len(q) / dt:9,.0f} q/s", flush=True)
    results["ann"].setdefault("scann_tried", []).append(
        {"leaves_to_search": lts, "reorder_k": rk, "recall": rec, "qps": len(q) / dt})
    return rec, dt
  grid = sorted({max(1, int(round(nl * f))) for f in (1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 1)})
  found = []
  for rk in (100, 200, 400):
    hit = _tune(lambda lts: scann_eval(lts, rk), grid, args.target_recall)
    if hit:
      found.append((hit[2], hit[0], rk, hit[1]))
  del r
  best = None
  if found:
    _, lts, rk, rec = min(found)
    child = run_measured([sys.executable, "-c", SEARCH_CHILD, str(index), str(qfile),
                          str(k), str(lts), str(rk), str(work / "scann_ids.npy")], env=_env())
    info = _child_json(child)
    rec_child = _recall(np.load(work / "scann_ids.npy"), truth)
    best = {"leaves_to_search": lts, "reorder_k": rk, "recall": rec_child,
            "qps": len(q) / info["search_s"], "load_s": info["load_s"],
            "search_process_peak_private": child["peak_private"], "bound": 1.5 * f16 + GiB}
    print(f"ScaNN search process: load {info['load_s']:.1f} s, private peak "
          f"{child['peak_private'] / GiB:.2f} GiB (bound {(1.5 * f16 + GiB) / GiB:.2f}), "
          f"{best['qps']:,.0f} q/s at recall {rec_child:.4f}", flush=True)
  results["ann"]["scann_best"] = best

  if "hnsw" in args.skip.split(","):
    return
  hnsw = run_measured([sys.executable, "-c", HNSW_CHILD, str(vec_dir / "all.npy"),
                       str(qfile), str(tfile), str(k),
                       str(args.hnsw_m), str(args.hnsw_ef_construction), str(args.target_recall)],
                      env=_env(), timeout_s=4 * 3600)
  info = _child_json(hnsw, "RESULT ")
  results["ann"]["hnsw"] = {**info, "peak_private": hnsw["peak_private"], "m": args.hnsw_m,
                            "ef_construction": args.hnsw_ef_construction}
  print(f"FAISS HNSW (M {args.hnsw_m}): build {info['build_s']:.0f} s, private peak "
        f"{hnsw['peak_private'] / GiB:.2f} GiB, best {info['best']}", flush=True)


def bench_store(args, work: pathlib.Path, results: dict) -> None:
  from rlrag_jax.retrieval import store as store_lib  # pylint: disable=g-import-not-at-top
  corpus = synthetic_corpus(work / f"corpus_{args.n}.jsonl", args.n)
  folder = work / f"index_{args.n}_{args.dim}" / "store"
  if not (folder / "store.json").is_file():
    folder = work / "store_only"
    store_lib.open_or_write(corpus, folder, progress=False)
  t = time.perf_counter()
  store = store_lib.PassageStore(folder)
  t_open = time.perf_counter() - t
  rng = np.random.default_rng(0)
  rows = rng.integers(0, len(store), 10_000)
  t = time.perf_counter()
  for i in rows:
    store[int(i)]
  t_row = (time.perf_counter() - t) / len(rows)
  ids = [f"doc-{int(i)}" for i in rows[:2000]]
  t = time.perf_counter()
  got = [store.row_of(x) for x in ids]
  t_id = (time.perf_counter() - t) / len(ids)
  assert got == [int(i) for i in rows[:2000]]
  results["store"] = {"n": len(store), "open_s": t_open, "row_us": t_row * 1e6,
                      "id_us": t_id * 1e6, "text_bytes": store.manifest["text_bytes"]}
  print(f"store: {len(store):,} passages, open {t_open * 1e3:.1f} ms, random row "
        f"{t_row * 1e6:.1f} us, id -> row {t_id * 1e6:.1f} us", flush=True)


def bench_tiny_builds(args, work: pathlib.Path, results: dict) -> None:
  enc = tiny_encoder(work / "tiny-bert-64")
  big = max(int(s) for s in args.tiny_sizes.split(","))
  src = synthetic_corpus(work / f"corpus_tiny_{big}.jsonl", big, words_per_passage=40, seed=1)
  out = []
  for n in sorted(int(s) for s in args.tiny_sizes.split(",")):
    corpus = head_lines(src, work / f"corpus_tiny_{n}.jsonl", n)
    index = work / f"tiny_index_{n}"
    res = run_measured([sys.executable, "-m", "rlrag_jax.retrieval.build", "--corpus",
                        str(corpus), "--out", str(index), "--encoder", str(enc), "--backend",
                        "scann", "--max-length", "64", "--quiet", "--restart"], env=_env())
    if res["rc"] != 0:
      raise RuntimeError(f"tiny build failed:\n{res['output']}")
    f16 = n * 64 * 2
    search = run_measured([sys.executable, "-c", SEARCH_CHILD, str(index),
                           str(_tiny_queries(work, index)), "10", "0", "0",
                           str(work / "tiny_ids.npy")], env=_env())
    row = {"n": n, "d": 64, "float16_bytes": f16, "build_s": res["seconds"],
           "build_peak_private": res["peak_private"], "build_bound": 3 * f16 + GiB,
           "search_peak_private": search["peak_private"], "search_bound": 1.5 * f16 + GiB}
    out.append(row)
    print(f"tiny build N={n:,}: {res['seconds']:.0f} s, private peak "
          f"{res['peak_private'] / GiB:.2f} GiB (bound {(3 * f16 + GiB) / GiB:.2f}); search "
          f"process {search['peak_private'] / GiB:.2f} GiB (bound {(1.5 * f16 + GiB) / GiB:.2f})",
          flush=True)
  results["tiny_builds"] = out


def _tiny_queries(work: pathlib.Path, index: pathlib.Path) -> pathlib.Path:
  emb = np.load(index / "embeddings.npy", mmap_mode="r")
  q = np.asarray(emb[:200], np.float32)
  path = work / f"tiny_queries_{emb.shape[0]}.npy"
  np.save(path, q)
  return path


def extrapolate(results: dict) -> dict:
  if results.get("ann", {}).get("n", 0) < 100_000:
    return {"skipped": "not extrapolated from fewer than 100,000 vectors"}
  return _extrapolate(results)


def _extrapolate(results: dict) -> dict:
  """wiki-18 x e5-base-v2 from the 1M x 768 factors: private bytes = factor x float16 bytes +
  the measured fixed part (the tiny builds' peak at the small size)."""
  from rlrag_jax.retrieval import plan  # pylint: disable=g-import-not-at-top
  a = results.get("ann", {})
  f16_w = plan.WIKI18["passages"] * plan.WIKI18["dim"] * 2
  out = {"passages": plan.WIKI18["passages"], "dim": plan.WIKI18["dim"],
         "float16_bytes": f16_w, "bound_build": 3 * f16_w + GiB,
         "bound_search": 1.5 * f16_w + GiB}
  tiny = results.get("tiny_builds") or []
  fixed_build = min((t["build_peak_private"] for t in tiny), default=0)
  fixed_search = min((t["search_peak_private"] for t in tiny), default=0)
  if a.get("scann_build"):
    peak = a["scann_build"]["peak_private"]
    fixed = fixed_build if peak > fixed_build else 0
    out["build_factor"] = (peak - fixed) / a["float16_bytes"]
    out["build_private"] = out["build_factor"] * f16_w + fixed
  if a.get("scann_best"):
    peak = a["scann_best"]["search_process_peak_private"]
    fixed = fixed_search if peak > fixed_search else 0
    out["search_factor"] = (peak - fixed) / a["float16_bytes"]
    out["search_private"] = out["search_factor"] * f16_w + fixed
  return out


def write_report(args, results: dict) -> None:
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  (out / "results.json").write_text(json.dumps(results, indent=1, sort_keys=True))
  g = lambda b: f"{b / GiB:.2f} GiB"
  lines = ["# Retrieval at scale", "",
           f"`python -m rlrag_jax.bench.retrieval {' '.join(sys.argv[1:])}` on "
           f"{results['host']['cpus']} CPU cores ({results['host']['machine']}), "
           f"{results['host']['date']}, commit {results['host']['commit']}. Raw figures: "
           "results.json.", ""]
  a = results.get("ann")
  if a:
    sb, best, h = a["scann_build"], a.get("scann_best"), a.get("hnsw")
    lines += [f"## {a['n']:,} x {a['d']} float16 clustered unit vectors, {a['queries']} queries, "
              f"recall@{a['k']} against exact search", "",
              "| | build s | private peak | queries/s at recall >= "
              f"{a['target']} | recall | setting |", "|---|---|---|---|---|---|"]
    if best:
      lines.append(f"| ScaNN (ours: {sb['description']}) | {sb['seconds']:.0f} | "
                   f"{g(sb['peak_private'])} build, {g(best['search_process_peak_private'])} "
                   f"search | {best['qps']:,.0f} | {best['recall']:.4f} | leaves "
                   f"{best['leaves_to_search']}/{sb['params']['num_leaves']}, reorder "
                   f"{best['reorder_k']} |")
    hb = h.get("best") if h else None
    if h:
      lines.append(f"| FAISS HNSW (M {h['m']}, efConstruction {h['ef_construction']}) | "
                   f"{h['build_s']:.0f} | {g(h['peak_private'])} | "
                   f"{hb['qps']:,.0f} | {hb['recall']:.4f} | efSearch {hb['efSearch']} |"
                   if hb else f"| FAISS HNSW (M {h['m']}) | {h['build_s']:.0f} | "
                   f"{g(h['peak_private'])} | target not reached | | |")
    lines.append(f"| exact (JAX) | - | - | {a['exact_qps']:,.0f} | 1 | |")
    if best and hb:
      lines += ["", f"ScaNN / HNSW queries/s at the target: **{best['qps'] / hb['qps']:.2f}**."]
    lines += ["", f"Memory bound of the build: 3 x {g(a['float16_bytes'])} + 1 GiB = "
              f"{g(sb['bound'])}; measured {g(sb['peak_private'])}."]
    if best:
      lines += [f"Memory bound of a search process: 1.5 x + 1 GiB = {g(best['bound'])}; "
                f"measured {g(best['search_process_peak_private'])}."]
  s = results.get("store")
  if s:
    lines += ["", f"## The passage store ({s['n']:,} passages, {g(s['text_bytes'])} of text)", "",
              f"open {s['open_s'] * 1e3:.1f} ms; random row {s['row_us']:.1f} us; id -> row "
              f"(hashes) {s['id_us']:.1f} us"]
  t = results.get("tiny_builds")
  if t:
    lines += ["", "## The full build (encode + store + ScaNN) with a tiny random BERT (d 64)", "",
              "| passages | build s | build private peak | bound | search private peak | bound |",
              "|---|---|---|---|---|---|"]
    for r in t:
      lines.append(f"| {r['n']:,} | {r['build_s']:.0f} | {g(r['build_peak_private'])} | "
                   f"{g(r['build_bound'])} | {g(r['search_peak_private'])} | "
                   f"{g(r['search_bound'])} |")
  e = results.get("wiki18")
  if e and "build_private" in e:
    lines += ["", f"## Extrapolation to wiki-18 x e5-base-v2 ({e['passages']:,} x {e['dim']})",
              "", f"float16 embeddings {g(e['float16_bytes'])}; build {g(e['build_private'])} "
              f"(factor {e['build_factor']:.2f} of the float16 bytes + the tiny build's fixed "
              "part; bound "
              f"{g(e['bound_build'])}); search {g(e.get('search_private', 0))} (factor "
              f"{e.get('search_factor', 0):.2f}; bound {g(e['bound_search'])})."]
  (out / "README.md").write_text("\n".join(lines) + "\n")
  print("\n".join(lines))


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m rlrag_jax.bench.retrieval --scale",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--scale", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--n", type=int, default=1_000_000)
  p.add_argument("--dim", type=int, default=768)
  p.add_argument("--clusters", type=int, default=2000)
  p.add_argument("--queries", type=int, default=1000)
  p.add_argument("--k", type=int, default=10)
  p.add_argument("--target-recall", type=float, default=0.95)
  p.add_argument("--hnsw-m", type=int, default=32)
  p.add_argument("--hnsw-ef-construction", type=int, default=40)
  p.add_argument("--tiny-sizes", default="100000,800000")
  p.add_argument("--encoder-for-dim", default="",
                 help="an encoder folder whose dimension is --dim (default: a random BERT of "
                      "that width is made)")
  p.add_argument("--skip", default="",
                 help="comma-separated phases to skip: ann, hnsw (ScaNN and exact only), store, "
                      "tiny")
  p.add_argument("--smoke", action="store_true",
                 help="the whole path at toy sizes (5k x 32, tiny builds of 500 / 1,000) in "
                      "./rlrag_scale_smoke")
  p.add_argument("--workdir", default="/tmp/rlrag_scale")
  p.add_argument("--out", default="docs/results/retrieval_scale")
  args = p.parse_args(argv)
  if args.smoke:
    args.n, args.dim, args.clusters, args.queries = 5000, 32, 20, 50
    args.tiny_sizes, args.workdir = "500,1000", "rlrag_scale_smoke"
    args.out = str(pathlib.Path(args.workdir) / "out")
  work = pathlib.Path(args.workdir)
  work.mkdir(parents=True, exist_ok=True)
  if not args.encoder_for_dim:   # the import checks the vectors' width against an encoder's
    args.encoder_for_dim = str(_encoder_of_dim(work, args.dim))
  skip = set(filter(None, args.skip.split(",")))
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
  dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                         capture_output=True, text=True).stdout.strip()
  results = {"host": {"cpus": os.cpu_count(), "machine": platform.processor() or platform.machine(),
                      "date": time.strftime("%Y-%m-%d"), "commit": commit + ("+dirty" if dirty
                                                                             else "")},
             "args": {k: v for k, v in vars(args).items()}}
  t0 = time.perf_counter()
  if "ann" not in skip:
    bench_ann(args, work, results)
  if "store" not in skip:
    bench_store(args, work, results)
  if "tiny" not in skip:
    bench_tiny_builds(args, work, results)
  results["wiki18"] = extrapolate(results)
  results["total_s"] = time.perf_counter() - t0
  write_report(args, results)
  return 0


def _encoder_of_dim(work: pathlib.Path, d: int) -> pathlib.Path:
  """A random 1-layer BERT of hidden size d (only its width and conventions are read)."""
  folder = work / f"bert-d{d}"
  if (folder / "config.json").is_file():
    return folder
  import transformers  # pylint: disable=g-import-not-at-top
  from rlrag_jax.retrieval.encoder import default_model_dir  # pylint: disable=g-import-not-at-top
  heads = next(h for h in (12, 8, 4, 2, 1) if d % h == 0)
  cfg = transformers.BertConfig(hidden_size=d, num_hidden_layers=1, num_attention_heads=heads,
                                intermediate_size=4 * d, max_position_embeddings=64)
  transformers.BertModel(cfg).save_pretrained(folder)
  transformers.AutoTokenizer.from_pretrained(str(default_model_dir()),
                                             local_files_only=True).save_pretrained(folder)
  return folder


if __name__ == "__main__":
  sys.exit(main())
