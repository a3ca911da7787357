"""The OpenAI-compatible judge against a local HTTP server that misbehaves in every way we know:
one call never raises, 'not judged' (None) is counted with its reason, transport failures and
5xx are retried; a batch is asked concurrently, in order; the failure monitor warns past 5% of
the recent calls and stops the run past its configured rate (also for SPARKLE's reader)."""
import http.server
import json
import logging
import socket
import struct
import threading
import types

import pytest

from rlrag_jax import judge
from rlrag_jax.methods.arena.task import ArenaTask
from rlrag_jax.methods.search.task import SearchTask
from rlrag_jax.methods.sparkle import readers


def _reply(content):
  return json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]})


class _Server(http.server.BaseHTTPRequestHandler):
  """Behaviour per request, popped from the class-level script (the last one repeats). With
  `barrier` set, every request waits there first (a broken barrier answers 500)."""
  script = []
  bodies = []
  barrier = None
  release = threading.Event()        # set at teardown: 'sleep' requests stop sleeping
  lock = threading.Lock()
  in_flight = max_in_flight = 0
  on_request = None                  # if set, called per request; what it returns is noted
  noted = []

  def do_POST(self):  # noqa: N802
    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    with _Server.lock:
      _Server.bodies.append(body)
      if _Server.on_request is not None:
        _Server.noted.append(_Server.on_request())
      action = _Server.script.pop(0) if len(_Server.script) > 1 else _Server.script[0]
      _Server.in_flight += 1
      _Server.max_in_flight = max(_Server.max_in_flight, _Server.in_flight)
    kind, arg = action
    try:
      if _Server.barrier is not None:
        _Server.barrier.wait()
    except threading.BrokenBarrierError:
      kind, arg = "status", 500
    with _Server.lock:                # before the reply: the client's next request comes after
      _Server.in_flight -= 1
    try:
      self._respond(body, kind, arg)
    except (BrokenPipeError, ConnectionResetError):
      pass                            # the client gave up (a timeout test): nothing to say

  def _respond(self, body, kind, arg):
    if kind == "hangup":                       # close without a status line
      self.close_connection = True
      self.connection.shutdown(socket.SHUT_RDWR)
      return
    if kind == "reset":                        # TCP RST
      self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
      self.connection.close()
      return
    if kind == "sleep":
      _Server.release.wait(arg)
      kind, arg = "ok", _reply("yes")
    if kind == "echo":                         # the verdict is the prediction itself
      text = body["messages"][-1]["content"]
      kind, arg = "ok", _reply(text.split("Predicted answer: ", 1)[-1].split("\n", 1)[0])
    status, out = (200, arg) if kind == "ok" else (int(arg), "{}")
    self.send_response(status)
    self.send_header("Content-Type", "application/json")
    self.end_headers()
    self.wfile.write(out.encode())

  def log_message(self, *a):
    pass


@pytest.fixture
def server():
  srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Server)
  srv.daemon_threads = True
  _Server.bodies.clear()
  _Server.on_request = None
  _Server.noted.clear()
  _Server.barrier, _Server.in_flight, _Server.max_in_flight = None, 0, 0
  _Server.release.clear()
  threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
  yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
  _Server.release.set()
  srv.shutdown()
  srv.server_close()


def _judge(url, script, **kw):
  _Server.script[:] = script
  return judge.OpenAIJudge(url, "m", timeout=kw.pop("timeout", 2.0), backoff=0.01, **kw)


def _refused_url():
  """A local port nothing listens on."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  return f"http://127.0.0.1:{port}/v1"


@pytest.mark.parametrize("name,script,verdict,failures,requests,reason", [
    ("yes", [("ok", _reply("Yes."))], True, 0, 1, ""),
    ("no", [("ok", _reply(" NO"))], False, 0, 1, ""),
    ("content null", [("ok", _reply(None))], None, 1, 1, "unreadable reply (no message content)"),
    ("body not an object", [("ok", json.dumps(["yes"]))], None, 1, 1,
     "unreadable reply (not a JSON object)"),
    ("body not JSON", [("ok", "<html>oops")], None, 1, 1, "unreadable reply (not JSON)"),
    ("no choices", [("ok", json.dumps({"choices": []}))], None, 1, 1,
     "unreadable reply (no choices)"),
    ("neither yes nor no", [("ok", _reply("maybe"))], None, 1, 1, "unrecognised verdict 'maybe'"),
    ("dropped connection, then yes", [("hangup", None), ("ok", _reply("yes"))], True, 0, 2, ""),
    ("reset, then yes", [("reset", None), ("ok", _reply("yes"))], True, 0, 2, ""),
    ("503 twice, then no", [("status", 503), ("status", 503), ("ok", _reply("no"))], False, 0, 3,
     ""),
    ("always 500", [("status", 500)], None, 1, 3, "HTTP 500: {} (3 attempts)"),
    ("always dropped", [("hangup", None)], None, 1, 3,
     "connection closed without a reply (3 attempts)"),
    ("400 is not retried", [("status", 400)], None, 1, 1, "HTTP 400: {}"),
])
def test_every_failure_is_not_judged_and_counted(server, name, script, verdict, failures,
                                                 requests, reason):
  j = _judge(server, script)
  assert j("Q?", "Paris", ["Paris"]) is verdict, name
  assert j.failures == failures and j.calls == 1 and len(_Server.bodies) == requests
  assert j.monitor.last_error == reason


def test_timeout_is_bounded(server):
  """The server would answer 'yes' only after 120 s (or at teardown): a None 'timed out' on both
  attempts is what proves each attempt was cut at `timeout`, with no clock read in the test."""
  j = _judge(server, [("sleep", 120.0)], timeout=0.3, retries=1)
  assert j("Q?", "Paris", ["Paris"]) is None and j.failures == 1
  assert j.monitor.last_error == "timed out (2 attempts)" and len(_Server.bodies) == 2


def test_refused_connection():
  j = judge.OpenAIJudge(_refused_url(), "m", timeout=0.5, retries=1, backoff=0.01)
  assert j("Q?", "Paris", ["Paris"]) is None and j.failures == 1
  assert j.monitor.last_error == "connection refused (2 attempts)"
  assert j.monitor.counts()["failures_transport"] == 1


def test_empty_prediction_is_wrong_without_a_call(server):
  j = _judge(server, [("status", 500)])
  assert j("Q?", "  ", ["Paris"]) is False and j.judge_many([("Q?", "", ["x"])]) == [False]
  assert j.calls == j.failures == 0 and not _Server.bodies


def test_each_method_asks_with_its_own_prompt(server):
  for task_cls, must_contain in ((ArenaTask, "correct answer list is:"),
                                 (SearchTask, "You are an evaluation assistant.")):
    j = _judge(server, [("ok", _reply("yes"))], prompt=task_cls.judge_prompt)
    assert j("Who?", "paris", ["paris", "city of light"]) is True
    body = _Server.bodies[-1]
    assert body["temperature"] == 0.0 and body["model"] == "m"
    text = body["messages"][-1]["content"]
    assert must_contain in text and "paris | city of light" in text
  assert ArenaTask.judge_prompt.template != SearchTask.judge_prompt.template


# ------------------------------------------------------------------ batches, concurrently
def test_judge_many_overlaps_requests_and_keeps_their_order(server):
  """Every request waits until 4 are in flight: only a batch asked 4 at a time gets through (a
  sequential one breaks the barrier after its timeout and is answered 500)."""
  _Server.barrier = threading.Barrier(4, timeout=10)
  j = _judge(server, [("echo", None)], concurrency=4, retries=0, timeout=20)
  preds = ["yes", "no", "yes", "maybe"]
  assert j.judge_many([("Q?", p, ["a"]) for p in preds]) == [True, False, True, None]
  assert _Server.max_in_flight == 4 and j.calls == 4 and j.failures == 1


def test_judge_many_is_bounded_by_its_pool(server):
  _Server.barrier = threading.Barrier(2, timeout=10)
  j = _judge(server, [("echo", None)], concurrency=2, retries=0, timeout=20)
  preds = ["yes", "no"] * 4
  assert j.judge_many([("Q?", p, ["a"]) for p in preds]) == [p == "yes" for p in preds]
  assert _Server.max_in_flight == 2


def test_batched_asks_each_distinct_question_once_in_one_batch(server):
  j = _judge(server, [("echo", None)], concurrency=4)
  seen = []

  def score(judge_fn):
    out = [judge_fn("Q?", p, ["a"]) for p in ("yes", "no", "yes", "")]
    seen.append(out)
    return out
  assert judge.batched(j, score) == [True, False, True, False]
  assert seen[0] == [None] * 4                 # the recording pass, discarded
  assert len(_Server.bodies) == 2 and j.calls == 2
  assert judge.batched(None, lambda judge_fn: judge_fn) is None


# ------------------------------------------------------------------ the failure monitor
def _monitor(rate=0.5, window=10):
  return judge.FailureMonitor("judge", "http://x/v1/chat/completions", max_failure_rate=rate,
                              window=window, key_prefix="reward.judge_",
                              consequence="scores as a wrong answer")


def test_monitor_counts_calls_failures_their_kinds_and_the_recent_rate():
  m = _monitor(rate=1.0)
  span = judge.Span([m, m])                    # one monitor counted once
  for _ in range(3):
    m.record()
  m.record("HTTP 503 (3 attempts)", "http")
  m.record("connection refused", "transport")
  assert (m.calls, m.failures, m.last_error) == (5, 2, "connection refused")
  assert m.recent_failure_rate == pytest.approx(0.4)
  assert span.metrics() == {"judge/calls": 5.0, "judge/failures": 2.0,
                            "judge/failure_rate": pytest.approx(0.4),
                            "judge/failures_transport": 1.0, "judge/failures_http": 1.0}
  later = judge.Span([m])
  m.record()
  assert later.metrics()["judge/calls"] == 1.0 and later.metrics()["judge/failure_rate"] == 0.0
  with pytest.raises(ValueError, match="kind"):
    m.record("odd", "weather")


def test_monitor_warns_once_past_five_percent(caplog, monkeypatch):
  monkeypatch.setattr(logging.getLogger("rlrag_jax"), "propagate", True)
  m = _monitor(rate=1.0, window=100)
  with caplog.at_level(logging.WARNING, logger="rlrag_jax.judge"):
    for _ in range(19):
      m.record()
    m.record("HTTP 503", "http")               # 1 of 20: 5%, not past it
    assert not caplog.records
    m.record("HTTP 502", "http")               # 2 of 21
    m.record("HTTP 502", "http")               # still past: no second warning
  # One warning: a second one would name 3 of the last 22. Counted by message, because in one
  # full-suite run caplog held this same record twice (once emitted: stderr had one line),
  # depending on which tests the worker ran before.
  messages = sorted({r.getMessage() for r in caplog.records})
  assert len(messages) == 1
  msg = messages[0]
  assert "judge at http://x/v1/chat/completions: 2 of the last 21 calls failed" in msg
  assert "HTTP 502" in msg and "reward.judge_max_failure_rate" in msg


def test_monitor_stops_past_the_rate_with_a_message_that_says_why():
  m = _monitor(rate=0.5, window=10)
  for _ in range(5):
    m.record("HTTP 503 (3 attempts)", "http")
  m.check()                                    # 5 of 10: not more than half
  m.record("connection refused (3 attempts)", "transport")
  with pytest.raises(judge.EndpointFailing) as e:
    m.check()
  msg = str(e.value)
  for part in ("judge at http://x/v1/chat/completions", "6 of the last 6 calls failed",
               "reward.judge_max_failure_rate=0.5", "reward.judge_failure_window=10",
               "last error: connection refused (3 attempts)", "scores as a wrong answer",
               "raise 'reward.judge_max_failure_rate'"):
    assert part in msg, part
  m.record()
  with pytest.raises(judge.EndpointFailing):   # it stays stopped
    m.check()


def test_old_failures_age_out_of_the_window():
  m = _monitor(rate=0.5, window=10)
  for outcome in [False] * 5 + [True] * 10 + [False] * 5:
    m.record() if outcome else m.record("HTTP 500", "http")
    m.check()                                  # never more than 5 of the last 10
  assert m.failures == 10
  m.record("HTTP 500", "http")
  with pytest.raises(judge.EndpointFailing, match="6 of the last 10"):
    m.check()


def test_max_rate_zero_stops_at_the_first_failure_and_one_never():
  zero, one = _monitor(rate=0.0, window=200), _monitor(rate=1.0, window=3)
  for _ in range(5):
    one.record("HTTP 500", "http")
  one.check()
  zero.record("HTTP 500", "http")
  with pytest.raises(judge.EndpointFailing):
    zero.check()


@pytest.mark.parametrize("key,value,match", [
    ("judge_max_failure_rate", 1.5, "'eval.judge_max_failure_rate' is 1.5; expected a rate in"),
    ("judge_max_failure_rate", -0.1, "'eval.judge_max_failure_rate' is -0.1"),
    ("judge_failure_window", 0, "'eval.judge_failure_window' is 0; expected a whole number >= 1"),
    ("judge_failure_window", -3, "'eval.judge_failure_window' is -3"),
    ("judge_concurrency", 0, "'eval.judge_concurrency' is 0"),
])
def test_config_ranges_are_checked_and_name_the_key(key, value, match):
  from rlrag_jax import config_base
  section = config_base.trainer_config("arena", "/tmp/unused").eval
  section.judge_url = "http://127.0.0.1:1/v1"
  assert judge.from_config(section, where="eval").concurrency == 16     # the defaults are valid
  section[key] = value
  with pytest.raises(ValueError, match=match):
    judge.from_config(section, where="eval")


def test_a_fractional_window_is_refused():    # (a ConfigDict already refuses it for an int key)
  with pytest.raises(ValueError, match="'reward.judge_failure_window' is 2.5"):
    _monitor(window=2.5)


def _join_new_pool_threads(before):
  """Waits for the batch's worker threads to finish the calls they had under way (each ends
  after one request; no timeout is involved), so the counts below are final."""
  for t in threading.enumerate():
    if t not in before and t.name.startswith("judge-pool"):
      t.join()


def test_a_dead_judge_stops_a_batch():
  """Refused connections (each fails at once): the window (4 calls, rate 0.5) trips at the 3rd
  failure, and no call starts after that, so at most `concurrency - 1` more calls (one already
  under way in each other worker) are made, however fast the failures come."""
  workers = 4
  j = judge.OpenAIJudge(_refused_url(), "m", retries=0, concurrency=workers,
                        max_failure_rate=0.5, failure_window=4, key_prefix="reward.judge_")
  before = set(threading.enumerate())
  with pytest.raises(judge.EndpointFailing, match="connection refused") as e:
    j.judge_many([("Q?", "Paris", ["Paris"])] * 40)
  assert "3 of the last 3 calls failed" in str(e.value)
  _join_new_pool_threads(before)
  assert 3 <= j.calls <= 3 + (workers - 1) and j.failures == j.calls


def test_a_judge_that_dies_mid_batch_starts_no_call_after_the_trip(server):
  """The endpoint answers 'yes' to its first 10 requests and 503 from then on (a latch flipped by
  the server's own count). The server notes, for every request, whether the judge's monitor had
  already stopped when it arrived: at most `concurrency - 1` requests arrive after the trip (one
  already under way in each other worker), none of the batch's later items is asked, and a
  second batch asks nothing."""
  workers, healthy = 4, 10
  j = _judge(server, [("ok", _reply("yes"))] * healthy + [("status", 503)], retries=0,
             concurrency=workers, max_failure_rate=0.5, failure_window=4)
  _Server.on_request = lambda: j.monitor.stopped
  before = set(threading.enumerate())
  with pytest.raises(judge.EndpointFailing, match="HTTP 503"):
    j.judge_many([("Q?", "Paris", ["Paris"])] * 200)
  _join_new_pool_threads(before)
  after_trip = sum(_Server.noted)
  assert after_trip <= workers - 1
  # Before the trip: the 10 good ones and at most 3 + 3 failures (3 of the last 4 recorded
  # calls failed; at most 3 late successes, in flight when the endpoint died, sit among them).
  assert healthy + 3 <= len(_Server.bodies) <= healthy + 6 + (workers - 1)
  assert j.calls == len(_Server.bodies) and j.failures == len(_Server.bodies) - healthy
  n = len(_Server.bodies)
  with pytest.raises(judge.EndpointFailing):
    j.judge_many([("Q?", "Paris", ["Paris"])] * 5)
  assert len(_Server.bodies) == n


def test_evaluation_reports_the_judge_calls_and_failures(server):
  from rlrag_jax import evaluation
  from rlrag_jax.tasks import Episode
  from stub_task import StubTask

  class Task(StubTask):
    def rollout(self, policy, examples, rng, *, group_size, greedy):
      return [Episode(ex, [], [], [], ex.pred) for ex in examples]

    def eval_metrics(self, eps):
      return [{"em": 0.0, "prediction": ep.text} for ep in eps]
  examples = [types.SimpleNamespace(question="Q?", answers=["a"], pred=p)
              for p in ("yes", "no", "maybe", "")]
  j = _judge(server, [("echo", None)])
  out = evaluation.evaluate(Task(), None, examples, batch_size=3, progress=False, judge=j)
  assert [r["judge"] for r in out["rows"]] == [1.0, 0.0, 0.0, 0.0]
  assert (out["all"]["judge/calls"], out["all"]["judge/failures"],
          out["all"]["judge/failures_verdict"]) == (3.0, 1.0, 1.0)
  assert out["all"]["judge/failure_rate"] == pytest.approx(1 / 3)


def test_progress_bar_shows_the_failures():
  from rlrag_jax.training import report

  class Bar:
    def update(self, n):
      pass

    def set_postfix(self, d):
      self.postfix = d
  rows, bar = [], Bar()
  rlog = types.SimpleNamespace(write=lambda step, stage, m: rows.append(m))
  report.log_step(rlog, 5, "rl", {"loss": 1.0, "judge/calls": 64, "judge/failures": 3,
                                  "judge/failure_rate": 3 / 64}, 5, bar)
  assert "judge_failed=3/64 (5%)" in bar.postfix["rl"]
  assert rows[0]["judge/failures"] == 3.0


# ------------------------------------------------------------------ SPARKLE's endpoint reader
def test_endpoint_reader_asks_concurrently_and_counts_its_failures(server):
  _Server.barrier = threading.Barrier(3, timeout=10)
  _Server.script[:] = [("ok", _reply("<think>a")), ("status", 400), ("ok", _reply("<think>c"))]
  r = readers.EndpointReader(server, "m", timeout=20, concurrency=3, max_failure_rate=1.0,
                             failure_window=10)
  out = r([("Q?", [], [])] * 3)
  assert _Server.max_in_flight == 3
  assert sorted(out) == ["", "<think>a</think>", "<think>c</think>"]
  span = judge.Span(r.monitors())
  _Server.barrier = None
  _Server.script[:] = [("status", 400)]
  assert r([("Q?", [], [])]) == [""]
  assert span.metrics()["reader/failures_http"] == 1.0 and r.failures == 2
  assert r.monitor.last_error == "HTTP 400: {}" and r.monitor.calls == 4
  assert readers.LMReader.monitors(None) == []


def test_endpoint_reader_stops_past_its_rate(server):
  _Server.script[:] = [("status", 400)]
  r = readers.EndpointReader(server, "m", timeout=5, concurrency=2, max_failure_rate=0.5,
                             failure_window=2)
  with pytest.raises(judge.EndpointFailing) as e:
    r([("Q?", [], [])] * 6)
  msg = str(e.value)
  assert msg.startswith("reader at http://127.0.0.1:") and "HTTP 400" in msg
  assert "sparkle.reader.max_failure_rate=0.5" in msg and "malformed reader step" in msg
