"""Maximum inner product search over unit vectors: an exact JAX index and a ScaNN index.

Both take a database [N, d] float32 and answer `search(queries [Q, d], k)` with
`(scores [Q, k'] float32, ids [Q, k'] int64)`, best first, where k' = min(k, N).

`ExactIndex` is the ground truth: a jitted matmul + `lax.top_k`, batched over queries so the score
block stays under ~256 MiB. `ScannIndex` is ScaNN's tree + asymmetric hashing + exact reorder; for
small corpora (N < `brute_force_below`, default `BRUTE_FORCE_BELOW` = 16384) it is ScaNN's float
brute force instead: exact, and at that size as fast as a partitioned search (k-means with sqrt(N)
leaves and 16-centre codebooks per block also need a few thousand points to train). Which of the
two ran is `index.mode` ('exact' | 'brute_force' | 'partitioned'), logged when a ScaNN index is
built or loaded (`index.describe()`) and written into the Retriever's manifest: a brute-force
"ScaNN" result is exact search's, to the last digit.

Persistence: `index.save(folder, embeddings_file)` writes the index's own files into `folder` and
returns the params to put in a manifest; `load_index(backend, folder, embeddings, params)`
rebuilds it. The Retriever owns the embeddings file; ScaNN reuses it instead of its own copy.
"""
from __future__ import annotations

import functools
import logging
import math
import os
import pathlib
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

_SCORE_BLOCK = 1 << 26     # floats in one [Q_batch, N] score block (256 MiB)
BRUTE_FORCE_BELOW = 16384  # ScannIndex's default; config key retrieval.scann_brute_force_below

log = logging.getLogger("rlrag_jax.retrieval")


def _pow2(n: int) -> int:
  return 1 << max(0, int(n) - 1).bit_length()


def _as_matrix(x, what: str, d: Optional[int] = None) -> np.ndarray:
  x = np.asarray(x, dtype=np.float32)
  if x.ndim != 2:
    raise ValueError(f"{what}: expected a 2-D array [n, d], found shape {x.shape}")
  if d is not None and x.shape[1] != d:
    raise ValueError(f"{what}: expected dimension d={d}, found shape {x.shape}")
  return x


@functools.partial(jax.jit, static_argnames=("k",))
def _top_k(db, queries, k):
  scores = jnp.einsum("qd,nd->qn", queries, db, precision=jax.lax.Precision.HIGHEST)  # [Q, N]
  return jax.lax.top_k(scores, k)


class ExactIndex:
  """Brute-force inner product: jnp matmul + lax.top_k (jitted, batched over queries)."""

  backend = "exact"
  mode = "exact"

  def __init__(self, embeddings, *, query_batch: Optional[int] = None):
    db = _as_matrix(embeddings, "ExactIndex embeddings")
    self.n, self.d = db.shape
    self._db = jnp.asarray(db)
    cap = max(1, _SCORE_BLOCK // max(1, self.n))
    self.query_batch = int(query_batch or min(1024, cap))

  def __len__(self):
    return self.n

  def search(self, queries, k: int):
    """queries [Q, d] -> (scores [Q, k'], ids [Q, k'] int64), k' = min(k, N)."""
    q = _as_matrix(queries, "ExactIndex.search queries", self.d)
    k = min(int(k), self.n)
    nq = q.shape[0]
    if k <= 0 or nq == 0:
      return np.zeros((nq, max(k, 0)), np.float32), np.zeros((nq, max(k, 0)), np.int64)
    # Compile for few shapes: k and the query rows are rounded up to powers of two.
    kc = min(self.n, _pow2(k))
    b = min(self.query_batch, _pow2(nq))
    outs = []
    for start in range(0, nq, b):
      chunk = q[start:start + b]
      if chunk.shape[0] < b:   # pad the tail
        chunk = np.concatenate([chunk, np.zeros((b - chunk.shape[0], self.d), np.float32)])
      outs.append(_top_k(self._db, jnp.asarray(chunk), kc))
    scores = np.concatenate([np.asarray(s) for s, _ in outs])[:nq, :k]
    ids = np.concatenate([np.asarray(i) for _, i in outs])[:nq, :k].astype(np.int64)
    return scores, ids

  def describe(self) -> str:
    return f"exact search (N={self.n})"

  def params(self) -> dict:
    return {}

  def save(self, folder, embeddings_file: Optional[str] = None) -> dict:
    del folder, embeddings_file  # the embeddings (stored by the Retriever) are the whole index
    return {}


# ------------------------------------------------------------------------------------ ScaNN
def scann_defaults(n: int) -> dict:
  """Build params that scale with the corpus size N (ScaNN's own rules of thumb)."""
  num_leaves = int(min(max(round(math.sqrt(n)), 1), 4096))
  return {
      "num_leaves": num_leaves,
      # MiniLM passages of the 2Wiki corpus (6k) with its dev questions gave Recall@10 0.81 /
      # 0.94 / 0.99 searching 1/8 / 1/4 / 1/2 of the leaves. Structureless data needs nearly all
      # leaves: raise num_leaves_to_search, or leaves_to_search per call.
      "num_leaves_to_search": max(1, min(num_leaves, int(math.ceil(num_leaves / 4)))),
      "dimensions_per_block": 2,
      "anisotropic_quantization_threshold": 0.2,
      "reorder_k": 200,
      "training_sample_size": int(min(n, 250_000)),
  }


class ScannIndex:
  """ScaNN tree + asymmetric hashing (AH) + exact float reorder, inner product.

  Args (None = `scann_defaults(N)`):
    num_leaves: k-means partitions (~sqrt(N)).
    num_leaves_to_search: partitions scanned per query (the main recall/speed knob).
    dimensions_per_block: dims per 16-centre AH codebook (2 = 4 bits per 2 dims).
    anisotropic_quantization_threshold: ScaNN's score-aware loss threshold (0.2 for unit vectors).
    reorder_k: AH candidates re-scored exactly; the second knob.
    training_sample_size: points used to train k-means and AH.
    brute_force_below: N under which ScaNN's float brute force is used instead (no training):
      exact search, reported as `mode` 'brute_force' (else 'partitioned').
    num_threads: search threads (0 = all cores).
  """

  backend = "scann"

  def __init__(self, embeddings, *, num_leaves=None, num_leaves_to_search=None,
               dimensions_per_block=None, anisotropic_quantization_threshold=None,
               reorder_k=None, training_sample_size=None,
               brute_force_below: int = BRUTE_FORCE_BELOW,
               num_threads: int = 0, _searcher=None):
    import scann  # pylint: disable=g-import-not-at-top
    db = _as_matrix(embeddings, "ScannIndex embeddings")
    self.n, self.d = db.shape
    if self.n == 0:
      raise ValueError("ScannIndex: the corpus is empty (0 embeddings); nothing to index")
    defaults = scann_defaults(self.n)
    given = dict(num_leaves=num_leaves, num_leaves_to_search=num_leaves_to_search,
                 dimensions_per_block=dimensions_per_block,
                 anisotropic_quantization_threshold=anisotropic_quantization_threshold,
                 reorder_k=reorder_k, training_sample_size=training_sample_size)
    p = {k: (defaults[k] if v is None else v) for k, v in given.items()}
    p["num_leaves"] = int(min(p["num_leaves"], self.n))
    p["num_leaves_to_search"] = int(min(p["num_leaves_to_search"], p["num_leaves"]))
    p["training_sample_size"] = int(min(p["training_sample_size"], self.n))
    p["brute_force"] = self.n < brute_force_below
    p["brute_force_below"] = int(brute_force_below)
    if p["dimensions_per_block"] < 1 or p["dimensions_per_block"] > self.d:
      raise ValueError(f"ScannIndex: dimensions_per_block={p['dimensions_per_block']} must be in "
                       f"1..d={self.d}")
    self._params = p
    self.num_threads = int(num_threads)
    if _searcher is not None:
      self._searcher = _searcher
    else:
      b = scann.scann_ops_pybind.builder(db, 10, "dot_product")
      if p["brute_force"]:
        b = b.score_brute_force()
      else:
        b = b.tree(num_leaves=p["num_leaves"], num_leaves_to_search=p["num_leaves_to_search"],
                   training_sample_size=p["training_sample_size"])
        b = b.score_ah(p["dimensions_per_block"],
                       anisotropic_quantization_threshold=p["anisotropic_quantization_threshold"],
                       training_sample_size=p["training_sample_size"])
        b = b.reorder(p["reorder_k"])
      self._searcher = b.build()
    if self.num_threads:
      self._searcher.set_num_threads(self.num_threads)
    if p["brute_force"]:     # ScaNN was chosen and exact search runs: say so
      log.warning("%s", self.describe())
    else:
      log.info("%s", self.describe())

  def __len__(self):
    return self.n

  @property
  def mode(self) -> str:
    """'brute_force' (N < brute_force_below: exact float scores) or 'partitioned'."""
    return "brute_force" if self._params["brute_force"] else "partitioned"

  def describe(self) -> str:
    p = self._params
    if p["brute_force"]:
      return (f"ScaNN brute force (N={self.n} < brute_force_below={p['brute_force_below']}): "
              "exact float search, no partitioning or quantisation")
    return (f"ScaNN partitioned (N={self.n} >= brute_force_below={p['brute_force_below']}): "
            f"{p['num_leaves']} leaves, {p['num_leaves_to_search']} searched, AH "
            f"{p['dimensions_per_block']} dims/block, reorder_k={p['reorder_k']}, "
            f"trained on {p['training_sample_size']}")

  def params(self) -> dict:
    return dict(self._params)

  def search(self, queries, k: int, *, leaves_to_search: Optional[int] = None,
             reorder_k: Optional[int] = None):
    """queries [Q, d] -> (scores [Q, k'], ids [Q, k'] int64), k' = min(k, N).

    ScaNN finds fewer than k' neighbours for a query when the searched leaves hold fewer
    points; those slots get id -1 and score -inf.
    """
    q = _as_matrix(queries, "ScannIndex.search queries", self.d)
    k = min(int(k), self.n)
    nq = q.shape[0]
    if k <= 0 or nq == 0:
      return np.zeros((nq, max(k, 0)), np.float32), np.zeros((nq, max(k, 0)), np.int64)
    kw = {"final_num_neighbors": k}
    if not self._params["brute_force"]:
      kw["leaves_to_search"] = int(leaves_to_search or self._params["num_leaves_to_search"])
      kw["pre_reorder_num_neighbors"] = int(max(k, reorder_k or self._params["reorder_k"]))
    if nq > 1:
      idx, dist = self._searcher.search_batched_parallel(q, **kw)
    else:
      idx, dist = self._searcher.search_batched(q, **kw)
    idx = np.asarray(idx).astype(np.int64)
    dist = np.asarray(dist, np.float32)
    if idx.shape[1] < k:   # fewer candidates than k anywhere: pad to a fixed width
      pad = k - idx.shape[1]
      idx = np.pad(idx, ((0, 0), (0, pad)), constant_values=-1)
      dist = np.pad(dist, ((0, 0), (0, pad)), constant_values=-np.inf)
    bad = np.isnan(dist) | (idx >= self.n)   # ScaNN fills missing slots with id 0, score NaN
    if bad.any():
      idx[bad], dist[bad] = -1, -np.inf
    return dist, idx

  # ---------------------------------------------------------------- persistence
  SUBDIR = "scann"

  def save(self, folder, embeddings_file: Optional[str] = None) -> dict:
    """Serialises the searcher into folder/scann; returns the params for the manifest.

    ScaNN keeps its own float copy of the database (dataset.npy) for reordering. When
    `embeddings_file` (relative to `folder`) holds the same array, that copy is dropped and the
    manifest points ScaNN at the embeddings file instead.
    """
    out = pathlib.Path(folder) / self.SUBDIR
    out.mkdir(parents=True, exist_ok=True)
    self._searcher.serialize(str(out), relative_path=True)
    params = self.params()
    params.pop("dataset_npy", None)
    copy = out / "dataset.npy"
    if embeddings_file and copy.is_file():
      ours = np.load(pathlib.Path(folder) / embeddings_file, mmap_mode="r")
      theirs = np.load(copy, mmap_mode="r")
      same = ours.shape == theirs.shape and ours.dtype == theirs.dtype and all(
          np.array_equal(ours[i:i + 65536], theirs[i:i + 65536])
          for i in range(0, ours.shape[0], 65536))
      del ours, theirs
      if same:
        copy.unlink()
        params["dataset_npy"] = embeddings_file
    return params

  @classmethod
  def load(cls, folder, embeddings, params: dict, num_threads: int = 0) -> "ScannIndex":
    """Loads folder/scann; asset paths are re-rooted at `folder`, so a moved folder loads."""
    import scann  # pylint: disable=g-import-not-at-top
    from scann.scann_ops import scann_assets_pb2  # pylint: disable=g-import-not-at-top
    from google.protobuf import text_format  # pylint: disable=g-import-not-at-top
    src = pathlib.Path(folder) / cls.SUBDIR
    pbtxt = src / "scann_assets.pbtxt"
    if not pbtxt.is_file():
      raise FileNotFoundError(f"{pbtxt}: missing; the ScaNN index folder is incomplete")
    try:
      assets = text_format.Parse(pbtxt.read_text(), scann_assets_pb2.ScannAssets())
    except text_format.ParseError as e:
      raise ValueError(f"{pbtxt}: not a valid ScannAssets text proto ({e})") from None
    for a in assets.assets:
      # serialize() may write absolute paths (older scann, or relative_path=False): keep only
      # the file name and look for it next to the pbtxt.
      local = src / os.path.basename(a.asset_path)
      if a.asset_type == scann_assets_pb2.ScannAsset.DATASET_NPY and params.get("dataset_npy"):
        local = pathlib.Path(folder) / params["dataset_npy"]
      if not local.is_file():
        raise FileNotFoundError(f"{local}: ScaNN asset listed in {pbtxt} is missing")
      a.asset_path = str(local)
    searcher = scann.scann_ops_pybind.ScannSearcher(
        scann.scann_ops_pybind.scann_pybind.ScannNumpy(str(src), text_format.MessageToString(assets)))
    p = dict(params)
    kw = {k: p.get(k) for k in ("num_leaves", "num_leaves_to_search", "dimensions_per_block",
                                "anisotropic_quantization_threshold", "reorder_k",
                                "training_sample_size")}
    return cls(embeddings, brute_force_below=p.get("brute_force_below", BRUTE_FORCE_BELOW),
               num_threads=num_threads, _searcher=searcher, **kw)


BACKENDS = {"exact": ExactIndex, "scann": ScannIndex}


def build_index(backend: str, embeddings, **params):
  if backend not in BACKENDS:
    raise ValueError(f"unknown backend {backend!r}; expected one of {sorted(BACKENDS)}")
  return BACKENDS[backend](embeddings, **params)


def load_index(backend: str, folder, embeddings, params: dict):
  if backend == "exact":
    return ExactIndex(embeddings)
  if backend == "scann":
    return ScannIndex.load(folder, embeddings, params)
  raise ValueError(f"unknown backend {backend!r}; expected one of {sorted(BACKENDS)}")
