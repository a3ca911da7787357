"""R2AG's evaluation options of the paper preset, at unit level: t = M/2 per dataset
(r2ag.eval.t_base_by_dataset) and appendix G.2's LLM accuracy through a fake judge endpoint."""
import types

import pytest

from rlrag_jax import evaluation, judge
from rlrag_jax.methods.r2ag import inference, parsing, prompts
from rlrag_jax.methods.r2ag.task import SteeringTask, parse_t_by_dataset
from rlrag_jax.tasks import EvalRow


def test_each_question_expands_its_own_t_base_queries():
  """One round, three base queries an output: t 1 (a HotpotQA question) opens one branch and
  retrieves one document, t 2 (a 2Wiki one) two."""
  text = parsing.render("x", ["a", "b", "c"], [])
  steer = lambda reqs: [text] * len(reqs)
  search = lambda queries, k: [[f"{q}{i}"] for i, q in enumerate(queries)]
  cfg = inference.TreeConfig(t_base=3, max_iterations=1)
  res = inference.expand(["q0", "q1"], steer, search, cfg, t_bases=[1, 2])
  assert [r.docs for r in res] == [["a0"], ["a1", "b2"]]
  every = inference.expand(["q0"], steer, search, cfg)
  assert every[0].docs == ["a0", "b1", "c2"]


def test_t_by_dataset_entries_and_their_error():
  assert parse_t_by_dataset(("hotpotqa:1", "2wiki:2")) == {"hotpotqa": 1, "2wiki": 2}
  with pytest.raises(ValueError, match=r"'r2ag.eval.t_base_by_dataset' entry 'musique'"):
    parse_t_by_dataset(("musique",))


def test_g2_verdicts():
  assert prompts.judge_verdict("Analysis:\n...\nValidation: [\u201cCorrect\u201d]") is True
  assert prompts.judge_verdict('Validation: ["Wrong"]') is False
  assert prompts.judge_verdict('Validation: ["Correct"] ... Validation: ["Wrong"]') is False
  assert prompts.judge_verdict("I think it is right") is None


def test_evaluation_gains_g2_judge_accuracy_through_a_fake_endpoint():
  from chat_server import serve
  ex = types.SimpleNamespace(question="Who?", answers=["Ann"], id="x", source="hotpotqa")
  from stub_task import StubTask
  task = StubTask(evaluate=lambda policy, chunk, rng: [
      EvalRow(e, p, {"recall": 1.0}) for e, p in zip(chunk, ["Ann", "Bob"])])
  reply = lambda body: ("Analysis: ok\nValidation: [\u201cCorrect\u201d]"
                        if "\u201cAnn\u201d" in body["messages"][1]["content"].split("Answer:")[1]
                        else 'Analysis: no\nValidation: ["Wrong"]')
  with serve(reply) as srv:
    j = judge.OpenAIJudge(srv.url, "gpt-4o", prompt=SteeringTask.judge_prompt)
    out = evaluation.evaluate(task, None, [ex, ex], progress=False, judge=j)
  assert [r["judge"] for r in out["rows"]] == [1.0, 0.0] and out["all"]["judge"] == 0.5
  # the two requests are in flight at once (the judge's pool): their arrival order is free
  assert all(b["messages"][0] == {"role": "system", "content": prompts.JUDGE_SYSTEM}
             for b in srv.bodies)
  assert sorted(b["messages"][1]["content"] for b in srv.bodies) == [
      f"Query: \u201cWho?\u201d\nLabel: \u201cAnn\u201d\nStudent\u2019s Answer: \u201c{a}\u201d"
      for a in ("Ann", "Bob")]
  assert all(b["max_tokens"] == prompts.JUDGE_MAX_TOKENS for b in srv.bodies)
