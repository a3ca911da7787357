"""Retrieval benchmark: ScaNN vs faiss at matched recall, and our encoder vs sentence-transformers.

  python -m rlrag_jax.bench.retrieval                       # 100k and 1M vectors, 1000 passages
  python -m rlrag_jax.bench.retrieval --sizes 20000 --queries 200 --encoder-texts 128   # quick
  python -m rlrag_jax.bench.retrieval --scale     # the index build CLI at 1M x 768: see
                                                  # retrieval_scale.py (memory, ScaNN vs HNSW)

ANN: random unit vectors (d=384), inner product, Recall@k against exact search. Each method's
search-time knob is raised until Recall@k >= --target-recall, then bisected back to the smallest
value that still reaches it (ScaNN: leaves_to_search, for reorder depths 100/200/400, keeping the
fastest; HNSW: efSearch), and queries/s is measured at that setting. Random unit vectors in high dimension have no structure for a tree or
a graph to exploit, so this is a hard case for both.

Encoder: passages/s on the same texts, batch size and threads; each side encodes once to warm up
(jit compiles, torch allocs), then the best of --reps interleaved timed runs is reported.

Columns: `ours`, `reference`, `ratio` = ours / reference for throughputs (higher is better) and
reference / ours for build times (a speedup), so ratio > 1 means ours is faster.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

from rlrag_jax.bench import HELP_SMOKE
from rlrag_jax.bench.ann_tuning import recall as _recall, tune as _tune
from rlrag_jax.data.paths import data_dir


def _random_unit(n: int, d: int, seed: int, chunk: int = 100_000) -> np.ndarray:
  out = np.empty((n, d), np.float32)
  rng = np.random.default_rng(seed)
  for s in range(0, n, chunk):
    x = rng.standard_normal((min(chunk, n - s), d), dtype=np.float32)
    out[s:s + len(x)] = x / np.linalg.norm(x, axis=1, keepdims=True)
  return out


def _timed(fn, reps: int = 1):
  """(best wall seconds over reps, last result)."""
  best, out = math.inf, None
  for _ in range(reps):
    t = time.perf_counter()
    out = fn()
    best = min(best, time.perf_counter() - t)
  return best, out


class Table:
  def __init__(self):
    self.rows = []

  def add(self, case, ours, ref, ratio, unit, note=""):
    self.rows.append((case, ours, ref, ratio, unit, note))

  def print(self):
    print()
    print(f"{'case':<46} {'ours':>11} {'reference':>11} {'ratio':>7}  {'unit':<11} note")
    print("-" * 118)
    for case, ours, ref, ratio, unit, note in self.rows:
      f = lambda v: "-" if v is None else (f"{v:11.1f}" if v < 1e5 else f"{v:11.3g}")
      r = "-" if ratio is None else f"{ratio:7.2f}"
      print(f"{case:<46} {f(ours):>11} {f(ref):>11} {r:>7}  {unit:<11} {note}")


# ------------------------------------------------------------------------------------ ANN
def bench_ann(n: int, args, table: Table):
  import faiss  # pylint: disable=g-import-not-at-top
  from rlrag_jax.retrieval.index import ExactIndex, ScannIndex, scann_defaults

  d, k, nq, target = args.dim, args.k, args.queries, args.target_recall
  print(f"\n== ANN  N={n:,}  d={d}  queries={nq}  k={k}  target Recall@{k} >= {target}  "
        f"threads={args.threads or os.cpu_count()}", flush=True)
  db = _random_unit(n, d, seed=1)
  q = _random_unit(nq, d, seed=2)
  tag = f"N={n // 1000}k" if n < 1_000_000 else f"N={n / 1e6:g}M"

  # ground truth + exact baselines
  exact = ExactIndex(db)
  exact.search(q[:8], k)   # compile
  t_exact, (_, truth) = _timed(lambda: exact.search(q, k), args.reps)
  del exact
  flat = faiss.IndexFlatIP(d)
  t_add_flat, _ = _timed(lambda: flat.add(db))
  t_flat, (_, flat_ids) = _timed(lambda: flat.search(q, k), args.reps)
  del flat
  print(f"exact: jax ExactIndex {nq / t_exact:,.0f} q/s, faiss IndexFlatIP {nq / t_flat:,.0f} q/s "
        f"(agreement Recall@{k} {_recall(flat_ids, truth):.4f})", flush=True)
  table.add(f"{tag} exact top-k (jax vs faiss FlatIP)", nq / t_exact, nq / t_flat,
            t_flat / t_exact, "queries/s", "both exact")

  # ScaNN
  params = scann_defaults(n)
  if args.scann_leaves:
    params["num_leaves"] = args.scann_leaves
  t_build_scann, scann = _timed(lambda: ScannIndex(db, num_threads=args.threads, **params))
  nl = scann.params()["num_leaves"]
  print(f"ScaNN build {t_build_scann:.1f} s  params {json.dumps(scann.params())}", flush=True)
  # for each reorder depth, the fewest leaves that reach the target; keep the fastest of those
  def scann_eval(lts, rk):
    dt, (_, ids) = _timed(lambda: scann.search(q, k, leaves_to_search=lts, reorder_k=rk))
    rec = _recall(ids, truth)
    print(f"  ScaNN leaves_to_search={lts:<5} reorder={rk:<4} Recall@{k}={rec:.4f} "
          f"{nq / dt:9,.0f} q/s", flush=True)
    return rec, dt
  lts_grid = sorted({max(1, int(round(nl * f))) for f in (1 / 8, 1 / 4, 1 / 2, 3 / 4, 7 / 8, 1)})
  found = []
  for rk in (100, 200, 400):
    hit = _tune(lambda lts: scann_eval(lts, rk), lts_grid, target)
    if hit:
      found.append((hit[2], hit[0], rk, hit[1]))
  if found:
    _, lts, rk, rec_scann = min(found)
    t_scann, _ = _timed(lambda: scann.search(q, k, leaves_to_search=lts, reorder_k=rk), args.reps)
    scann_note = f"R={rec_scann:.3f} leaves {lts}/{nl} reorder {rk}"
  else:
    t_scann, rec_scann, scann_note = None, None, f"Recall@{k} {target} not reached"
  del scann

  # faiss HNSW
  hnsw = faiss.IndexHNSWFlat(d, args.hnsw_m, faiss.METRIC_INNER_PRODUCT)
  hnsw.hnsw.efConstruction = args.hnsw_ef_construction
  t_build_hnsw, _ = _timed(lambda: hnsw.add(db))
  print(f"faiss HNSW build {t_build_hnsw:.1f} s  (M={args.hnsw_m}, "
        f"efConstruction={args.hnsw_ef_construction})", flush=True)
  tried = []

  def hnsw_eval(ef):
    hnsw.hnsw.efSearch = ef
    dt, (_, ids) = _timed(lambda: hnsw.search(q, k))
    rec = _recall(ids, truth)
    print(f"  HNSW efSearch={ef:<6} Recall@{k}={rec:.4f} {nq / dt:9,.0f} q/s", flush=True)
    tried.append((rec, ef, dt))
    return rec, dt
  ef_grid = [16 << i for i in range(12) if 16 << i <= args.hnsw_max_ef]
  hit = _tune(hnsw_eval, ef_grid, target)
  if hit:
    hnsw.hnsw.efSearch = hit[0]
    t_hnsw, _ = _timed(lambda: hnsw.search(q, k), args.reps)
    hnsw_note = f"R={hit[1]:.3f} efSearch {hit[0]}"
  else:   # report its best point; the ratio is then a lower bound (more recall costs more)
    rec, ef, t_hnsw = max(tried)
    hnsw_note = (f"target not reached: best R={rec:.3f} at efSearch {ef} (max), so the ratio "
                 "is a lower bound")
  del hnsw

  qps = lambda t: None if t is None else nq / t
  ratio = (t_hnsw / t_scann) if (t_scann and t_hnsw) else None
  table.add(f"{tag} ANN @Recall@{k}>={target} (ScaNN vs HNSW)", qps(t_scann), qps(t_hnsw), ratio,
            "queries/s", f"ScaNN {scann_note}; HNSW {hnsw_note}")
  table.add(f"{tag} ScaNN vs faiss FlatIP (exact)", qps(t_scann), nq / t_flat,
            (t_flat / t_scann) if t_scann else None, "queries/s", "")
  table.add(f"{tag} build (ScaNN vs HNSW)", t_build_scann, t_build_hnsw,
            t_build_hnsw / t_build_scann, "seconds", f"FlatIP add {t_add_flat:.1f} s")


# ------------------------------------------------------------------------------------ encoder
def _texts(n: int) -> tuple:
  """Real passages from the shared corpus files when present, else synthetic sentences."""
  texts, source = [], "synthetic"
  corpus = data_dir() / "corpus"
  for name in ("wiki18_flashrag_sample.jsonl", "2wikimultihopqa_hipporag_corpus.jsonl"):
    p = corpus / name
    if p.is_file() and len(texts) < n:
      from rlrag_jax.retrieval.retriever import as_record, passage_text  # pylint: disable=g-import-not-at-top
      with open(p, encoding="utf-8") as f:
        for i, line in enumerate(f):
          r = as_record(json.loads(line), i)
          texts.append(passage_text(r.title, r.text))
          if len(texts) >= n:
            break
      source = "shared corpus passages"
  rng = np.random.default_rng(0)
  words = "the of and a in to was is for on by with as at from his her that which river city".split()
  while len(texts) < n:
    texts.append(" ".join(rng.choice(words, size=int(rng.integers(5, 200)))))
  return texts[:n], source


def bench_encoder(args, table: Table):
  import torch  # pylint: disable=g-import-not-at-top
  from sentence_transformers import SentenceTransformer  # pylint: disable=g-import-not-at-top
  from rlrag_jax.retrieval.encoder import Encoder, default_model_dir  # pylint: disable=g-import-not-at-top

  if args.threads:
    torch.set_num_threads(args.threads)
  texts, source = _texts(args.encoder_texts)
  bs = args.batch_size
  t_load, ours = _timed(Encoder.from_pretrained)
  ref = SentenceTransformer(str(default_model_dir()), device="cpu", local_files_only=True)
  lengths = [len(x) for x in ours.tokenize(texts)]
  print(f"\n== Encoder  all-MiniLM-L6-v2  {len(texts)} texts ({source}; mean {np.mean(lengths):.0f} "
        f"tokens, max_length {ours.max_length})  batch {bs}  torch threads {torch.get_num_threads()}",
        flush=True)
  t_first, e_ours = _timed(lambda: ours.encode(texts, batch_size=bs))
  e_ref = ref.encode(texts, batch_size=bs, convert_to_numpy=True)
  best_ours = best_ref = math.inf
  for _ in range(args.reps):   # interleaved, so load changes on a shared machine hit both
    best_ours = min(best_ours, _timed(lambda: ours.encode(texts, batch_size=bs))[0])
    best_ref = min(best_ref, _timed(lambda: ref.encode(texts, batch_size=bs))[0])
  cos = np.sum(e_ours * e_ref, axis=1)
  print(f"first call (jit compile included) {len(texts) / t_first:.1f} passages/s; load "
        f"{t_load:.1f} s; min cosine vs sentence-transformers {cos.min():.6f}", flush=True)
  table.add("encoder passages/s (ours vs sentence-transformers)", len(texts) / best_ours,
            len(texts) / best_ref, best_ref / best_ours, "passages/s",
            f"batch {bs}, best of {args.reps}; first call {len(texts) / t_first:.1f}/s")


def main(argv=None):
  argv = sys.argv[1:] if argv is None else list(argv)
  if "--scale" in argv:       # the index build at scale: its own flags (retrieval_scale.py)
    from rlrag_jax.bench import retrieval_scale  # pylint: disable=g-import-not-at-top
    return retrieval_scale.main(argv)
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--sizes", default="100000,1000000", help="comma-separated database sizes")
  p.add_argument("--dim", type=int, default=384)
  p.add_argument("--queries", type=int, default=1000)
  p.add_argument("--k", type=int, default=10)
  p.add_argument("--target-recall", type=float, default=0.95)
  p.add_argument("--threads", type=int, default=0, help="search/torch threads (0 = all cores)")
  p.add_argument("--reps", type=int, default=3, help="timed repetitions; the best is reported")
  p.add_argument("--scann-leaves", type=int, default=0, help="override ScaNN num_leaves")
  p.add_argument("--hnsw-m", type=int, default=32)
  p.add_argument("--hnsw-ef-construction", type=int, default=40)
  p.add_argument("--hnsw-max-ef", type=int, default=16384)
  p.add_argument("--encoder-texts", type=int, default=1000)
  p.add_argument("--batch-size", type=int, default=64)
  p.add_argument("--skip-ann", action="store_true")
  p.add_argument("--skip-encoder", action="store_true")
  p.add_argument("--smoke", action="store_true", help=HELP_SMOKE)
  args = p.parse_args(argv)
  if args.smoke:
    p.set_defaults(sizes="2000", dim=32, queries=32, reps=1, encoder_texts=8, batch_size=8,
                   threads=1)
    args = p.parse_args(argv)
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
  if args.threads:
    import faiss  # pylint: disable=g-import-not-at-top
    faiss.omp_set_num_threads(args.threads)
  table = Table()
  t0 = time.perf_counter()
  if not args.skip_ann:
    for n in (int(s) for s in args.sizes.split(",") if s.strip()):
      bench_ann(n, args, table)
  if not args.skip_encoder:
    bench_encoder(args, table)
  table.print()
  print(f"\ntotal {time.perf_counter() - t0:.0f} s on {os.cpu_count()} cores")


if __name__ == "__main__":
  main()
