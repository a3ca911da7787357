"""The APEX planner through the task protocol: gold and paraphrased plans score 1, malformed
plans 0 (never an exception), one encoder call per batch; and a tiny end-to-end training run."""
import json

import numpy as np
import pytest

from configs import apex_planner
from rlrag_jax import trainer
from rlrag_jax.data import world_text
from rlrag_jax.methods.apex import plans
from rlrag_jax.tasks import Episode, get_task


class CountingEncoder:
  def __init__(self, inner):
    self.inner, self.calls = inner, 0

  # queries and passages without prefixes, as the packaged MiniLM
  encode_queries = encode_passages = property(lambda self: self.encode)

  def encode(self, texts, batch_size=64):
    self.calls += 1
    return self.inner.encode(texts, batch_size=batch_size)


@pytest.fixture(scope="module")
def task(tmp_path_factory):
  c = apex_planner.get_config("")
  c.workdir = str(tmp_path_factory.mktemp("apex_task"))
  c.data.world = dict(seed=0, num_questions=200)
  c.model.vocab_size = 512
  t = get_task("apex", c)
  t.scorer.encoder = CountingEncoder(t.scorer.encoder)
  return t


def _ep(ex, text):
  return Episode(example=ex, prompt_ids=[], completion_ids=[], loss_mask=[], text=text)


def _paraphrase(step):
  """The other world template of the step's relation, same subject (None when it has one)."""
  import re
  for templates in world_text.Q.values():
    for i, t in enumerate(templates):
      m = re.match("^" + re.escape(t).replace(re.escape("{x}"), "(.+)") + "$", step)
      if m and len(templates) == 2:
        return templates[1 - i].format(x=m.group(1))
  return None


def test_prompt_has_no_gold_and_target_renders_gold(task):
  ex = task.train[0]
  prompt = task.prompt_text(ex)
  assert ex.question in prompt and prompt.endswith("Plan:\n")
  assert all(s not in prompt for s in plans.gold_steps(ex) if s != ex.question)
  assert task.sft_target(ex) == plans.render(plans.gold_steps(ex))
  assert task.sft_target_ids(ex)[-1] == task.tokenizer.eos_token_id


def test_rewards_gold_paraphrase_extra_step_and_malformed(task):
  ex = next(e for e in task.train if len(e.decomposition) == 3
            and _paraphrase(e.decomposition[0].question))
  gold = plans.gold_steps(ex)
  para = [_paraphrase(gold[0])] + gold[1:]
  swapped = [gold[1], gold[0], gold[2]]    # step 1 now names #1, itself: the plan is malformed
  extra = gold + ["What is the capital of #3?"]
  eps = [_ep(ex, plans.render(gold)), _ep(ex, plans.render(para)), _ep(ex, plans.render(swapped)),
         _ep(ex, plans.render(extra)), _ep(ex, "no plan at all"), _ep(ex, "1. a?\n3. b?"),
         _ep(ex, "")]
  before = task.scorer.encoder.calls
  out = task.rewards(eps, step=1)
  assert task.scorer.encoder.calls == before + 1                  # one call for the batch
  totals = [o["total"] for o in out]
  assert totals[:2] == [1.0, 1.0]
  assert totals[3] == pytest.approx(2 * 0.75 * 1.0 / 1.75)        # P 3/4, R 1
  assert totals[2] == 0.0 and totals[4:] == [0.0, 0.0, 0.0]
  assert [o["fallback"] for o in out] == [0, 0, 1, 0, 1, 1, 1]
  assert out[0]["exact"] == 1.0 and out[1]["exact"] == 0.0
  assert out[3]["step_error"] == 1.0
  m = task.eval_metrics(eps)[3]
  assert m["sepr"] == totals[3] and m["step_abs_error"] == 1.0 and m["prediction"] == eps[3].text


def test_unknown_role_is_a_clear_error(tmp_path):
  c = apex_planner.get_config("")
  c.apex.role = "critic"
  with pytest.raises(ValueError, match="apex.role"):
    get_task("apex", c)


@pytest.mark.slow
def test_tiny_planner_run_writes_sepr(tmp_path):
  c = apex_planner.get_config("")
  c.workdir = str(tmp_path / "run")
  c.data.world = dict(seed=0, num_questions=200)
  c.data.max_eval = 8
  c.model.update(dict(vocab_size=512, hidden_size=32, intermediate_size=64, num_layers=1,
                      num_heads=2, num_kv_heads=1, head_dim=16))
  c.sft.steps, c.sft.batch_size = 3, 4
  c.rl.update(dict(steps=2, prompts_per_step=2, group_size=2, max_new_tokens=12,
                   entropy_coef=0.01))
  c.eval.update(dict(num_examples=4, max_new_tokens=12, batch_size=4))
  res = trainer.run(c, progress=False)
  summary = json.loads((tmp_path / "run" / "eval_summary.json").read_text())
  for point in ("before", "after"):
    assert 0.0 <= summary[point]["sepr"] <= 1.0 and summary[point]["n"] == 4
  rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  rl_rows = [r for r in rows if r["stage"] == "rl"]
  assert len(rl_rows) == 2 and all(np.isfinite(r["loss"]) and "reward/sepr" in r
                                   for r in rl_rows)
  assert res.after["all"]["sepr"] == summary["after"]["sepr"]


def test_gold_plan_file_and_symbolic_rewrite(task, monkeypatch):
  import dataclasses
  from rlrag_jax.data.schema import Step
  ex = task.train[0]
  sym = dataclasses.replace(ex, id="sym", decomposition=[
      Step("Anna Bell >> place of birth", "Rome"), Step("#1 >> country", "Italy")])
  assert task.gold(sym) == ["Where was Anna Bell born?", "Which country is #1 in?"]
  monkeypatch.setattr(task, "rewrite_symbolic", False)
  assert task.gold(sym) == ["Anna Bell >> place of birth", "#1 >> country"]
  monkeypatch.setattr(task, "gold_plans", {"sym": ["From the file?"]})
  assert task.gold(sym) == ["From the file?"]
  assert task.gold(ex) == plans.gold_steps(ex)
