"""A passage retriever: passages + embeddings + an index (+ the encoder for text queries).

Passages are encoded as `passage_text(title, text)` = "title\\ntext" (just `text` when the title
is empty), the layout DPR-style corpora store (FlashRAG's `contents` is '"Title"\\ntext'), after
the encoder's passage prefix (E5's 'passage: '); queries get its query prefix.

The passages are a list of `CorpusRecord`s (a small corpus, built in a run) or a memory-mapped
`PassageStore` (an index folder built by `python -m rlrag_jax.retrieval.build`, any size).

On disk (`save` / `load`), one folder; `build.py` writes the same layout in shards:
  manifest.json     format 'rlrag_jax.index', format_version, backend, index_mode ('exact' |
                    'brute_force' | 'partitioned': what ScaNN really ran), n, d, the encoder's id
                    and conventions (pooling, normalisation, prefixes), the embedding dtype,
                    index params, the corpus's sha256, and a digest of every file below
  store/            the passage store (row i = embedding i)
  embeddings.npy    [N, d] float32 (built in a run) or float16 (built by the CLI), unit rows
  scann/            ScaNN's serialised searcher (backend 'scann' only)
Files up to `FULL_HASH_BYTES` are checked by sha256, larger ones by size and a sha256 of sampled
blocks (a full hash of a 32 GB file would cost a minute at every load). Anything missing,
corrupt or mismatched (version, n, d, the encoder's dimension or conventions) is refused with an
error naming the file and field.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from rlrag_jax.data.schema import CorpusRecord, Triple
from rlrag_jax.runlog import write_atomic
from rlrag_jax.retrieval import index as index_lib
from rlrag_jax.retrieval import store as store_lib

FORMAT = "rlrag_jax.index"
FORMAT_VERSION = 2
MANIFEST = "manifest.json"
STORE = "store"
EMBEDDINGS = "embeddings.npy"
FULL_HASH_BYTES = 1 << 30
# The conventions a query encoder must share with the index (max_length may differ).
MATCHING_CONVENTIONS = ("pooling", "normalize", "query_prefix", "passage_prefix")


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


def file_digest(path: pathlib.Path) -> str:
  """'sha256:<hex>' of the whole file up to FULL_HASH_BYTES; above, 'sampled:<hex>' over the
  size, the first and last 16 MiB and 64 evenly spaced 1 MiB blocks."""
  size = path.stat().st_size
  if size <= FULL_HASH_BYTES:
    return "sha256:" + _sha256(path)
  h = hashlib.sha256(str(size).encode())
  with open(path, "rb") as f:
    spots = [0, size - (16 << 20)] + [int(size * i / 65) for i in range(1, 65)]
    for at in spots:
      f.seek(at)
      h.update(f.read(16 << 20 if at in (0, size - (16 << 20)) else 1 << 20))
  return "sampled:" + h.hexdigest()


def encode_queries(encoder, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
  """The encoder's query embeddings (its query prefix applied)."""
  return encoder.encode_queries(list(texts), batch_size=batch_size)


def encode_passages(encoder, records: Sequence[CorpusRecord], batch_size: int = 64) -> np.ndarray:
  """The encoder's passage embeddings of records (its passage prefix applied)."""
  return encoder.encode_passages([passage_text(r.title, r.text) for r in records],
                                 batch_size=batch_size)


class _Passages:
  """A list of records with an id -> row map (the small-corpus form of a PassageStore)."""

  def __init__(self, records: Sequence[CorpusRecord]):
    self.records = list(records)
    self._row = {r.id: i for i, r in enumerate(self.records)}
    if len(self._row) != len(self.records):
      seen, dup = set(), None
      for r in self.records:
        if r.id in seen:
          dup = r.id
          break
        seen.add(r.id)
      raise ValueError(f"corpus ids must be unique; id {dup!r} appears more than once")

  def __len__(self) -> int:
    return len(self.records)

  def __getitem__(self, row: int) -> CorpusRecord:
    return self.records[row]

  def __iter__(self):
    return iter(self.records)

  def row_of(self, rid: str) -> Optional[int]:
    return self._row.get(str(rid))


class Retriever:
  """Top-k passages for text queries (needs an encoder) or for query embeddings."""

  FORMAT_VERSION = FORMAT_VERSION

  def __init__(self, records, embeddings: np.ndarray, index, encoder=None, encoder_id: str = "",
               conventions: Optional[dict] = None):
    self.passages = records if isinstance(records, store_lib.PassageStore) else _Passages(records)
    self.embeddings = embeddings          # [N, d] float32, or float16 memory-mapped
    self.index = index
    self.encoder = encoder
    self.encoder_id = encoder_id or (encoder.id if encoder is not None else "")
    if conventions is None and encoder is not None and hasattr(encoder, "conventions"):
      conventions = encoder.conventions()
    self.conventions = dict(conventions or {})
    if embeddings.shape[0] != len(self.passages):
      raise ValueError(f"{len(self.passages)} corpus records but {embeddings.shape[0]} "
                       "embeddings")

  @property
  def records(self):
    """The passages: a list (small corpus) or a `PassageStore`; both index by row."""
    p = self.passages
    return p.records if isinstance(p, _Passages) else p

  def record_of(self, rid: str) -> Optional[CorpusRecord]:
    """The passage with id `rid`, or None."""
    row = self.passages.row_of(rid)
    return None if row is None else self.passages[row]

  def __len__(self) -> int:
    return len(self.passages)

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
    """Encodes `corpus` (the encoder's passage prefix + "title\\ntext") and indexes it.

    Args:
      corpus: CorpusRecords, dicts with id/title/text, or FlashRAG dicts with id/contents.
      encoder: an `Encoder` (anything with `.encode_passages(texts, batch_size)`, `.dim`, `.id`).
      backend: 'scann' or 'exact'.
      batch_size: encoder batch size.
      **index_params: passed to the index (see `ScannIndex`).
    """
    if backend not in index_lib.BACKENDS:
      raise ValueError(f"unknown backend {backend!r}; expected one of {sorted(index_lib.BACKENDS)}")
    records = [as_record(x, i) for i, x in enumerate(corpus)]
    if not records:
      raise ValueError("Retriever.build: the corpus is empty")
    emb = np.ascontiguousarray(encode_passages(encoder, records, batch_size), dtype=np.float32)
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
    q = encode_queries(self.encoder, queries, batch_size)
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
    nq, n = q.shape[0], len(self.passages)
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
    skip = [{r for r in map(self.passages.row_of, e) if r is not None} for e in excl]
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
    n, step = len(self.passages), 1 << 18     # blocks: a float16 map is widened piece by piece
    scores = np.concatenate([np.asarray(self.embeddings[i:i + step], np.float32) @ q
                             for i in range(0, n, step)])   # [N]
    if skip:
      scores[list(skip)] = -np.inf
    top = np.argsort(-scores, kind="stable")[:k]
    return [(int(j), float(scores[j])) for j in top]

  def _hit(self, row: int, score: float) -> Hit:
    r = self.passages[row]
    return Hit(id=r.id, score=score, title=r.title, text=r.text)

  # ---------------------------------------------------------------- persistence
  def save(self, folder: str | os.PathLike, *, extra: Optional[dict] = None) -> pathlib.Path:
    """Writes store, embeddings, index files and (last) the manifest into `folder`.

    A store or embeddings file already in `folder` (a CLI build's memory maps) is kept, not
    rewritten. `extra`: more manifest fields (the build's corpus and settings).
    """
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if (folder / MANIFEST).exists():   # overwriting: the old manifest must not vouch for new files
      (folder / MANIFEST).unlink()
    store = self.passages
    if not (isinstance(store, store_lib.PassageStore) and
            store.folder.resolve() == (folder / STORE).resolve()):
      store = store_lib.write_records(self.passages, folder / STORE)
    emb_file = getattr(self.embeddings, "filename", None)
    if not (emb_file and pathlib.Path(emb_file).resolve() == (folder / EMBEDDINGS).resolve()):
      tmp = folder / f".{EMBEDDINGS}.tmp"
      with open(tmp, "wb") as f:    # (a path np.save would give a '.npy' suffix of its own)
        np.save(f, np.ascontiguousarray(self.embeddings))
      os.replace(tmp, folder / EMBEDDINGS)
    index_params = self.index.save(folder, EMBEDDINGS)
    files = [f"{STORE}/{name}" for name in sorted(os.listdir(folder / STORE))] + [EMBEDDINGS]
    sub = folder / index_lib.ScannIndex.SUBDIR
    if self.backend == "scann":
      files += sorted(str(p.relative_to(folder)) for p in sub.rglob("*") if p.is_file())
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "backend": self.backend,
        "index_mode": self.index.mode,
        "n": len(self.passages),
        "d": self.dim,
        "embedding_dtype": np.dtype(self.embeddings.dtype).name,
        "encoder": self.encoder_id,
        "conventions": self.conventions,
        "corpus": {"sha256": store.fingerprint, "content_sha256": store.manifest.get(
            "content_sha256"), "source": store.manifest["source"].get("path")},
        "passage_format": "title\\ntext",
        "index_params": index_params,
        "files": {name: file_digest(folder / name) for name in files},
        **(extra or {}),
    }
    # The manifest appears last and whole: a half-written save has none.
    write_atomic(folder / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
    return folder

  @staticmethod
  def read_manifest(folder: str | os.PathLike) -> dict:
    """The manifest of an index folder, its format and required fields checked."""
    mpath = pathlib.Path(folder) / MANIFEST
    if not mpath.is_file():
      raise RetrieverFormatError(f"{mpath}: missing; not an index folder (build one with "
                                 "`python -m rlrag_jax.retrieval.build`)")
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
    for key in ("backend", "n", "d", "files", "index_params", "embedding_dtype"):
      if key not in m:
        raise RetrieverFormatError(f"{mpath}: missing field {key!r}")
    if m["backend"] not in index_lib.BACKENDS:
      raise RetrieverFormatError(f"{mpath}: field 'backend' is {m['backend']!r}; expected one of "
                                 f"{sorted(index_lib.BACKENDS)}")
    return m

  @staticmethod
  def check_encoder(m: dict, encoder, where: str, *, check_ids: bool = True) -> None:
    """Refuses a query encoder of another dimension, model or convention than the index's."""
    if encoder.dim != int(m["d"]):
      raise RetrieverFormatError(
          f"{where}: field 'd' is {m['d']} but the encoder {encoder.id!r} produces "
          f"{encoder.dim}-d vectors")
    saved = m.get("encoder", "")
    if check_ids and saved and _fp(saved) != _fp(encoder.id):
      raise RetrieverFormatError(
          f"{where}: field 'encoder' is {saved!r} but the given encoder is {encoder.id!r}; "
          "queries would be embedded in a different space (check_encoder=False to override)")
    theirs = m.get("conventions") or {}
    ours = encoder.conventions() if hasattr(encoder, "conventions") else {}
    for key in MATCHING_CONVENTIONS:
      if key in theirs and key in ours and theirs[key] != ours[key]:
        raise RetrieverFormatError(
            f"{where}: field 'conventions.{key}' is {theirs[key]!r} but the query encoder's is "
            f"{ours[key]!r}; set the encoder's {key} to match the index (config key "
            f"retrieval.{key}, or the build's --{key.replace('_', '-')})")

  @classmethod
  def load(cls, folder: str | os.PathLike, encoder=None, *, check_encoder: bool = True,
           verify: bool = True) -> "Retriever":
    """Loads an index folder (written by `save` or the build CLI); verifies versions, shapes
    and digests.

    Args:
      folder: the index folder.
      encoder: an Encoder for text queries (None: search_embeddings only).
      check_encoder: refuse an encoder whose id differs from the one that built the index (its
        dimension and conventions are always checked).
      verify: check every file's digest (sampled for large files).
    """
    folder = pathlib.Path(folder)
    mpath = folder / MANIFEST
    m = cls.read_manifest(folder)
    n, d = int(m["n"]), int(m["d"])
    for name in (f"{STORE}/{store_lib.MANIFEST}", EMBEDDINGS):
      if name not in m["files"]:
        raise RetrieverFormatError(f"{mpath}: field 'files' does not list {name!r}")
    for name, digest in m["files"].items():
      p = folder / name
      if not p.is_file():
        raise RetrieverFormatError(f"{p}: missing (listed in {mpath})")
      if verify and file_digest(p) != digest:
        raise RetrieverFormatError(f"{p}: checksum mismatch; the file is corrupt or was changed "
                                   f"after {mpath} was written")
    if encoder is not None:
      cls.check_encoder(m, encoder, str(mpath), check_ids=check_encoder)
    epath = folder / EMBEDDINGS
    try:
      emb = np.load(epath, mmap_mode="r", allow_pickle=False)
    except ValueError as e:
      raise RetrieverFormatError(f"{epath}: not a readable .npy array ({e})") from None
    if emb.dtype.name != m["embedding_dtype"] or emb.shape != (n, d):
      raise RetrieverFormatError(f"{epath}: expected {m['embedding_dtype']} [{n}, {d}] per "
                                 f"{mpath}, found {emb.dtype} {list(emb.shape)}")
    try:
      store = store_lib.PassageStore(folder / STORE)
    except (store_lib.StoreError, FileNotFoundError, ValueError) as e:
      raise RetrieverFormatError(str(e)) from None
    if len(store) != n:
      raise RetrieverFormatError(f"{folder / STORE}: {len(store)} passages; {mpath} field 'n' "
                                 f"says {n}")
    if emb.dtype == np.float32 and emb.nbytes <= FULL_HASH_BYTES:
      emb = np.ascontiguousarray(emb)      # small: in memory, as a run built it
    try:
      idx = index_lib.load_index(m["backend"], folder, emb, m["index_params"])
    except (FileNotFoundError, ValueError) as e:
      raise RetrieverFormatError(str(e)) from None
    return cls(store, emb, idx, encoder=encoder, encoder_id=m.get("encoder", ""),
               conventions=m.get("conventions"))


def _fp(encoder_id: str) -> str:
  """The content fingerprint part of an encoder id ('name@fingerprint')."""
  return encoder_id.rsplit("@", 1)[-1]
