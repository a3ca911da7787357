"""Builds a retrieval index folder from a corpus: a passage store, float16 embedding shards, an
index, and a manifest. Sharded, resumable, data-parallel over devices and processes.

  python -m rlrag_jax.retrieval.build --corpus wiki-18.jsonl --out indexes/wiki18_e5 \\
      --encoder /models/e5-base-v2 [--backend scann|exact] [--shard-size 65536] \\
      [--pooling mean|cls] [--query-prefix 'query: '] [--passage-prefix 'passage: '] \\
      [--skip-invalid] [--plan]
  python -m rlrag_jax.retrieval.build --corpus wiki-18.jsonl --out DIR --from-faiss e5_Flat.index
  python -m rlrag_jax.retrieval.build --corpus wiki-18.jsonl --out DIR --from-embeddings NPY_DIR

The folder (`index_dir.py` reads it):

  manifest.json        written last: corpus (sha256, n, layout), encoder (id, pooling,
                       normalisation, prefixes), d, embedding dtype, backend, index mode and params
  build.json           the settings this build started with; a resumed build must match them
  store/               the passage store (`store.py`)
  shards/emb-NNNNN.npy float16 [<= shard_size, d] each, written whole (temporary name, then
                       rename): a shard file that exists is complete
  embeddings.npy       float16 [N, d], assembled from the shards once all exist
  scann/               ScaNN's searcher (backend scann); its reorder data is bfloat16 by default

Resuming: the same command after a kill (SIGKILL included) keeps the store and every complete
shard, encodes the rest, and ends with the index an uninterrupted build gives (a shard's vectors
depend on its rows alone).

Processes: under `jax.distributed` (`--coordinator`, `--num-processes`, `--process-id`, or
`--distributed-auto` on a TPU pod / SLURM) process p encodes shards p, p + P, ...; process 0
writes the store first (the others wait for it) and builds the index once every shard file is
there. The folder must be on a file system all processes share. Within a process the encoder is
one jitted function over a mesh of the local devices (batch rows sharded over 'data').

Memory: the text stays on disk (the store is memory-mapped), embeddings go to disk shard by shard,
and the float32 copy ScaNN trains on is a file-backed memory map. `--plan` prints the bytes before
any work.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
import shutil
import sys
import time
from typing import Optional

import numpy as np

from rlrag_jax.retrieval import store as store_lib
# The pieces the planning and import tools (retrieval.plan, retrieval.imports) share with the
# build, below all three (re-exported: build.encode_sharded, build.EMBEDDINGS, ...).
from rlrag_jax.retrieval.build_parts import (  # noqa: F401
    EMBEDDING_DTYPES, EMBEDDINGS, SCANN_BUILD_FACTOR, TOKENIZE_ROWS, encode_sharded,
    encoder_conventions, load_encoder, local_mesh, scann_params, scann_slices)
from rlrag_jax.runlog import write_atomic

log = logging.getLogger("rlrag_jax.retrieval")

FORMAT = "rlrag_jax.index"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
BUILD = "build.json"
STORE = "store"
SHARDS = "shards"
SCANN = "scann"
REORDER_DTYPES = ("float32", "bfloat16", "int8")


class BuildError(ValueError):
  """A build that cannot start or continue: the message names the flag, file or field."""


@dataclasses.dataclass(frozen=True)
class BuildSettings:
  """What decides the index's content; a resumed build must have the same."""
  corpus_sha256: str
  n: int
  d: int
  encoder: str                 # Encoder.id, or 'faiss:<file>' / 'embeddings:<dir>' (imported)
  conventions: dict            # pooling, normalize, query_prefix, passage_prefix, max_length
  shard_size: int
  embedding_dtype: str
  compute_dtype: str
  batch_size: int


def shard_path(out: pathlib.Path, s: int) -> pathlib.Path:
  return out / SHARDS / f"emb-{s:05d}.npy"


def num_shards(n: int, shard_size: int) -> int:
  return (n + shard_size - 1) // shard_size


# Fault injection for the resume test: the build SIGKILLs itself after writing this shard's
# temporary file, before renaming it (the worst moment: a whole file under the wrong name).
SIGKILL_AT_SHARD_ENV = "RLRAG_BUILD_SIGKILL_AT_SHARD"


def save_npy_atomic(path: pathlib.Path, array: np.ndarray, kill_before_rename: bool = False):
  """np.save to a temporary name in the same folder, then rename: the file exists whole or not."""
  tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
  with open(tmp, "wb") as f:
    np.save(f, array)
    f.flush()
    os.fsync(f.fileno())
  if kill_before_rename:
    import signal  # pylint: disable=g-import-not-at-top
    os.kill(os.getpid(), signal.SIGKILL)
  os.replace(tmp, path)


# ------------------------------------------------------------------------------ encoding


def shard_texts(store, start: int, stop: int, prefix: str) -> list:
  from rlrag_jax.retrieval.retriever import passage_text  # pylint: disable=g-import-not-at-top
  return [prefix + passage_text(r.title, r.text) for r in store.records(start, stop)]


def encode_shards(out: pathlib.Path, store, encoder, settings: BuildSettings, *,
                  process_index: int = 0, process_count: int = 1, progress: bool = True,
                  stop_after: Optional[int] = None) -> int:
  """Encodes this process's missing shards; returns how many it encoded.

  `stop_after`: encode at most that many shards, then return (tests, and a bounded run).
  """
  mesh = local_mesh()
  prefix = settings.conventions.get("passage_prefix", "")
  dtype = EMBEDDING_DTYPES[settings.embedding_dtype]
  total = num_shards(settings.n, settings.shard_size)
  mine = [s for s in range(total) if s % process_count == process_index]
  todo = [s for s in mine if not shard_path(out, s).is_file()]
  (out / SHARDS).mkdir(exist_ok=True)
  done_rows = sum(min(settings.shard_size, settings.n - s * settings.shard_size)
                  for s in mine if s not in todo)
  bar = None
  if progress:
    from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top
    bar = tqdm(total=sum(min(settings.shard_size, settings.n - s * settings.shard_size)
                         for s in mine), initial=done_rows, unit=" passages", unit_scale=True,
               desc=f"encode (process {process_index}/{process_count})", smoothing=0.05)
  if todo and done_rows:
    log.info("resuming: %d of this process's %d shards are complete", len(mine) - len(todo),
             len(mine))
  count = 0
  for s in todo:
    if stop_after is not None and count >= stop_after:
      break
    start = s * settings.shard_size
    stop = min(settings.n, start + settings.shard_size)
    emb = encode_sharded(encoder, shard_texts(store, start, stop, prefix), settings.batch_size,
                         mesh)
    save_npy_atomic(shard_path(out, s), emb.astype(dtype),
                    kill_before_rename=os.environ.get(SIGKILL_AT_SHARD_ENV) == str(s))
    count += 1
    if bar is not None:
      bar.update(stop - start)
  if bar is not None:
    bar.close()
  return count


def wait_for(paths, what: str, timeout_s: float, poll_s: float = 2.0) -> None:
  """Waits until every path exists (another process writes them); a bounded wait."""
  deadline = time.monotonic() + timeout_s
  missing = [p for p in paths if not pathlib.Path(p).exists()]
  while missing:
    if time.monotonic() > deadline:
      raise BuildError(f"waited {timeout_s:.0f} s for {what}; still missing {missing[0]} "
                       f"({len(missing)} in all). Is every process running on a shared folder?")
    time.sleep(poll_s)
    missing = [p for p in missing if not pathlib.Path(p).exists()]


# ------------------------------------------------------------------------------ assembly
def assemble_embeddings(out: pathlib.Path, settings: BuildSettings) -> np.ndarray:
  """Shards -> one [N, d] memory-mapped file (written through the page cache, not held)."""
  dtype = EMBEDDING_DTYPES[settings.embedding_dtype]
  path = out / EMBEDDINGS
  tmp = out / f".{EMBEDDINGS}.tmp"
  mm = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=(settings.n, settings.d))
  for s in range(num_shards(settings.n, settings.shard_size)):
    start = s * settings.shard_size
    stop = min(settings.n, start + settings.shard_size)
    part = np.load(shard_path(out, s), mmap_mode="r")
    if part.shape != (stop - start, settings.d) or part.dtype != dtype:
      raise BuildError(f"{shard_path(out, s)}: expected {np.dtype(dtype).name} "
                       f"[{stop - start}, {settings.d}], found {part.dtype} {list(part.shape)}")
    mm[start:stop] = part
  mm.flush()
  del mm
  os.replace(tmp, path)
  return np.load(path, mmap_mode="r")


def build_index(out: pathlib.Path, backend: str, embeddings: np.ndarray, params: dict):
  """The index over `embeddings` (a float16 memory map): ScaNN in `scann_slices` row slices, each
  widened to float32 in a file-backed map of its own (ScaNN takes float32)."""
  from rlrag_jax.retrieval import index as index_lib  # pylint: disable=g-import-not-at-top
  if backend == "exact":
    return index_lib.ExactIndex(embeddings)
  params = dict(params)
  slices = int(params.pop("slices", 0) or scann_slices(*embeddings.shape))
  return index_lib.ScannSlices.build(embeddings, slices, folder=out, **params)


# ------------------------------------------------------------------------------ the run
def _settings_from(store, args, d: int, encoder_id: str, conventions: dict):
  return BuildSettings(corpus_sha256=store.fingerprint, n=len(store), d=d, encoder=encoder_id,
                       conventions=conventions, shard_size=int(args.shard_size),
                       embedding_dtype=args.embedding_dtype, compute_dtype=args.dtype,
                       batch_size=int(args.batch_size))


def check_or_write_settings(out: pathlib.Path, settings: BuildSettings) -> None:
  """A new build records its settings; a resumed one must match them field for field."""
  path = out / BUILD
  mine = dataclasses.asdict(settings)
  if path.is_file():
    old = json.loads(path.read_text())
    for key, value in mine.items():
      if old.get(key) != value:
        raise BuildError(f"{path}: field {key!r} is {old.get(key)!r} but this build has "
                         f"{value!r}; {out} was started with other settings (use another --out, "
                         "or --restart to start over)")
    return
  write_atomic(path, json.dumps(mine, indent=1, sort_keys=True))


def _distributed(args) -> tuple:
  """(process_index, process_count) after jax.distributed when asked."""
  import jax  # pylint: disable=g-import-not-at-top
  from rlrag_jax.models import sharding  # pylint: disable=g-import-not-at-top
  sharding.maybe_initialize_distributed(args.coordinator, args.num_processes, args.process_id,
                                        auto=args.distributed_auto)
  return jax.process_index(), jax.process_count()


def run(args) -> Optional[pathlib.Path]:
  """The whole build (see the module docstring); returns the index folder (process 0)."""
  from rlrag_jax.retrieval import imports  # pylint: disable=g-import-not-at-top
  from rlrag_jax.retrieval.retriever import Retriever  # pylint: disable=g-import-not-at-top
  out = pathlib.Path(args.out).expanduser()
  if args.restart and out.exists():
    shutil.rmtree(out)
  out.mkdir(parents=True, exist_ok=True)
  pid, nproc = _distributed(args)
  imported = imports.source(args)
  if (imported is not None and pid == 0 and not args.skip_invalid and
      not (out / STORE / store_lib.MANIFEST).is_file()):
    from rlrag_jax.retrieval import plan  # pylint: disable=g-import-not-at-top
    imports.check(imported, args, plan.count_rows(args.corpus))   # fail before the store pass
  if pid == 0:
    store = store_lib.open_or_write(args.corpus, out / STORE, skip_invalid=args.skip_invalid,
                                    progress=not args.quiet)
    if store.manifest.get("skipped"):
      log.warning("%s: skipped %d malformed rows (--skip-invalid); first: %s", args.corpus,
                  store.manifest["skipped"], store.manifest["first_skipped"][:1])
  else:
    wait_for([out / STORE / store_lib.MANIFEST], "process 0's passage store", args.wait_s)
    store = store_lib.PassageStore(out / STORE)
  if imported is not None:
    if pid != 0:
      return None
    embeddings, encoder, encoder_id, conventions = imports.load(imported, store, out, args)
    settings = _settings_from(store, args, embeddings.shape[1], encoder_id, conventions)
  else:
    encoder = load_encoder(args)
    settings = _settings_from(store, args, encoder.dim, encoder.id,
                              encoder_conventions(encoder))
    if pid == 0:
      check_or_write_settings(out, settings)
    else:
      wait_for([out / BUILD], "process 0's build.json", args.wait_s)
      check_or_write_settings(out, settings)
    encode_shards(out, store, encoder, settings, process_index=pid, process_count=nproc,
                  progress=not args.quiet, stop_after=args.stop_after_shards)
    if args.stop_after_shards is not None:
      return None
    if pid != 0:
      return None
    wait_for([shard_path(out, s) for s in range(num_shards(settings.n, settings.shard_size))],
             "every process's shards", args.wait_s)
    embeddings = assemble_embeddings(out, settings)
  params = {}
  if args.backend == "scann":
    params = scann_params(settings.n, settings.d, args.reorder_dtype,
                          num_leaves=args.num_leaves, num_leaves_to_search=args.leaves_to_search,
                          reorder_k=args.reorder_k, slices=args.scann_slices or None)
  t = time.time()
  index = build_index(out, args.backend, embeddings, params)
  log.info("%s index built in %.1f s: %s", args.backend, time.time() - t, index.describe())
  retriever = Retriever(store, embeddings, index, encoder_id=settings.encoder,
                        conventions=settings.conventions)
  retriever.save(out, extra={"build": dataclasses.asdict(settings),
                             "index_description": index.describe()})
  if not args.keep_shards and (out / SHARDS).exists():
    shutil.rmtree(out / SHARDS)
  print(f"index: {out} ({settings.n} passages, d={settings.d}, {index.describe()})")
  return out


def parser():
  import argparse  # pylint: disable=g-import-not-at-top
  p = argparse.ArgumentParser(
      prog="python -m rlrag_jax.retrieval.build",
      description="Build a retrieval index folder (passage store, float16 embeddings, ScaNN or "
                  "exact index, manifest) from a corpus; resumable, sharded over devices and "
                  "processes.")
  p.add_argument("--corpus", required=True,
                 help="FlashRAG/Search-R1 {id, contents} JSONL, {title, text} JSONL, DPR TSV "
                      "(id, text, title with a header), or a name in loaders.CORPORA")
  p.add_argument("--out", required=True, help="the index folder (created; resumed if present)")
  p.add_argument("--encoder", default="", help="a BERT-family HF folder ('' = packaged MiniLM)")
  p.add_argument("--backend", choices=("scann", "exact"), default="scann")
  p.add_argument("--shard-size", type=int, default=65536, help="passages a shard")
  p.add_argument("--batch-size", type=int, default=256, help="encoder rows a call")
  p.add_argument("--pooling", choices=("mean", "cls"), default=None,
                 help="default: the encoder folder's (sentence-transformers files, E5/BGE name)")
  p.add_argument("--normalize", choices=("true", "false"), default=None)
  p.add_argument("--query-prefix", default=None, help="default: the encoder's ('query: ' for E5)")
  p.add_argument("--passage-prefix", default=None,
                 help="default: the encoder's ('passage: ' for E5)")
  p.add_argument("--max-length", type=int, default=None, help="encoder token limit")
  p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                 help="encoder compute dtype")
  p.add_argument("--embedding-dtype", choices=sorted(EMBEDDING_DTYPES), default="float16")
  p.add_argument("--reorder-dtype", choices=REORDER_DTYPES, default="bfloat16",
                 help="ScaNN's exact-reorder vectors")
  p.add_argument("--num-leaves", type=int, default=None)
  p.add_argument("--leaves-to-search", type=int, default=None)
  p.add_argument("--reorder-k", type=int, default=None)
  p.add_argument("--scann-slices", type=int, default=0,
                 help="row slices ScaNN is built over (0: from N, to bound the build's memory)")
  p.add_argument("--skip-invalid", action="store_true",
                 help="skip malformed corpus rows (counted in the store's manifest)")
  p.add_argument("--from-faiss", default=None,
                 help="a FAISS flat inner-product index (Search-R1's e5_Flat.index): its vectors "
                      "are the embeddings, nothing is encoded")
  p.add_argument("--from-embeddings", default=None,
                 help="a folder of .npy [rows, d] shards in corpus order (sorted by name)")
  p.add_argument("--plan", action="store_true", help="print sizes, memory and time; build nothing")
  p.add_argument("--plan-sample", type=int, default=256, help="passages timed for --plan")
  p.add_argument("--keep-shards", action="store_true")
  p.add_argument("--restart", action="store_true", help="delete --out first")
  p.add_argument("--quiet", action="store_true", help="no progress bars")
  p.add_argument("--coordinator", default=None, help="jax.distributed coordinator host:port")
  p.add_argument("--num-processes", type=int, default=None)
  p.add_argument("--process-id", type=int, default=None)
  p.add_argument("--distributed-auto", action="store_true",
                 help="jax.distributed.initialize() with JAX's cluster detection")
  p.add_argument("--wait-s", type=float, default=24 * 3600,
                 help="how long a process waits for the others' files")
  p.add_argument("--stop-after-shards", type=int, default=None, help=argparse.SUPPRESS)
  return p


def main(argv=None) -> int:
  from rlrag_jax import runlog  # pylint: disable=g-import-not-at-top
  args = parser().parse_args(argv)
  runlog.cli_logging()
  if args.from_faiss and args.from_embeddings:
    print("build: give --from-faiss or --from-embeddings, not both", file=sys.stderr)
    return 2
  try:
    if args.plan:
      from rlrag_jax.retrieval import plan  # pylint: disable=g-import-not-at-top
      print(plan.report(args))
      return 0
    run(args)
  except (BuildError, store_lib.StoreError, ValueError, FileNotFoundError) as e:
    print(f"build: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
