"""Prebuilt embeddings into an index folder, without re-encoding: a FAISS flat inner-product index
(Search-R1's `e5_Flat.index`, 21M x 768) or a folder of `.npy` shards.

Both are read in chunks into the folder's float16 `embeddings.npy` (a memory map; nothing holds the
whole matrix). Their row count and dimension are checked against the corpus and the query encoder
before anything is written: a mismatch is a one-line error. The query encoder (`--encoder`, with
its conventions) is the one that made the vectors: its id and conventions go into the manifest,
so that a search with another encoder or convention is refused.

FAISS is an optional dependency (`pip install faiss-cpu`); the index is opened memory-mapped
(`faiss.IO_FLAG_MMAP`) and read with `reconstruct_n`, chunk by chunk.
"""
from __future__ import annotations

import pathlib
from typing import Optional

import numpy as np

CHUNK_ROWS = 1 << 16


class VectorImportError(ValueError):
  """Prebuilt vectors that do not fit the corpus or the encoder."""


def source(args) -> Optional[tuple]:
  """('faiss', file) | ('embeddings', folder) | None, from the build's flags."""
  if getattr(args, "from_faiss", None):
    return ("faiss", pathlib.Path(args.from_faiss).expanduser())
  if getattr(args, "from_embeddings", None):
    return ("embeddings", pathlib.Path(args.from_embeddings).expanduser())
  return None


class _Faiss:
  def __init__(self, path: pathlib.Path):
    try:
      import faiss  # pylint: disable=g-import-not-at-top
    except ImportError:
      raise VectorImportError(f"--from-faiss {path}: the faiss package is not installed "
                         "(pip install faiss-cpu)") from None
    if not path.is_file():
      raise VectorImportError(f"--from-faiss {path}: no such file")
    self._owner = faiss.read_index(str(path), faiss.IO_FLAG_MMAP)  # keeps the C++ index alive
    index = faiss.downcast_index(self._owner)
    if not isinstance(index, faiss.IndexFlat):
      raise VectorImportError(f"--from-faiss {path}: a {type(index).__name__}; expected a flat index "
                         "(IndexFlatIP) whose vectors can be read back exactly")
    if index.metric_type != faiss.METRIC_INNER_PRODUCT:
      raise VectorImportError(f"--from-faiss {path}: metric_type {index.metric_type}; expected inner "
                         f"product ({faiss.METRIC_INNER_PRODUCT})")
    self.index, self.path = index, path
    self.shape = (int(index.ntotal), int(index.d))

  def chunks(self):
    n = self.shape[0]
    for start in range(0, n, CHUNK_ROWS):
      yield start, self.index.reconstruct_n(start, min(CHUNK_ROWS, n - start))


class _NpyShards:
  def __init__(self, folder: pathlib.Path):
    if not folder.is_dir():
      raise VectorImportError(f"--from-embeddings {folder}: not a folder")
    self.files = sorted(folder.glob("*.npy"))
    if not self.files:
      raise VectorImportError(f"--from-embeddings {folder}: no .npy files")
    rows, d = 0, None
    for f in self.files:
      a = np.load(f, mmap_mode="r")
      if a.ndim != 2 or (d is not None and a.shape[1] != d):
        raise VectorImportError(f"{f}: shape {list(a.shape)}; expected [rows, {d or 'd'}] like "
                           f"{self.files[0].name}")
      d = a.shape[1]
      rows += a.shape[0]
    self.path, self.shape = folder, (rows, int(d))

  def chunks(self):
    start = 0
    for f in self.files:
      a = np.load(f, mmap_mode="r")
      for i in range(0, a.shape[0], CHUNK_ROWS):
        yield start + i, np.asarray(a[i:i + CHUNK_ROWS])
      start += a.shape[0]


def open_vectors(kind: str, path: pathlib.Path):
  return _Faiss(path) if kind == "faiss" else _NpyShards(path)


def check(imported: tuple, args, n_rows: Optional[int]):
  """Opens the vectors and the query encoder and checks their shapes against each other and
  (when known) the corpus's row count; returns (vectors, encoder). Nothing is written."""
  from rlrag_jax.retrieval import build_parts  # pylint: disable=g-import-not-at-top
  kind, path = imported
  vectors = open_vectors(kind, path)
  n, d = vectors.shape
  flag = "--from-faiss" if kind == "faiss" else "--from-embeddings"
  if n_rows is not None and n != n_rows:
    raise VectorImportError(f"{flag} {path}: {n} vectors but the corpus {args.corpus} has "
                            f"{n_rows} passages; row i must be passage i")
  encoder = build_parts.load_encoder(args)
  if encoder.dim != d:
    raise VectorImportError(f"{flag} {path}: dimension {d} but the query encoder "
                            f"{args.encoder or '(packaged MiniLM)'} gives {encoder.dim}; pass "
                            "the --encoder that made these vectors")
  return vectors, encoder


def load(imported: tuple, store, out: pathlib.Path, args):
  """Checks and copies the vectors into out/embeddings.npy (float16); returns
  (embeddings memmap, encoder, encoder id, conventions)."""
  from rlrag_jax.retrieval import build_parts  # pylint: disable=g-import-not-at-top
  vectors, encoder = check(imported, args, len(store))
  n, d = vectors.shape
  dtype = build_parts.EMBEDDING_DTYPES[args.embedding_dtype]
  tmp = out / f".{build_parts.EMBEDDINGS}.tmp"
  mm = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=(n, d))
  bar = None
  if not args.quiet:
    from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top
    bar = tqdm(total=n, unit=" vectors", unit_scale=True, desc=f"import {vectors.path.name}")
  for start, chunk in vectors.chunks():
    mm[start:start + len(chunk)] = chunk
    if bar is not None:
      bar.update(len(chunk))
  if bar is not None:
    bar.close()
  mm.flush()
  del mm
  tmp.replace(out / build_parts.EMBEDDINGS)
  emb = np.load(out / build_parts.EMBEDDINGS, mmap_mode="r")
  return emb, encoder, encoder.id, build_parts.encoder_conventions(encoder)
