"""The retrieval server (rlrag_jax.retrieval.serve) over real HTTP on 127.0.0.1: Search-R1's request
and both reply shapes against the in-process Retriever, concurrent requests each answered with
their own results, every bad request refused with the field named (the server serving on), and
/health."""
import concurrent.futures
import json

import httpx
import pytest

from serve_helpers import serving, small_corpus
from rlrag_jax.retrieval import Hit, Retriever
from rlrag_jax.retrieval import serve

MAX_TOPK, MAX_QUERIES = 10, 8
QUERIES = ["Marie Curie and the violin", "a comet in the night", "who wrote about the glacier",
           "Alan Turing harbour", "volcano number 17", "library of Emmy Noether"]


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory, minilm):
  folder = tmp_path_factory.mktemp("served_index")
  Retriever.build(small_corpus(), minilm, backend="exact").save(folder)
  return folder


@pytest.fixture(scope="module")
def reference(index_dir, minilm):
  """The same saved index searched in process: what the server must answer."""
  return Retriever.load(index_dir, minilm)


@pytest.fixture(scope="module")
def url(index_dir):
  index = serve.open_index(index_dir)
  app = serve.create_app(index, max_batch=16, max_wait_ms=20, max_topk=MAX_TOPK,
                         max_queries=MAX_QUERIES)
  with serving(app) as u:
    yield u


def _post(url, body, **kw):
  return httpx.post(f"{url}/retrieve", json=body, timeout=60.0, **kw)


def _check_rows(rows, expected, with_scores):
  assert len(rows) == len(expected)
  for row, want in zip(rows, expected):
    docs = [d["document"] for d in row] if with_scores else row
    assert [d["id"] for d in docs] == [h.id for h in want]
    assert [d["contents"] for d in docs] == [f'"{h.title}"\n{h.text}' for h in want]
    if with_scores:
      assert [d["score"] for d in row] == pytest.approx([h.score for h in want], abs=1e-5)
    else:
      assert all(set(d) == {"id", "contents"} for d in docs)


def test_search_r1_request_and_both_reply_shapes_match_the_in_process_retriever(url, reference):
  expected = reference.search(QUERIES[:4], 3)
  r = _post(url, {"queries": QUERIES[:4], "topk": 3, "return_scores": True})   # Search-R1's
  assert r.status_code == 200 and set(r.json()) == {"result"}
  _check_rows(r.json()["result"], expected, with_scores=True)
  r = _post(url, {"queries": QUERIES[:4], "topk": 3})         # documents only
  assert r.status_code == 200
  _check_rows(r.json()["result"], expected, with_scores=False)
  r = _post(url, {"queries": QUERIES[:2]})                    # topk: the server's default, 3
  _check_rows(r.json()["result"], reference.search(QUERIES[:2], serve.DEFAULT_TOPK), False)
  r = _post(url, {"queries": QUERIES[4:], "topk": MAX_TOPK, "return_scores": True})
  _check_rows(r.json()["result"], reference.search(QUERIES[4:], MAX_TOPK), with_scores=True)


def test_concurrent_requests_each_get_their_own_answer(url, reference):
  # 16 requests at once, of different queries, depths and shapes: batched together by the
  # server, each must still get exactly its own rows.
  jobs = []
  for i in range(16):
    qs = [QUERIES[(i + j) % len(QUERIES)] + f" {i}" for j in range(1 + i % 3)]
    jobs.append((qs, 1 + i % 5, i % 2 == 0))
  expected = [reference.search(qs, k) for qs, k, _ in jobs]

  def ask(job):
    qs, k, scores = job
    with httpx.Client(timeout=60.0) as client:
      return client.post(f"{url}/retrieve", json={"queries": qs, "topk": k,
                                                  "return_scores": scores})

  with concurrent.futures.ThreadPoolExecutor(16) as pool:
    replies = list(pool.map(ask, jobs))
  for (_, _, scores), r, want in zip(jobs, replies, expected):
    assert r.status_code == 200
    _check_rows(r.json()["result"], want, with_scores=scores)


BAD = [
    # (name, raw body or JSON value, status, field)
    ("not_json", b"{queries: [", 400, "body"),
    ("not_an_object", [["who?"]], 400, "body"),
    ("queries_missing", {"topk": 3}, 422, "queries"),
    ("queries_a_string", {"queries": "who wrote it?"}, 422, "queries"),
    ("queries_empty", {"queries": []}, 422, "queries"),
    ("query_not_a_string", {"queries": ["ok", 3]}, 422, "queries"),
    ("query_blank", {"queries": ["ok", "  "]}, 422, "queries"),
    ("too_many_queries", {"queries": [f"q{i}" for i in range(MAX_QUERIES + 1)]}, 422, "queries"),
    ("topk_a_string", {"queries": ["ok"], "topk": "3"}, 422, "topk"),
    ("topk_a_float", {"queries": ["ok"], "topk": 2.5}, 422, "topk"),
    ("topk_a_bool", {"queries": ["ok"], "topk": True}, 422, "topk"),
    ("topk_zero", {"queries": ["ok"], "topk": 0}, 422, "topk"),
    ("topk_above_max", {"queries": ["ok"], "topk": MAX_TOPK + 1}, 422, "topk"),
    ("return_scores_a_string", {"queries": ["ok"], "return_scores": "yes"}, 422, "return_scores"),
    ("return_scores_an_int", {"queries": ["ok"], "return_scores": 1}, 422, "return_scores"),
    ("unknown_field", {"queries": ["ok"], "top_k": 3}, 422, "top_k"),
]


@pytest.mark.parametrize("name,body,status,field", BAD, ids=[b[0] for b in BAD])
def test_a_bad_request_is_refused_naming_the_field_and_the_server_serves_on(
    url, reference, name, body, status, field):
  del name
  if isinstance(body, bytes):
    r = httpx.post(f"{url}/retrieve", content=body, timeout=60.0,
                   headers={"Content-Type": "application/json"})
  else:
    r = _post(url, body)
  assert r.status_code == status, r.text
  reply = r.json()
  assert set(reply) == {"error", "field"} and reply["field"] == field
  assert reply["error"]
  good = _post(url, {"queries": QUERIES[:1], "topk": 2, "return_scores": True})
  assert good.status_code == 200
  _check_rows(good.json()["result"], reference.search(QUERIES[:1], 2), with_scores=True)


@pytest.mark.parametrize("method,path,status", [("GET", "/retrieve", 405),
                                                ("POST", "/search", 404)])
def test_a_wrong_route_answers_in_the_same_shape(url, method, path, status):
  r = httpx.request(method, f"{url}{path}", json={"queries": ["ok"]}, timeout=60.0)
  assert r.status_code == status
  assert r.json()["field"] is None and path in r.json()["error"]


def test_health_describes_the_index(url, index_dir, reference):
  r = httpx.get(f"{url}/health", timeout=60.0)
  assert r.status_code == 200
  h = r.json()
  saved = json.loads((index_dir / "manifest.json").read_text())
  assert h["status"] == "ok" and h["n"] == len(small_corpus()) == saved["n"]
  assert h["encoder"] == saved["encoder"] == reference.encoder_id
  assert h["backend"] == saved["backend"] == "exact"
  assert h["manifest"]["d"] == saved["d"]


def test_parse_request_reads_what_search_r1_sends_and_fills_defaults():
  limits = serve.Limits(max_topk=5, max_queries=4, default_topk=3)
  assert serve.parse_request(b'{"queries": ["a", "b"]}', limits) == (["a", "b"], 3, False)
  assert serve.parse_request(b'{"queries": ["a"], "topk": null, "return_scores": true}',
                             limits) == (["a"], 3, True)
  assert serve.parse_request(b'{"queries": ["a"], "topk": 5, "return_scores": false}',
                             limits) == (["a"], 5, False)


class _BrokenIndex:
  """Fails any search holding the query 'boom'; else one made-up hit a query."""
  manifest = {"n": 1, "encoder": "none", "backend": "test"}

  def search(self, queries, k):
    del k
    if "boom" in queries:
      raise RuntimeError("the index broke")
    return [[Hit(id=q, score=0.5, title="T", text="x")] for q in queries]


def test_a_failing_search_answers_500_in_the_same_shape_and_the_server_serves_on():
  with serving(serve.create_app(_BrokenIndex(), max_batch=1)) as u:
    r = _post(u, {"queries": ["boom"]})
    assert r.status_code == 500
    assert r.json() == {"error": "search failed: RuntimeError: the index broke", "field": None}
    r = _post(u, {"queries": ["fine"], "return_scores": True})
    assert r.status_code == 200
    assert r.json() == {"result": [[{"document": {"id": "fine", "contents": '"T"\nx'},
                                     "score": 0.5}]]}
