"""The APEX plan -> execute pipeline over two tiny trained runs: every Table 2 cell is
evaluated and written (report, summary, per-question traces), and the seed aggregation pairs
questions across runs."""
import json

import numpy as np
import pytest

from _deps import require
from configs import apex_executor, apex_planner
from rlrag_jax import trainer
from rlrag_jax.methods.apex import pipeline

pytestmark = pytest.mark.slow

TINY = dict(vocab_size=512, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
            num_kv_heads=1, head_dim=16)
WORLD = dict(seed=0, num_countries=12, num_cities=48, num_people=320, num_orgs=80, num_films=200,
             num_books=200, num_questions=200)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  root = tmp_path_factory.mktemp("apex_pipeline")
  p = apex_planner.get_config("")
  p.workdir = str(root / "planner")
  p.data.world = dict(WORLD)
  p.model.update(TINY)
  p.sft.steps, p.sft.batch_size = 2, 4
  p.rl.update(dict(steps=1, prompts_per_step=2, group_size=2, max_new_tokens=12))
  p.eval.update(dict(num_examples=2, max_new_tokens=12, batch_size=4))
  p.checkpoint.every = 1
  trainer.run(p, progress=False)
  e = apex_executor.get_config("")
  e.workdir = str(root / "executor")
  e.data.world = dict(WORLD)
  e.model.update(TINY)
  e.sft.steps, e.sft.batch_size = 2, 8
  e.eval.update(dict(num_examples=2, max_new_tokens=8, batch_size=4))
  e.apex.max_query_tokens, e.apex.max_answer_tokens = 6, 6
  res = trainer.run(e, progress=False)
  return root, res


def test_executor_run_evaluates_by_executing_gold_plans(runs):
  root, res = runs
  after = res.after["all"]
  assert after["n"] == 2 and 0.0 <= after["em"] <= 1.0
  assert after["calls"] >= 4            # at least check, query, answer, synthesis per question


def test_pipeline_writes_every_cell_and_traces(runs):
  root, _ = runs
  out = root / "out"
  result = pipeline.run_pipeline(str(root / "planner"), str(root / "executor"), out,
                                 num_examples=3)
  on = {c for c in result["cells"] if c.endswith("exec_sft_on")}
  assert on == {f"{c}/exec_sft_on" for c in pipeline.CELLS}
  assert result["planner_sft_step"] == 2            # the planner's config: its SFT end
  for cell in pipeline.CELLS:
    rows = [json.loads(l) for l in (out / "traces" / f"{cell}.exec_sft_on.jsonl").open()]
    assert [r["id"] for r in rows] == result["ids"]
    for r in rows:
      assert r["em"] in (0.0, 1.0) and isinstance(r["prediction"], str)
      assert len(r["steps"]) == len(r["plan"])
    if cell == "naive_rag":
      assert all(r["retrievals"] == 1 for r in rows)
    if cell == "no_planning":
      assert all(r["plan"] == [r["question"]] for r in rows)
    if cell == "gold_plan":
      assert all(r["plan"] == r["gold_plan"] for r in rows)
  s = result["cells"]["plan_rl/exec_sft_on"]
  assert 0.0 <= s["sepr"] <= 1.0 and 0.0 <= s["plan_fallback"] <= 1.0
  report = (out / "apex_report.txt").read_text()
  for label in pipeline.LABELS.values():
    assert label in report
  assert "n/a" in report                            # exec SFT off without --executor_base
  assert json.loads((out / "summary.json").read_text())["cells"] == result["cells"]
  # the Table 2 switches one at a time
  some = pipeline.run_pipeline(str(root / "planner"), str(root / "executor"), root / "some",
                               num_examples=2, cells=("no_planning", "plan_sft"))
  assert set(some["cells"]) == {"no_planning/exec_sft_on", "plan_sft/exec_sft_on"}
  with pytest.raises(ValueError, match="unknown"):
    pipeline.run_pipeline(str(root / "planner"), str(root / "executor"), root / "x",
                          cells=("plan_sft", "magic"))


def test_aggregate_pairs_questions_over_seeds(runs, tmp_path):
  root, _ = runs
  dirs = []
  for seed, ems in enumerate(([1, 0, 1], [1, 1, 0])):
    d = tmp_path / f"s{seed}"
    d.mkdir()
    per_q = {"plan_rl/exec_sft_on": ems, "naive_rag/exec_sft_on": [0, 0, 1]}
    cells = {k: {"em": float(np.mean(v)), "f1": float(np.mean(v))} for k, v in per_q.items()}
    (d / "summary.json").write_text(json.dumps({"cells": cells, "per_question_em": per_q}))
    dirs.append(str(d))
  agg = pipeline.aggregate(dirs, tmp_path / "agg", resamples=200)
  m, lo, hi = agg["diffs"]["plan_rl - naive_rag"]["ci"]
  assert m == pytest.approx(np.mean([1, 0, 0, 1, 1, -1]))
  assert lo <= m <= hi
  assert agg["diffs"]["plan_rl - naive_rag"]["per_seed"] == pytest.approx([1 / 3, 1 / 3])
  assert agg["cells"]["plan_rl/exec_sft_on"]["em"][0] == pytest.approx(2 / 3)
  assert (tmp_path / "agg" / "pipeline_seeds.md").exists()
  assert (tmp_path / "agg" / "pipeline_seeds.png").stat().st_size > 0


def test_paper_presets_train_on_real_data_and_run_the_pipeline(tmp_path, shared_data_dir):
  """`:paper` executor and planner shrunk onto tiny HF checkpoints and the MuSiQue samples: the
  executor's SFT is killed, resumes and finishes; the pipeline then runs every cell on MuSiQue
  dev, the 'exec SFT off' cells with the untrained checkpoint."""
  require("torch")
  from hf_tiny import E2E_HF, make_tiny_checkpoint
  ckpt = make_tiny_checkpoint(tmp_path, "qwen2", **E2E_HF)

  def executor_cfg():
    e = apex_executor.get_config("paper")
    e.workdir, e.model.path, e.data.dir = str(tmp_path / "executor"), str(ckpt), ""
    e.data.mix, e.data.eval_mix = ("musique:train",), ("musique:dev",)
    e.data.max_train, e.data.max_eval = 4, 2
    e.sft.steps, e.sft.epochs, e.sft.batch_size, e.sft.max_len = 2, 0, 2, 2048
    e.apex.max_hops, e.apex.max_query_tokens, e.apex.max_answer_tokens = 2, 6, 6
    # Short passages: the byte-level tokenizer makes a 200-word passage ~1.2k tokens, and the
    # pipeline's prefills over 3 of them per hop were most of this test's time; the plumbing
    # checked here does not depend on their length.
    e.apex.top_k, e.apex.max_passage_words = 2, 12
    e.retrieval.backend = "exact"
    e.eval.update(dict(num_examples=2, max_new_tokens=6, batch_size=2))
    e.checkpoint.every, e.checkpoint.keep = 1, 3
    e.model.attention_block = 64
    return e
  assert trainer.run(executor_cfg(), progress=False, stop_after=1) is None
  res = trainer.run(executor_cfg(), progress=False, resume=True)
  assert res.after["all"]["n"] == 2

  p = apex_planner.get_config("paper")
  p.workdir, p.model.path, p.data.dir = str(tmp_path / "planner"), str(ckpt), ""
  p.data.max_train, p.data.max_eval = 4, 2
  p.rl.update(dict(steps=1, epochs=0, prompts_per_step=2, group_size=2, micro_batches=1,
                   max_new_tokens=8))
  p.eval.update(dict(num_examples=2, max_new_tokens=8, batch_size=2, every=0))
  p.checkpoint.every = 1
  p.model.attention_block = 64
  trainer.run(p, progress=False)

  result = pipeline.run_pipeline(str(tmp_path / "planner"), str(tmp_path / "executor"),
                                 tmp_path / "out", data="musique:dev", num_examples=2,
                                 executor_base=str(ckpt))
  for cell in pipeline.CELLS:                       # plan_sft: the untrained HF planner
    for sft in ("on", "off"):
      assert result["cells"][f"{cell}/exec_sft_{sft}"]["n"] == 2
  assert result["planner_sft_step"] == 0
  rows = [json.loads(l) for l in (tmp_path / "out" / "traces" /
                                  "gold_plan.exec_sft_on.jsonl").open()]
  assert all(">>" not in s for r in rows for s in r["plan"])    # symbolic steps rewritten
