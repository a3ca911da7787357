"""The APEX pipeline's EM and F1 per dataset and their unweighted average (the paper's Tables 1-2
and "Avg."), not one mean pooled over every question: on hand-labelled rows, over seeds, on a
summary written before the datasets were kept (the CPU default's world: one row), and on the real
samples of the four datasets through the pipeline's own --data path (no model)."""
import json

import numpy as np
import pytest

from configs import apex_executor
from rlrag_jax.data import sources
from rlrag_jax.methods.apex import executor, pipeline

# 7 questions of three datasets, listed out of the paper's order
LABELS = ["musique", "hotpotqa", "musique", "bamboogle", "hotpotqa", "hotpotqa", "musique"]
EM = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0]
F1 = [1.0, 0.5, 0.25, 1.0, 1.0, 1.0, 0.0]


def test_per_dataset_rows_and_average_by_hand():
  t = pipeline.per_dataset(LABELS, EM, F1)
  assert list(t["datasets"]) == ["hotpotqa", "musique", "bamboogle"]      # the paper's order
  assert t["datasets"]["hotpotqa"] == {"em": pytest.approx(2 / 3), "f1": pytest.approx(2.5 / 3),
                                       "n": 3}
  assert t["datasets"]["musique"] == {"em": pytest.approx(1 / 3), "f1": pytest.approx(1.25 / 3),
                                      "n": 3}
  assert t["datasets"]["bamboogle"] == {"em": 1.0, "f1": 1.0, "n": 1}
  assert t["avg"]["em"] == pytest.approx((2 / 3 + 1 / 3 + 1.0) / 3)       # not 4 / 7
  assert t["avg"]["f1"] == pytest.approx((2.5 / 3 + 1.25 / 3 + 1.0) / 3)
  assert t["avg"]["em"] != pytest.approx(np.mean(EM))
  assert t["avg"]["datasets"] == 3
  rows, cols = pipeline.dataset_rows({"plan_rl/exec_sft_on": t, "plan_rl/exec_sft_off": t})
  assert cols == ["dataset", "n", "plan_rl EM", "plan_rl F1", "plan_rl/off EM", "plan_rl/off F1"]
  assert [r["dataset"] for r in rows] == ["HotpotQA", "MuSiQue", "Bamboogle", "Avg."]
  assert [r["n"] for r in rows] == [3, 3, 1, ""]
  assert rows[1]["plan_rl F1"] == pytest.approx(1.25 / 3)
  assert rows[-1]["plan_rl EM"] == pytest.approx(t["avg"]["em"])
  with pytest.raises(ValueError, match="one of each per question"):
    pipeline.per_dataset(LABELS, EM[:-1], F1)


def test_one_dataset_is_one_row():
  t = pipeline.per_dataset(["world"] * 4, [1.0, 0.0, 0.0, 1.0], [1.0, 0.5, 0.0, 1.0])
  assert t["avg"] == {"em": 0.5, "f1": 0.625, "datasets": 1}
  rows, _ = pipeline.dataset_rows({"naive_rag/exec_sft_on": t})
  assert rows == [{"dataset": "world", "n": 4, "naive_rag EM": 0.5, "naive_rag F1": 0.625}]


def _summary(seed_em, seed_f1, labels, ids):
  cells = {}
  for c in seed_em:
    t = pipeline.per_dataset(labels, seed_em[c], seed_f1[c])
    cells[c] = {"em": float(np.mean(seed_em[c])), "f1": float(np.mean(seed_f1[c])),
                "retrievals": 1.0, "n": len(labels), "by_dataset": t["datasets"],
                "avg_em": t["avg"]["em"], "avg_f1": t["avg"]["f1"]}
  return {"cells": cells, "per_question_em": seed_em, "per_question_f1": seed_f1, "ids": ids,
          "datasets": labels}


def test_aggregate_gives_each_dataset_and_the_average_over_seeds(tmp_path):
  ids = [f"q{i}" for i in range(len(LABELS))]
  em2 = [0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0]
  f1_2 = [0.5, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0]
  files = []
  for seed, (em, f1) in enumerate(((EM, F1), (em2, f1_2))):
    s = _summary({"plan_rl/exec_sft_on": em, "naive_rag/exec_sft_on": [0.0] * 7},
                 {"plan_rl/exec_sft_on": f1, "naive_rag/exec_sft_on": [0.0] * 7}, LABELS, ids)
    f = tmp_path / f"summary.seed_{seed}.json"
    f.write_text(json.dumps(s))
    files.append(str(f))
  agg = pipeline.aggregate(files, tmp_path / "agg", resamples=100)
  d = agg["datasets"]["plan_rl/exec_sft_on"]
  hot = [2 / 3, 2 / 3]                   # seed 0: q1, q4, q5 = 0, 1, 1; seed 1: 1, 1, 0
  mus = [1 / 3, 2 / 3]
  bam = [1.0, 0.0]
  assert d["HotpotQA"]["em"] == pytest.approx((np.mean(hot), np.std(hot), 2))
  assert d["MuSiQue"]["em"] == pytest.approx((np.mean(mus), np.std(mus), 2))
  assert d["Bamboogle"]["em"] == pytest.approx((np.mean(bam), np.std(bam), 2))
  assert d["MuSiQue"]["f1"][0] == pytest.approx(np.mean([1.25 / 3, 2.5 / 3]))
  avg = [np.mean([h, m, b]) for h, m, b in zip(hot, mus, bam)]
  assert d["Avg."]["em"] == pytest.approx((np.mean(avg), np.std(avg), 2))
  assert agg["cells"]["plan_rl/exec_sft_on"]["em"][0] == pytest.approx(np.mean(avg))
  assert [d[k]["n"] for k in ("HotpotQA", "MuSiQue", "Bamboogle")] == [3, 3, 1]
  text = agg["text"]
  row = next(l for l in text.splitlines() if l.startswith("| Avg. |"))
  assert f"{np.mean(avg):.3f} ± {np.std(avg):.3f}" in row
  assert "questions pooled over the 3 datasets" in text
  saved = json.loads((tmp_path / "agg" / "pipeline_seeds.json").read_text())
  assert saved["datasets"]["plan_rl/exec_sft_on"]["Avg."]["em"][0] == pytest.approx(np.mean(avg))


def test_a_summary_without_datasets_is_the_world_row(tmp_path):
  """A summary written before the datasets were kept (the committed CPU-default ones): the
  generated world's questions, its pooled EM and F1 as one row."""
  s = {"cells": {"plan_rl/exec_sft_on": {"em": 0.25, "f1": 0.3, "n": 4}},
       "per_question_em": {"plan_rl/exec_sft_on": [1.0, 0.0, 0.0, 0.0]},
       "ids": ["world-00001", "world-00004", "world-00007", "world-00009"],
       "planner": "p", "executor": "e", "planner_sft_step": 1, "data": "executor run's"}
  t = pipeline.cell_datasets(s, "plan_rl/exec_sft_on")
  assert t == {"datasets": {"world": {"em": 0.25, "f1": 0.3, "n": 4}},
               "avg": {"em": 0.25, "f1": 0.3, "datasets": 1}}
  report = pipeline.format_report(s)
  table = report.split("per dataset")[1].splitlines()[3:]
  assert [l.split() for l in table] == [["world", "4", "0.250", "0.300"]]      # no Avg. row
  assert pipeline.legacy_dataset({"ids": ["x"], "data": "musique:dev"}) == "musique"
  assert pipeline.legacy_dataset({"ids": ["x"], "data": "musique:dev,2wiki:dev"}) == \
      pipeline.UNLABELLED


def test_real_samples_are_scored_per_dataset(shared_data_dir):
  """The four datasets' real samples through the pipeline's --data path (use_eval_data, the
  loaders): each question counted under its own dataset, the report a row per dataset and
  Avg."""
  c = apex_executor.get_config("")
  pipeline.use_eval_data(c, "musique:dev:3,bamboogle:test:2,hotpotqa:dev:2,2wiki:dev:3")
  examples = sources.select(c.data, seed=0).eval
  # right on every second question
  traces = [executor.Trace(question=ex.question, plan=[ex.question],
                           answer=ex.answers[0] if k % 2 == 0 else "no idea")
            for k, ex in enumerate(examples)]
  summary, rows = pipeline.score_cell(None, examples, traces)
  labels = [r["dataset"] for r in rows]
  assert labels == ["musique"] * 3 + ["bamboogle"] * 2 + ["hotpotqa"] * 2 + ["2wiki"] * 3
  em = [1.0 if k % 2 == 0 else 0.0 for k in range(10)]
  assert [r["em"] for r in rows] == em
  assert list(summary["by_dataset"]) == ["hotpotqa", "2wiki", "musique", "bamboogle"]
  by_hand = {"musique": np.mean(em[0:3]), "bamboogle": np.mean(em[3:5]),
             "hotpotqa": np.mean(em[5:7]), "2wiki": np.mean(em[7:10])}
  for name, v in by_hand.items():
    assert summary["by_dataset"][name]["em"] == pytest.approx(v)
  assert summary["avg_em"] == pytest.approx(np.mean(list(by_hand.values())))
  assert summary["em"] == pytest.approx(0.5)                     # pooled: 5 of 10
  result = {"planner": "p", "executor": "e", "planner_sft_step": 0, "data": "real samples",
            "cells": {"no_planning/exec_sft_on": summary}}
  report = pipeline.format_report(result)
  table = report.split("per dataset")[1].splitlines()
  assert [l.split()[0] for l in table[3:]] == ["HotpotQA", "2Wiki", "MuSiQue", "Bamboogle",
                                                "Avg."]


def test_committed_seed_reports_are_what_their_summaries_give():
  """docs/results/apex_pipeline/apex_report.seed_N.txt: format_report of the committed
  summary.seed_N.json (written before the datasets were kept: the world, one row)."""
  import pathlib
  folder = pathlib.Path(__file__).resolve().parents[2] / "docs" / "results" / "apex_pipeline"
  files = sorted(folder.glob("summary.seed_*.json"))
  assert files
  for f in files:
    report = folder / f.name.replace("summary", "apex_report").replace(".json", ".txt")
    assert pipeline.format_report(json.loads(f.read_text())) == report.read_text(), report.name
