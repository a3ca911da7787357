"""`r2ag_report.txt`: held-out retrieval and QA per variant, before RL (the SFT warm-up: our
stand-in for the paper's prompted R2AG-p) and after, plus the RR-Forest after pruning.
`r2ag_forest.json`: the forest's per-level counts and the pruned trees of spent forests."""
from __future__ import annotations

import json
import pathlib

from rlrag_jax import runlog

VARIANTS = (("sr_", "single-step retrieval (SR@k)"), ("", "R2AG top-1"),
            ("base_", "R2AG base-only top-1"), ("top2_", "R2AG top-2"))
COLUMNS = (("recall", "Recall"), ("full_recall", "FR"), ("at_k", "@K"), ("map", "mAP"),
           ("em", "EM"), ("f1", "F1"), ("iterations", "Iter"),
           ("latency_retrieval_s", "T_r s"), ("latency_generation_s", "T_g s"))


def rows_of(summary: dict, checkpoint: str) -> list:
  out = []
  for prefix, name in VARIANTS:
    if f"{prefix}recall" not in summary:
      continue
    row = {"checkpoint": checkpoint, "variant": name}
    for key, col in COLUMNS:
      v = summary.get(f"{prefix}{key}")
      row[col] = "-" if v is None else v
    out.append(row)
  return out


def _share(a: float, b: float) -> str:
  return f"{a / b:.3f}" if b else "-"


def later_steps_text(summary: dict) -> str:
  """Premature stops after the first round, at branches with and without a non-gold
  document (means per question pooled into shares; task.later_step_counts)."""
  lines = []
  for name in ("before", "after"):
    m = summary.get(name) or {}
    steps, noisy = m.get("later_steps", 0.0), m.get("later_noisy", 0.0)
    if not steps:
      continue
    pre, pre_noisy = m.get("later_premature_stops", 0.0), m.get("later_noisy_premature_stops",
                                                                 0.0)
    label = "SFT only" if name == "before" else "after RL" if summary.get("before") else "final"
    lines.append(f"  {label:<9} {steps:5.2f} steps a question, {noisy / steps:.3f} with a "
                 f"non-gold document; premature stops: noisy {_share(pre_noisy, noisy)}, "
                 f"clean {_share(pre - pre_noisy, steps - noisy)}")
  if not lines:
    return ""
  return ("\n\nSteering steps after the first round (top-1 tree); a stop before every gold "
          "document is on the branch is premature\n" + "\n".join(lines))


def write(task, workdir: pathlib.Path) -> str:
  summary = json.loads((workdir / "eval_summary.json").read_text())
  rows = []
  if summary.get("before"):
    rows += rows_of(summary["before"], "SFT only (R2AG-p stand-in)")
  rows += rows_of(summary["after"], "after RL" if summary.get("before") else "final")
  cols = ["checkpoint", "variant"] + [c for _, c in COLUMNS]
  text = runlog.format_table(rows, cols, title="R2AG held-out evaluation "
                             f"(n={summary['after'].get('n', 0)})")
  text += later_steps_text(summary)
  forest = task.forest.summary()
  text += "\n\nRR-Forest (trees of the spent forests, pruned to positive-weight branches)\n"
  text += "\n".join(f"  {k}: {v:.3f}" if isinstance(v, float) else f"  {k}: {v}"
                    for k, v in forest.items())
  text += f"\n  forests started: {task.forest.forests}\n"
  runlog.write_atomic(workdir / "r2ag_report.txt", text)
  runlog.write_atomic(workdir / "r2ag_forest.json", json.dumps(
      {"summary": forest, "levels": task.forest.history,
       "pruned_trees": task.forest.finished[:50]}, indent=1))
  print(text)
  return text
