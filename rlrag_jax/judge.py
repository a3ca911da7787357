"""Optional LLM judge of answer correctness through an OpenAI-compatible chat endpoint, and the
failure monitor every endpoint the training loop depends on shares (the judge, SPARKLE's reader).

Off by default everywhere; nothing in the default pipeline or the tests touches the network.
Enable with e.g. `--config.eval.judge_url=http://localhost:8000/v1 --config.eval.judge_model=NAME`
(an endpoint you run, such as a local vLLM or SGLang server).

The judge prompt is per method: a method passes its own `JudgePrompt` (the template with
`{question}`, `{gold}`, `{pred}` fields and the function that reads the reply). `DEFAULT_PROMPT`
is a neutral yes/no prompt for methods whose paper gives none.

One call never raises. A reply that cannot be read (no choices, `content: null`, a body that is
not a JSON object, a verdict the prompt's parser does not recognise) and a failed request
(connection refused or reset, the server hanging up mid-reply, a timeout, an HTTP error) both
give "not judged": None, which callers score as incorrect. An empty prediction is False without
a request, and not a failure. Transport failures and 5xx/429 answers are retried `retries` times
with a doubling pause; every attempt is bounded by `timeout` seconds.

A batch (`judge_many`) is judged by at most `concurrency` threads, order preserved; once the
monitor stops (below), no new call of the batch starts.

Every call is counted by the judge's `FailureMonitor` (`.monitor`), which keeps the reason of
the last failure ('connection refused', 'HTTP 503', 'unreadable reply (no choices)', ...) and
looks at the last `failure_window` calls: past `WARN_RATE` of them failed, a warning is logged
(logger 'rlrag_jax.judge'); more than `max_failure_rate * failure_window` of them failed, the
next call's caller gets `EndpointFailing`, which stops the run on purpose: a judge that is down
would otherwise score every answer as wrong and train on the zeros. `Span` turns the counters
into the metrics the trainer logs per RL step and the evaluation summaries hold:
`<name>/calls`, `<name>/failures`, `<name>/failure_rate` and `<name>/failures_<kind>`.
"""
from __future__ import annotations

import collections
import dataclasses
import http.client
import json
import logging
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Optional, Sequence

log = logging.getLogger("rlrag_jax.judge")


def yes_no(reply: str) -> Optional[bool]:
  """'yes…' -> True, 'no…' -> False (case and surrounding punctuation ignored), else None."""
  word = reply.strip().strip("\"'`*.:").lower()
  if word.startswith("yes"):
    return True
  if word.startswith("no"):
    return False
  return None


@dataclasses.dataclass(frozen=True)
class JudgePrompt:
  """A method's judge instruction: `template.format(question=, gold=, pred=)` is the user message;
  `parse(reply_text)` is the verdict (None when the reply says neither)."""
  template: str
  parse: Callable[[str], Optional[bool]] = yes_no
  max_tokens: int = 8
  system: str = ""


DEFAULT_PROMPT = JudgePrompt(
    "You judge whether a predicted answer to a question means the same as one of the gold "
    "answers. Reply with exactly one word: yes or no.\n\nQuestion: {question}\n"
    "Gold answers: {gold}\nPredicted answer: {pred}\nSame meaning?")

# Kept for callers of the previous module-level name.
PROMPT = DEFAULT_PROMPT.template

_RETRY_STATUS = {429, 500, 502, 503, 504}
_TRANSPORT_ERRORS = (urllib.error.URLError, http.client.HTTPException, ConnectionError,
                     socket.timeout, TimeoutError, OSError)

# Why a call failed, for the metrics: the request never got an answer ('transport'), the server
# answered with an HTTP error ('http'), its 200 could not be read ('reply'), or the judge's
# reply was neither verdict ('verdict').
FAILURE_KINDS = ("transport", "http", "reply", "verdict")
WARN_RATE = 0.05


class EndpointFailing(RuntimeError):
  """Too many of an endpoint's recent calls failed: the run stops rather than train on them."""


class FailureMonitor:
  """Counts one endpoint's calls and failures (thread-safe) and judges the last `window` calls.

  `record()` after each call (`record(error, kind)` for a failed one); `check()` raises
  `EndpointFailing` once more than `max_failure_rate * window` of the last `window` calls
  failed, and from then on (1.0: never). A warning is logged when more than `WARN_RATE` of the
  recent calls failed (all calls so far while fewer than `window` were made), again only after
  the rate fell back to half that. `key_prefix` is where the two settings live in the config
  ('reward.judge_' for 'reward.judge_max_failure_rate') and `consequence` what a failed call
  becomes ('scores as a wrong answer'), both for the messages."""

  def __init__(self, name: str, url: str, *, max_failure_rate: float, window: int,
               key_prefix: str, consequence: str):
    self.name, self.url, self.consequence = name, url, consequence
    self.rate_key = f"{key_prefix}max_failure_rate"
    self.window_key = f"{key_prefix}failure_window"
    rate = float(max_failure_rate)
    if not 0.0 <= rate <= 1.0:
      raise ValueError(f"config key '{self.rate_key}' is {max_failure_rate!r}; expected a rate "
                       "in [0, 1] (0: stop at the first failure, 1: never stop)")
    self.max_failure_rate, self.window = rate, at_least_one(window, self.window_key)
    self.calls = self.failures = 0
    self.by_kind = dict.fromkeys(FAILURE_KINDS, 0)
    self.last_error = ""
    self._recent = collections.deque(maxlen=self.window)     # True: that call failed
    self._recent_failures = 0
    self._warned = False
    self._stop: Optional[str] = None
    self._lock = threading.Lock()

  def record(self, error: str = "", kind: str = "") -> None:
    """One finished call: succeeded (no arguments) or failed with `error`, of `kind`."""
    failed = bool(error)
    if failed and kind not in FAILURE_KINDS:
      raise ValueError(f"FailureMonitor.record: kind {kind!r}; expected one of {FAILURE_KINDS}")
    with self._lock:
      self.calls += 1
      if len(self._recent) == self.window:
        self._recent_failures -= self._recent[0]
      self._recent.append(failed)
      self._recent_failures += failed
      if failed:
        self.failures += 1
        self.by_kind[kind] += 1
        self.last_error = error
      recent, n = self._recent_failures, len(self._recent)
      if not self._warned and recent > WARN_RATE * n:
        self._warned = True
        limit = (f"The run stops past {self.max_failure_rate * self.window:g} of the last "
                 f"{self.window}" if self.max_failure_rate < 1 else "The run goes on")
        log.warning("%s at %s: %d of the last %d calls failed (last error: %s); a failed "
                    "call %s. %s (config keys '%s', '%s').", self.name, self.url, recent, n,
                    self.last_error, self.consequence, limit, self.rate_key, self.window_key)
      elif self._warned and recent <= WARN_RATE / 2 * n:
        self._warned = False
      if self._stop is None and recent > self.max_failure_rate * self.window:
        self._stop = (
            f"{self.name} at {self.url}: {recent} of the last {n} calls failed, more "
            f"than {self.rate_key}={self.max_failure_rate:g} of {self.window_key}="
            f"{self.window}; last error: {self.last_error}. A failed call {self.consequence}, "
            f"so the run stops rather than go on scoring them. Fix the endpoint, or raise "
            f"'{self.rate_key}' (1.0: never stop).")

  def check(self) -> None:
    """Raises `EndpointFailing` once the failures passed the limit."""
    if self.stopped:
      raise EndpointFailing(self._stop)

  @property
  def stopped(self) -> bool:
    """Whether the failures passed the limit (then `check()` raises); it stays so."""
    with self._lock:
      return self._stop is not None

  @property
  def recent_failure_rate(self) -> float:
    """Failures among the last `window` calls (all calls while fewer were made); 0.0 before any."""
    with self._lock:
      return self._recent_failures / len(self._recent) if self._recent else 0.0

  def counts(self) -> dict:
    """Cumulative {'calls', 'failures', 'failures_<kind>'}, for `Span`."""
    with self._lock:
      return {"calls": self.calls, "failures": self.failures,
              **{f"failures_{k}": n for k, n in self.by_kind.items()}}


class Span:
  """The calls and failures of `monitors` between its creation and `.metrics()`:
  {'<name>/calls', '<name>/failures', '<name>/failure_rate' (failures / calls, 0.0 without a
  call), and '<name>/failures_<kind>' for each kind that occurred}; monitors of the same name
  are summed (each counted once)."""

  def __init__(self, monitors: Sequence[FailureMonitor]):
    unique = {id(m): m for m in monitors}.values()
    self._start = [(m, m.counts()) for m in unique]

  def metrics(self) -> dict:
    out = {}
    for m, start in self._start:
      for k, v in m.counts().items():
        key = f"{m.name}/{k}"
        out[key] = out.get(key, 0.0) + float(v - start[k])
    for name in {m.name for m, _ in self._start}:
      calls = out[f"{name}/calls"]
      out[f"{name}/failure_rate"] = out[f"{name}/failures"] / calls if calls else 0.0
    return {k: v for k, v in out.items() if v or "/failures_" not in k}


def map_bounded(fn: Callable[[Any], Any], items: Sequence, workers: int,
                monitor: FailureMonitor) -> list:
  """[fn(x) for x in items] by at most `workers` threads, in order; `fn` records each call in
  `monitor` and never raises.

  Each worker takes the next item only while `monitor` has not stopped, so once the failure
  window trips no new call starts: besides the call whose failure tripped it, at most
  `workers - 1` calls (one already under way in each other worker) reach the endpoint. The
  caller gets `EndpointFailing` as soon as the monitor stops, without waiting for those calls;
  they finish (bounded by the call's own timeout) in their daemon threads and are counted."""
  items = list(items)
  if not items:
    return []
  n = len(items)
  out: list = [None] * n
  cond = threading.Condition()
  state = {"next": 0, "done": 0, "error": None}

  def work():
    while True:
      with cond:
        if state["error"] is not None or state["next"] == n or monitor.stopped:
          cond.notify_all()
          return
        i = state["next"]
        state["next"] += 1
      try:
        result = fn(items[i])
      except BaseException as e:  # pylint: disable=broad-except   (handed to the caller)
        with cond:
          state["error"] = state["error"] or e
          cond.notify_all()
        return
      with cond:
        out[i] = result
        state["done"] += 1
        cond.notify_all()

  monitor.check()                   # already stopped: not one call
  for k in range(max(1, min(int(workers), n))):
    threading.Thread(target=work, name=f"{monitor.name}-pool_{k}", daemon=True).start()
  with cond:                        # woken by every finished call, so no stop goes unseen
    while state["done"] < n and state["error"] is None and not monitor.stopped:
      cond.wait()
    error = state["error"]
  if error is not None:
    raise error
  monitor.check()
  return out


class OpenAIJudge:
  """`judge(question, prediction, answers) -> True | False | None` (None: not judged);
  `judge.judge_many([(question, prediction, answers), ...])` for a batch."""

  def __init__(self, base_url: str, model: str, *, prompt: JudgePrompt = DEFAULT_PROMPT,
               api_key_env: str = "OPENAI_API_KEY", timeout: float = 30.0, retries: int = 2,
               backoff: float = 0.5, concurrency: int = 16, max_failure_rate: float = 0.5,
               failure_window: int = 200, key_prefix: str = "judge_"):
    self.url = base_url.rstrip("/") + "/chat/completions"
    self.model = model
    self.prompt = prompt
    self.api_key = os.environ.get(api_key_env, "")
    self.timeout = float(timeout)
    self.retries = int(retries)
    self.backoff = float(backoff)
    self.concurrency = at_least_one(concurrency, f"{key_prefix}concurrency")
    self.monitor = FailureMonitor("judge", self.url, max_failure_rate=max_failure_rate,
                                  window=failure_window, key_prefix=key_prefix,
                                  consequence="scores as a wrong answer")

  @property
  def calls(self) -> int:
    return self.monitor.calls

  @property
  def failures(self) -> int:
    return self.monitor.failures

  @property
  def errors(self) -> int:            # the older name of the counter
    return self.failures

  def request_body(self, question: str, prediction: str, answers: Sequence[str]) -> dict:
    content = self.prompt.template.format(question=question, gold=" | ".join(answers),
                                          pred=prediction)
    messages = [{"role": "user", "content": content}]
    if self.prompt.system:
      messages.insert(0, {"role": "system", "content": self.prompt.system})
    return {"model": self.model, "temperature": 0.0, "max_tokens": self.prompt.max_tokens,
            "messages": messages}

  def __call__(self, question: str, prediction: str, answers: Sequence[str]) -> Optional[bool]:
    verdict = self._judge_one((question, prediction, answers))
    self.monitor.check()
    return verdict

  def judge_many(self, items: Sequence[tuple]) -> list:
    """[judge(*item) for item in items], asked `concurrency` at a time; order preserved."""
    return map_bounded(self._judge_one, items, self.concurrency, self.monitor)

  def _judge_one(self, item: tuple) -> Optional[bool]:
    question, prediction, answers = item
    if not (prediction or "").strip():
      return False                    # nothing to judge: wrong, and not a judge failure
    reply = ask(self.url, self.request_body(question, prediction, answers), api_key=self.api_key,
                timeout=self.timeout, retries=self.retries, backoff=self.backoff)
    if reply.text is None:
      self.monitor.record(reply.error, reply.kind)
      return None
    verdict = self.prompt.parse(reply.text)
    if verdict is None:
      self.monitor.record(f"unrecognised verdict {reply.text.strip()[:60]!r}", "verdict")
    else:
      self.monitor.record()
    return verdict


def at_least_one(value, key: str) -> int:
  """`value` as an int, or a ValueError naming config key `key` unless it is a whole number >= 1."""
  if isinstance(value, bool) or int(value) != value or int(value) < 1:
    raise ValueError(f"config key '{key}' is {value!r}; expected a whole number >= 1")
  return int(value)


@dataclasses.dataclass(frozen=True)
class Reply:
  """What `ask` got: the first choice's content, or None with why (`error`, of a `kind` in
  FAILURE_KINDS)."""
  text: Optional[str]
  error: str = ""
  kind: str = ""


def ask(url: str, body: dict, *, api_key: str = "", timeout: float = 30.0, retries: int = 2,
        backoff: float = 0.5) -> Reply:
  """POSTs `body` to an OpenAI-compatible `.../chat/completions` url. Transport errors and
  5xx/429 answers are retried `retries` times with a doubling pause; never raises."""
  data = json.dumps(body).encode()
  headers = {"Content-Type": "application/json"}
  if api_key:
    headers["Authorization"] = f"Bearer {api_key}"
  failed = Reply(None, "no attempt", "transport")
  attempts = retries + 1
  for attempt in range(attempts):
    if attempt:
      time.sleep(backoff * 2 ** (attempt - 1))
    try:
      req = urllib.request.Request(url, data=data, headers=headers)
      with urllib.request.urlopen(req, timeout=timeout) as resp:
        raw = resp.read()
    except urllib.error.HTTPError as e:
      failed = Reply(None, f"HTTP {e.code}{_http_detail(e)}", "http")
      if e.code in _RETRY_STATUS:
        continue
      return failed                 # 4xx: the request itself is wrong; retrying won't help
    except _TRANSPORT_ERRORS as e:
      failed = Reply(None, _transport_reason(e), "transport")
      continue
    text, why = _content(raw)       # a readable HTTP 200 is final, whatever it says
    return Reply(text) if why is None else Reply(None, f"unreadable reply ({why})", "reply")
  if attempts > 1:
    failed = dataclasses.replace(failed, error=f"{failed.error} ({attempts} attempts)")
  return failed


def chat_completion(url: str, body: dict, *, api_key: str = "", timeout: float = 30.0,
                    retries: int = 2, backoff: float = 0.5) -> Optional[str]:
  """`ask(...).text`: the first choice's message content, or None when the request failed or
  the reply has no readable content; never raises."""
  return ask(url, body, api_key=api_key, timeout=timeout, retries=retries, backoff=backoff).text


def _http_detail(e: urllib.error.HTTPError) -> str:
  """': <the start of the error body>' (e.g. a server's 'model not found'), or ''."""
  try:
    text = e.read(200).decode("utf-8", errors="replace").strip()
  except Exception:  # pylint: disable=broad-except   (the body is a courtesy; never raise)
    return ""
  return f": {' '.join(text.split())[:120]}" if text else ""


def _transport_reason(e: BaseException) -> str:
  inner = e.reason if isinstance(e, urllib.error.URLError) else e
  if isinstance(inner, http.client.RemoteDisconnected):
    return "connection closed without a reply"
  if isinstance(inner, ConnectionRefusedError):
    return "connection refused"
  if isinstance(inner, ConnectionResetError):
    return "connection reset"
  if isinstance(inner, (socket.timeout, TimeoutError)):
    return "timed out"
  return f"{type(inner).__name__}: {inner}"


def _content(raw: bytes) -> tuple:
  """(the first choice's message content, None), or (None, why) for any other shape."""
  try:
    reply = json.loads(raw.decode("utf-8", errors="replace"))
  except ValueError:
    return None, "not JSON"
  if not isinstance(reply, dict):
    return None, "not a JSON object"
  choices = reply.get("choices")
  if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
    return None, "no choices"
  message = choices[0].get("message")
  content = message.get("content") if isinstance(message, dict) else None
  return (content, None) if isinstance(content, str) else (None, "no message content")


class _Prefetch:
  """A judge callable that first only writes down what it is asked (answering None), then,
  after `fetch()`, answers from one `judge_many` of those questions (each distinct one once)."""

  def __init__(self, judge: OpenAIJudge):
    self.judge = judge
    self.asked: dict = {}
    self.verdicts: Optional[dict] = None

  def __call__(self, question: str, prediction: str, answers: Sequence[str]) -> Optional[bool]:
    key = (question, prediction, tuple(answers))
    if self.verdicts is None:
      self.asked[key] = None
      return None
    if key not in self.verdicts:      # asked only in the second pass: asked alone
      self.verdicts[key] = self.judge(question, prediction, list(answers))
    return self.verdicts[key]

  def fetch(self) -> None:
    keys = list(self.asked)
    self.verdicts = dict(zip(keys, self.judge.judge_many(keys)))


def batched(judge: Optional[OpenAIJudge], score: Callable[[Optional[Callable]], Any]) -> Any:
  """`score(judge_fn)` with every judge question it asks answered concurrently: a first pass
  with a recording `judge_fn` collects the questions, `judge.judge_many` answers them, and the
  second pass, whose result is returned, reads the verdicts. `score` must ask the same questions
  whatever the verdicts (each reward and metric here does); its first result is discarded.
  Without a judge, `score(None)`."""
  if judge is None:
    return score(None)
  pre = _Prefetch(judge)
  score(pre)
  pre.fetch()
  return score(pre)


def from_config(section, prompt: JudgePrompt = DEFAULT_PROMPT, *,
                where: str) -> Optional[OpenAIJudge]:
  """A judge from a config section's `judge_url` / `judge_model` / `judge_concurrency` /
  `judge_max_failure_rate` / `judge_failure_window` (None when the url is empty); `where` is
  the section's name in the config ('reward', 'eval'), for messages."""
  url = getattr(section, "judge_url", "") or ""
  if not url:
    return None
  return OpenAIJudge(url, section.judge_model, prompt=prompt,
                     concurrency=section.judge_concurrency,
                     max_failure_rate=section.judge_max_failure_rate,
                     failure_window=section.judge_failure_window, key_prefix=f"{where}.judge_")
