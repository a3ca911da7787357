"""A real HTTP server on 127.0.0.1 for the retrieval-service tests: an ASGI app run by uvicorn in
a thread on a socket bound to a free port, ready once GET /health answers (bounded wait), always
shut down (imported by name: tests/ is on sys.path)."""
import contextlib
import socket
import threading
import time

import httpx

from rlrag_jax.data.schema import CorpusRecord

READY_DEADLINE_S = 120.0      # a bound on start-up, not a measurement


def small_corpus(n: int = 50) -> list:
  """`n` short passages on distinct topics (titles and texts a query can tell apart)."""
  topics = ["river", "mountain", "violin", "comet", "glacier", "harbour", "orchard", "volcano",
            "library", "desert"]
  people = ["Ada Lovelace", "Niels Bohr", "Marie Curie", "Alan Turing", "Emmy Noether"]
  out = []
  for i in range(n):
    t, p = topics[i % len(topics)], people[(i // len(topics)) % len(people)]
    out.append(CorpusRecord(id=f"doc{i}", title=f"{p} and the {t} {i}",
                            text=f"{p} wrote about the {t} number {i}, a place of {t}s.\n"
                                 f"Second line of passage {i}."))
  return out


def free_socket() -> socket.socket:
  sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  sock.bind(("127.0.0.1", 0))
  return sock


def wait_ready(url: str, thread=None, deadline_s: float = READY_DEADLINE_S) -> None:
  """Polls GET {url}/health until it answers 200; fails past the deadline or if `thread` died."""
  end = time.monotonic() + deadline_s
  last = None
  while time.monotonic() < end:
    if thread is not None and not thread.is_alive():
      raise RuntimeError(f"the server thread for {url} exited before it was ready")
    try:
      if httpx.get(f"{url}/health", timeout=5.0).status_code == 200:
        return
    except httpx.HTTPError as e:
      last = e
    time.sleep(0.05)
  raise TimeoutError(f"{url}/health did not answer within {deadline_s:g} s (last: {last!r})")


def protocol_stand_in(state: dict, rows):
  """A stand-in server of the Search-R1 /retrieve protocol for client-side tests (the real
  server, `retrieval.serve`, has its own): GET /health, and POST /retrieve, which counts its
  calls in `state['calls']`, keeps each body's first query in `state['queries']` (when that
  list exists), fails with HTTP `state.get('fail_status', 503)` while `failing(state)` holds,
  and otherwise answers {"result": rows(body)}."""
  from fastapi import FastAPI, Request
  from fastapi.responses import JSONResponse
  app = FastAPI()
  lock = threading.Lock()

  @app.get("/health")
  async def health():
    return {"status": "ok"}

  async def retrieve(request: Request):
    body = await request.json()
    with lock:
      state["calls"] += 1
      if "queries" in state:
        state["queries"].append(body["queries"][0])
      down = state["failing"](state)
    if down:
      return JSONResponse({"error": "down", "field": None},
                          status_code=state.get("fail_status", 503))
    return {"result": rows(body)}

  app.add_api_route("/retrieve", retrieve, methods=["POST"])
  return app


@contextlib.contextmanager
def serving(app):
  """Runs `app` on 127.0.0.1:<free port>; yields its base url; stops it on exit."""
  import uvicorn
  sock = free_socket()
  port = sock.getsockname()[1]
  server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
  thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                            name=f"uvicorn-{port}")
  thread.start()
  url = f"http://127.0.0.1:{port}"
  try:
    wait_ready(url, thread)
    yield url
  finally:
    server.should_exit = True
    thread.join(timeout=30)
    sock.close()
