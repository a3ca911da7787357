"""SPARKLE's plug-and-play pieces against a local OpenAI-compatible server: the endpoint reader
(one step per call, stop strings, a failed request read as a malformed step) and the offline
triple extraction command (resumable, empty and failed replies counted)."""
import json

import pytest

from chat_server import serve
from rlrag_jax.data.schema import CorpusRecord
from rlrag_jax.methods.sparkle import extract_triples, parsing, readers


def test_endpoint_reader_asks_one_step_and_closes_the_tag_it_stopped_on():
  def reply(body):     # requests go out concurrently: answer by content, not arrival order
    seen = "<think>I need X</think>" in body["messages"][0]["content"]
    return "<answer>Paris" if seen else "<think>I need X"

  with serve(reply) as chat:
    r = readers.EndpointReader(chat.url, "m", style="paper", timeout=5)
    out = r([("Q?", [("Doc", "text")], []), ("Q?", [], ["I need X"])])
    assert out == ["<think>I need X</think>", "<answer>Paris</answer>"]
    assert [parsing.parse_thought(o).kind for o in out] == ["think", "answer"]
    first, second = sorted(chat.bodies, key=lambda b: "I need X" in b["messages"][0]["content"])
    assert first["stop"] == ["</think>", "</answer>"] and first["temperature"] == 0.0
    assert "Context: [1] Doc: text" in first["messages"][0]["content"]
    assert "<think>I need X</think>" in second["messages"][0]["content"]
    # A 500 (retried, then given up): an empty, malformed step; the next request still works.
    chat.respond = lambda body: None
    out = r([("Q?", [], [])])
    assert out == [""] and r.failures == 1
    chat.respond = lambda body: "<think>done</think>"
    assert parsing.parse_thought(out[0]).kind == "malformed"
    assert r([("Q?", [], [])]) == ["<think>done</think>"]


def test_reasoning_endpoint_reader_sends_no_stops():
  with serve(lambda body: "First line\n\\boxed{42}") as chat:
    r = readers.EndpointReader(chat.url, "m", reasoning=True, timeout=5)
    out = r([("Q?", [], [])])
    assert "stop" not in chat.bodies[0] and "\\boxed" in chat.bodies[0]["messages"][0]["content"]
    assert parsing.parse_thought(out[0], reasoning=True) == parsing.Thought("answer", "42")


def test_extract_triples_is_resumable_and_counts_failures(tmp_path):
  docs = [CorpusRecord(id=f"d{i}", title=f"T{i}", text=f"text {i}") for i in range(5)]

  def respond(body):
    text = body["messages"][0]["content"]
    if "(T1)" in text:
      return None                                     # fails (500)
    if "(T2)" in text:
      return "nothing to extract"                     # no triple: written empty
    i = text.split("(T", 1)[1][0]
    return f"<T{i}; has; v{i}>, <T{i}; named; n{i}>, <; bad; >"
  out = tmp_path / "triples.jsonl"
  with serve(respond) as chat:
    ask = extract_triples.endpoint_ask(chat.url, "m")
    counts = extract_triples.extract(docs, ask, out, batch=2, progress=False)
    assert counts == {"asked": 5, "written": 4, "empty": 1, "failed": 1, "already": 0}
    rows = {r["id"]: r["triples"] for r in map(json.loads, out.read_text().splitlines())}
    assert rows["d0"] == [["T0", "has", "v0"], ["T0", "named", "n0"]] and rows["d2"] == []
    assert "d1" not in rows
    # The rerun asks only the failed document.
    asked = len(chat.bodies)
    chat.respond = lambda body: "<T1; has; v1>"
    counts = extract_triples.extract(docs, ask, out, progress=False)
    assert counts["asked"] == 1 and counts["already"] == 4 and len(chat.bodies) == asked + 1
  assert extract_triples.read_done(out)["d1"] == [["T1", "has", "v1"]]
  (tmp_path / "bad.jsonl").write_text('{"id": "x"}\n')
  with pytest.raises(ValueError, match="bad.jsonl:1"):
    extract_triples.read_done(tmp_path / "bad.jsonl")


def test_trajectories_from_an_endpoint_proxy_keep_the_correct_ones(tmp_path):
  """The world oracle behind a chat endpoint plays the stronger proxy; a scripted reader and
  retriever stand in for the task's. Correct trajectories are read back as SFT samples."""
  import types
  from rlrag_jax.data import world
  from rlrag_jax.methods.sparkle import agent as agent_lib
  from rlrag_jax.methods.sparkle import rewards, trajectories
  from rlrag_jax.methods.sparkle.triples import TripleStore
  from test_sparkle_agent import Scripted
  from test_sparkle_oracle import HashEncoder
  w = world.build(seed=0)
  examples = w.split("train")[:4]
  s = Scripted(w, examples)
  cue = {"Retrieve?": "rd", "Query:": "qf", "Select:": "ki"}

  def respond(body):
    text = body["messages"][0]["content"]
    if "Lantern" in text or examples[1].question in text:
      return "I refuse"                          # the second question goes wrong
    role = next(r for c, r in cue.items() if text.rstrip().endswith(c))
    return s.propose(role, [text], True)[0][0]
  enc = HashEncoder()
  cfg = agent_lib.AgentConfig(max_steps=12, top_triples=60)
  gold = {ex.question: ex for ex in examples}
  task = types.SimpleNamespace(
      agent_cfg=cfg, _read=lambda requests, rows_per_call: s.read(requests),
      env=types.SimpleNamespace(search=s.search, embed=enc.encode, pairs=s.docs),
      store=TripleStore.from_records(w.corpus, enc), target_ids=lambda t: [1],
      score_state=lambda ex, st: rewards.system_reward(
          context_ids=st.context, context_texts=[], gold_ids=ex.gold_ids,
          prediction=st.prediction, answers=ex.answers, cfg=rewards.RewardConfig()))
  out = tmp_path / "traj.jsonl"
  with serve(respond) as chat:
    propose = trajectories.endpoint_proposer(chat.url, "m", {"rd": 8, "qf": 64, "ki": 32})
    counts = trajectories.collect(task, examples, propose, out, batch=2, progress=False)
    assert counts == {"asked": 4, "correct": 3, "already": 0}
    assert trajectories.collect(task, examples, propose, out, progress=False)["asked"] == 0
  got = trajectories.read_trajectories(out)
  assert set(got) == {str(ex.id) for k, ex in enumerate(examples) if k != 1}
  roles = [r for r, _, _ in got[str(examples[0].id)]]
  assert roles[:3] == ["rd", "qf", "ki"] and set(roles) == {"rd", "qf", "ki"}
  first = got[str(examples[0].id)]
  assert first[0][2] == parsing.YES and parsing.QUERY in first[1][2]
  assert gold[examples[0].question].answers
