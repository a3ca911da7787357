"""One config over several seeds: mean ± std, the RL gain with intervals over seeds and examples.

  python -m rlrag_jax.experiments.seeds --config=configs/arena.py --seeds=0,1,2 --out=DIR \\
      [--parallel=N] [--resamples=2000] [--config.rl.steps=80 ...]
  python -m rlrag_jax.experiments.seeds --config=configs/arena.py --seeds=0,1,2 --out=DIR \\
      --arm k2=--config.rl.kl_estimator=k2 --arm k3=--config.rl.kl_estimator=k3
  python -m rlrag_jax.experiments.seeds --summarize=DIR/seeds.json [--out=DIR2]
  python -m rlrag_jax.experiments.seeds --summarize=A/seeds.json,B/seeds.json [--seeds=1,2,3] \\
      --out=DIR [--name=NAME]
  python -m rlrag_jax.experiments.seeds --summarize=DIR/seeds.md [--rerun='the command']

Each (arm, seed) is one `python -m rlrag_jax.train` process with `--config.seed=S` and its own
workdir `DIR/<arm>/seed_<S>` (arm 'main' without --arm); every other `--config.…` flag is passed
through to all of them, an arm's FLAGS (space-separated) to that arm's only. Up to `--parallel`
processes run at once (default 1: on a 2-core machine two trainings just share the cores).
Resumable: a finished run (its `eval_summary.json` and `eval_rows.json` exist) is reused when
its fingerprint.json matches the config its flags give now (`rlrag_jax.fingerprint`), and a
killed run resumes from its checkpoints (`--resume`). A run directory made with other flags is
moved aside to `seed_<S>.stale-<its fingerprint>` (nothing is deleted) and the seed is trained
again: the table must describe the flags given. A run made before fingerprints cannot be
checked: it is reused (finished) or resumed with a warning.

Outputs:
  DIR/seeds.json  per arm and seed: warm-up (before RL) and after-RL metrics, wall minutes,
                  per-example correctness (the trainer's eval_rows.json), the code versions
                  the run's starts recorded (`run_code`: git commit and dirty flag), the
                  plotted curves, the harness's own code version, optional `notes` (how the
                  table came about, printed in seeds.md), and the summary below;
  DIR/seeds.md    per metric: warm-up and after-RL mean ± std over seeds, the gain (after - before)
                  with its std over seeds, and four 95% intervals of the mean gain
                  (`rlrag_jax.metrics`, `--resamples` bootstrap resamples): pooled, a paired
                  bootstrap with each (seed, example) pair one unit (leaves out seed-to-seed
                  variance); hierarchical, seeds resampled, then examples within each drawn
                  seed separately; crossed, seeds resampled and one example draw shared by the
                  drawn seeds (examples paired by id: every seed evaluates the same ones); t,
                  Student-t over the per-seed mean gains. 'vs 0' says whether the three
                  seed-aware intervals all exclude 0 (a bootstrap's seed part is too narrow at
                  few seeds, though the example draws let it leave the per-seed range). Then
                  the t test's p-value and whether it survives Holm's correction over every
                  outcome the table tests (`add_holm`; the count heads the table). With two
                  arms, also the after-RL difference B - A, paired on (seed, example), with the
                  same intervals;
  DIR/seeds.png   each metric's curve over training steps per seed (thin), the mean bold.
                  `--plot` picks them: evaluation metrics, or any RL training metric (kl,
                  reward/total, vf/explained_variance, ...).
With `--contrast=top2_map-map,...`, seeds.md also compares two metrics of the same evaluation
(settings a run evaluates side by side), paired on (seed, example), before and after RL.
With `--curves=kl,reward/total,...`, seeds.md also summarises those training curves per arm: the
mean over the last quarter of RL steps and the std of the step-to-step changes (smoothness),
mean ± std over seeds.

`--summarize=DIR/seeds.json` runs nothing: it recomputes the summary from the per-example rows
the file holds and writes DIR/seeds.json and seeds.md again (seeds.png too when the file holds the
curves). Several files, comma-separated, made by one command (same config, flags, arms and
points) on disjoint seeds, are merged into one table first (`merge_records`: the runs copied
unchanged, the hosts kept per file where they differ); `--seeds` keeps some of the seeds (also of
a single file). `--summarize=DIR/seeds.md`, for a committed table whose seeds.json was not kept, adds a
section of Student-t intervals over seeds computed from its mean ± std rows.
"""
from __future__ import annotations

import concurrent.futures
import json
import pathlib
import re
import shlex
import subprocess
import sys
import time
from typing import Optional, Sequence

import numpy as np

# The intervals live in rlrag_jax.metrics; re-exported for callers that import them from here.
from rlrag_jax.metrics import (claim, crossed_bootstrap, hierarchical_bootstrap, holm,  # pylint: disable=unused-import
                               mean_std, paired_bootstrap, seed_intervals, t_interval,
                               t_interval_from_moments, t_pvalue)
from rlrag_jax import fingerprint, runlog

METRICS = ("em", "f1", "format", "relevance", "accuracy", "rc", "reward")


# ------------------------------------------------------------------------------- statistics
def pair_rows(rows_a: Sequence[dict], rows_b: Sequence[dict], metric: str) -> dict:
  """{example id: b - a} over the ids present in both (the same held-out example under two
  runs): paired by id, never by position, so either run's rows may come in any order."""
  a = {r["id"]: r[metric] for r in rows_a if metric in r}
  return {r["id"]: float(r[metric]) - float(a[r["id"]]) for r in rows_b
          if metric in r and r["id"] in a}


# ------------------------------------------------------------------------------- runs
def run_dir(out: pathlib.Path, arm: str, seed: int) -> pathlib.Path:
  return out / arm / f"seed_{seed}"


def is_done(workdir: pathlib.Path) -> bool:
  """Whether the run in `workdir` finished (its results exist), whatever its flags."""
  return (workdir / "eval_summary.json").exists() and (workdir / "eval_rows.json").exists()


def job_state(workdir: pathlib.Path, config) -> tuple:
  """(state, fingerprint.Check) of a run directory against the config its flags resolve to
  (`train_config`): 'stale' when it holds a run whose fingerprint differs, finished or not;
  else 'done' when finished (fingerprints equal, or a run made before fingerprints); else
  'todo'. A `config` of None checks nothing (finished is done)."""
  if config is None:
    return ("done" if is_done(workdir) else "todo"), None
  check = fingerprint.check(workdir, config)
  if check.status == "differs":
    return "stale", check
  return ("done" if is_done(workdir) else "todo"), check


def set_aside(workdir: pathlib.Path, check) -> pathlib.Path:
  """Renames a stale run directory to `<name>.stale-<its fingerprint>` (`-<k>` when taken)."""
  dst = base = workdir.with_name(f"{workdir.name}.stale-{check.recorded['fingerprint'][:12]}")
  k = 1
  while dst.exists():
    dst, k = base.with_name(f"{base.name}-{k}"), k + 1
  workdir.rename(dst)
  return dst


def train_config(config: str, seed: int, workdir: pathlib.Path, flags: Sequence[str]):
  """The config the training command of (seed, workdir, flags) runs: what its fingerprint is
  made from (`rlrag_jax.train.config_from_argv` over `train_command`'s arguments)."""
  from rlrag_jax.train import config_from_argv
  return config_from_argv(train_command(config, seed, workdir, flags)[3:])


def train_command(config: str, seed: int, workdir: pathlib.Path, flags: Sequence[str]) -> list:
  return [sys.executable, "-m", "rlrag_jax.train", f"--config={config}",
          f"--config.seed={seed}", f"--config.workdir={workdir}", "--quiet", "--resume",
          *flags]


def run_all(jobs: list, parallel: int = 1, runner=None) -> list:
  """Runs (arm, seed, workdir, command[, config]) jobs not yet done; returns [(arm, seed, rc,
  minutes)]. With the job's resolved `config` (`train_config`), a finished run is reused only
  when its fingerprint matches, and a run made with other flags is set aside and rerun
  (`job_state`). `runner(command, log_path) -> returncode` defaults to a subprocess."""
  def default_runner(cmd, log_path):
    with open(log_path, "w") as log:
      return subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
  runner = runner or default_runner
  todo = []
  for arm, seed, wd, cmd, *config in jobs:
    state, check = job_state(wd, config[0] if config else None)
    if state == "stale":
      moved = set_aside(wd, check)
      print(f"seeds: {arm} seed {seed}: {wd} holds a run of other flags (fingerprint "
            f"{check.recorded['fingerprint'][:12]}, these flags' {check.fingerprint[:12]}); "
            f"moved it to {moved} and training again. Differing keys, old -> new:\n"
            f"{fingerprint.format_differences(check.differs, 20)}", flush=True)
    if state == "done":
      unchecked = check is not None and check.status == "unchecked"
      print(f"seeds: {arm} seed {seed}: done already ({wd})" + (
          "; made before run fingerprints, so its flags cannot be checked against these"
          if unchecked else ""))
      if check is not None and check.code_differs:
        made_by = ", ".join(map(fingerprint.describe_code, run_code(wd))) or "unrecorded"
        print(f"seeds: WARNING: {arm} seed {seed}: reusing a run made by code {made_by}, "
              f"this is {fingerprint.describe_code(check.code)}: the table mixes code versions "
              f"unless they compute the same (move {wd} aside to rerun it)", flush=True)
    else:
      todo.append((arm, seed, wd, cmd))

  def one(job):
    arm, seed, wd, cmd = job
    wd.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    print(f"seeds: {arm} seed {seed}: {shlex.join(cmd)}", flush=True)
    rc = runner(cmd, wd / "train.log")
    minutes = (time.time() - t0) / 60
    print(f"seeds: {arm} seed {seed}: exit {rc} after {minutes:.1f} min", flush=True)
    return arm, seed, rc, minutes
  with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
    return list(pool.map(one, todo))


# ------------------------------------------------------------------------------- summary
POINTS_HELP = ("'warmup' (before RL), 'final' (after RL) or 'rlK' (the evaluation after K RL "
               "steps, e.g. rl10; needs eval.every to hit K)")


def _point(workdir: pathlib.Path, point: str, summary: dict, rows: dict) -> tuple:
  """(metrics, per-example rows) of one evaluation point of a run."""
  if point == "warmup":
    return summary.get("before"), rows["before"]
  if point == "final":
    return summary["after"], rows["after"]
  if point.startswith("rl") and point[2:].isdigit():
    p = workdir / f"eval_rows_{point}.json"
    if not p.exists():
      raise FileNotFoundError(f"{p}: no evaluation after {point[2:]} RL steps in this run "
                              "(set eval.every so that it evaluates there)")
    mid = json.loads(p.read_text())
    return mid["all"], mid["rows"]
  raise ValueError(f"evaluation point {point!r}: expected {POINTS_HELP}")


def load_run(workdir: pathlib.Path, before: str = "warmup", after: str = "final") -> dict:
  """A finished run's metrics and per-example rows at two evaluation points (default: the
  warm-up and the end of RL), under the keys 'before' and 'after'."""
  summary = json.loads((workdir / "eval_summary.json").read_text())
  rows = json.loads((workdir / "eval_rows.json").read_text())
  b_metrics, b_rows = _point(workdir, before, summary, rows)
  a_metrics, a_rows = _point(workdir, after, summary, rows)
  recorded = fingerprint.read(workdir)
  return {"before": b_metrics, "after": a_metrics, "minutes": summary.get("minutes"),
          "rows": {"before": b_rows, "after": a_rows},
          "fingerprint": recorded and recorded["fingerprint"], "code": run_code(workdir)}


def run_code(workdir: pathlib.Path) -> list:
  """The code versions ({'commit', 'dirty'}) a run's starts were made by, in order, each once;
  [] for a run made before code versions were recorded (its starts carry none)."""
  out = []
  for start in (fingerprint.read(workdir) or {}).get("starts", []):
    code = start.get("code")
    if code and code not in out:
      out.append(code)
  return out


def provenance_line(record: dict) -> str:
  """The code versions of a record's runs, for seeds.md: 'Code: <commit> (<arm> seeds ...)'."""
  by_code, unknown = {}, []
  for arm, by in record["runs"].items():
    for s, r in by.items():
      codes = r.get("code") or []
      if not codes:
        unknown.append(f"{arm} {s}")
      for c in codes:
        by_code.setdefault(fingerprint.describe_code(c), []).append(f"{arm} {s}")
  if not by_code:
    return ("Code versions: not recorded (these runs predate the per-run commit record; the git "
            "history of this folder says which commit wrote the table).")
  parts = [f"{code} ({', '.join(runs)})" for code, runs in by_code.items()]
  if unknown:
    parts.append(f"unrecorded ({', '.join(unknown)})")
  return ("Code versions (arm seed): " + "; ".join(parts)
          + (". **More than one code version made these runs.**" if len(by_code) > 1 else "."))


def metric_names(runs: dict) -> list:
  """METRICS in their order, then any other numeric metric the runs' final evaluations hold
  (a method's own, e.g. APEX's 'sepr'), sorted; 'n' and counts such as 'judge/failures' are
  left out."""
  extra = set()
  for by_seed in runs.values():
    for run in by_seed.values():
      for k, v in (run.get("after") or {}).items():
        if k not in METRICS and k != "n" and "/" not in k and isinstance(v, (int, float)):
          extra.add(k)
  return list(METRICS) + sorted(extra)


def summarise(runs: dict, resamples: int = 2000) -> dict:
  """runs: {arm: {seed: load_run(...)}} -> per arm and metric the statistics of seeds.md."""
  out = {"arms": {}, "comparison": {}}
  names = metric_names(runs)
  for arm, by_seed in runs.items():
    seeds = sorted(by_seed)
    stats = {}
    for m in names:
      have = [s for s in seeds if m in (by_seed[s]["after"] or {})]
      if not have:
        continue
      after = [by_seed[s]["after"][m] for s in have]
      entry = {"after": mean_std(after), "after_per_seed": after}
      with_before = [s for s in have if by_seed[s]["before"] and m in by_seed[s]["before"]]
      if with_before:
        before = [by_seed[s]["before"][m] for s in with_before]
        gains = [by_seed[s]["after"][m] - by_seed[s]["before"][m] for s in with_before]
        iv = seed_intervals([pair_rows(by_seed[s]["rows"]["before"], by_seed[s]["rows"]["after"],
                                       m) for s in with_before], resamples)
        entry.update(before=mean_std(before), before_per_seed=before, gain=mean_std(gains),
                     gain_per_seed=gains, gain_ci=iv["pooled"], gain_ci_hier=iv["hierarchical"],
                     gain_ci_crossed=iv["crossed"], gain_ci_t=iv["t"], gain_p=iv["p"],
                     gain_claim=iv["claim"],
                     gain_all_seeds_positive=bool(all(g > 0 for g in gains)),
                     paired_examples=iv["pairs"])
      stats[m] = entry
    minutes = [by_seed[s]["minutes"] for s in seeds if by_seed[s].get("minutes") is not None]
    out["arms"][arm] = {"seeds": seeds, "metrics": stats,
                        "minutes": mean_std(minutes) if minutes else None}
  arms = list(runs)
  if len(arms) == 2:
    a, b = arms
    common = sorted(set(runs[a]) & set(runs[b]))
    for m in names:
      iv = seed_intervals([pair_rows(runs[a][s]["rows"]["after"], runs[b][s]["rows"]["after"], m)
                           for s in common], resamples)
      per_seed = [runs[b][s]["after"][m] - runs[a][s]["after"][m] for s in common
                  if m in runs[a][s]["after"] and m in runs[b][s]["after"]]
      if per_seed:
        out["comparison"][m] = {"arms": [a, b], "diff": mean_std(per_seed),
                                "diff_per_seed": per_seed, "diff_ci": iv["pooled"],
                                "diff_ci_hier": iv["hierarchical"],
                                "diff_ci_crossed": iv["crossed"], "diff_ci_t": iv["t"],
                                "diff_p": iv["p"], "diff_claim": iv["claim"],
                                "paired_examples": iv["pairs"]}
  return out


def contrasts(runs: dict, pairs: Sequence[str], resamples: int = 2000) -> dict:
  """Two metrics of the same evaluation compared, e.g. 'top2_map-map' (two settings a run
  evaluates side by side): per arm and point (before / after RL) the difference A - B per seed
  and a paired bootstrap interval over (seed, example)."""
  out = {}
  for spec in pairs:
    a, sep, b = spec.partition("-")
    if not sep or not a or not b:
      raise ValueError(f"--contrast {spec!r}: expected METRIC_A-METRIC_B")
    for arm, by_seed in runs.items():
      for point in ("before", "after"):
        have = [s for s in sorted(by_seed) if by_seed[s][point]
                and a in by_seed[s][point] and b in by_seed[s][point]]
        if not have:
          continue
        per_seed = [by_seed[s][point][a] - by_seed[s][point][b] for s in have]
        iv = seed_intervals([{r["id"]: float(r[a]) - float(r[b]) for r in by_seed[s]["rows"][point]
                              if a in r and b in r} for s in have], resamples)
        out.setdefault(spec, {}).setdefault(arm, {})[point] = {
            "diff": mean_std(per_seed), "diff_per_seed": per_seed, "diff_ci": iv["pooled"],
            "diff_ci_hier": iv["hierarchical"], "diff_ci_crossed": iv["crossed"],
            "diff_ci_t": iv["t"], "diff_p": iv["p"], "diff_claim": iv["claim"],
            "paired_examples": iv["pairs"]}
  return out


INTERVALS_NOTE = (
    "Intervals (95%) of a mean difference over seeds and held-out examples: *pooled*, a paired "
    "bootstrap with every (seed, example) pair one unit, which leaves out seed-to-seed variance; "
    "*hierarchical*, a bootstrap that resamples seeds, then examples within each drawn seed "
    "separately; *crossed*, a bootstrap that resamples seeds and, in the same replicate, one draw "
    "of examples shared by every drawn seed (examples paired by id across seeds and arms: every "
    "seed evaluates the same examples, so their difficulty is counted once, not averaged over "
    "independent draws); *t*, a Student-t interval over the per-seed means (df = seeds - 1). "
    "A seeds-only bootstrap cannot leave the range of the per-seed means; the hierarchical and "
    "crossed ones also resample examples and can (R2AG's default, mAP gain: per seed 0.010 ± "
    "0.002, hierarchical [-0.007, +0.028]), but with few seeds their seed part is still too "
    "narrow, so the *vs 0* column reads '> 0' or '< 0' only when the hierarchical, the crossed "
    "and the t interval all exclude 0.")
SEED_AWARE_HEAD = ("hierarchical bootstrap 95% CI | crossed bootstrap 95% CI | t 95% CI over seeds "
                   "| vs 0 (all three) | p (t) | Holm |")
ALPHA = 0.05     # the tables' family-wise error rate: 1 - the intervals' level


def _ci(iv) -> str:
  if iv is None or not np.isfinite(iv[1]):
    return "–"
  return f"[{iv[1]:+.3f}, {iv[2]:+.3f}]"


def _p(p) -> str:
  if p is None or not np.isfinite(p):
    return "–"
  return "<0.0001" if p < 1e-4 else f"{p:.4f}"


def _seed_aware(e: dict, key: str) -> str:
  """The hierarchical, crossed and t cells, the claim, the t p-value and the Holm mark of a
  summary entry ('gain' or 'diff')."""
  holm_cell = {True: "holds", False: "no"}.get(e.get(f"{key}_holm"), "–")
  return (f"{_ci(e.get(f'{key}_ci_hier'))} | {_ci(e.get(f'{key}_ci_crossed'))} | "
          f"{_ci(e.get(f'{key}_ci_t'))} | {e.get(f'{key}_claim', '–')} | "
          f"{_p(e.get(f'{key}_p'))} | {holm_cell} |")


def _tested(summary: dict) -> list:
  """(kind, entry, key) of every outcome a table tests: each arm's gain per metric, the arm
  difference per metric, each metric contrast per arm and point."""
  out = [("gain", e, "gain") for st in summary["arms"].values() for e in st["metrics"].values()
         if "gain" in e]
  out += [("arm difference", e, "diff") for e in summary.get("comparison", {}).values()]
  out += [("metric contrast", e, "diff") for by_arm in summary.get("contrasts", {}).values()
          for by_point in by_arm.values() for e in by_point.values()]
  return out


def add_holm(summary: dict, alpha: float = ALPHA) -> dict:
  """Marks every tested outcome (`_tested`) with whether it survives Holm's correction at
  `alpha` over the table's outcomes with a p-value (the t test over per-seed values, `<key>_p`),
  and writes summary['holm'] = {alpha, outcomes, by kind, survive}. The t test, not a bootstrap:
  it is the seed-aware interval whose p-value is defined at any size (a percentile bootstrap's
  cannot go below 1 / resamples, and with 3 seeds its tails are the per-seed extremes)."""
  tested = [(kind, e, key) for kind, e, key in _tested(summary)
            if np.isfinite(e.get(f"{key}_p", float("nan")))]
  marks = holm([e[f"{key}_p"] for _, e, key in tested], alpha)
  for (_, e, key), mark in zip(tested, marks):
    e[f"{key}_holm"] = bool(mark)
  kinds = {}
  for kind, _, _ in tested:
    kinds[kind] = kinds.get(kind, 0) + 1
  summary["holm"] = {"alpha": alpha, "outcomes": len(tested), "by_kind": kinds,
                     "survive": int(sum(marks))}
  return summary


def holm_note(summary: dict) -> str:
  h = summary.get("holm")
  if not h:
    return ""
  parts = ", ".join(f"{n} {k}{'s' if n != 1 else ''}" for k, n in h["by_kind"].items())
  return (f"**Outcomes tested: {h['outcomes']}** ({parts or 'none'}: every metric the runs "
          f"report, for each arm and point the table shows). *p (t)* is the "
          f"two-sided p-value of the t test over seeds (the test the t interval inverts); "
          f"*Holm* reads 'holds' when the outcome survives Holm's step-down correction at "
          f"family-wise alpha {h['alpha']:g} over all {h['outcomes']} of them: "
          f"{h['survive']} do. A row is a claim only with 'vs 0' excluding 0; one that does not "
          f"also hold under Holm may be one of the table's many chances.")


def contrasts_markdown(con: dict, before: str, after: str) -> str:
  lines = ["## Metric contrasts (A - B within each evaluation, paired on seed and example)", "",
           "| A - B | arm | point | mean ± std over seeds | pooled bootstrap 95% CI | "
           + SEED_AWARE_HEAD, "|---|---|---|---|---|---|---|---|---|---|---|"]
  for spec, by_arm in con.items():
    for arm, by_point in by_arm.items():
      for point, e in by_point.items():
        name = _point_name(before if point == "before" else after)
        lines.append(f"| {spec} | {arm} | {name} | {_pm(e['diff'])} | "
                     f"{_ci(e['diff_ci'])} ({e['paired_examples']} pairs) | "
                     + _seed_aware(e, "diff"))
  return "\n".join(lines + [""])


def _pm(ms) -> str:
  return f"{ms[0]:.3f} ± {ms[1]:.3f}"


POINT_NAMES = {"warmup": "warm-up (before RL)", "final": "after RL"}


def _point_name(point: str) -> str:
  return POINT_NAMES.get(point, f"after {point[2:]} RL steps" if point.startswith("rl")
                         else point)


NOTES_HEADING = "## How this table came about"


def write_markdown(summary: dict, path: pathlib.Path, title: str, before: str = "warmup",
                   after: str = "final", notes: Sequence[str] = (), provenance: str = "") -> str:
  """seeds.md: the intervals note, the outcomes tested (`add_holm`), the record's `notes` (how
  the table came about: seeds added after a first result, a metric named after the fact), the
  runs' code versions, then the tables."""
  lines = [f"# {title}", "", INTERVALS_NOTE, ""]
  if summary.get("holm"):
    lines += [holm_note(summary), ""]
  if notes:
    lines += [NOTES_HEADING, ""] + [x for n in notes for x in (n, "")]
  if provenance:
    lines += [provenance, ""]
  for arm, st in summary["arms"].items():
    # runs without RL (SFT only) have no warm-up point: their final evaluation is "final"
    after_name = (_point_name(after) if after != "final" or
                  any("gain" in e for e in st["metrics"].values()) else "final")
    lines += [f"## {arm}: seeds {', '.join(map(str, st['seeds']))}"
              + (f"; {_pm(st['minutes'])} min per seed" if st["minutes"] else ""), "",
              f"| metric | {_point_name(before)} | {after_name} | gain (after - before) | "
              "pooled bootstrap 95% CI of the gain | " + SEED_AWARE_HEAD
              + " gain > 0 on every seed |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m, e in st["metrics"].items():
      if "gain" in e:
        lines.append(f"| {m} | {_pm(e['before'])} | {_pm(e['after'])} | {_pm(e['gain'])} | "
                     f"{_ci(e['gain_ci'])} ({e['paired_examples']} pairs) | "
                     + _seed_aware(e, "gain")
                     + f" {'yes' if e['gain_all_seeds_positive'] else 'no'} |")
      else:
        lines.append(f"| {m} | – | {_pm(e['after'])} | – | – | – | – | – | – | – | – | – |")
    lines.append("")
  if summary["comparison"]:
    a, b = next(iter(summary["comparison"].values()))["arms"]
    lines += [f"## {b} - {a} (after RL, paired on seed and example)", "",
              "| metric | difference, mean ± std over seeds | pooled bootstrap 95% CI | "
              + SEED_AWARE_HEAD, "|---|---|---|---|---|---|---|---|---|"]
    for m, e in summary["comparison"].items():
      lines.append(f"| {m} | {_pm(e['diff'])} | {_ci(e['diff_ci'])} | "
                   + _seed_aware(e, "diff"))
    lines.append("")
  if summary.get("contrasts"):
    lines.append(contrasts_markdown(summary["contrasts"], before, after))
  if summary.get("curves"):
    lines.append(curves_markdown(summary["curves"]))
  text = "\n".join(lines)
  runlog.write_atomic(path, text)
  return text


def curve_series(workdirs: dict, metrics: Sequence[str]) -> dict:
  """{arm: {seed: workdir}} -> {arm: {seed: {metric: [steps, values]}}}: the curves seeds.png
  draws (`_curve`), kept in seeds.json so that `--summarize` can redraw them."""
  return {arm: {str(seed): {m: list(_curve(wd, m)) for m in metrics}
                for seed, wd in sorted(by_seed.items())}
          for arm, by_seed in workdirs.items()}


def plot_curves(workdirs: dict, path: pathlib.Path, metrics=("em", "f1", "format", "relevance",
                                                              "reward/total")) -> None:
  """Per metric, one thin line per (arm, seed) over steps and the arm's mean in bold."""
  plot_series(curve_series(workdirs, metrics), path, metrics)


def plot_series(series: dict, path: pathlib.Path, metrics: Sequence[str]) -> None:
  """`plot_curves` from `curve_series` output."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.4))
  colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for ax, m in zip(np.atleast_1d(axes), metrics):
    for k, (arm, by_seed) in enumerate(series.items()):
      curves = []
      for seed in sorted(by_seed, key=int):
        xs, ys = by_seed[seed].get(m, ([], []))
        if xs:
          ax.plot(xs, ys, color=colours[k % len(colours)], lw=0.8, alpha=0.45)
          curves.append(dict(zip(xs, ys)))
      if curves:
        steps = sorted(set.intersection(*[set(c) for c in curves]))
        ax.plot(steps, [np.mean([c[s] for c in curves]) for s in steps],
                color=colours[k % len(colours)], lw=2.4, label=f"{arm} (mean)")
    ax.set_title(m)
    ax.set_xlabel("step")
  np.atleast_1d(axes)[0].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _curve(workdir: pathlib.Path, metric: str) -> tuple:
  """(steps, values): the eval points for a metric the evaluations hold (METRICS and a method's
  own, e.g. 'sepr'), else the RL training rows (reward/…, kl, grad_norm, entropy, vf/…)."""
  rows = runlog.read_rows(workdir / "metrics.jsonl")     # a torn last line: dropped, warned
  evals = ("eval_before", "eval", "eval_after")
  pts = [(r["step"], r[metric]) for r in rows if r.get("stage") in evals and metric in r]
  if not pts and metric not in METRICS:
    pts = [(r["step"], r[metric]) for r in rows if r.get("stage") == "rl" and metric in r]
  return [s for s, _ in pts], [v for _, v in pts]


def curve_stats(workdir: pathlib.Path, metric: str) -> Optional[dict]:
  """A training curve in two numbers: its mean over the last quarter of RL steps, and the std of
  its step-to-step changes (a smoothness measure: lower is smoother). None without >= 2 points."""
  _, ys = _curve(workdir, metric)
  ys = np.asarray([y for y in ys if y is not None and np.isfinite(y)], np.float64)
  if ys.size < 2:
    return None
  return {"last_quarter": float(ys[-max(1, ys.size // 4):].mean()),
          "step_change_std": float(np.diff(ys).std(ddof=1)) if ys.size > 2 else 0.0}


def summarise_curves(workdirs: dict, metrics: Sequence[str]) -> dict:
  """{arm: {seed: workdir}} -> {arm: {metric: {stat: (mean, std) over seeds, per_seed}}}."""
  out = {}
  for arm, by_seed in workdirs.items():
    for m in metrics:
      per = [st for st in (curve_stats(wd, m) for _, wd in sorted(by_seed.items())) if st]
      if per:
        out.setdefault(arm, {})[m] = {
            k: mean_std([p[k] for p in per]) for k in ("last_quarter", "step_change_std")}
        out[arm][m]["seeds"] = len(per)
  return out


def curves_markdown(curves: dict) -> str:
  lines = ["## Training curves (RL steps): last-quarter mean and step-to-step change std", "",
           "| metric | arm | mean over the last quarter | std of step-to-step changes | seeds |",
           "|---|---|---|---|---|"]
  metrics = list(dict.fromkeys(m for by in curves.values() for m in by))
  for m in metrics:
    for arm, by in curves.items():
      if m in by:
        e = by[m]
        lines.append(f"| {m} | {arm} | {_pm(e['last_quarter'])} | {_pm(e['step_change_std'])} "
                     f"| {e['seeds']} |")
  return "\n".join(lines + [""])


# ------------------------------------------------------------------------------- re-summarising
def title(config: str, seeds: Sequence[int], overrides: Sequence[str]) -> str:
  return (f"{config} over seeds {','.join(map(str, seeds))}"
          + (f" ({' '.join(overrides)})" if overrides else ""))


def write_outputs(record: dict, out: pathlib.Path, name: str) -> str:
  """DIR/<name>.json (the record: config, arms, seeds, points, runs with their per-example rows,
  the plotted curves, the summary) and DIR/<name>.md; returns the markdown."""
  runlog.write_atomic(out / f"{name}.json", json.dumps(record, indent=1))
  before, after = record["points"]
  return write_markdown(record["summary"], out / f"{name}.md",
                        title(record["config"], record["seeds"], record["overrides"]),
                        before, after, record.get("notes") or (), provenance_line(record))


def resummarise(source: pathlib.Path, out: pathlib.Path, name: str,
                resamples: int = 2000) -> str:
  """Recomputes a seeds.json's summary (every interval) from the per-example rows it holds and
  writes DIR/<name>.json and .md, without rerunning anything. The contrasts are the ones the
  record names (or its summary holds); training-curve statistics (--curves) need the runs'
  metrics.jsonl and are carried over as they were. seeds.png is redrawn when the record holds
  the plotted curves (written since this function exists); otherwise it is left alone."""
  return summarise_record(json.loads(source.read_text()), out, name, resamples)


def summarise_record(record: dict, out: pathlib.Path, name: str, resamples: int = 2000,
                     plot: bool = True) -> str:
  """`resummarise` on a record already read (or merged, `merge_records`); `plot=False` leaves
  the png alone."""
  runs = {arm: {int(s): r for s, r in by.items()} for arm, by in record["runs"].items()}
  old = record.get("summary", {})
  summary = summarise(runs, resamples)
  pairs = record.get("contrast") or list(old.get("contrasts", {}))
  if pairs:
    summary["contrasts"] = contrasts(runs, pairs, resamples)
    record["contrast"] = pairs
  if old.get("curves"):
    summary["curves"] = old["curves"]
  record["summary"] = add_holm(summary)
  out.mkdir(parents=True, exist_ok=True)
  text = write_outputs(record, out, name)
  if plot and record.get("plot"):
    plot_series(record["plot"]["series"], out / f"{name}.png", record["plot"]["metrics"])
  return text


class MergeError(ValueError):
  """Records that cannot make one table; the message names the file and the field."""


# What must agree between merged records: the table describes one command's runs.
_MERGE_SAME = ("config", "overrides", "arms", "points")


def merge_records(named: Sequence[tuple], seeds: Optional[Sequence[int]] = None) -> dict:
  """One seeds.json record from several (name, record) pairs made by the same command
  (config, overrides, arms and points equal; contrasts and plotted metrics equal where both
  hold them), keeping `seeds` (default: every seed any of them holds). A seed held by two
  records, or asked for and held by none, is an error. The runs and plotted curves are
  copied unchanged; the summary is left to `summarise_record`. Hosts: kept as one when all
  records name the same, else one entry per record ('seeds 1, 2 (<name>)': host). Training-
  curve statistics (--curves) are dropped: they need the runs' metrics.jsonl."""
  if not named:
    raise MergeError("merge: no records")
  first_name, first = named[0]
  for name, rec in named[1:]:
    for key in _MERGE_SAME:
      if rec.get(key) != first.get(key):
        raise MergeError(f"merge: {name} field {key!r} is {rec.get(key)!r}, {first_name} has "
                         f"{first.get(key)!r}: the records come from different commands")
    for key, get in (("contrast", lambda r: r.get("contrast")),
                     ("plot.metrics", lambda r: (r.get("plot") or {}).get("metrics"))):
      if get(rec) and get(first) and get(rec) != get(first):
        raise MergeError(f"merge: {name} field {key!r} is {get(rec)!r}, {first_name} has "
                         f"{get(first)!r}")
  held = {}                                    # (arm, seed) -> names holding it
  for name, rec in named:
    for arm, by in rec["runs"].items():
      for s in by:
        held.setdefault((arm, int(s)), []).append(name)
  every = sorted({s for _, s in held})
  keep = sorted(set(seeds)) if seeds is not None else every
  missing = [s for s in keep if s not in every]
  if missing:
    raise MergeError(f"merge: seed(s) {missing} are in none of {[n for n, _ in named]} "
                     f"(they hold {every})")
  twice = {k: v for k, v in held.items() if k[1] in keep and len(v) > 1}
  if twice:
    (arm, s), names = next(iter(twice.items()))
    raise MergeError(f"merge: arm {arm!r} seed {s} is in {names}: pick one with --seeds")
  merged = json.loads(json.dumps(first))       # a deep copy, key order kept
  merged["seeds"] = keep
  merged["runs"] = {arm: {} for arm in first["runs"]}
  series = {arm: {} for arm in first["runs"]}
  for _, rec in named:
    for arm, by in rec["runs"].items():
      for s, r in by.items():
        if int(s) in keep:
          merged["runs"].setdefault(arm, {})[str(s)] = r
    for arm, by in ((rec.get("plot") or {}).get("series") or {}).items():
      for s, curve in by.items():
        if int(s) in keep:
          series.setdefault(arm, {})[str(s)] = curve
  for arm in merged["runs"]:
    merged["runs"][arm] = dict(sorted(merged["runs"][arm].items(), key=lambda kv: int(kv[0])))
    series[arm] = dict(sorted(series.get(arm, {}).items(), key=lambda kv: int(kv[0])))
  if merged.get("plot"):
    merged["plot"]["series"] = series
  merged["contrast"] = next((r["contrast"] for _, r in named if r.get("contrast")),
                            first.get("contrast", []))
  kept = {name: sorted({int(s) for by in rec["runs"].values() for s in by} & set(keep))
          for name, rec in named}
  used = [(name, rec) for name, rec in named if kept[name]]
  if len({json.dumps(rec.get("host"), sort_keys=True) for _, rec in used}) > 1:
    merged["host"] = {f"seeds {', '.join(map(str, kept[name]))} ({name})": rec.get("host")
                      for name, rec in used}
  elif used:
    merged["host"] = used[0][1].get("host")
  merged.setdefault("summary", {}).pop("curves", None)
  return merged


SEED_LEVEL_HEADING = "## Seed-level intervals (the per-example raw was not committed)"
_MEAN_SD = re.compile(r"^(-?\d+\.\d+) ± (\d+\.\d+)$")


def seed_level_section(text: str, rerun: str = "") -> str:
  """For a committed seeds.md whose per-example rows were not kept: a Student-t 95% interval
  over seeds of every gain, arm difference and contrast row, from the row's mean ± std over
  seeds (sample std) and the seed count of its arm's heading. The markdown rounds both to 3
  decimals, so an end can be off by up to 0.0005 · (1 + t / sqrt(n)); 'vs 0' reads '> 0' or
  '< 0' only when the interval clears 0 by more than that."""
  rows, seeds, mode, arm = [], {}, None, None
  for line in text.split(SEED_LEVEL_HEADING)[0].splitlines():
    heading = re.match(r"^## (\S+): seeds ([\d, ]+)", line)
    if heading:
      mode, arm = "gain", heading.group(1)
      seeds[arm] = len([x for x in heading.group(2).split(",") if x.strip()])
      continue
    if line.startswith("## "):
      mode = ("contrast" if line.startswith("## Metric contrasts") else
              "comparison" if "(after RL, paired on seed and example)" in line else None)
      arm = line[3:].split(" (")[0] if mode == "comparison" else None
      continue
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if not line.startswith("| ") or len(cells) < 3 or cells[0] in ("metric", "A - B"):
      continue
    if mode == "gain" and len(cells) > 4:
      label, n, ms, pooled = (arm, cells[0]), seeds[arm], cells[3], cells[4]
    elif mode == "comparison" and len(cells) > 2:
      label, n, ms, pooled = (arm, cells[0]), min(seeds.values()), cells[1], cells[2]
    elif mode == "contrast" and len(cells) > 4:
      label = (f"{cells[1]}, {cells[2]}", cells[0])
      n, ms, pooled = seeds.get(cells[1], 0), cells[3], cells[4]
    else:
      continue
    m = _MEAN_SD.match(ms)
    if m is None or n < 2:
      continue
    mean, sd = float(m.group(1)), float(m.group(2))
    _, lo, hi = t_interval_from_moments(mean, sd, n)
    tol = 0.0005 * (1 + t_interval_from_moments(0.0, 1.0, n)[2])   # t / sqrt(n) for std 1
    verdict = "> 0" if lo - tol > 0 else "< 0" if hi + tol < 0 else "includes 0"
    rows.append(f"| {label[0]} | {label[1]} | {ms} | {n} | {pooled.split(' (')[0]} | "
                f"[{lo:+.3f}, {hi:+.3f}] | {verdict} |")
  lines = [SEED_LEVEL_HEADING, "",
           "These runs' per-example rows (seeds.json) were not committed, so the hierarchical "
           "bootstrap (seeds, then examples within a seed) cannot be computed for this table. "
           "What its text allows: a Student-t 95% interval over the per-seed values, from each "
           "row's mean ± std over seeds above (sample std; mean ± t_{0.975, n-1} · std / "
           "sqrt(n), n seeds). The table rounds both to 3 decimals, so an end may be off by up "
           "to 0.0005 · (1 + t / sqrt(n)), 0.0017 at 3 seeds; 'vs 0' reads '> 0' or '< 0' only "
           "when the interval clears 0 by more than that. The pooled interval beside it leaves "
           "out seed-to-seed variance. Computed by `python -m rlrag_jax.experiments.seeds "
           "--summarize=<this file>`."]
  if rerun:
    lines += ["", "Regenerate the table with its per-example raw (the command writes seeds.json, "
              "the rows all three intervals need, beside seeds.md; commit both): "
              f"`{rerun}`"]
  lines += [""]
  if rows:
    lines += ["| table | row | mean ± std over seeds | seeds | pooled bootstrap 95% CI | "
              "t 95% CI over seeds | vs 0 |", "|---|---|---|---|---|---|---|"] + rows + [""]
  else:
    lines += ["This table has no gain, arm difference or contrast: no interval applies.", ""]
  return "\n".join(lines)


def annotate_markdown(source: pathlib.Path, out: pathlib.Path, rerun: str = "") -> str:
  """Writes DIR/<source name>: the committed markdown with its seed-level section (replacing
  an earlier one). Returns the section."""
  text = source.read_text()
  section = seed_level_section(text, rerun)
  body = text.split(SEED_LEVEL_HEADING)[0].rstrip("\n")
  out.mkdir(parents=True, exist_ok=True)
  (out / source.name).write_text(body + "\n\n" + section)
  return section


def _parse_seeds(parser, text: str) -> list:
  try:
    return [int(s) for s in text.split(",") if s.strip()]
  except ValueError:
    parser.error(f"--seeds={text!r}: expected comma-separated integers")
  return []


def _summarize_cli(parser, args) -> int:
  """--summarize: one .json resummarised, several merged (or one filtered by --seeds), or one
  .md annotated."""
  sources = [pathlib.Path(p) for p in args.summarize.split(",") if p.strip()]
  if not sources:
    parser.error(f"--summarize={args.summarize!r}: no file named")
  for source in sources:
    if not source.exists():
      parser.error(f"--summarize={source}: no such file")
    if source.suffix not in (".json", ".md"):
      parser.error(f"--summarize={source}: expected a seeds .json or .md")
  out = pathlib.Path(args.out) if args.out else sources[0].parent
  if len(sources) == 1 and sources[0].suffix == ".md":
    if args.seeds is not None:
      parser.error("--seeds with --summarize=FILE.md: a markdown table's seeds cannot be "
                   "chosen (its per-example rows are not there)")
    print(annotate_markdown(sources[0], out, args.rerun))
    return 0
  if any(s.suffix != ".json" for s in sources):
    parser.error(f"--summarize={args.summarize}: only seeds .json files can be merged")
  if len(sources) == 1 and args.seeds is None:
    print(resummarise(sources[0], out, args.name or sources[0].stem, args.resamples))
    return 0
  keep = _parse_seeds(parser, args.seeds) if args.seeds is not None else None
  named = []
  for source in sources:
    try:
      named.append((str(source), json.loads(source.read_text())))
    except json.JSONDecodeError as e:
      parser.error(f"--summarize: {source} line {e.lineno}: not JSON ({e.msg})")
  try:
    record = merge_records(named, keep)
  except MergeError as e:
    parser.error(str(e))
  print(summarise_record(record, out, args.name or "seeds", args.resamples))
  return 0


# ------------------------------------------------------------------------------- CLI
def main(argv: Optional[Sequence[str]] = None) -> int:
  import argparse
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", help="the config file (required unless --summarize)")
  parser.add_argument("--seeds", default=None,
                      help="comma-separated seeds (default 0,1,2); with --summarize of .json "
                      "files, the seeds to keep")
  parser.add_argument("--out", help="output directory (default with --summarize: the source's)")
  parser.add_argument("--parallel", type=int, default=1)
  parser.add_argument("--resamples", type=int, default=2000)
  parser.add_argument("--before", default="warmup", help="the baseline point: " + POINTS_HELP)
  parser.add_argument("--after", default="final", help="the compared point: " + POINTS_HELP)
  parser.add_argument("--plot", default="em,f1,format,relevance,reward/total",
                      help="comma-separated metrics to plot (eval metrics or reward/… curves)")
  parser.add_argument("--name", default=None,
                      help="output stem: DIR/<name>.json, .md, .png (e.g. one per pair of points; "
                      "default 'seeds', with --summarize the source's stem)")
  parser.add_argument("--curves", default="",
                      help="comma-separated training metrics (e.g. kl,reward/total) summarised per "
                      "arm by their last-quarter mean and the std of their step-to-step changes")
  parser.add_argument("--contrast", default="",
                      help="comma-separated A-B metric pairs of one evaluation (e.g. "
                      "top2_map-map): their difference with a paired bootstrap interval")
  parser.add_argument("--arm", action="append", default=[],
                      help="NAME=FLAGS: a comparison arm (give two); FLAGS are train flags")
  parser.add_argument("--summarize", metavar="FILE", default=None,
                      help="run nothing: FILE.json (a seeds.json) is summarised again from its "
                      "per-example rows into DIR/<name>.json, .md (and .png when it holds the "
                      "curves); A.json,B.json,... (records of one command, disjoint seeds) "
                      "are merged first, --seeds keeping some; FILE.md (a committed table "
                      "without its seeds.json) gets the seed-level t intervals its mean ± std "
                      "rows allow, as a section")
  parser.add_argument("--rerun", default="",
                      help="with --summarize=FILE.md: the command that regenerates the table "
                      "with its per-example raw, quoted in the section")
  args, passthrough = parser.parse_known_args(argv)
  bad = [f for f in passthrough if not f.startswith("--config.")]
  if bad:
    parser.error(f"unrecognised arguments {bad}: only --config.<key>=<value> overrides pass "
                 "through to the training runs")
  if args.summarize:
    return _summarize_cli(parser, args)
  if not args.config or not args.out:
    parser.error("--config and --out are required (unless --summarize)")
  name = args.name or "seeds"
  seeds = _parse_seeds(parser, args.seeds or "0,1,2")
  arms = {"main": []}
  if args.arm:
    arms = {}
    for spec in args.arm:
      arm, sep, flags = spec.partition("=")
      if not sep or not arm:
        parser.error(f"--arm {spec!r}: expected NAME=FLAGS")
      arms[arm] = shlex.split(flags)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  jobs = [(arm, s, run_dir(out, arm, s),
           train_command(args.config, s, run_dir(out, arm, s), list(passthrough) + extra),
           train_config(args.config, s, run_dir(out, arm, s), list(passthrough) + extra))
          for arm, extra in arms.items() for s in seeds]
  results = run_all(jobs, args.parallel)
  failed = [(a, s, rc) for a, s, rc, _ in results if rc != 0]
  for a, s, rc in failed:
    print(f"seeds: {a} seed {s} failed (exit {rc}); see {run_dir(out, a, s) / 'train.log'}",
          file=sys.stderr)
  runs = {arm: {s: load_run(run_dir(out, arm, s), args.before, args.after) for s in seeds
                if is_done(run_dir(out, arm, s))}
          for arm in arms}
  pairs = [c for c in args.contrast.split(",") if c]
  summary = summarise(runs, args.resamples)
  if pairs:
    summary["contrasts"] = contrasts(runs, pairs, args.resamples)
  add_holm(summary)
  if args.curves:
    summary["curves"] = summarise_curves(
        {a: {s: run_dir(out, a, s) for s in runs[a]} for a in arms},
        [m for m in args.curves.split(",") if m])
  plotted = args.plot.split(",")
  series = curve_series({a: {s: run_dir(out, a, s) for s in seeds} for a in arms}, plotted)
  record = {"config": args.config, "overrides": passthrough, "host": fingerprint.host(),
            "code": fingerprint.code_version(),
            "arms": dict(arms), "seeds": seeds,
            "points": [args.before, args.after], "contrast": pairs,
            "runs": {a: {str(s): r for s, r in by.items()} for a, by in runs.items()},
            "plot": {"metrics": plotted, "series": series}, "summary": summary}
  print(write_outputs(record, out, name))
  plot_series(series, out / f"{name}.png", plotted)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
