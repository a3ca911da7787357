"""A saved index served over HTTP with Search-R1's retrieval protocol, queries batched across
concurrent requests.

  python -m rlrag_jax.retrieval.serve --index DIR [--host 127.0.0.1] [--port 8000]
      [--max-batch 64] [--max-wait-ms 5] [--max-topk 100] [--max-queries 512] [--encoder PATH]
      [--encode-rows 8] [--topk 3] [--no-warm-up]

`POST /retrieve` takes `{"queries": [str, ...], "topk": int, "return_scores": bool}` (topk
optional, default `--topk` = 3 as Search-R1's server; return_scores optional, default false) and
answers `{"result": [...]}`, one list per query in request order, best first. With
return_scores each entry is `{"document": {"id": str, "contents": str}, "score": float}`;
without, the documents themselves `{"id": str, "contents": str}`. `contents` is
'"Title"\\ntext', the layout of FlashRAG's wiki-18 that Search-R1 serves (the title always
quoted, also when empty, so that a text holding newlines reads back whole). This is the request
and reply of Search-R1's `retrieval_server.py`, so its clients and ours
(`rlrag_jax.retrieval.client.RemoteRetriever`) talk to either server.

`GET /health` answers `{"status": "ok", "n", "encoder", "backend", "manifest": {...}}`.

Dynamic batching: each request's queries join one queue; a single worker takes the first
request waiting, then more, until `--max-batch` queries are gathered or `--max-wait-ms` passed
since it took the first, and serves them all with ONE encoder call and ONE index search (at the
largest topk asked; each request gets its own topk's prefix), run in a thread so that the event
loop keeps accepting requests. The encoder call sorts the queries by length and runs forward
passes of at most `--encode-rows` (8) of them, each padded to its own length: one pass over the
whole batch would pad every query to the longest one, which costs more on a CPU than the
larger pass saves. A request is never split: one of more than `--max-batch` queries
is served alone. `--max-batch 1` serves each request alone (batching off); `--max-wait-ms 0`
waits for nobody, but still serves together the requests that are already queued.

A bad request is refused with a 4xx and `{"error": "<what was wrong>", "field": "<name>"}`
(docs/reliability.md lists each case): 400 when the body is not a JSON object (field "body"),
422 for a field (`queries` missing, not a list, empty, longer than `--max-queries`, an entry
not a string or blank; `topk` not an integer or outside 1..`--max-topk`; `return_scores` not a
boolean; any other field: refused rather than ignored, so that a misspelt `top_k` does not
silently get the default). A failure inside the search answers 500 in the same shape; the
server keeps serving after each of them.

`open_index(dir, encoder_path)` is the one place that turns an index folder into something
searchable; a new on-disk layout plugs in there.
"""
# No `from __future__ import annotations`: FastAPI reads the handlers' annotations (Request).

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import pathlib
import time
from typing import Optional, Sequence

log = logging.getLogger("rlrag_jax.retrieval.serve")

DEFAULT_TOPK = 3              # Search-R1's retrieval_server.py default (--topk 3)
REQUEST_FIELDS = ("queries", "topk", "return_scores")


# ------------------------------------------------------------------ the index
# Rows of one encoder forward pass. The encoder sorts a batch's queries by length and pads each
# pass to its own length bucket and to a power of two rows; one pass over a whole batch would
# pad every query to the longest one's bucket. On 2 CPU cores, 24 2Wiki questions encode in
# 127 ms in passes of 8, 144 ms of 16, 200 ms in one pass of 64 rows and 230 ms one at a time
# (docs/results/retrieval_service).
ENCODE_ROWS = 8


class LoadedIndex:
  """`search(queries, k) -> list[list[Hit]]` over a saved index (one encoder call, in forward
  passes of at most `encode_rows` queries, and one index search), and its `manifest` (at least
  `n`, `encoder`, `backend`)."""

  def __init__(self, retriever, manifest: dict, encode_rows: int = ENCODE_ROWS):
    self.retriever = retriever
    self.manifest = manifest
    self.encode_rows = int(encode_rows)

  def search(self, queries: Sequence[str], k: int) -> list:
    return self.retriever.search(list(queries), k, batch_size=self.encode_rows)


def open_index(folder, encoder_path: Optional[str] = None, *,
               encode_rows: int = ENCODE_ROWS) -> LoadedIndex:
  """The index in `folder` (built by `python -m rlrag_jax.retrieval.build`, or a run's
  `Retriever.save`) with its query encoder: `encoder_path`, or None for the packaged MiniLM,
  with the index's pooling and prefixes. The encoder must be the one the index was built with
  (`Retriever.load` refuses another)."""
  from rlrag_jax.retrieval import search as search_cli
  if encode_rows < 1:
    raise ValueError(f"--encode-rows is {encode_rows}; expected >= 1")
  folder = pathlib.Path(folder)
  retriever, manifest = search_cli.open_searcher(str(folder), encoder_path or "")
  manifest.update(n=len(retriever), encoder=retriever.encoder_id, backend=retriever.backend)
  return LoadedIndex(retriever, manifest, encode_rows)


# ------------------------------------------------------------------ requests
class BadRequest(Exception):
  """A request the server refuses: HTTP `status`, with the offending `field`."""

  def __init__(self, status: int, field: str, error: str):
    super().__init__(error)
    self.status, self.field, self.error = status, field, error


@dataclasses.dataclass(frozen=True)
class Limits:
  max_topk: int = 100
  max_queries: int = 512
  default_topk: int = DEFAULT_TOPK


def parse_request(raw: bytes, limits: Limits) -> tuple:
  """A /retrieve body -> (queries, topk, return_scores), or `BadRequest` naming the field."""
  try:
    body = json.loads(raw)
  except (ValueError, UnicodeDecodeError) as e:
    raise BadRequest(400, "body", f"the request body is not valid JSON ({e})") from None
  if not isinstance(body, dict):
    raise BadRequest(400, "body", f"the request body must be a JSON object, found "
                     f"{type(body).__name__}")
  for key in body:
    if key not in REQUEST_FIELDS:
      raise BadRequest(422, key, f"unknown field {key!r}; /retrieve takes "
                       f"{', '.join(REQUEST_FIELDS)}")
  if "queries" not in body:
    raise BadRequest(422, "queries", "field 'queries' is missing; expected a list of strings")
  queries = body["queries"]
  if not isinstance(queries, list):
    raise BadRequest(422, "queries", f"field 'queries' must be a list of strings, found "
                     f"{type(queries).__name__}")
  if not queries:
    raise BadRequest(422, "queries", "field 'queries' is an empty list; send at least one query")
  if len(queries) > limits.max_queries:
    raise BadRequest(422, "queries", f"field 'queries' holds {len(queries)} queries; this "
                     f"server takes at most {limits.max_queries} a request (--max-queries)")
  for i, q in enumerate(queries):
    if not isinstance(q, str):
      raise BadRequest(422, "queries", f"field 'queries' entry {i} is a "
                       f"{type(q).__name__}; expected a string")
    if not q.strip():
      raise BadRequest(422, "queries", f"field 'queries' entry {i} is blank")
  topk = body.get("topk")
  if topk is None:                       # absent or null: the server's default, as Search-R1
    topk = limits.default_topk
  elif isinstance(topk, bool) or not isinstance(topk, int):
    raise BadRequest(422, "topk", f"field 'topk' must be an integer, found {topk!r:.40}")
  elif not 1 <= topk <= limits.max_topk:
    raise BadRequest(422, "topk", f"field 'topk' is {topk}; expected 1..{limits.max_topk} "
                     "(--max-topk)")
  scores = body.get("return_scores", False)
  if not isinstance(scores, bool):
    raise BadRequest(422, "return_scores", f"field 'return_scores' must be true or false, "
                     f"found {scores!r:.40}")
  return queries, topk, scores


def contents(hit) -> str:
  """FlashRAG's passage layout: '"Title"\\ntext'."""
  return f'"{hit.title}"\n{hit.text}'


def result_rows(hits: list, return_scores: bool) -> list:
  """Per query its documents, Search-R1's reply shape."""
  out = []
  for row in hits:
    docs = [{"id": h.id, "contents": contents(h)} for h in row]
    if return_scores:
      docs = [{"document": d, "score": float(h.score)} for d, h in zip(docs, row)]
    out.append(docs)
  return out


# ------------------------------------------------------------------ batching
class Batcher:
  """One worker that serves queued requests in batches (see the module docstring)."""

  def __init__(self, index, max_batch: int, max_wait_s: float):
    if max_batch < 1:
      raise ValueError(f"--max-batch is {max_batch}; expected >= 1")
    if max_wait_s < 0:
      raise ValueError(f"--max-wait-ms is {max_wait_s * 1000:g}; expected >= 0")
    self.index, self.max_batch, self.max_wait_s = index, int(max_batch), float(max_wait_s)
    self.queue: Optional[asyncio.Queue] = None
    self._task: Optional[asyncio.Task] = None
    self.batches = self.queries = 0          # served so far (for /health)
    self.search_s = 0.0                      # wall seconds inside index.search

  async def start(self) -> None:
    self.queue = asyncio.Queue()
    self._task = asyncio.get_running_loop().create_task(self._run())

  async def stop(self) -> None:
    if self._task is not None:
      self._task.cancel()
      with contextlib.suppress(asyncio.CancelledError):
        await self._task

  async def search(self, queries: list, k: int) -> list:
    future = asyncio.get_running_loop().create_future()
    await self.queue.put((queries, k, future))
    return await future

  async def _gather(self) -> list:
    items = [await self.queue.get()]
    size = len(items[0][0])
    deadline = time.monotonic() + self.max_wait_s
    while size < self.max_batch:
      if not self.queue.empty():
        item = self.queue.get_nowait()
      else:
        left = deadline - time.monotonic()
        if left <= 0:
          break
        try:
          item = await asyncio.wait_for(self.queue.get(), left)
        except asyncio.TimeoutError:
          break
      items.append(item)
      size += len(item[0])
    return items

  async def _run(self) -> None:
    loop = asyncio.get_running_loop()
    while True:
      items = await self._gather()
      items = [it for it in items if not it[2].cancelled()]   # a client that went away
      if not items:
        continue
      queries = [q for qs, _, _ in items for q in qs]
      k = max(k for _, k, _ in items)
      try:
        t0 = time.perf_counter()
        hits = await loop.run_in_executor(None, self.index.search, queries, k)
        self.search_s += time.perf_counter() - t0
        if len(hits) != len(queries):
          raise RuntimeError(f"the index answered {len(hits)} rows for {len(queries)} queries")
      except Exception as e:  # pylint: disable=broad-except   (each waiting request gets it;
        log.exception("search of %d queries failed", len(queries))   # the worker serves on)
        for _, _, fut in items:
          if not fut.done():
            fut.set_exception(e)
        continue
      self.batches += 1
      self.queries += len(queries)
      start = 0
      for qs, kq, fut in items:
        if not fut.done():
          fut.set_result([row[:kq] for row in hits[start:start + len(qs)]])
        start += len(qs)


# ------------------------------------------------------------------ the app
def create_app(index, *, max_batch: int = 64, max_wait_ms: float = 5.0, max_topk: int = 100,
               max_queries: int = 512, default_topk: int = DEFAULT_TOPK):
  """The FastAPI app serving `index` (anything with `search(queries, k)` and `manifest`)."""
  from fastapi import FastAPI, Request
  from fastapi.exceptions import RequestValidationError
  from fastapi.responses import JSONResponse
  from starlette.exceptions import HTTPException as StarletteHTTPException

  for name, value in (("--max-topk", max_topk), ("--max-queries", max_queries),
                      ("--topk", default_topk)):
    if value < 1:
      raise ValueError(f"{name} is {value}; expected >= 1")
  limits = Limits(max_topk=int(max_topk), max_queries=int(max_queries),
                  default_topk=min(int(default_topk), int(max_topk)))
  batcher = Batcher(index, max_batch, max_wait_ms / 1000.0)

  @contextlib.asynccontextmanager
  async def lifespan(_app):
    await batcher.start()
    try:
      yield
    finally:
      await batcher.stop()

  app = FastAPI(title="rlrag_jax retrieval", lifespan=lifespan)
  app.state.batcher = batcher

  def refuse(status: int, field, error: str):
    return JSONResponse({"error": error, "field": field}, status_code=status)

  @app.exception_handler(BadRequest)
  async def _bad_request(_request, e: BadRequest):
    return refuse(e.status, e.field, e.error)

  @app.exception_handler(RequestValidationError)
  async def _invalid(_request, e: RequestValidationError):   # FastAPI's own 422, same shape
    first = (e.errors() or [{}])[0]
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    return refuse(422, ".".join(loc) or "body", str(first.get("msg", "invalid request")))

  @app.exception_handler(StarletteHTTPException)
  async def _http(request, e: StarletteHTTPException):       # 404, 405, ...
    return refuse(e.status_code, None, f"{request.method} {request.url.path}: {e.detail}")

  @app.get("/health")
  async def health():
    m = index.manifest
    return {"status": "ok", "n": m.get("n"), "encoder": m.get("encoder"),
            "backend": m.get("backend"), "manifest": m,
            "served": {"batches": batcher.batches, "queries": batcher.queries,
                       "search_s": round(batcher.search_s, 6)}}

  @app.post("/retrieve")
  async def retrieve(request: Request):
    queries, topk, return_scores = parse_request(await request.body(), limits)
    try:
      hits = await batcher.search(queries, topk)
    except Exception as e:  # pylint: disable=broad-except   (a 500 in the protocol's shape)
      return refuse(500, None, f"search failed: {type(e).__name__}: {e}")
    return {"result": result_rows(hits, return_scores)}

  return app


def warm_up(index, max_batch: int, k: int, max_tokens: int = 64) -> None:
  """Compiles the encoder and index for the shapes the worker will meet with short queries:
  batches of 1, 2, 4, ... up to `max_batch` queries (the encoder and the exact index pad rows to
  a power of two) for each of the encoder's length buckets up to `max_tokens`, at depth `k`; so
  that the first requests do not wait for XLA. Longer queries and other depths compile when
  first met."""
  buckets = [b for b in index.retriever.encoder.length_buckets if b <= max_tokens] or [16]
  for b in buckets:
    text = " ".join(["warm"] * max(1, b - 2))     # b tokens with [CLS] and [SEP]
    rows = 1
    while True:
      index.search([text] * rows, k)
      if rows >= max_batch:
        break
      rows = min(2 * rows, max_batch)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(prog="python -m rlrag_jax.retrieval.serve",
                              description=__doc__.split("\n\n")[0])
  p.add_argument("--index", required=True, help="a saved index folder (manifest.json)")
  p.add_argument("--host", default="127.0.0.1")
  p.add_argument("--port", type=int, default=8000)
  p.add_argument("--max-batch", type=int, default=64,
                 help="queries gathered into one encoder call + search (1: no batching)")
  p.add_argument("--max-wait-ms", type=float, default=5.0,
                 help="longest wait for more requests after the first one of a batch")
  p.add_argument("--max-topk", type=int, default=100)
  p.add_argument("--max-queries", type=int, default=512, help="queries one request may hold")
  p.add_argument("--topk", type=int, default=DEFAULT_TOPK, help="topk of a request without one")
  p.add_argument("--encode-rows", type=int, default=ENCODE_ROWS,
                 help="queries in one encoder forward pass (a batch's queries sorted by length)")
  p.add_argument("--encoder", default=None,
                 help="query encoder checkpoint (default: the packaged MiniLM)")
  p.add_argument("--no-warm-up", action="store_true",
                 help="skip compiling the batch shapes before serving")
  args = p.parse_args(argv)
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
  import uvicorn
  index = open_index(args.index, args.encoder, encode_rows=args.encode_rows)
  if not args.no_warm_up:
    warm_up(index, args.max_batch, args.topk)
  app = create_app(index, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
                   max_topk=args.max_topk, max_queries=args.max_queries, default_topk=args.topk)
  m = index.manifest
  log.info("serving %s: %d passages, %s, encoder %s on http://%s:%d (max batch %d, wait %g ms)",
           args.index, m["n"], m["backend"], m["encoder"], args.host, args.port, args.max_batch,
           args.max_wait_ms)
  uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
  main()
