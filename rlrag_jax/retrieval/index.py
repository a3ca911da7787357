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

import contextlib
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
  db = db.astype(jnp.float32)        # a float16 block is widened here, one block at a time
  scores = jnp.einsum("qd,nd->qn", queries, db, precision=jax.lax.Precision.HIGHEST)  # [Q, N]
  return jax.lax.top_k(scores, k)


def merge_top_k(parts, k: int):
  """[(scores [Q, k_i], global ids [Q, k_i])] -> the best k of each row, ties by lower id
  (missing slots: id -1, score -inf, last)."""
  if len(parts) == 1:
    scores, ids = parts[0]
    return scores[:, :k], ids[:, :k]
  scores = np.concatenate([p[0] for p in parts], axis=1)
  ids = np.concatenate([p[1] for p in parts], axis=1)
  order = np.lexsort((ids, -scores), axis=1)[:, :k]     # best first; ties by lower row
  return np.take_along_axis(scores, order, 1), np.take_along_axis(ids, order, 1)


class ExactIndex:
  """Brute-force inner product: jnp matmul + lax.top_k (jitted, batched over queries).

  The database stays in its dtype (float32, or float16 for a built index: half the memory) in
  row blocks of at most `block_rows`; scores are float32. One block (the usual small corpus)
  is one matmul; more blocks are searched one by one and their top-k merged.
  """

  backend = "exact"
  mode = "exact"

  def __init__(self, embeddings, *, query_batch: Optional[int] = None,
               block_rows: int = 1 << 21):
    if getattr(embeddings, "dtype", None) == np.float16:
      db = np.asarray(embeddings)
      if db.ndim != 2:
        raise ValueError(f"ExactIndex embeddings: expected a 2-D array [n, d], found shape "
                         f"{db.shape}")
    else:
      db = _as_matrix(embeddings, "ExactIndex embeddings")
    self.n, self.d = db.shape
    self._blocks = [jnp.asarray(db[i:i + block_rows]) for i in range(0, max(self.n, 1),
                                                                     block_rows)]
    self._starts = list(range(0, max(self.n, 1), block_rows))
    cap = max(1, _SCORE_BLOCK // max(1, min(self.n, block_rows)))
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
    b = min(self.query_batch, _pow2(nq))
    parts = []
    for block, start in zip(self._blocks, self._starts):
      kc = min(block.shape[0], _pow2(k))
      outs = []
      for qs in range(0, nq, b):
        chunk = q[qs:qs + b]
        if chunk.shape[0] < b:   # pad the tail
          chunk = np.concatenate([chunk, np.zeros((b - chunk.shape[0], self.d), np.float32)])
        outs.append(_top_k(block, jnp.asarray(chunk), kc))
      scores = np.concatenate([np.asarray(s) for s, _ in outs])[:nq]
      ids = np.concatenate([np.asarray(i) for _, i in outs])[:nq].astype(np.int64) + start
      parts.append((scores, ids))
    return merge_top_k(parts, k)

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


REORDER_DTYPES = ("float32", "bfloat16", "int8")


def _reorder_type(name: str):
  from scann.scann_ops.py import scann_builder  # pylint: disable=g-import-not-at-top
  return {"float32": scann_builder.ReorderType.FLOAT32,
          "bfloat16": scann_builder.ReorderType.BFLOAT16,
          "int8": scann_builder.ReorderType.INT8}[name]


class ScannIndex:
  """ScaNN tree + asymmetric hashing (AH) + exact float reorder, inner product.

  Args (None = `scann_defaults(N)`):
    num_leaves: k-means partitions (~sqrt(N)).
    num_leaves_to_search: partitions scanned per query (the main recall/speed knob).
    dimensions_per_block: dims per 16-centre AH codebook (2 = 4 bits per 2 dims).
    anisotropic_quantization_threshold: ScaNN's score-aware loss threshold (0.2 for unit vectors).
    reorder_k: AH candidates re-scored exactly; the second knob.
    reorder_dtype: the vectors the reorder scores: 'float32' (ScaNN keeps a float32 copy of the
      database, 2x a float16 one), 'bfloat16' (half that, 8 bits of mantissa) or 'int8'.
    training_sample_size: points used to train k-means and AH.
    brute_force_below: N under which ScaNN's float brute force is used instead (no training):
      exact search, reported as `mode` 'brute_force' (else 'partitioned').
    num_threads: search threads (0 = all cores).
  """

  backend = "scann"

  def __init__(self, embeddings, *, num_leaves=None, num_leaves_to_search=None,
               dimensions_per_block=None, anisotropic_quantization_threshold=None,
               reorder_k=None, training_sample_size=None,
               brute_force_below: int = BRUTE_FORCE_BELOW, reorder_dtype: str = "float32",
               num_threads: int = 0, _searcher=None):
    import scann  # pylint: disable=g-import-not-at-top
    if _searcher is None:
      db = _as_matrix(embeddings, "ScannIndex embeddings")
    else:   # loaded: only the shape is needed (no float32 copy of a float16 memory map)
      db = None
      if len(getattr(embeddings, "shape", ())) != 2:
        raise ValueError(f"ScannIndex embeddings: expected a 2-D array [n, d], found "
                         f"{getattr(embeddings, 'shape', None)}")
    self.n, self.d = (db if db is not None else embeddings).shape
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
    if reorder_dtype not in REORDER_DTYPES:
      raise ValueError(f"ScannIndex: reorder_dtype={reorder_dtype!r}; expected one of "
                       f"{sorted(REORDER_DTYPES)}")
    p["reorder_dtype"] = reorder_dtype
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
        b = b.reorder(p["reorder_k"], quantize=_reorder_type(p["reorder_dtype"]))
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
            f"{p['dimensions_per_block']} dims/block, reorder_k={p['reorder_k']} over "
            f"{p['reorder_dtype']}, "
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
    dataset = pathlib.Path(folder) / params["dataset_npy"] if params.get("dataset_npy") else None
    return cls.load_searcher_dir(pathlib.Path(folder) / cls.SUBDIR, embeddings.shape, params,
                                 num_threads, dataset)

  @classmethod
  def load_searcher_dir(cls, src: pathlib.Path, shape, params: dict, num_threads: int = 0,
                        dataset: Optional[pathlib.Path] = None) -> "ScannIndex":
    """A searcher serialised in `src` for a [n, d] database (`dataset`: the float copy's file
    when it was deduplicated against the embeddings)."""
    import scann  # pylint: disable=g-import-not-at-top
    from scann.scann_ops import scann_assets_pb2  # pylint: disable=g-import-not-at-top
    from google.protobuf import text_format  # pylint: disable=g-import-not-at-top
    src = pathlib.Path(src).resolve()     # ScaNN reads a relative asset path as empty
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
      if a.asset_type == scann_assets_pb2.ScannAsset.DATASET_NPY and dataset is not None:
        local = pathlib.Path(dataset).resolve()
      if not local.is_file():
        raise FileNotFoundError(f"{local}: ScaNN asset listed in {pbtxt} is missing")
      a.asset_path = str(local)
    searcher = scann.scann_ops_pybind.ScannSearcher(
        scann.scann_ops_pybind.scann_pybind.ScannNumpy(str(src), text_format.MessageToString(assets)))
    p = dict(params)
    kw = {k: p.get(k) for k in ("num_leaves", "num_leaves_to_search", "dimensions_per_block",
                                "anisotropic_quantization_threshold", "reorder_k",
                                "training_sample_size")}
    return cls(_Shape(shape), brute_force_below=p.get("brute_force_below", BRUTE_FORCE_BELOW),
               reorder_dtype=p.get("reorder_dtype", "float32"), num_threads=num_threads,
               _searcher=searcher, **kw)


class _Shape:
  """Stands for a database of this shape when only its shape is needed (a loaded searcher)."""

  def __init__(self, shape):
    self.shape = tuple(int(x) for x in shape)


@contextlib.contextmanager
def _float32_rows(embeddings, a: int, b: int, folder: pathlib.Path):
  """Rows a..b-1 as float32: the array itself when it is float32 already, else a file-backed
  memory map written chunk by chunk and removed afterwards."""
  if embeddings.dtype == np.float32:
    yield embeddings[a:b]
    return
  path = folder / f".scann-rows-{a}-{b}.f32.npy"
  mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(b - a,
                                                                          embeddings.shape[1]))
  try:
    for i in range(a, b, 1 << 16):
      mm[i - a:min(b, i + (1 << 16)) - a] = embeddings[i:min(b, i + (1 << 16))]
    mm.flush()
    yield np.load(path, mmap_mode="r")
  finally:
    del mm
    path.unlink(missing_ok=True)


def _return_freed_memory() -> None:
  """glibc keeps freed heap memory for reuse; malloc_trim hands it back to the system, so that a
  build's peak is one slice's, as measured (a no-op where there is no glibc)."""
  try:
    import ctypes  # pylint: disable=g-import-not-at-top
    ctypes.CDLL("libc.so.6").malloc_trim(0)
  except (OSError, AttributeError):
    pass


class ScannSlices:
  """ScaNN over row slices of the database, searched together and merged: the build's memory.

  ScaNN's build holds about 4-4.5x the float16 bytes of what it indexes in private memory at once
  (a float32 copy, residuals, codes; measured in docs/results/retrieval_scale). Building it over
  `slices` consecutive row ranges, each serialised and freed before the next, bounds the build
  by one slice's share. Each slice is a `ScannIndex` with ~sqrt(rows) leaves; a query searches
  every slice with the same fraction of leaves and the results are merged, so the points scanned
  are those of one index over all rows. One slice is exactly a `ScannIndex`.
  """

  backend = "scann"
  SUBDIR = ScannIndex.SUBDIR

  def __init__(self, parts: list, starts: list, n: int, d: int):
    self.parts, self.starts, self.n, self.d = parts, starts, n, d

  @classmethod
  def build(cls, embeddings, slices: int, folder=None, **params) -> "ScannSlices":
    """Builds slice by slice; with `folder`, each slice is saved there and reloaded, so only one
    slice's build buffers are alive at a time, and a float16 database is widened to float32 one
    slice at a time into a file-backed map in `folder` (ScaNN takes float32; no private copy)."""
    n, d = embeddings.shape
    bounds = [round(i * n / slices) for i in range(slices + 1)]
    if slices > 1 and n >= params.get("brute_force_below", BRUTE_FORCE_BELOW):
      params = {**params, "brute_force_below": 0}   # the whole is partitioned: so is each slice
    if folder is None:
      parts = [ScannIndex(embeddings[a:b], **params) for a, b in zip(bounds, bounds[1:])]
      return cls(parts, bounds[:-1], n, d)
    saved = []
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
      with _float32_rows(embeddings, a, b, pathlib.Path(folder)) as rows:
        part = ScannIndex(rows, **params)
      if slices == 1:
        return cls([part], [0], n, d)
      sub = pathlib.Path(folder) / cls.SUBDIR / f"slice-{i:03d}"
      sub.mkdir(parents=True, exist_ok=True)
      part._searcher.serialize(str(sub), relative_path=True)   # pylint: disable=protected-access
      saved.append((sub, (b - a, d), part.params()))
      del part         # no slice is held while the next one is built: each build alone peaks
      _return_freed_memory()
    parts = [ScannIndex.load_searcher_dir(sub, shape, p) for sub, shape, p in saved]
    return cls(parts, bounds[:-1], n, d)

  def __len__(self):
    return self.n

  @property
  def mode(self) -> str:
    return self.parts[0].mode

  def describe(self) -> str:
    if len(self.parts) == 1:
      return self.parts[0].describe()
    return f"{len(self.parts)} slices of {self.parts[0].describe()}"

  def params(self) -> dict:
    p = self.parts[0].params()
    p["slices"] = [[s, s + len(part)] for s, part in zip(self.starts, self.parts)]
    return p

  def search(self, queries, k: int, **kw):
    q = _as_matrix(queries, "ScannSlices.search queries", self.d)
    k = min(int(k), self.n)
    parts = []
    for start, part in zip(self.starts, self.parts):
      scores, ids = part.search(q, k, **kw)
      parts.append((scores, np.where(ids >= 0, ids + start, -1)))
    return merge_top_k(parts, k)

  def save(self, folder, embeddings_file: Optional[str] = None) -> dict:
    if len(self.parts) == 1:
      return self.parts[0].save(folder, embeddings_file)
    for i, part in enumerate(self.parts):      # already serialised by build(folder=...)
      sub = pathlib.Path(folder) / self.SUBDIR / f"slice-{i:03d}"
      if not (sub / "scann_assets.pbtxt").is_file():
        sub.mkdir(parents=True, exist_ok=True)
        part._searcher.serialize(str(sub), relative_path=True)   # pylint: disable=protected-access
    return self.params()

  @classmethod
  def load(cls, folder, embeddings, params: dict, num_threads: int = 0) -> "ScannSlices":
    n, d = embeddings.shape
    slices = params.get("slices")
    p = {k: v for k, v in params.items() if k != "slices"}
    parts, starts = [], []
    for i, (a, b) in enumerate(slices):
      sub = pathlib.Path(folder) / cls.SUBDIR / f"slice-{i:03d}"
      parts.append(ScannIndex.load_searcher_dir(sub, (b - a, d), p, num_threads))
      starts.append(a)
    if starts[0] != 0 or slices[-1][1] != n:
      raise ValueError(f"{pathlib.Path(folder) / cls.SUBDIR}: slices {slices} do not cover "
                       f"rows 0..{n}")
    return cls(parts, starts, n, d)


BACKENDS = {"exact": ExactIndex, "scann": ScannIndex}


def build_index(backend: str, embeddings, **params):
  if backend not in BACKENDS:
    raise ValueError(f"unknown backend {backend!r}; expected one of {sorted(BACKENDS)}")
  return BACKENDS[backend](embeddings, **params)


def load_index(backend: str, folder, embeddings, params: dict):
  if backend == "exact":
    return ExactIndex(embeddings)
  if backend == "scann" and params.get("slices") and len(params["slices"]) > 1:
    return ScannSlices.load(folder, embeddings, params)
  if backend == "scann":
    return ScannIndex.load(folder, embeddings, {k: v for k, v in params.items()
                                                if k != "slices"})
  raise ValueError(f"unknown backend {backend!r}; expected one of {sorted(BACKENDS)}")
