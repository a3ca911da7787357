"""A local OpenAI-compatible chat endpoint for tests: `serve(respond)` runs one whose replies
come from `respond(request_body) -> content`; None answers HTTP 500. Every request body is kept
in `.bodies`."""
import contextlib
import http.server
import json
import threading


@contextlib.contextmanager
def serve(respond):
  """Yields an object with `.url` (the …/v1 base), `.bodies` and a settable `.respond`."""
  state = type("ChatServer", (), {})()
  state.bodies, state.respond = [], respond

  class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802
      body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
      state.bodies.append(body)
      content = state.respond(body)
      if content is None:
        self.send_response(500)
        self.end_headers()
        return
      out = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]})
      self.send_response(200)
      self.send_header("Content-Type", "application/json")
      self.end_headers()
      self.wfile.write(out.encode())

    def log_message(self, *a):
      pass

  srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
  srv.daemon_threads = True
  threading.Thread(target=srv.serve_forever, daemon=True).start()
  state.url = f"http://127.0.0.1:{srv.server_address[1]}/v1"
  try:
    yield state
  finally:
    srv.shutdown()
