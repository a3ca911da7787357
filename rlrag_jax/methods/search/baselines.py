"""The search agent against two reference pipelines, on the same examples, retriever and weights.

The command in experiments/search_baselines.py runs them on a checkpoint.

Pipelines (`SearchTask.rollout(pipeline=...)`), all greedy, all scored by `eval_metrics`:
  agent         the trained policy with its tool loop (up to `tool.max_turns` searches);
  no_retrieval  answer directly: the completion is forced to open with "<think>I know this.</think>"
                and no search is served;
  naive_rag     one retrieval of the question itself (top `search.eval.naive_k`, 5 by default)
                shown as the first <information> block, then the policy reflects and answers; no
                further search is served.
Metrics per dataset (`Example.source`): F1, EM, accuracy (the reward's correctness rule), mean
retrieval count (RC), and the share of valid format.

`write_report` (called by `SearchTask.report` after training) also draws accuracy and RC across
training from the run log, marks where stage 2 starts, and compares the end of stage 1 with the
end of stage 2.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import pathlib

import numpy as np

from rlrag_jax import evaluation, runlog, tasks
from rlrag_jax.tasks import Task

COLUMNS = ("f1", "em", "accuracy", "rc", "format")
EVAL_STAGES = ("eval_before", "eval", "eval_after")


@dataclasses.dataclass
class _Pipeline(Task):
  """The search task evaluated with its rollouts running one pipeline, for
  `evaluation.evaluate`: the greedy `rollout(..., pipeline=...)` scored by the search task's
  `eval_metrics` (no monitors); the rest is the search task's."""
  task: Task
  pipeline: str

  def __post_init__(self):
    self.name, self.tokenizer = self.task.name, self.task.tokenizer
    self.train, self.eval = self.task.train, self.task.eval

  def sft_samples(self, example):
    return self.task.sft_samples(example)

  def evaluate(self, policy, examples, rng):
    eps = self.task.rollout(policy, examples, rng, group_size=1, greedy=True,
                            pipeline=self.pipeline)
    return tasks.eval_rows(eps, self.task.eval_metrics(eps))


def evaluate_pipelines(task, policy, examples, *, pipelines=("agent", "no_retrieval", "naive_rag"),
                       batch_size: int = 64, seed: int = 0, progress: bool = False) -> dict:
  """{pipeline: {dataset: {metric: mean, 'n': count}}} with an 'all' dataset."""
  examples = list(examples)
  out = {}
  for name in pipelines:
    res = evaluation.evaluate(_Pipeline(task, name), policy, examples, batch_size=batch_size,
                              seed=seed, progress=progress, desc=name)
    by_source = collections.defaultdict(list)
    for ex, row in zip(examples, res["rows"]):
      by_source[ex.source or "unknown"].append(row)
    table = {"all": _mean(res["rows"])}
    if len(by_source) > 1:
      table.update({k: _mean(v) for k, v in sorted(by_source.items())})
    else:
      table = {next(iter(by_source)): table["all"]}
    out[name] = table
  return out


def _mean(rows) -> dict:
  out = {k: float(np.mean([r[k] for r in rows])) for k in COLUMNS}
  out["n"] = len(rows)
  return out


def format_pipelines(results: dict, title: str = "Agent vs reference pipelines") -> str:
  rows = [{"dataset": ds, "pipeline": name, **m}
          for name, table in results.items() for ds, m in table.items()]
  rows.sort(key=lambda r: (r["dataset"], list(results).index(r["pipeline"])))
  return runlog.format_table(rows, ("dataset", "pipeline") + COLUMNS + ("n",), title=title)


# ------------------------------------------------------------------------------ training report
def sft_length(rows) -> int:
  """The global step RL started after, read from a run log's rows: the first RL row's step
  minus 1 (the last SFT row's step when the run has no RL row yet, else 0)."""
  rl = [r["step"] for r in rows if r["stage"] == "rl"]
  if rl:
    return min(rl) - 1
  return max([r["step"] for r in rows if r["stage"] == "sft"], default=0)


def eval_curve(rlog) -> list:
  """Held-out evaluations logged during training: [{'rl_step', 'stage', metrics...}], the RL
  step counted as the rewards see it (1: the first RL step)."""
  every = rlog.rows()
  sft_steps = sft_length(every)
  rows = [r for r in every if r["stage"] in EVAL_STAGES]
  out = []
  for r in rows:
    if r["stage"] == "eval_after" and out and out[-1]["step"] == r["step"]:
      continue                          # the trainer's last mid-run eval is the same model
    out.append(dict(r, rl_step=r["step"] - sft_steps))
  return out


def stage_comparison(curve: list, stage2_step: int) -> dict:
  """The last evaluation before stage 2 starts vs the last evaluation of the run."""
  if not curve or stage2_step <= 0:
    return {}
  before = [r for r in curve if r["rl_step"] < stage2_step]
  after = [r for r in curve if r["rl_step"] >= stage2_step]
  if not before or not after:
    return {}
  s1, s2 = before[-1], after[-1]
  keys = [k for k in ("em", "f1", "accuracy", "rc", "format", "direct") if k in s1 and k in s2]
  return {"stage1_end": {"rl_step": s1["rl_step"], **{k: s1[k] for k in keys}},
          "stage2_end": {"rl_step": s2["rl_step"], **{k: s2[k] for k in keys}},
          "delta": {k: s2[k] - s1[k] for k in keys}}


def plot_curve(curve: list, stage2_step: int, out_png) -> pathlib.Path:
  """Accuracy / EM and mean RC against the RL step, and accuracy against RC."""
  xs = [r["rl_step"] for r in curve]
  fig, (ax, ax2) = runlog.subplots(1, 2, figsize=(10, 3.6))
  ax.plot(xs, [r["accuracy"] for r in curve], "o-", label="accuracy")
  ax.plot(xs, [r["em"] for r in curve], "s--", label="EM", alpha=0.7)
  ax.set_xlabel("RL step")
  ax.set_ylabel("held-out accuracy / EM")
  right = ax.twinx()
  right.plot(xs, [r["rc"] for r in curve], "^-", color="tab:red", label="mean RC")
  right.set_ylabel("mean retrieval count", color="tab:red")
  if stage2_step > 0:
    ax.axvline(stage2_step - 0.5, color="gray", ls=":", lw=1)
    ax.text(stage2_step - 0.5, ax.get_ylim()[1], " stage 2", va="top", fontsize=8)
  ax.legend(loc="lower left", fontsize=8)
  ax.grid(alpha=0.3)
  ax2.plot([r["rc"] for r in curve], [r["accuracy"] for r in curve], "-", color="gray", alpha=0.5)
  sc = ax2.scatter([r["rc"] for r in curve], [r["accuracy"] for r in curve], c=xs, cmap="viridis",
                   zorder=3)
  fig.colorbar(sc, ax=ax2, label="RL step")
  ax2.set_xlabel("mean retrieval count (RC)")
  ax2.set_ylabel("held-out accuracy")
  ax2.grid(alpha=0.3)
  return runlog.save_figure(fig, out_png, "Accuracy vs retrieval count across training")


def write_report(task, workdir, rlog, setup) -> dict:
  """search_report.{txt,json} and accuracy_vs_rc.png in `workdir` (see the module docstring);
  the pipelines run `setup`'s policy on its examples (`tasks.EvalSetup`: the engine's final
  evaluation)."""
  workdir = pathlib.Path(workdir)
  curve = eval_curve(rlog)
  report = {"curve": curve, "stages": stage_comparison(curve, task.stage2_step)}
  text = []
  if curve:
    plot_curve(curve, task.stage2_step, workdir / "accuracy_vs_rc.png")
    text.append(runlog.format_table(
        curve, ("rl_step", "stage", "em", "f1", "accuracy", "rc", "format", "direct"),
        title="Held-out evaluations across training"))
  if report["stages"]:
    st = report["stages"]
    rows = [{"point": f"end of stage 1 (RL step {st['stage1_end']['rl_step']})",
             **st["stage1_end"]},
            {"point": f"end of stage 2 (RL step {st['stage2_end']['rl_step']})",
             **st["stage2_end"]},
            {"point": "stage 2 - stage 1", **st["delta"]}]
    text.append(runlog.format_table(rows, ["point"] + [k for k in st["delta"]],
                                    title="Stage 1 vs stage 2"))
  if task.settings.eval.baselines:
    report["pipelines"] = evaluate_pipelines(task, setup.policy, setup.examples,
                                             batch_size=setup.batch_size, seed=setup.seed)
    text.append(format_pipelines(report["pipelines"]))
  body = "\n\n".join(text)
  (workdir / "search_report.txt").write_text(body + "\n")
  (workdir / "search_report.json").write_text(json.dumps(report, indent=2))
  if body:
    print(body)
  return report

