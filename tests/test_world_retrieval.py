"""The world-retrieval experiment's query builder: '#k' references resolved, gold ids carried."""
from rlrag_jax.data.schema import Example, Step
from rlrag_jax.experiments.world_retrieval import single_hop_queries


def test_single_hop_queries_resolve_references():
  ex = Example(id="q", question="?", answers=["Italy"], decomposition=[
      Step("Where was Anna Bell born?", "Rome", ["p1"]),
      Step("Which country is #1 in?", "Italy", ["p2"]),
      Step("Is #2 older than #9?", "yes", [])])        # comparison step: no passage, skipped
  assert single_hop_queries([ex]) == [("Where was Anna Bell born?", ["p1"], 0),
                                      ("Which country is Rome in?", ["p2"], 1)]
