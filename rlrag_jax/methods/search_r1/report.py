"""The Search-R1 evaluation report: exact match per dataset with a 95% bootstrap interval over
its questions, the average over datasets, and the published row of the same model beside them.

Published rows: Search-R1 (Jin et al. 2025, arXiv 2503.09516), the main results table (the
brief for this code calls it Table 3 of v3/v5; other write-ups cite the same rows as Table 2 of
v3: we could not open the paper to check the number), exact match of Qwen2.5-7B trained with
PPO, base and instruct. The 7B instruct row's multi-hop values (HotpotQA 0.370, 2Wiki 0.414,
MuSiQue 0.146, Bamboogle 0.368) are also quoted in APEX-Searcher's Table 2
(shared/papers/apex-searcher.txt). Rows we cannot state with confidence are kept with every value
None ("unknown"): Qwen2.5-3B base and instruct (we remember two different 3B rows, and cannot
tell which version of the paper holds which), and every GRPO row. Fill them from the paper
before comparing with them.

The average is the unweighted mean of the per-dataset EMs, as the paper's "Avg." column; its
interval resamples questions within each dataset (`metrics.stratified_bootstrap`). When a
dataset is missing, the average covers the datasets present and the published average beside it
is recomputed over the same datasets (so both sides average the same sets).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from rlrag_jax import metrics

DATASETS = ("nq", "triviaqa", "popqa", "hotpotqa", "2wiki", "musique", "bamboogle")


def _row(*values) -> dict:
  return dict(zip(DATASETS, values))


_UNKNOWN = _row(*[None] * len(DATASETS))
PUBLISHED = {
    "qwen2.5-7b-base-ppo": _row(0.480, 0.638, 0.457, 0.433, 0.382, 0.196, 0.432),
    "qwen2.5-7b-instruct-ppo": _row(0.393, 0.610, 0.397, 0.370, 0.414, 0.146, 0.368),
    "qwen2.5-3b-base-ppo": dict(_UNKNOWN),
    "qwen2.5-3b-instruct-ppo": dict(_UNKNOWN),
    "qwen2.5-7b-base-grpo": dict(_UNKNOWN),
    "qwen2.5-7b-instruct-grpo": dict(_UNKNOWN),
    "qwen2.5-3b-base-grpo": dict(_UNKNOWN),
    "qwen2.5-3b-instruct-grpo": dict(_UNKNOWN),
}
# The paper's own averages of the two known rows (its "Avg." column).
PUBLISHED_AVG = {"qwen2.5-7b-base-ppo": 0.431, "qwen2.5-7b-instruct-ppo": 0.385}


def _num(v: Optional[float]) -> str:
  return "unknown" if v is None else f"{v:.3f}"


def format_report(rows: list, datasets: list, missing: dict, published: str = "",
                  resamples: int = 2000, seed: int = 0) -> str:
  """The report as text. `rows`: per-question dicts with 'dataset' and 'em' (evaluation's
  rows); `datasets`: the evaluation's datasets in order; `missing`: {dataset: why} for those
  whose file was not found (listed in their place, not dropped); `published`: a key of
  PUBLISHED or ''."""
  datasets = list(datasets) + [d for d in missing if d not in datasets]
  by = {d: [float(r["em"]) for r in rows if r.get("dataset") == d] for d in datasets}
  pub = PUBLISHED.get(published) if published else None
  head = f"{'dataset':<10} {'n':>5}  {'EM':>5}  {'95% CI':<15}"
  if pub is not None:
    head += f"  published ({published})"
  lines = ["Search-R1 protocol: exact match per dataset (95% bootstrap interval over questions)",
           head]
  present = []
  for d in datasets:
    if d in missing:
      lines.append(f"{d:<10} {'-':>5}  missing: {missing[d]}")
      continue
    if not by[d]:
      lines.append(f"{d:<10} {0:>5}  no questions evaluated")
      continue
    em, lo, hi = metrics.paired_bootstrap(by[d], resamples, seed)
    present.append(d)
    line = f"{d:<10} {len(by[d]):>5}  {em:.3f}  [{lo:.3f}, {hi:.3f}]"
    if pub is not None:
      line += f"  {_num(pub.get(d))}"
    lines.append(line)
  avg, lo, hi = metrics.stratified_bootstrap([by[d] for d in present], resamples, seed)
  shown = len(present)
  total = len(datasets)
  line = (f"{'average':<10} {shown:>2}/{total:<2}  {avg:.3f}  [{lo:.3f}, {hi:.3f}]" if present
          else f"{'average':<10} {0:>2}/{total:<2}  no dataset evaluated")
  if pub is not None and present:
    known = [pub.get(d) for d in present]
    if any(v is None for v in known):
      line += "  unknown"
    elif shown == len(DATASETS) and published in PUBLISHED_AVG:
      line += f"  {PUBLISHED_AVG[published]:.3f}"
    else:
      line += f"  {float(np.mean(known)):.3f} (same datasets)"
  lines.append(line)
  lines.append("average: the unweighted mean of the datasets' EMs (the paper's Avg.); interval: "
               "questions resampled within each dataset")
  if published and pub is None:
    lines.append(f"published row {published!r}: not in the table")
  return "\n".join(lines)
