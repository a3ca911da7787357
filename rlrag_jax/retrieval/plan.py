"""`build --plan`: what a build will take, printed before any work.

For a corpus and an encoder: passages, embedding bytes, disk, the peak private (anonymous) memory
of the build and of a process that loads the index to search, the index parameters, and an
encode-time estimate from a short timed sample of the corpus's first passages.

The memory figures are a model of measured builds (`python -m rlrag_jax.bench.retrieval --scale`,
committed in docs/results/retrieval_scale/), per phase, below. The text never counts: the store is
memory-mapped.
"""
from __future__ import annotations

import json
import pathlib
import time

import numpy as np

# Private memory per phase, bytes, as a function of N, d and the encoder's parameter count.
# Measured on this repo's CPU host (docs/results/retrieval_scale):
#   encode: 0.61 GiB at 100k passages with a tiny BERT (the runtime, one tokenized chunk, the
#     bounded look-ahead), plus the encoder's float32 parameters held twice (host and device);
#   ScaNN build: ~4.6x the float16 bytes of one row slice (build_parts.SCANN_BUILD_FACTOR; a float32
#     copy, residuals, codes) plus two float32 training samples of up to 250k rows and 0.45 GiB of
#     runtime: three slices of 1M x 768 peaked at 3.85 GiB (the model: 4.07), 800k x 64 in one
#     at 1.00 GiB (the model: 1.00);
#   ScaNN search: the bfloat16 reorder copy (1x) and the 4-bit codes (0.25x): 1.89 GiB at 1M x 768.
def _scann_build(n: int, d: int, params: int) -> float:
  from rlrag_jax.retrieval import build_parts, index  # pylint: disable=g-import-not-at-top
  del params
  if n < index.BRUTE_FORCE_BELOW:       # float brute force: ScaNN's float32 copy, no training
    return 2 * n * d * 2 + 0.3 * 2**30
  k = build_parts.scann_slices(n, d)
  sample = min(n // k, 250_000)         # k-means and hashing train on float32 samples
  return build_parts.SCANN_BUILD_FACTOR * n * d * 2 / k + 2 * sample * d * 4 + 0.45 * 2**30


MEMORY_MODEL = {
    "encode": lambda n, d, params: 0.6 * 2**30 + 2 * 4 * params,
    "scann_build": _scann_build,
    "scann_search": lambda n, d, params: 1.14 * n * d * 2 + 0.26 * 2**30,
    "exact_build": lambda n, d, params: 0.5 * 2**30,
    "exact_search": lambda n, d, params: 1.0 * n * d * 2 + 0.5 * 2**30,
}
WIKI18 = {"passages": 21_015_324, "dim": 768, "encoder": "intfloat/e5-base-v2",
          "params": 109_482_240, "jsonl_bytes": 14_000_000_000}


def count_rows(corpus) -> int:
  """Non-blank lines of a JSONL corpus (a DPR TSV's without its header): one streaming scan."""
  from rlrag_jax.data import loaders  # pylint: disable=g-import-not-at-top
  path = loaders.corpus_path(corpus)
  with open(path, "rb", buffering=1 << 24) as f:
    rows = sum(1 for line in f if not line.isspace())
  return rows - (loaders.corpus_format(path) == "dpr_tsv")


def encoder_shape(encoder_path: str) -> tuple:
  """(hidden size, parameter count) of a BERT-family encoder from its config.json alone."""
  from rlrag_jax.retrieval.encoder import default_model_dir  # pylint: disable=g-import-not-at-top
  folder = pathlib.Path(encoder_path).expanduser() if encoder_path else default_model_dir()
  c = json.loads((folder / "config.json").read_text())
  h, layers = int(c["hidden_size"]), int(c["num_hidden_layers"])
  ffn = int(c.get("intermediate_size", 4 * h))
  embed = (int(c["vocab_size"]) + int(c.get("max_position_embeddings", 512)) + 2) * h
  return h, embed + layers * (4 * h * h + 2 * h * ffn + 9 * h + ffn)


def memory(phase: str, n: int, d: int, params: int = 0) -> float:
  return MEMORY_MODEL[phase](n, d, params)


def figures(n: int, d: int, source_bytes: int, backend: str, shard_size: int,
            params: int = 0) -> dict:
  """Bytes of every part of a build of n passages at dimension d."""
  f16 = n * d * 2
  store = source_bytes + 24 * n        # normalised text (about the source) + offsets and id hashes
  index = (f16 + n * d // 2) if backend == "scann" else 0    # bfloat16 reorder + 4-bit AH codes
  return {
      "passages": n,
      "dim": d,
      "embedding_bytes_float16": f16,
      "disk_final": store + f16 + index,
      "disk_peak": store + 2 * f16 + index + (2 * f16 / _slices(n, d) if backend == "scann"
                                              else 0),   # shards + embeddings + a float32 slice
      "build_private_peak": max(memory("encode", n, d, params),
                                memory(f"{backend}_build", n, d, params)),
      "search_private": memory(f"{backend}_search", n, d),
      "bound_build": 3 * f16 + 2**30,
      "bound_search": 1.5 * f16 + 2**30,
      "shards": (n + shard_size - 1) // shard_size,
  }


def _slices(n: int, d: int) -> int:
  from rlrag_jax.retrieval import build_parts  # pylint: disable=g-import-not-at-top
  return build_parts.scann_slices(n, d)


def _gb(x: float) -> str:
  return f"{x / 2**30:,.1f} GiB"


def _encode_rate(args) -> float:
  """Passages/s of the encoder over the corpus's first `args.plan_sample` passages (after one
  warm-up pass over the same texts: the jit compiles are not timed)."""
  from rlrag_jax.data import loaders  # pylint: disable=g-import-not-at-top
  from rlrag_jax.retrieval import build_parts  # pylint: disable=g-import-not-at-top
  from rlrag_jax.retrieval.retriever import passage_text  # pylint: disable=g-import-not-at-top
  encoder = build_parts.load_encoder(args)
  prefix = encoder.conventions().get("passage_prefix", "")
  texts = []
  for rec in loaders.iter_corpus(args.corpus, skip_invalid=True):
    texts.append(prefix + passage_text(rec.title, rec.text))
    if len(texts) >= args.plan_sample:
      break
  mesh = build_parts.local_mesh()
  build_parts.encode_sharded(encoder, texts, args.batch_size, mesh)
  t = time.perf_counter()
  build_parts.encode_sharded(encoder, texts, args.batch_size, mesh)
  return len(texts) / (time.perf_counter() - t)


def report(args) -> str:
  """The plan for `args` (build's flags), and the same plan at wiki-18 x e5-base-v2 scale."""
  from rlrag_jax.data import loaders  # pylint: disable=g-import-not-at-top
  from rlrag_jax.retrieval import build_parts  # pylint: disable=g-import-not-at-top
  src = loaders.corpus_path(args.corpus)
  n = count_rows(src)
  d, params = encoder_shape(args.encoder)
  f = figures(n, d, src.stat().st_size, args.backend, args.shard_size, params)
  lines = [f"plan for {src} ({loaders.corpus_format(src)}), encoder "
           f"{args.encoder or '(packaged MiniLM)'}, backend {args.backend}:"]
  lines += _table(f)
  if args.backend == "scann":
    p = build_parts.scann_params(n, d, args.reorder_dtype, num_leaves=args.num_leaves,
                           num_leaves_to_search=args.leaves_to_search, reorder_k=args.reorder_k)
    mode = "brute force (exact)" if n < p["brute_force_below"] else "partitioned"
    lines.append(f"  ScaNN {mode}: " + ", ".join(f"{k}={v}" for k, v in sorted(p.items())))
  rate = None
  if args.plan_sample > 0 and not (args.from_faiss or args.from_embeddings):
    rate = _encode_rate(args)
    lines.append(f"  encode: {rate:,.0f} passages/s here ({args.plan_sample} timed) -> "
                 f"{n / rate / 3600:,.2f} h for {n:,} on this process's devices")
  w = figures(WIKI18["passages"], WIKI18["dim"], WIKI18["jsonl_bytes"], "scann",
              args.shard_size, WIKI18["params"])
  lines.append(f"\nthe same build at wiki-18 scale ({WIKI18['passages']:,} passages x "
               f"{WIKI18['encoder']}, d={WIKI18['dim']}, ScaNN):")
  lines += _table(w)
  if rate is not None and d == WIKI18["dim"]:
    lines.append(f"  encode at this rate: {WIKI18['passages'] / rate / 3600:,.1f} h")
  return "\n".join(lines)


def _table(f: dict) -> list:
  ok = lambda x, bound: "within" if x <= bound else "OVER"
  return [
      f"  passages            {f['passages']:,} in {f['shards']:,} shards",
      f"  embeddings float16  {_gb(f['embedding_bytes_float16'])} (d={f['dim']})",
      f"  disk                {_gb(f['disk_final'])} at the end, {_gb(f['disk_peak'])} at the peak",
      f"  build memory        {_gb(f['build_private_peak'])} private peak "
      f"({ok(f['build_private_peak'], f['bound_build'])} 3 x float16 + 1 GiB = "
      f"{_gb(f['bound_build'])})",
      f"  search memory       {_gb(f['search_private'])} private "
      f"({ok(f['search_private'], f['bound_search'])} 1.5 x float16 + 1 GiB = "
      f"{_gb(f['bound_search'])})",
  ]
