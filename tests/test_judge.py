"""The OpenAI-compatible judge against a local HTTP server that misbehaves in every way we know:
it never raises, 'not judged' (None) is counted, transport failures and 5xx are retried."""
import http.server
import json
import socket
import struct
import threading
import time

import pytest

from rlrag_jax import judge
from rlrag_jax.methods.arena.task import ArenaTask
from rlrag_jax.methods.search.task import SearchTask


def _reply(content):
  return json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]})


class _Server(http.server.BaseHTTPRequestHandler):
  """Behaviour per request, popped from the class-level script (the last one repeats)."""
  script = []
  bodies = []

  def do_POST(self):  # noqa: N802
    _Server.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
    action = _Server.script.pop(0) if len(_Server.script) > 1 else _Server.script[0]
    kind, arg = action
    if kind == "hangup":                       # close without a status line
      self.close_connection = True
      self.connection.shutdown(socket.SHUT_RDWR)
      return
    if kind == "reset":                        # TCP RST
      self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
      self.connection.close()
      return
    if kind == "sleep":
      time.sleep(arg)
      kind, arg = "ok", _reply("yes")
    status, body = (200, arg) if kind == "ok" else (int(arg), "{}")
    self.send_response(status)
    self.send_header("Content-Type", "application/json")
    self.end_headers()
    self.wfile.write(body.encode())

  def log_message(self, *a):
    pass


@pytest.fixture
def server():
  srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Server)
  srv.daemon_threads = True
  threading.Thread(target=srv.serve_forever, daemon=True).start()
  _Server.bodies.clear()
  yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
  srv.shutdown()


def _judge(url, script, **kw):
  _Server.script[:] = script
  return judge.OpenAIJudge(url, "m", timeout=kw.pop("timeout", 2.0), backoff=0.01, **kw)


@pytest.mark.parametrize("name,script,verdict,failures,requests", [
    ("yes", [("ok", _reply("Yes."))], True, 0, 1),
    ("no", [("ok", _reply(" NO"))], False, 0, 1),
    ("content null", [("ok", _reply(None))], None, 1, 1),
    ("body not an object", [("ok", json.dumps(["yes"]))], None, 1, 1),
    ("body not JSON", [("ok", "<html>oops")], None, 1, 1),
    ("no choices", [("ok", json.dumps({"choices": []}))], None, 1, 1),
    ("neither yes nor no", [("ok", _reply("maybe"))], None, 1, 1),
    ("dropped connection, then yes", [("hangup", None), ("ok", _reply("yes"))], True, 0, 2),
    ("reset, then yes", [("reset", None), ("ok", _reply("yes"))], True, 0, 2),
    ("503 twice, then no", [("status", 503), ("status", 503), ("ok", _reply("no"))], False, 0, 3),
    ("always 500", [("status", 500)], None, 1, 3),
    ("always dropped", [("hangup", None)], None, 1, 3),
    ("400 is not retried", [("status", 400)], None, 1, 1),
])
def test_every_failure_is_not_judged_and_counted(server, name, script, verdict, failures,
                                                 requests):
  j = _judge(server, script)
  assert j("Q?", "Paris", ["Paris"]) is verdict, name
  assert j.failures == failures and len(_Server.bodies) == requests


def test_timeout_is_bounded(server):
  j = _judge(server, [("sleep", 3.0)], timeout=0.3, retries=1)
  t0 = time.time()
  assert j("Q?", "Paris", ["Paris"]) is None
  assert time.time() - t0 < 2.5 and j.failures == 1


def test_refused_connection(server):
  j = judge.OpenAIJudge("http://127.0.0.1:9/v1", "m", timeout=0.5, retries=1, backoff=0.01)
  assert j("Q?", "Paris", ["Paris"]) is None and j.failures == 1


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
