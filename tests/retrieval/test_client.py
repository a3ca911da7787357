"""RemoteRetriever (rlrag_jax.retrieval.client) against stand-in servers written here (Search-R1's
reply shapes, a server that fails and recovers, one that always fails: calls counted on the
server side) and end to end: CorpusSearch with retrieval.url set against our server gives the
ids the in-process search gives."""
import math

import ml_collections
import pytest

from serve_helpers import free_socket, protocol_stand_in, serving, small_corpus
from rlrag_jax import judge as judge_lib
from rlrag_jax.retrieval import client as client_lib
from rlrag_jax.retrieval import serve
from rlrag_jax.retrieval.client import RemoteRetriever, split_contents


def _doc(q, j):
  # a title with inner quotes and a text of two lines: the split must keep both whole
  return {"id": f"{q}#{j}", "contents": f'"Title "{q}" {j}"\nfirst line {j}\nsecond line'}


def _rows(state):
  """The /retrieve reply of `state['mode']`: 'scores' or 'docs' (the two Search-R1 shapes), or
  'echo' (the query names the id; the passage is another one)."""
  def rows(body):
    out = []
    for q in body["queries"]:
      docs = [_doc(q, j) for j in range(body["topk"])]
      if state["mode"] == "echo":
        docs = [{"id": q, "contents": '"Elsewhere"\nanother corpus'}]
      if state["mode"] == "scores":
        docs = [{"document": d, "score": 1.0 - j / 10} for j, d in enumerate(docs)]
      out.append(docs)
    return out
  return rows


def _failing(state):
  """Fails the first `state['failures']` calls ('always': every call)."""
  return state["failures"] == "always" or state["calls"] <= state["failures"]


@pytest.fixture(scope="module")
def stand_in():
  state = {"mode": "scores", "failures": 0, "fail_status": 503, "calls": 0, "failing": _failing}
  with serving(protocol_stand_in(state, _rows(state))) as url:
    yield url, state


def _reset(state, **kw):
  state.update({"mode": "scores", "failures": 0, "fail_status": 503, "calls": 0}, **kw)


@pytest.mark.parametrize("mode", ["scores", "docs"])
def test_both_search_r1_reply_shapes_are_read(stand_in, mode):
  url, state = stand_in
  _reset(state, mode=mode)
  with RemoteRetriever(url, retries=0) as r:
    hits = r.search(["alpha", "beta"], k=2)
  assert [[h.id for h in row] for row in hits] == [["alpha#0", "alpha#1"], ["beta#0", "beta#1"]]
  h = hits[1][1]
  assert h.title == 'Title "beta" 1' and h.text == "first line 1\nsecond line"
  if mode == "scores":
    assert [x.score for x in hits[0]] == [1.0, 0.9]
  else:
    assert all(math.isnan(x.score) for row in hits for x in row)
  assert state["calls"] == 1


def test_requests_hold_at_most_max_queries(stand_in):
  url, state = stand_in
  _reset(state)
  with RemoteRetriever(url, retries=0, max_queries=2) as r:
    hits = r.search(["a", "b", "c", "d", "e"], k=1)
  assert [row[0].id for row in hits] == ["a#0", "b#0", "c#0", "d#0", "e#0"]
  assert state["calls"] == 3


def test_a_server_that_fails_then_recovers_is_retried(stand_in):
  url, state = stand_in
  _reset(state, failures=2)
  with RemoteRetriever(url, retries=3, backoff_s=0.0) as r:
    hits = r.search(["q"], k=1)
    assert hits[0][0].id == "q#0"
    assert r.attempts == 3 and r.monitor.failures == 0 and r.monitor.calls == 1
  assert state["calls"] == 3


def test_an_always_failing_server_stops_the_run_after_the_threshold(stand_in):
  url, state = stand_in
  _reset(state, failures="always")
  # 3 attempts a search; more than 0.4 x 5 = 2 failed searches stop the run
  r = RemoteRetriever(url, retries=2, backoff_s=0.0, max_failure_rate=0.4, failure_window=5)
  with r:
    assert r.search(["q"], 1) == [[]]          # a failed search: no passages, counted
    assert r.search(["q", "p"], 1) == [[], []]
    with pytest.raises(judge_lib.EndpointFailing, match="retrieval.url_max_failure_rate"):
      r.search(["q"], 1)
    assert state["calls"] == 9                  # 3 searches x (1 + 2 retries)
    with pytest.raises(judge_lib.EndpointFailing):
      r.search(["q"], 1)                        # stopped: no further request is sent
  assert state["calls"] == 9
  assert r.monitor.failures == 3 and r.monitor.by_kind["http"] == 3


def test_a_4xx_is_not_retried(stand_in):
  url, state = stand_in
  _reset(state, failures="always", fail_status=422)
  with RemoteRetriever(url, retries=3, backoff_s=0.0, max_failure_rate=1.0) as r:
    assert r.search(["q"], 1) == [[]]
    assert "HTTP 422" in r.monitor.last_error
  assert state["calls"] == 1


def test_a_refused_connection_is_retried_and_counted():
  sock = free_socket()               # bound, never listening: connections are refused
  try:
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with RemoteRetriever(url, retries=2, backoff_s=0.0, max_failure_rate=1.0) as r:
      assert r.search(["q"], 1) == [[]]
      assert r.attempts == 3 and r.monitor.by_kind["transport"] == 1
  finally:
    sock.close()


@pytest.mark.parametrize("contents,title,text", [
    ('"Title"\ntext', "Title", "text"),
    ('""\ntext\nmore', "", "text\nmore"),
    ("no title line", "", "no title line"),
    ('"A "quoted" name"\nbody', 'A "quoted" name', "body"),
    ("Bare title\nbody", "Bare title", "body"),
])
def test_split_contents_the_flashrag_way(contents, title, text):
  assert split_contents(contents) == (title, text)


@pytest.mark.parametrize("reply", [[], {"result": "x"}, {"result": [[]]},
                                   {"result": [[{"contents": '"T"\nx'}], []]},
                                   {"result": [[{"id": "1"}], []]},
                                   {"result": [[{"document": {"id": "1", "contents": "x"},
                                                 "score": "high"}], []]}])
def test_replies_of_another_shape_are_refused(reply):
  with pytest.raises(client_lib.ReplyError):
    client_lib.parse_result(reply, 2)


def _config(tmp_path, url=""):
  from rlrag_jax import config_base
  return ml_collections.ConfigDict(dict(method="t", workdir=str(tmp_path),
                                        retrieval=config_base.retrieval_config(
                                            cache_dir=str(tmp_path / "cache"), url=url)))


class _Selection:
  corpus = small_corpus()
  train = eval = val = ()


def test_corpus_search_through_our_server_returns_the_in_process_ids(tmp_path, minilm):
  from rlrag_jax.retrieval.corpus_search import CorpusSearch
  local = CorpusSearch(_config(tmp_path), _Selection(), minilm)
  queries = ["Niels Bohr and the orchard", "the desert of Ada Lovelace", "comet 23",
             "a glacier", "violin"]
  want = local.search(queries, 4)
  app = serve.create_app(serve.open_index(local.index_dir), max_batch=8, max_wait_ms=5)
  with serving(app) as url:
    remote = CorpusSearch(_config(tmp_path, url), _Selection(), minilm)
    assert isinstance(remote.retriever, RemoteRetriever)
    got = remote.search(queries, 4)
    remote.retriever.close()
  assert got == want
  assert remote.pairs(got[0]) == local.pairs(want[0])
  assert remote.retriever.monitor.failures == 0


def test_corpus_search_reads_passages_it_lacks_and_warns_once_of_another_corpus(
    tmp_path, minilm, stand_in, caplog):
  from rlrag_jax.retrieval.corpus_search import CorpusSearch
  url, state = stand_in
  _reset(state, mode="scores")
  env = CorpusSearch(_config(tmp_path, url), _Selection(), minilm)
  assert env.search(["zeta"], 1) == [["zeta#0"]]          # an id the local corpus lacks
  assert env.pairs(["zeta#0"]) == [('Title "zeta" 0', "first line 0\nsecond line")]
  _reset(state, mode="echo")
  with caplog.at_level("WARNING", logger="rlrag_jax.retrieval"):
    assert env.search(["doc3", "doc4"], 1) == [["doc3"], ["doc4"]]
  said = [r.getMessage() for r in caplog.records if "retrieval.url" in r.getMessage()]
  assert len(said) == 1 and "'doc3'" in said[0] and "Elsewhere" in said[0]
  env.retriever.close()
