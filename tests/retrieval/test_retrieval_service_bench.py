"""The load test's client loop (rlrag_jax.bench.retrieval_service.run_clients): bounded by count,
every request and every error counted, checked against the requests a stand-in server saw."""

import pytest

from serve_helpers import protocol_stand_in, serving
from rlrag_jax.bench import retrieval_service


@pytest.mark.parametrize("fail", [False, True])
def test_the_client_loop_is_bounded_by_count_and_counts_every_request(fail):
  state = {"calls": 0, "queries": [], "failing": lambda _: fail}
  reply = lambda body: [[{"document": {"id": "1", "contents": '"T"\nx'}, "score": 1.0}]]
  with serving(protocol_stand_in(state, reply)) as url:
    # the time bound (600 s) is never reached: each client stops after its 4 requests
    raw = retrieval_service.run_clients(url, ["q0", "q1", "q2"], clients=3, seconds=600,
                                        max_requests=4)
  assert state["calls"] == 12 and set(state["queries"]) <= {"q0", "q1", "q2"}
  s = retrieval_service.summarize(raw)
  assert s["requests"] == 12
  if fail:
    assert s["errors"] == 12 and not raw["latencies_s"] and "HTTP 503" in raw["error_examples"][0]
  else:
    assert s["errors"] == 0 and len(raw["latencies_s"]) == 12
    assert 0 < s["p50_ms"] <= s["p99_ms"]
