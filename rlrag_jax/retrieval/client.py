"""`RemoteRetriever`: passage search through a retrieval server that speaks Search-R1's protocol
(ours, `python -m rlrag_jax.retrieval.serve`, or Search-R1's own `retrieval_server.py`).

  retriever = RemoteRetriever("http://127.0.0.1:8000")
  hits = retriever.search(["who wrote it?"], k=3)     # [[Hit(id, score, title, text), ...]]

Each `search` posts `{"queries": [...], "topk": k, "return_scores": true}` to `<url>/retrieve`
(in requests of at most `max_queries` queries) and reads `{"result": [[...], ...]}`, one list per
query. A result entry is `{"document": {"id", "contents"}, "score"}`, or the document alone when
a server leaves the scores out (the score is then NaN). `contents` is split the FlashRAG way:
the first line is the title, one pair of surrounding double quotes removed; the rest is the
text (a `contents` without a newline is all text, the title empty). A document's `title` /
`text` fields, where a server sends them, are used as they are.

One pooled `httpx.Client` carries every request, each bounded by `timeout_s`. Transport
failures (refused, reset, timed out) and 5xx / 429 answers are retried `retries` times, the
pause doubling from `backoff_s`; a 4xx is not retried (the request itself is wrong). A search
that still failed, or whose 200 cannot be read (not JSON, no `result`, the wrong number of rows,
a document without `id` / `contents`), gives every one of its queries no passages, and is
counted by a `judge.FailureMonitor` as the LLM judge's calls are: past 5% of the recent calls a
warning is logged, and once more than `max_failure_rate` of the last `failure_window` searches
failed the next `search` raises `judge.EndpointFailing`, which stops the run rather than train
on empty observations (config keys `retrieval.url_max_failure_rate`,
`retrieval.url_failure_window`; `rlrag_jax.retrieval.from_config` builds the client from them).

Limits: the server embeds the queries, so there is no `search_embeddings`; a method that needs
query vectors for itself (the search agent's r_s reward, SPARKLE's triple candidates) still
embeds them locally. The ids are the server's: they name passages of the local corpus only when
the server serves that same corpus.
"""
from __future__ import annotations

import logging
import math
import time
from typing import Optional, Sequence

from rlrag_jax import judge as judge_lib
from rlrag_jax.retrieval.retriever import Hit

log = logging.getLogger("rlrag_jax.retrieval.client")

_RETRY_STATUS = {429, 500, 502, 503, 504}


class ReplyError(ValueError):
  """A 200 from the server that is not a reply of the protocol."""


def split_contents(contents: str) -> tuple:
  """FlashRAG's '"Title"\\ntext' -> (title, text)."""
  head, newline, body = contents.partition("\n")
  if not newline:
    return "", contents
  title = head.strip()
  if len(title) >= 2 and title[0] == title[-1] == '"':
    title = title[1:-1]
  return title, body


def parse_result(reply, n_queries: int) -> list:
  """A /retrieve reply -> per query a list of Hits; `ReplyError` for another shape."""
  if not isinstance(reply, dict) or not isinstance(reply.get("result"), list):
    raise ReplyError("no 'result' list")
  rows = reply["result"]
  if len(rows) != n_queries:
    raise ReplyError(f"'result' has {len(rows)} rows for {n_queries} queries")
  out = []
  for qi, row in enumerate(rows):
    if not isinstance(row, list):
      raise ReplyError(f"'result' row {qi} is a {type(row).__name__}, not a list")
    hits = []
    for j, entry in enumerate(row):
      if not isinstance(entry, dict):
        raise ReplyError(f"'result'[{qi}][{j}] is a {type(entry).__name__}, not an object")
      doc, score = entry, math.nan
      if isinstance(entry.get("document"), dict):
        doc = entry["document"]
        score = entry.get("score", math.nan)
        if isinstance(score, bool) or not isinstance(score, (int, float)):
          raise ReplyError(f"'result'[{qi}][{j}] score is {score!r:.40}, not a number")
      if doc.get("id") is None:
        raise ReplyError(f"'result'[{qi}][{j}] document has no 'id'")
      if "text" in doc:
        title, text = str(doc.get("title") or ""), str(doc["text"])
      elif isinstance(doc.get("contents"), str):
        title, text = split_contents(doc["contents"])
      else:
        raise ReplyError(f"'result'[{qi}][{j}] document has no 'contents' string")
      hits.append(Hit(id=str(doc["id"]), score=float(score), title=title, text=text))
    out.append(hits)
  return out


class RemoteRetriever:
  """`search(queries, k) -> list[list[Hit]]` from a server at `url` (see the module docstring)."""

  remote = True

  def __init__(self, url: str, *, timeout_s: float = 30.0, retries: int = 3,
               backoff_s: float = 0.5, max_failure_rate: float = 0.1,
               failure_window: int = 100, max_queries: int = 512, return_scores: bool = True,
               key_prefix: str = "retrieval.url_"):
    import httpx
    if not url.startswith(("http://", "https://")):
      raise ValueError(f"config key '{key_prefix[:-1]}' is {url!r}; expected an http(s):// "
                       "url of a retrieval server")
    if float(timeout_s) <= 0:
      raise ValueError(f"config key '{key_prefix}timeout_s' is {timeout_s!r}; expected > 0")
    if isinstance(retries, bool) or int(retries) != retries or retries < 0:
      raise ValueError(f"config key '{key_prefix}retries' is {retries!r}; expected a whole "
                       "number >= 0")
    self.url = url.rstrip("/")
    self.timeout_s, self.retries, self.backoff_s = float(timeout_s), int(retries), float(backoff_s)
    self.max_queries = judge_lib.at_least_one(max_queries, "max_queries")
    self.return_scores = bool(return_scores)
    self.attempts = 0                 # HTTP requests sent, retries included
    self.monitor = judge_lib.FailureMonitor(
        "retrieval", f"{self.url}/retrieve", max_failure_rate=max_failure_rate,
        window=failure_window, key_prefix=key_prefix,
        consequence="gives its queries no passages")
    self._http = httpx.Client(timeout=self.timeout_s)
    self._httpx = httpx

  def close(self) -> None:
    self._http.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  def health(self) -> Optional[dict]:
    """GET <url>/health as a dict, or None where the server has none (Search-R1's) or is down."""
    try:
      r = self._http.get(f"{self.url}/health")
      return r.json() if r.status_code == 200 else None
    except (self._httpx.HTTPError, ValueError):
      return None

  def search(self, queries: Sequence[str], k: int = 3) -> list:
    """Per query its top-k `Hit`s, best first (no Hits for the queries of a failed request);
    `judge.EndpointFailing` once too many searches failed."""
    if isinstance(queries, str):
      raise TypeError("search expects a list of query strings, got one str; wrap it in a list")
    self.monitor.check()            # stopped already: no request is sent
    queries = list(queries)
    if k < 1 or not queries:
      return [[] for _ in queries]
    out = []
    for start in range(0, len(queries), self.max_queries):
      chunk = queries[start:start + self.max_queries]
      hits, error, kind = self._request(chunk, int(k))
      if error:
        self.monitor.record(error, kind)
        hits = [[] for _ in chunk]
      else:
        self.monitor.record()
      out.extend(hits)
      self.monitor.check()
    return out

  def _request(self, queries: list, k: int) -> tuple:
    """(hits, '', '') or (None, why, kind) after the retries."""
    body = {"queries": queries, "topk": k, "return_scores": self.return_scores}
    error, kind = "no attempt", "transport"
    for attempt in range(self.retries + 1):
      if attempt:
        time.sleep(self.backoff_s * 2 ** (attempt - 1))
      self.attempts += 1
      try:
        r = self._http.post(f"{self.url}/retrieve", json=body)
      except self._httpx.TimeoutException:
        error, kind = "timed out", "transport"
        continue
      except self._httpx.TransportError as e:
        error, kind = f"{type(e).__name__}: {e}", "transport"
        continue
      if r.status_code != 200:
        error, kind = f"HTTP {r.status_code}: {' '.join(r.text.split())[:160]}", "http"
        if r.status_code in _RETRY_STATUS:
          continue
        return None, error, kind            # 4xx: retrying the same request won't help
      try:
        return parse_result(r.json(), len(queries)), "", ""
      except ValueError as e:                # not JSON, or ReplyError
        return None, f"unreadable reply ({e})", "reply"
    if self.retries:
      error = f"{error} ({self.retries + 1} attempts)"
    return None, error, kind


def from_config(rc) -> RemoteRetriever:
  """The client of config section `retrieval` (`url`, `url_timeout_s`, `url_retries`,
  `url_max_failure_rate`, `url_failure_window`)."""
  return RemoteRetriever(rc.url, timeout_s=rc.url_timeout_s, retries=rc.url_retries,
                         max_failure_rate=rc.url_max_failure_rate,
                         failure_window=rc.url_failure_window)
