"""`sparkle_report.txt`: held-out F1 / EM / recall and cumulative Recall@k per retrieval step for
the reader alone, naive RAG and SPARKLE, before RL (SFT only) and after (tree or standard
rollout PPO), plus the last training tree's shape."""
from __future__ import annotations

import json
import pathlib

from rlrag_jax import runlog

# The evaluated variants: (metric prefix, label); the task evaluates each, the report tabulates.
VARIANTS = (("llm_", "reader alone (no retrieval)"), ("naive_", "naive RAG"),
            ("", "SPARKLE"))

COLUMNS = (("f1", "F1"), ("em", "EM"), ("recall", "Recall"), ("retrievals", "Retr"),
           ("steps", "Steps"), ("answered", "Answered"), ("latency_s", "s/q"))


def rows_of(summary: dict, checkpoint: str, variants, recall_cols) -> list:
  out = []
  for prefix, name in variants:
    if f"{prefix}f1" not in summary:
      continue
    row = {"checkpoint": checkpoint, "variant": name}
    for key, col in COLUMNS + recall_cols:
      v = summary.get(f"{prefix}{key}")
      row[col] = "-" if v is None else v
    out.append(row)
  return out


def truncation_line(summary: dict, caps: dict) -> str:
  """The held-out proxy calls that hit their token cap without a stop, per role: from an eval
  summary's per-question means of agent.truncation_counts (their ratio is the sums' ratio)."""
  from rlrag_jax.methods.sparkle import agent as agent_lib
  if "decisions" not in summary:
    return ""
  n = float(summary.get("n", 0))
  rates = agent_lib.truncation_rates(summary)
  parts = [f"{name}s {rates[f'truncated_{name}_rate']:.3f} "
           f"({summary[f'truncated_{name}s'] * n:.0f} of {summary[f'{name}s'] * n:.0f}, cap "
           f"{caps[role]})" for role, name in agent_lib.CALL_NAMES.items()]
  return "\n\nTruncated proxy calls (SPARKLE, held-out): " + ", ".join(parts)


def write(task, workdir: pathlib.Path) -> str:
  summary = json.loads((workdir / "eval_summary.json").read_text())
  after = summary["after"]
  k = task.agent_cfg.recall_k
  steps = sorted({int(key.rsplit("step", 1)[1]) for key in after
                  if key.startswith(f"recall@{k}_step")})
  recall_cols = tuple((f"recall@{k}_step{t}", f"R@{k} s{t}") for t in steps)
  rows = []
  rollout = task.settings.rollout
  if summary.get("before"):
    rows += rows_of(summary["before"], "SFT only", VARIANTS, recall_cols)
    rows += rows_of(after, f"{rollout}-rollout PPO", [v for v in VARIANTS if v[0] == ""],
                    recall_cols)
  else:
    rows += rows_of(after, "final", VARIANTS, recall_cols)
  cols = ["checkpoint", "variant"] + [c for _, c in COLUMNS + recall_cols]
  text = runlog.format_table(rows, cols, title=f"SPARKLE held-out evaluation "
                             f"(n={after.get('n', 0)})")
  text += truncation_line(after, task.max_new)
  if task.sft_counts:
    text += ("\n\nSFT warm-up: {kept} correct oracle trajectories of {oracle} "
             "({samples} samples)".format(**task.sft_counts))
  if task.last_forest:
    text += "\nLast training rollout, per question: " + ", ".join(
        f"{key} {v:.3f}" for key, v in task.last_forest.items() if isinstance(v, float))
  text += "\n"
  runlog.write_atomic(workdir / "sparkle_report.txt", text)
  print(text)
  return text
