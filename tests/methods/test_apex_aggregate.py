"""The APEX pipeline's aggregation over seeds, on hand-written summaries (no training): the EM
differences carry the pooled, hierarchical and t intervals of rlrag_jax.metrics."""
import json

import numpy as np
import pytest

from rlrag_jax import metrics
from rlrag_jax.methods.apex import pipeline


def test_aggregate_intervals_by_hand(tmp_path):
  per_q = [([1, 0, 1, 1], [0, 0, 1, 0]), ([1, 1, 0, 1], [0, 1, 0, 0]), ([1, 1, 1, 1], [1, 1, 1, 0])]
  dirs = []
  for seed, (rl, naive) in enumerate(per_q):
    d = tmp_path / f"s{seed}"
    d.mkdir()
    ems = {"plan_rl/exec_sft_on": rl, "naive_rag/exec_sft_on": naive}
    cells = {k: {"em": float(np.mean(v)), "f1": float(np.mean(v))} for k, v in ems.items()}
    (d / "summary.json").write_text(json.dumps({"cells": cells, "per_question_em": ems}))
    dirs.append(str(d))
  agg = pipeline.aggregate(dirs, tmp_path / "agg", resamples=300)
  v = agg["diffs"]["plan_rl - naive_rag"]
  groups = [[x - y for x, y in zip(rl, naive)] for rl, naive in per_q]
  assert v["per_seed"] == pytest.approx([0.5, 0.5, 0.25])
  assert v["ci"] == metrics.paired_bootstrap(sum(groups, []), 300)
  assert v["ci_hier"] == metrics.hierarchical_bootstrap(groups, 300)
  assert v["ci_t"] == pytest.approx(metrics.t_interval([0.5, 0.5, 0.25]))
  assert v["claim"] == metrics.claim(v["ci_hier"], v["ci_t"])
  t = v["ci_t"]
  assert f"t [{t[1]:+.3f}, {t[2]:+.3f}] (vs 0: {v['claim']}; p " in agg["text"]
  assert np.isnan(v["ci_crossed"][1])             # no question ids: nothing pairs across seeds
  assert v["p"] == pytest.approx(metrics.t_pvalue([0.5, 0.5, 0.25]))
  saved = json.loads((tmp_path / "agg" / "pipeline_seeds.json").read_text())
  assert saved["diffs"]["plan_rl - naive_rag"]["ci_t"] == pytest.approx(list(t))


def test_aggregate_pairs_questions_by_id_and_reads_committed_summaries(tmp_path):
  """With the summaries' question ids the crossed interval pairs questions across seeds by id
  (a seed listing its questions in another order gives the same intervals), and a summary .json
  can be named directly (a committed copy)."""
  per_q = [([1, 0, 1, 1], [0, 0, 1, 0]), ([1, 1, 0, 1], [0, 1, 0, 0]), ([1, 1, 1, 1], [1, 1, 1, 0])]
  ids = ["a", "b", "c", "d"]
  files = []
  for seed, (rl, naive) in enumerate(per_q):
    order = [3, 1, 0, 2] if seed == 1 else [0, 1, 2, 3]      # seed 1 lists them shuffled
    ems = {"plan_rl/exec_sft_on": [rl[i] for i in order],
           "naive_rag/exec_sft_on": [naive[i] for i in order]}
    cells = {k: {"em": float(np.mean(v)), "f1": float(np.mean(v))} for k, v in ems.items()}
    f = tmp_path / f"summary.seed_{seed}.json"
    f.write_text(json.dumps({"cells": cells, "per_question_em": ems,
                             "ids": [ids[i] for i in order]}))
    files.append(str(f))
  v = pipeline.aggregate(files, tmp_path / "agg", resamples=300)["diffs"]["plan_rl - naive_rag"]
  tables = [dict(zip(ids, (x - y for x, y in zip(rl, naive)))) for rl, naive in per_q]
  assert v["ci_crossed"] == metrics.crossed_bootstrap(tables, 300)
  assert v["ci_hier"] == metrics.hierarchical_bootstrap(
      [[x - y for x, y in zip(rl, naive)] for rl, naive in per_q], 300)
  assert v["claim"] == metrics.claim(v["ci_hier"], v["ci_crossed"], v["ci_t"])
