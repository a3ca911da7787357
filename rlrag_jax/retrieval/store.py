"""A passage store on disk: random access by row to millions of passages, nothing per passage in
memory.

One streaming pass (`write_store`) reads a corpus in any layout `loaders.iter_corpus` reads
(FlashRAG / Search-R1 `{id, contents}` JSONL, `{title, text}` JSONL, DPR TSV) into a folder:

  store.json      format, format_version, n, the source file (path, bytes, sha256) and its layout,
                  the rows skipped under `skip_invalid`, whether ids are the row numbers
  passages.jsonl  one normalised record a line: {"id", "title", "text"} (row i = line i + 1)
  offsets.npy     int64 [n + 1]: byte offset of each line in passages.jsonl
  id_hash.npy     uint64 [n]: 64-bit hashes of the ids, sorted   (absent when ids are the rows)
  id_row.npy      int64 [n]: the row of each sorted hash           (absent likewise)

`PassageStore(folder)` memory-maps the arrays and the text: opening costs the same at 1k and 21M
passages, a row is one slice and one `json.loads`, and id -> row is a binary search over the
hashes (the id itself is compared, so a hash collision cannot return a wrong row). The store is
written into `<folder>.partial` and renamed when whole: a killed build leaves no store that looks
complete.

Records read back equal `loaders.load_corpus` of the same file, field for field: the store is the
same corpus, not a re-parse with other rules.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
from typing import Iterator, Optional, Sequence

import numpy as np

from rlrag_jax.data import loaders
from rlrag_jax.data.schema import CorpusRecord
from rlrag_jax.runlog import write_atomic

FORMAT = "rlrag_jax.passage_store"
FORMAT_VERSION = 1
MANIFEST = "store.json"
PASSAGES = "passages.jsonl"
OFFSETS = "offsets.npy"
ID_HASH = "id_hash.npy"
ID_ROW = "id_row.npy"


class StoreError(ValueError):
  """A store folder is missing a file, is of another version, or does not match its source."""


def id_hash(rid: str) -> int:
  """A stable 64-bit hash of a passage id (blake2b; the same on every host and run)."""
  return int.from_bytes(hashlib.blake2b(rid.encode("utf-8"), digest_size=8).digest(), "little")


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 24) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(chunk), b""):
      h.update(block)
  return h.hexdigest()


def source_stat(path: pathlib.Path) -> dict:
  st = path.stat()
  return {"path": str(path.resolve()), "bytes": int(st.st_size), "mtime_ns": int(st.st_mtime_ns)}


class _Growing:
  """An int array that grows by doubling (8 bytes a row; no Python object per row)."""

  def __init__(self, dtype, capacity: int = 1 << 16):
    self.a = np.zeros(capacity, dtype)
    self.n = 0

  def append(self, x) -> None:
    if self.n == len(self.a):
      self.a = np.resize(self.a, 2 * len(self.a))
    self.a[self.n] = x
    self.n += 1

  def array(self) -> np.ndarray:
    return self.a[:self.n]


def write_store(corpus: str | os.PathLike, folder: str | os.PathLike, *,
                skip_invalid: bool = False, progress: bool = True) -> "PassageStore":
  """Streams `corpus` (a path, or a name in `loaders.CORPORA`) into a store at `folder`.

  A malformed row raises `loaders.DataError` (file, line, field) unless `skip_invalid`, which
  skips and counts it. A duplicate id is always an error (naming both lines): rows are matched
  to gold passages and to index rows by id.
  """
  src = loaders.corpus_path(corpus)
  report = loaders.LoadReport()
  rows = loaders.iter_corpus(src, skip_invalid, report, with_lines=True)
  source = lambda: {**source_stat(src), "sha256": file_sha256(src),
                    "layout": loaders.corpus_format(src)}
  return _write(rows, folder, src, source, report, progress)


def write_records(records, folder: str | os.PathLike, *, source: str = "records",
                  progress: bool = False) -> "PassageStore":
  """A store of in-memory `CorpusRecord`s (a run's small corpus); its fingerprint is the sha256
  of the records' normalised lines."""
  report = loaders.LoadReport()
  return _write(((i + 1, r) for i, r in enumerate(records)), folder, source,
                lambda: {"path": source, "layout": "records"}, report, progress)


def _write(rows, folder, src, source, report, progress) -> "PassageStore":
  folder = pathlib.Path(folder)
  partial = folder.with_name(folder.name + ".partial")
  if partial.exists():
    shutil.rmtree(partial)
  partial.mkdir(parents=True)
  try:
    return _write_into(partial, rows, folder, src, source, report, progress)
  finally:                       # an error (a malformed row, say) leaves no partial store
    if partial.exists():
      shutil.rmtree(partial)


def _write_into(partial, rows, folder, src, source, report, progress) -> "PassageStore":
  offsets, hashes, lines = _Growing(np.int64), _Growing(np.uint64), _Growing(np.int64)
  offsets.append(0)
  ids_are_rows = True
  bar = None
  if progress:
    from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top
    bar = tqdm(desc=f"store {pathlib.Path(str(src)).name}", unit=" passages", unit_scale=True,
               mininterval=2.0)
  pos, content = 0, hashlib.sha256()
  with open(partial / PASSAGES, "wb") as out:
    for line_no, rec in rows:
      row = offsets.n - 1
      line = json.dumps({"id": rec.id, "title": rec.title, "text": rec.text},
                        ensure_ascii=False).encode("utf-8") + b"\n"
      out.write(line)
      content.update(line)
      pos += len(line)
      offsets.append(pos)
      hashes.append(id_hash(rec.id))
      lines.append(line_no)
      ids_are_rows = ids_are_rows and rec.id == str(row)
      if bar is not None:
        bar.update(1)
  if bar is not None:
    bar.close()
  n = offsets.n - 1
  if n == 0:
    raise StoreError(f"{src}: no passages ({report.num_skipped} malformed rows skipped)")
  np.save(partial / OFFSETS, offsets.array())
  if not ids_are_rows:
    h = hashes.array()
    order = np.argsort(h, kind="stable")
    sorted_h = h[order]
    _check_unique(src, partial, sorted_h, order, lines.array())
    np.save(partial / ID_HASH, sorted_h)
    np.save(partial / ID_ROW, order.astype(np.int64))
  info = source()
  info.setdefault("sha256", content.hexdigest())
  manifest = {
      "format": FORMAT,
      "format_version": FORMAT_VERSION,
      "n": int(n),
      "source": info,
      "content_sha256": content.hexdigest(),
      "skipped": int(report.num_skipped),
      "first_skipped": report.errors[:5],
      "ids_are_rows": bool(ids_are_rows),
      "text_bytes": int(pos),
  }
  write_atomic(partial / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
  if folder.exists():
    shutil.rmtree(folder)
  os.replace(partial, folder)
  return PassageStore(folder)


def _check_unique(src, partial, sorted_h, order, lines) -> None:
  """Equal hashes are compared by id; a real duplicate names both source records."""
  same = np.nonzero(sorted_h[1:] == sorted_h[:-1])[0]
  if not len(same):
    return
  offsets = np.load(partial / OFFSETS)
  with open(partial / PASSAGES, "rb") as f:
    def rid(row):
      f.seek(int(offsets[row]))
      return json.loads(f.readline())["id"]
    for i in same:
      a, b = sorted((int(order[i]), int(order[i + 1])))
      if rid(a) == rid(b):
        raise loaders.DataError(src, int(lines[b]), "id",
                                f"id {rid(a)!r} appears twice, on lines {lines[a]} and {lines[b]}; "
                                "ids must be unique")


class PassageStore:
  """Read-only, memory-mapped access to a store folder written by `write_store`."""

  def __init__(self, folder: str | os.PathLike):
    self.folder = pathlib.Path(folder)
    mpath = self.folder / MANIFEST
    if not mpath.is_file():
      raise StoreError(f"{mpath}: missing; not a passage store (build one with `python -m "
                       "rlrag_jax.retrieval.build`)")
    m = json.loads(mpath.read_text())
    if m.get("format") != FORMAT or m.get("format_version") != FORMAT_VERSION:
      raise StoreError(f"{mpath}: format {m.get('format')!r} version {m.get('format_version')!r};"
                       f" this code reads {FORMAT!r} version {FORMAT_VERSION}")
    self.manifest = m
    self.n = int(m["n"])
    self.offsets = np.load(self.folder / OFFSETS, mmap_mode="r")
    if self.offsets.shape != (self.n + 1,):
      raise StoreError(f"{self.folder / OFFSETS}: shape {self.offsets.shape}; {mpath} says "
                       f"n={self.n}")
    size = (self.folder / PASSAGES).stat().st_size
    if size != int(self.offsets[-1]):
      raise StoreError(f"{self.folder / PASSAGES}: {size} bytes; {OFFSETS} ends at "
                       f"{int(self.offsets[-1])} (truncated or changed)")
    self._blob = np.memmap(self.folder / PASSAGES, np.uint8, mode="r") if size else None
    self.ids_are_rows = bool(m.get("ids_are_rows"))
    if not self.ids_are_rows:
      self._hash = np.load(self.folder / ID_HASH, mmap_mode="r")
      self._row = np.load(self.folder / ID_ROW, mmap_mode="r")

  def __len__(self) -> int:
    return self.n

  @property
  def fingerprint(self) -> str:
    """sha256 of the source corpus file."""
    return self.manifest["source"]["sha256"]

  def _line(self, row: int) -> dict:
    if not 0 <= row < self.n:
      raise IndexError(f"row {row} is outside 0..{self.n - 1} of {self.folder}")
    a, b = int(self.offsets[row]), int(self.offsets[row + 1])
    return json.loads(self._blob[a:b].tobytes())

  def __getitem__(self, row: int) -> CorpusRecord:
    d = self._line(int(row))
    return CorpusRecord(id=d["id"], title=d["title"], text=d["text"])

  def records(self, start: int, stop: int) -> list:
    """Rows start..stop-1 in one contiguous read."""
    stop = min(stop, self.n)
    if start >= stop:
      return []
    a, b = int(self.offsets[start]), int(self.offsets[stop])
    out = []
    for raw in self._blob[a:b].tobytes().splitlines():
      d = json.loads(raw)
      out.append(CorpusRecord(id=d["id"], title=d["title"], text=d["text"]))
    return out

  def __iter__(self) -> Iterator[CorpusRecord]:
    step = 4096
    for start in range(0, self.n, step):
      yield from self.records(start, start + step)

  def row_of(self, rid: str) -> Optional[int]:
    """The row of passage id `rid`, or None."""
    rid = str(rid)
    if self.ids_are_rows:
      if rid.isdigit() and str(int(rid)) == rid and int(rid) < self.n:
        return int(rid)
      return None
    h = np.uint64(id_hash(rid))
    i = int(np.searchsorted(self._hash, h))
    while i < self.n and self._hash[i] == h:
      row = int(self._row[i])
      if self._line(row)["id"] == rid:
        return row
      i += 1
    return None

  def rows_of(self, ids: Sequence[str]) -> list:
    return [self.row_of(i) for i in ids]


def open_or_write(corpus: str | os.PathLike, folder: str | os.PathLike, *,
                  skip_invalid: bool = False, progress: bool = True) -> PassageStore:
  """The store at `folder` when it was built from this very file (path, size, mtime, and the
  sha256 recorded then), else a new one."""
  folder = pathlib.Path(folder)
  src = loaders.corpus_path(corpus)
  if (folder / MANIFEST).is_file():
    try:
      store = PassageStore(folder)
    except (StoreError, FileNotFoundError, ValueError):
      store = None
    if store is not None:
      old, now = store.manifest["source"], source_stat(src)
      if all(old.get(k) == now[k] for k in ("path", "bytes", "mtime_ns")):
        return store
  return write_store(src, folder, skip_invalid=skip_invalid, progress=progress)
