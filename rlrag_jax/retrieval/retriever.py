"""A passage retriever: corpus + embeddings + an index (+ the encoder for text queries).

Passages are encoded as `passage_text(title, text)` = "title\\ntext" (just `text` when the title
is empty), the layout DPR-style corpora store (FlashRAG's `contents` is '"Title"\\ntext').

On disk (`save` / `load`), one folder:
  manifest.json     format, format_version, backend, index_mode ('exact' | 'brute_force' |
                    'partitioned': what ScaNN really ran), n, d, encoder id, index params, and
                    the sha256 of every file below
  corpus.jsonl      one CorpusRecord per line (id, title, text, triples), row i = embedding i
  embeddings.npy    [N, d] float32, unit rows
  scann/            ScaNN's serialised searcher (backend 'scann' only)
Anything missing, corrupt (checksum) or mismatched (version, n, d, encoder dimension) is refused
with an error naming the file.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
from typing import Any, Iterable, Sequence

import numpy as np

from rlrag_jax.data.schema import CorpusRecord, Triple
from rlrag_jax.runlog import write_atomic
from rlrag_jax.retrieval import index as index_lib

FORMAT = "rlrag_jax.retriever"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
CORPUS = "corpus.jsonl"
EMBEDDINGS = "embeddings.npy"


@dataclasses.dataclass(frozen=True)
class Hit:
  id: str
  score: float
  title: str
  text: str


class RetrieverFormatError(ValueError):
  """A saved retriever folder is missing a file, is corrupt, or does not match."""


def passage_text(title: str, text: str) -> str:
  """What the encoder sees for a passage."""
  return f"{title}\n{text}" if title else text


def numbered_passages(docs, passage_words: int = 0) -> str:
  """(title, text) pairs -> "[k] title: text" lines for a prompt, each text cut to its first
  `passage_words` words (0: whole); "(none)" when there are none."""
  lines = []
  for i, (title, text) in enumerate(docs, 1):
    words = text.split()
    if passage_words and len(words) > passage_words:
      text = " ".join(words[:passage_words])
    lines.append(f"[{i}] {title}: {text}")
  return "\n".join(lines) if lines else "(none)"


def as_record(x: Any, row: int) -> CorpusRecord:
  """CorpusRecord | {'id','title','text'} | FlashRAG {'id','contents'} -> CorpusRecord.

  A missing id becomes the row number as a string.
  """
  if isinstance(x, CorpusRecord):
    return x
  if not isinstance(x, dict):
    raise TypeError(f"corpus row {row}: expected a CorpusRecord or dict, found {type(x).__name__}")
  rid = str(x["id"]) if x.get("id") is not None else str(row)
  if "text" in x:
    title, text = str(x.get("title") or ""), str(x["text"])
  elif "contents" in x:
    head, _, body = str(x["contents"]).partition("\n")
    title, text = (head.strip().strip('"'), body) if body else ("", head)
  else:
    raise ValueError(f"corpus row {row} (id {rid!r}): expected field 'text' (or FlashRAG "
                     f"'contents'), found fields {sorted(x)}")
  triples = [t if isinstance(t, Triple) else Triple(*_triple(t)) for t in x.get("triples", [])]
  return CorpusRecord(id=rid, title=title, text=text, triples=triples)


def _triple(t):
  if isinstance(t, dict):
    return t["head"], t["relation"], t["tail"]
  return tuple(t)


def _sha256(path: pathlib.Path) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 22), b""):
      h.update(block)
  return h.hexdigest()


class Retriever:
  """Top-k passages for text queries (needs an encoder) or for query embeddings."""

  def __init__(self, records: Sequence[CorpusRecord], embeddings: np.ndarray, index,
               encoder=None, encoder_id: str = ""):
    self.records = list(records)
    self.embeddings = embeddings          # [N, d] float32
    self.index = index
    self.encoder = encoder
    self.encoder_id = encoder_id or (encoder.id if encoder is not None else "")
    self._row = {r.id: i for i, r in enumerate(self.records)}
    if len(self._row) != len(self.records):
      seen, dup = set(), None
      for r in self.records:
        if r.id in seen:
          dup = r.id
          break
        seen.add(r.id)
      raise ValueError(f"corpus ids must be unique; id {dup!r} appears more than once")
    if embeddings.shape[0] != len(self.records):
      raise ValueError(f"{len(self.records)} corpus records but {embeddings.shape[0]} embeddings")

  def __len__(self) -> int:
    return len(self.records)

  @property
  def dim(self) -> int:
    return int(self.embeddings.shape[1])

  @property
  def backend(self) -> str:
    return self.index.backend

  # ---------------------------------------------------------------- build
  @classmethod
  def build(cls, corpus: Iterable, encoder, backend: str = "scann", *, batch_size: int = 64,
            **index_params) -> "Retriever":
    """Encodes `corpus` ("title\\ntext" per passage) and indexes it.

    Args:
      corpus: CorpusRecords, dicts with id/title/text, or FlashRAG dicts with id/contents.
      encoder: an `Encoder` (anything with `.encode(texts, batch_size)`, `.dim` and `.id`).
      backend: 'scann' or 'exact'.
      batch_size: encoder batch size.
      **index_params: passed to the index (see `ScannIndex`).
    """
    if backend not in index_lib.BACKENDS:
      raise ValueError(f"unknown backend {backend!r}; expected one of {sorted(index_lib.BACKENDS)}")
    records = [as_record(x, i) for i, x in enumerate(corpus)]
    if not records:
      raise ValueError("Retriever.build: the corpus is empty")
    emb = encoder.encode([passage_text(r.title, r.text) for r in records], batch_size=batch_size)
    emb = np.ascontiguousarray(emb, dtype=np.float32)
    idx = index_lib.build_index(backend, emb, **index_params)
    return cls(records, emb, idx, encoder=encoder)

  @classmethod
  def from_embeddings(cls, corpus: Iterable, embeddings, backend: str = "scann", *, encoder=None,
                      encoder_id: str = "", **index_params) -> "Retriever":
    """Indexes precomputed passage embeddings [N, d] (row i = corpus[i])."""
    records = [as_record(x, i) for i, x in enumerate(corpus)]
    emb = np.ascontiguousarray(embeddings, dtype=np.float32)
    return cls(records, emb, index_lib.build_index(backend, emb, **index_params), encoder=encoder,
               encoder_id=encoder_id)

  # ---------------------------------------------------------------- search
  def search(self, queries: Sequence[str], k: int = 5, exclude=None, *,
             batch_size: int = 64) -> list:
    """Text queries -> per query a list of k `Hit`s, best first."""
    if self.encoder is None:
      raise ValueError("this Retriever has no encoder; pass encoder= to Retriever.load, or use "
                       "search_embeddings")
    if isinstance(queries, str):
      raise TypeError("search expects a list of query strings, got one str; wrap it in a list")
    q = self.encoder.encode(list(queries), batch_size=batch_size)
    return self.search_embeddings(q, k, exclude)

  def search_embeddings(self, q_emb, k: int = 5, exclude=None, **search_kw) -> list:
    """Query embeddings [Q, d] -> per query a list of min(k, N - excluded) `Hit`s, best first.

    `exclude`: None, or one collection of passage ids per query; those passages are skipped and
    the search goes deeper so that k others still come back. If ScaNN finds too few candidates
    in the leaves it searched, that query is answered by exact search over the embeddings.
    `search_kw` go to the index (e.g. ScaNN's leaves_to_search).
    """
    if k < 0:
      raise ValueError(f"k must be >= 0, got {k}")
    q = np.asarray(q_emb, dtype=np.float32)
    if q.ndim == 1:
      q = q[None]
    if q.ndim != 2 or q.shape[1] != self.dim:
      raise ValueError(f"query embeddings: expected shape [Q, {self.dim}], found {q.shape}")
    nq, n = q.shape[0], len(self.records)
    if exclude is None:
      excl = [frozenset()] * nq
    else:
      if isinstance(exclude, (str, bytes)) or len(exclude) != nq:
        raise ValueError(f"exclude: expected one collection of ids per query ({nq}), found "
                         f"{exclude!r:.80}")
      excl = [frozenset() if e is None else frozenset(str(i) for i in
                                                        ([e] if isinstance(e, str) else e))
              for e in exclude]
    # rows to skip per query (ids not in the corpus cannot come back, so they cost nothing)
    skip = [{self._row[i] for i in e if i in self._row} for e in excl]
    want = [min(k, n - len(s)) for s in skip]
    # k + |excluded| candidates always leave k after filtering, unless the index ran out of
    # candidates (ScaNN: the searched leaves hold too few points); such queries go exact.
    depth = min(n, k + max((len(s) for s in skip), default=0))
    scores, ids = self.index.search(q, depth, **search_kw)
    results = []
    for qi in range(nq):
      hits = [(int(j), float(s)) for j, s in zip(ids[qi], scores[qi])
              if j >= 0 and int(j) not in skip[qi]][:want[qi]]
      if len(hits) < want[qi]:
        hits = self._exact_one(q[qi], want[qi], skip[qi])
      results.append(hits)
    return [[self._hit(j, s) for j, s in hits] for hits in results]

  def _exact_one(self, q: np.ndarray, k: int, skip: set) -> list:
    scores = np.asarray(self.embeddings @ q, np.float32)   # [N]
    if skip:
      scores[list(skip)] = -np.inf
    top = np.argsort(-scores, kind="stable")[:k]
    return [(int(j), float(scores[j])) for j in top]

  def _hit(self, row: int, score: float) -> Hit:
    r = self.records[row]
    return Hit(id=r.id, score=score, title=r.title, text=r.text)

  # ---------------------------------------------------------------- persistence
  def save(self, folder: str | os.PathLike) -> pathlib.Path:
    """Writes manifest, corpus, embeddings and index files into `folder`."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if (folder / MANIFEST).exists():   # overwriting: the old manifest must not vouch for new files
      (folder / MANIFEST).unlink()
    with open(folder / CORPUS, "w", encoding="utf-8") as f:
      for r in self.records:
        f.write(json.dumps(r.to_dict(), ensure_ascii=False) + "\n")
    np.save(folder / EMBEDDINGS, np.ascontiguousarray(self.embeddings, dtype=np.float32))
    index_params = self.index.save(folder, EMBEDDINGS)
    files = [CORPUS, EMBEDDINGS]
    sub = folder / index_lib.ScannIndex.SUBDIR
    if self.backend == "scann":
      files += sorted(f"{sub.name}/{p.name}" for p in sub.iterdir() if p.is_file())
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "backend": self.backend,
        "index_mode": self.index.mode,
        "n": len(self.records),
        "d": self.dim,
        "encoder": self.encoder_id,
        "passage_format": "title\\ntext",
        "index_params": index_params,
        "files": {name: _sha256(folder / name) for name in files},
    }
    # The manifest appears last and whole: a half-written save has none.
    write_atomic(folder / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
    return folder

  @classmethod
  def load(cls, folder: str | os.PathLike, encoder=None, *,
           check_encoder: bool = True) -> "Retriever":
    """Loads a folder written by `save`; verifies versions, shapes and checksums.

    Args:
      folder: the saved retriever.
      encoder: an Encoder for text queries (None: search_embeddings only).
      check_encoder: refuse an encoder whose id differs from the one that built the index.
    """
    folder = pathlib.Path(folder)
    mpath = folder / MANIFEST
    if not mpath.is_file():
      raise RetrieverFormatError(f"{mpath}: missing; not a saved Retriever folder")
    try:
      m = json.loads(mpath.read_text())
    except json.JSONDecodeError as e:
      raise RetrieverFormatError(f"{mpath}:{e.lineno}: not valid JSON ({e.msg})") from None
    if m.get("format") != FORMAT:
      raise RetrieverFormatError(f"{mpath}: field 'format' is {m.get('format')!r}; expected "
                                 f"{FORMAT!r}")
    if m.get("format_version") != FORMAT_VERSION:
      raise RetrieverFormatError(f"{mpath}: field 'format_version' is {m.get('format_version')!r};"
                                 f" this code reads version {FORMAT_VERSION}")
    for key in ("backend", "n", "d", "files", "index_params"):
      if key not in m:
        raise RetrieverFormatError(f"{mpath}: missing field {key!r}")
    if m["backend"] not in index_lib.BACKENDS:
      raise RetrieverFormatError(f"{mpath}: field 'backend' is {m['backend']!r}; expected one of "
                                 f"{sorted(index_lib.BACKENDS)}")
    n, d = int(m["n"]), int(m["d"])
    for name in (CORPUS, EMBEDDINGS):
      if name not in m["files"]:
        raise RetrieverFormatError(f"{mpath}: field 'files' does not list {name!r}")
    for name, digest in m["files"].items():
      p = folder / name
      if not p.is_file():
        raise RetrieverFormatError(f"{p}: missing (listed in {mpath})")
      if _sha256(p) != digest:
        raise RetrieverFormatError(f"{p}: checksum mismatch; the file is corrupt or was changed "
                                   f"after {mpath} was written")
    if encoder is not None:
      if encoder.dim != d:
        raise RetrieverFormatError(
            f"{mpath}: field 'd' is {d} but the encoder {encoder.id!r} produces {encoder.dim}-d "
            "vectors")
      saved = m.get("encoder", "")
      if check_encoder and saved and _fp(saved) != _fp(encoder.id):
        raise RetrieverFormatError(
            f"{mpath}: field 'encoder' is {saved!r} but the given encoder is {encoder.id!r}; "
            "queries would be embedded in a different space (check_encoder=False to override)")
    epath = folder / EMBEDDINGS
    try:
      emb = np.load(epath, mmap_mode="r", allow_pickle=False)
    except ValueError as e:
      raise RetrieverFormatError(f"{epath}: not a readable .npy array ({e})") from None
    if emb.dtype != np.float32 or emb.shape != (n, d):
      raise RetrieverFormatError(f"{epath}: expected float32 [{n}, {d}] per {mpath}, found "
                                 f"{emb.dtype} {list(emb.shape)}")
    records = []
    cpath = folder / CORPUS
    with open(cpath, encoding="utf-8") as f:
      for lineno, line in enumerate(f, 1):
        try:
          records.append(as_record(json.loads(line), lineno - 1))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
          raise RetrieverFormatError(f"{cpath}:{lineno}: bad corpus record ({e})") from None
    if len(records) != n:
      raise RetrieverFormatError(f"{cpath}: {len(records)} records; {mpath} field 'n' says {n}")
    emb = np.ascontiguousarray(emb)
    try:
      idx = index_lib.load_index(m["backend"], folder, emb, m["index_params"])
    except (FileNotFoundError, ValueError) as e:
      raise RetrieverFormatError(str(e)) from None
    return cls(records, emb, idx, encoder=encoder, encoder_id=m.get("encoder", ""))


def _fp(encoder_id: str) -> str:
  """The content fingerprint part of an encoder id ('name@fingerprint')."""
  return encoder_id.rsplit("@", 1)[-1]
