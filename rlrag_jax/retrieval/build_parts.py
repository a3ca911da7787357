"""The pieces of an index build (`retrieval.build`) that its planning and import tools
(`retrieval.plan`, `retrieval.imports`) share: the embeddings file, the encoder and its sharded
encoding, ScaNN's parameters and row slices. Below all three, so that none imports another's
command (`retrieval.build` re-exports them)."""
from __future__ import annotations

import math

import numpy as np

EMBEDDINGS = "embeddings.npy"
EMBEDDING_DTYPES = {"float16": np.float16, "float32": np.float32}


def load_encoder(args):
  from rlrag_jax.retrieval.encoder import Encoder  # pylint: disable=g-import-not-at-top
  kw = {k: getattr(args, k) for k in ("pooling", "query_prefix", "passage_prefix")
        if getattr(args, k) is not None}
  if args.normalize is not None:
    kw["normalize"] = args.normalize == "true"
  return Encoder.from_pretrained(args.encoder or None, dtype=args.dtype,
                                 max_length=args.max_length, **kw)


def encoder_conventions(encoder) -> dict:
  return dict(encoder.conventions())


# ------------------------------------------------------------------------------ encoding
def local_mesh():
  """A 1-D 'data' mesh over this process's devices (the encoder is replicated, rows split)."""
  import jax  # pylint: disable=g-import-not-at-top
  from rlrag_jax.models import sharding  # pylint: disable=g-import-not-at-top
  return sharding.make_mesh(devices=jax.local_devices())


TOKENIZE_ROWS = 4096   # texts tokenized at once: a fast tokenizer's encodings of a whole
                       # 65,536-passage shard held 1.5 GiB (2.14 GiB peak at 100k passages)


def encode_sharded(encoder, texts, batch_size: int, mesh,
                   tokenize_rows: int = TOKENIZE_ROWS) -> np.ndarray:
  """Texts -> [len(texts), d] float32 unit vectors, each batch's rows split over `mesh`.

  Texts are tokenized `tokenize_rows` at a time; within those, the longest go first and each
  batch is padded to the encoder's next length bucket (as `Encoder.encode`), so a row's vector
  depends on its text and its neighbours' lengths only, the same on every run.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from rlrag_jax.models import sharding  # pylint: disable=g-import-not-at-top
  n_dev = mesh.devices.size
  batch_size = max(n_dev, (batch_size // n_dev) * n_dev)
  rows_in = sharding.batch_sharding(mesh)
  params = jax.device_put(encoder.params, sharding.replicated(mesh))
  texts = list(texts)
  out = np.zeros((len(texts), encoder.dim), np.float32)
  pending = []
  for c0 in range(0, len(texts), tokenize_rows):
    ids = encoder.tokenize(texts[c0:c0 + tokenize_rows])
    lengths = np.fromiter((len(x) for x in ids), np.int64, len(ids))
    order = np.argsort(-lengths, kind="stable")
    for start in range(0, len(ids), batch_size):
      sel = order[start:start + batch_size]
      t = encoder._bucket(int(lengths[sel].max()))   # pylint: disable=protected-access
      tok, mask = encoder.pad_rows([ids[j] for j in sel], batch_size, t)   # [B, T] each
      emb = encoder.embed_fn(params, jax.device_put(tok, rows_in), jax.device_put(mask, rows_in))
      pending.append((c0 + sel, emb))
      if len(pending) > 4:      # bounded look-ahead: device memory stays a few batches
        s, e = pending.pop(0)
        out[s] = np.asarray(e)[:len(s)]
    del ids
  for s, e in pending:
    out[s] = np.asarray(e)[:len(s)]
  return out


# ------------------------------------------------------------------------------ ScaNN
def scann_params(n: int, d: int, reorder_dtype: str = "bfloat16", **overrides) -> dict:
  """ScaNN's parameters from N: float brute force under `brute_force_below`; above it a tree
  of ~sqrt(N) leaves, asymmetric hashing with 2 dimensions a 4-bit code, and an exact reorder of
  the top `reorder_k` over `reorder_dtype` vectors (bfloat16 halves the float32 reorder data and
  keeps 8 bits of mantissa; int8 quarters it)."""
  from rlrag_jax.retrieval import index as index_lib  # pylint: disable=g-import-not-at-top
  p = index_lib.scann_defaults(n)
  p["reorder_dtype"] = reorder_dtype
  p["brute_force_below"] = index_lib.BRUTE_FORCE_BELOW
  p.update({k: v for k, v in overrides.items() if v is not None})
  del d
  return p


# ScaNN's build holds about this many times the float16 bytes of the rows it indexes, privately
# (docs/results/retrieval_scale: 4.6x at 1M x 768, the float32 copy and its residuals).
SCANN_BUILD_FACTOR = 4.6


def scann_slices(n: int, d: int, budget_factor: float = 1.5, budget_const: float = 0.5 * 2**30,
                 min_rows: int = 1 << 18) -> int:
  """How many row slices keep ScaNN's build under budget_factor x the float16 bytes +
  budget_const (its training samples, the runtime and malloc's slack take the rest of the
  3x + 1 GiB bound: at 1M x 768 two slices measured 5.54 GiB against 5.29, three fit)."""
  f16 = n * d * 2
  k = math.ceil(SCANN_BUILD_FACTOR * f16 / (budget_factor * f16 + budget_const))
  return int(max(1, min(k, n // min_rows)))
