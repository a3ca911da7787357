"""rollout.agents.drive: generator agents run side by side, one batched handler call per
request type per round, replies routed back to the program that asked."""
import dataclasses

import pytest

from rlrag_jax.rollout.agents import drive


@dataclasses.dataclass
class Gen:
  prompt: str


@dataclasses.dataclass
class Find:
  query: str


def agent(name, turns):
  seen = []
  for t in range(turns):
    text = yield Gen(f"{name}:{t}")
    hits = yield Find(text)
    seen.append(hits)
  return name, seen


def test_requests_are_batched_per_type_and_routed_back():
  gen_calls, find_calls = [], []

  def gen(reqs):
    gen_calls.append([r.prompt for r in reqs])
    return [r.prompt.upper() for r in reqs]

  def find(reqs):
    find_calls.append([r.query for r in reqs])
    return [f"hits({r.query})" for r in reqs]

  out = drive([agent("a", 2), agent("b", 1), agent("c", 0)], {Gen: gen, Find: find})
  assert out == [("a", ["hits(A:0)", "hits(A:1)"]), ("b", ["hits(B:0)"]), ("c", [])]
  assert gen_calls == [["a:0", "b:0"], ["a:1"]]
  assert find_calls == [["A:0", "B:0"], ["A:1"]]


def test_missing_handler_and_wrong_reply_count_are_clear_errors():
  with pytest.raises(TypeError, match="Find request"):
    drive([agent("a", 1)], {Gen: lambda reqs: ["x"] * len(reqs)})
  with pytest.raises(ValueError, match="1 replies for 2 requests"):
    drive([agent("a", 1), agent("b", 1)], {Gen: lambda reqs: ["x"], Find: lambda r: r})
  assert drive([], {}) == []
