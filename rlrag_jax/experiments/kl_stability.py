"""KL-estimator stability: the same short GRPO run with k2 and with k3 at an aggressive lr.

  python -m rlrag_jax.experiments.kl_stability [--workdir runs/kl_stability --rl-steps 24
      --lr-mult 20 --beta 0.5 --sft-steps 100 --estimators k2,k3 --set rl.group_size=8 ...
      --seeds 0,1,2]

ARENA (appendix B) argues for k2 as the KL loss term. With r = pi_ref / pi on a sampled token,
the gradient of k2 = (log r)^2 / 2 with respect to log pi is -log r (linear in the log-ratio),
while that of k3 = r - 1 - log r is 1 - r, which grows like exp(log r) once the policy drops a
token the reference liked. At a large learning rate and a large beta, k3 should then show larger
KL excursions and gradient-norm spikes.

Procedure (every stage is `trainer.run` on `configs/arena.py[:preset]` plus overrides):
  1. `<workdir>/warmup`: a short SFT warm-up (no RL), exported as an HF checkpoint;
  2. `<workdir>/<estimator>` for each estimator: RL only, starting from that checkpoint (so every
     run starts from identical weights and draws identical first rollouts), at
     lr = --lr (or --lr-mult x the preset's RL lr), beta = --beta, estimator = k2 / k3.
  3. Both runs' `metrics.jsonl` are read back and summarised per estimator:
       max KL      the largest per-step KL over the run, measured with k3 (unbiased, and the
                   same yardstick for both runs) and also with the run's own estimator;
       spikes      RL steps whose (pre-clipping) gradient norm exceeds --spike-factor x the
                   median gradient norm of that run;
       final reward  mean `reward/total` over the last --final-window RL steps;
       skipped     updates skipped for a non-finite loss or gradient.
     A table goes to stdout and `<workdir>/kl_stability.txt` (+ `.json`), the KL / gradient-norm
     / reward curves of both runs to `<workdir>/kl_stability.png`.

Defaults keep the whole experiment at a few minutes on a 2-core CPU; raise --sft-steps,
--rl-steps, or pick `--config configs/arena.py:paper` (with --set model.path=...) on an
accelerator.
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import shutil
import statistics
import time
from typing import Optional, Sequence

from rlrag_jax import fingerprint, runlog

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------ config
def load_config(spec: str):
  """`path/to/config.py[:preset]` -> ConfigDict (config_base.load_config_file)."""
  from rlrag_jax import config_base
  return config_base.load_config_file(spec)


def _cast(old, text: str, key: str):
  if isinstance(old, bool):
    if text.lower() in ("1", "true", "yes"):
      return True
    if text.lower() in ("0", "false", "no"):
      return False
    raise ValueError(f"--set {key}={text}: expected a boolean (true/false)")
  if isinstance(old, (tuple, list)):
    return tuple(t for t in text.split(",") if t)
  if old is None:
    return text
  try:
    return type(old)(text)
  except ValueError:
    raise ValueError(f"--set {key}={text}: expected a {type(old).__name__} like the config's "
                     f"current value {old!r}") from None


def apply_overrides(config, overrides: Sequence[str]):
  """Applies `key.path=value` strings in place; values are cast to the existing field's type."""
  for item in overrides:
    key, sep, text = item.partition("=")
    if not sep:
      raise ValueError(f"--set {item!r}: expected key.path=value")
    *parents, leaf = key.split(".")
    node = config
    for p in parents:
      if p not in node:
        raise ValueError(f"--set {item!r}: config has no key {key!r} ({p!r} is missing)")
      node = node[p]
    if leaf not in node:
      raise ValueError(f"--set {item!r}: config has no key {key!r}")
    node[leaf] = _cast(node[leaf], text, key)
  return config


def warmup_config(base, workdir: pathlib.Path, sft_steps: int, eval_examples: int):
  c = base.copy_and_resolve_references()
  c.workdir = str(workdir)
  c.sft.steps = int(sft_steps)
  c.rl.steps = 0
  c.eval.num_examples = int(eval_examples)
  c.eval.every = 0
  c.checkpoint.every = 0
  c.export_hf = True
  return c


def rl_config(base, workdir: pathlib.Path, init_path: Optional[pathlib.Path], estimator: str,
              rl_steps: int, lr: float, beta: float, eval_examples: int):
  c = base.copy_and_resolve_references()
  c.workdir = str(workdir)
  if init_path is not None:
    c.model.init = "hf"
    c.model.path = str(init_path)
  c.sft.steps = 0
  c.rl.steps = int(rl_steps)
  c.rl.lr = float(lr)
  c.rl.kl_beta = float(beta)
  c.rl.kl_estimator = estimator
  c.eval.num_examples = int(eval_examples)
  c.eval.every = 0
  c.checkpoint.every = 0
  c.export_hf = False
  return c


# ------------------------------------------------------------------------------------ summary
def _num(v) -> float:
  """A metrics.jsonl value as a float ('nan' / 'inf' strings included)."""
  try:
    return float(v)
  except (TypeError, ValueError):
    return float("nan")


def read_rl_rows(workdir) -> list:
  return runlog.RunLog(workdir, tensorboard=False).rows("rl")


def read_eval_after(workdir) -> dict:
  """Held-out figures after RL from the run's eval_summary.json ({} when absent)."""
  path = pathlib.Path(workdir) / "eval_summary.json"
  if not path.exists():
    return {}
  after = json.loads(path.read_text()).get("after") or {}
  return {f"eval_{k}_after": float(after[k]) for k in ("reward", "format", "em") if k in after}


def summarize(rows: Sequence[dict], spike_factor: float = 3.0, final_window: int = 5) -> dict:
  """Stability figures of one run's RL rows (see the module docstring for the definitions)."""
  if not rows:
    return {"steps": 0}
  col = lambda k: [_num(r.get(k)) for r in rows]
  finite = lambda xs: [x for x in xs if math.isfinite(x)]
  gn = col("grad_norm")
  gn_ok = finite(gn)
  median = statistics.median(gn_ok) if gn_ok else float("nan")
  threshold = spike_factor * median
  kl_ref = "kl_k3" if any("kl_k3" in r for r in rows) else "kl"
  rewards = finite(col("reward/total"))
  own_kl = finite(col("kl"))
  ref_kl = finite(col(kl_ref))
  return {
      "steps": len(rows),
      "max_kl_k3": max(ref_kl) if ref_kl else float("nan"),
      "max_kl_own": max(own_kl) if own_kl else float("nan"),
      "final_kl_k3": ref_kl[-1] if ref_kl else float("nan"),
      "median_grad_norm": median,
      "max_grad_norm": max(gn_ok) if gn_ok else float("nan"),
      "spikes": sum(1 for g in gn if math.isfinite(g) and g > threshold),
      "nonfinite_grad_norm": sum(1 for g in gn if not math.isfinite(g)),
      "skipped": int(sum(finite(col("skipped")))),
      "final_reward": (statistics.fmean(rewards[-final_window:]) if rewards else float("nan")),
      "first_reward": (statistics.fmean(rewards[:final_window]) if rewards else float("nan")),
  }


COLUMNS = ("estimator", "steps", "max_kl_k3", "max_kl_own", "final_kl_k3", "median_grad_norm",
           "max_grad_norm", "spikes", "skipped", "first_reward", "final_reward",
           "eval_reward_after", "eval_format_after")


def format_summary(summaries: dict, spike_factor: float, final_window: int) -> str:
  rows = [{"estimator": est, **s} for est, s in summaries.items()]
  table = runlog.format_table(rows, COLUMNS, title="KL-estimator stability (RL stage)")
  notes = (f"max_kl_k3: largest per-step KL measured with k3 (same yardstick for every run); "
           f"max_kl_own: with the run's own estimator\nspikes: steps with grad_norm (before "
           f"clipping) > {spike_factor:g} x the run's median; first/final_reward: mean reward/total "
           f"over the first/last {final_window} RL steps; eval_*_after: held-out greedy "
           f"evaluation after RL")
  return table + "\n" + notes


def plot(runs: dict, out_png, spike_factor: float = 3.0) -> Optional[pathlib.Path]:
  """KL (k3 and own estimator), gradient norm and reward of every run on one PNG."""
  if not runs:
    return None
  panels = [("kl_k3", "KL estimated with k3", False), ("kl", "KL, run's own estimator", False),
            ("grad_norm", f"grad norm (dashed: {spike_factor:g} x median)", True),
            ("reward/total", "reward/total", False)]
  fig, axes = runlog.subplots(2, 2, figsize=(10, 6.5))
  for ax, (key, title, log_y) in zip(axes.flat, panels):
    for i, (name, rows) in enumerate(runs.items()):
      pts = [(r["step"], _num(r.get(key))) for r in rows if key in r]
      if not pts:
        continue
      color = f"C{i}"
      ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, lw=1.5, label=name)
      if key == "grad_norm":
        ok = [y for _, y in pts if math.isfinite(y)]
        if ok:
          ax.axhline(spike_factor * statistics.median(ok), color=color, ls="--", lw=0.8)
    if log_y:
      ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("step", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  return runlog.save_figure(fig, out_png, "KL-estimator stability")


# ------------------------------------------------------------------------------------ main
def _fresh(path: pathlib.Path):
  """Clears a run directory this experiment owns (metrics.jsonl appends otherwise)."""
  if path.exists():
    shutil.rmtree(path)


def run_experiment(args, base=None) -> dict:
  """Runs the warm-up and one RL run per estimator; returns {estimator: summary}.

  `args` are the parsed flags (see `build_parser`); `base` replaces the config loaded from
  --config (tests pass a tiny one); --set overrides apply to either.
  """
  from rlrag_jax import trainer
  workdir = pathlib.Path(args.workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  base = apply_overrides(load_config(args.config) if base is None else base, args.set)
  lr = args.lr if args.lr is not None else args.lr_mult * float(base.rl.lr)
  t0 = time.time()
  init_path = None
  if args.sft_steps > 0:
    wdir = workdir / "warmup"
    init_path = wdir / "hf"
    if args.reuse_warmup and (init_path / "config.json").exists():
      print(f"reusing the warm-up checkpoint {init_path}")
    else:
      _fresh(wdir)
      print(f"== SFT warm-up: {args.sft_steps} steps -> {wdir}", flush=True)
      trainer.run(warmup_config(base, wdir, args.sft_steps, args.eval_examples),
                  progress=not args.quiet)
  elif base.model.init == "hf":
    init_path = pathlib.Path(base.model.path)
  estimators = [e for e in args.estimators.split(",") if e]
  for est in estimators:
    rdir = workdir / est
    _fresh(rdir)
    print(f"== RL with {est}: {args.rl_steps} steps, lr {lr:g}, beta {args.beta:g} -> {rdir}",
          flush=True)
    trainer.run(rl_config(base, rdir, init_path, est, args.rl_steps, lr, args.beta,
                          args.eval_examples), progress=not args.quiet)
  runs = {est: read_rl_rows(workdir / est) for est in estimators}
  summaries = {est: {**summarize(rows, args.spike_factor, args.final_window),
                     **read_eval_after(workdir / est)} for est, rows in runs.items()}
  text = format_summary(summaries, args.spike_factor, args.final_window)
  text += (f"\nsettings: {args.config} {' '.join(args.set)}; SFT warm-up {args.sft_steps} steps; "
           f"RL {args.rl_steps} steps at lr {lr:g}, beta {args.beta:g}; "
           f"wall time {(time.time() - t0) / 60:.1f} min")
  png = plot(runs, workdir / "kl_stability.png", args.spike_factor)
  (workdir / "kl_stability.txt").write_text(text + "\n")
  (workdir / "kl_stability.json").write_text(json.dumps(
      {"settings": {"config": args.config, "set": list(args.set), "sft_steps": args.sft_steps,
                    "rl_steps": args.rl_steps, "lr": lr, "beta": args.beta,
                    "spike_factor": args.spike_factor, "final_window": args.final_window},
       "summary": summaries}, indent=2))
  print()
  print(text)
  if png is not None:
    print(f"curves: {png}")
  return summaries


# ------------------------------------------------------------------------------------ seeds
SEED_FIGURES = ("max_kl_k3", "final_kl_k3", "spikes", "max_grad_norm", "first_reward",
                "final_reward", "eval_reward_after", "eval_format_after")
SMOOTHNESS = ("kl_k3", "reward/total", "grad_norm")


def aggregate_seeds(workdir: pathlib.Path, seeds: Sequence[int]) -> str:
  """Per estimator, mean ± std over seeds of each seed's summary figures and of the curves'
  step-to-step change std (smoothness; `experiments.seeds.curve_stats`); with two estimators,
  their per-seed difference of each figure with a t interval over seeds. Writes
  <workdir>/kl_stability_seeds.{md,json,png} (the json also holds the raw: each seed's figures,
  every RL step's KL / reward / gradient norm, and the host); returns the markdown."""
  from rlrag_jax.experiments import seeds as seeds_lib
  per_seed = {s: json.loads((workdir / f"seed_{s}" / "kl_stability.json").read_text())
              for s in seeds}
  estimators = list(next(iter(per_seed.values()))["summary"])
  dirs = {e: {s: workdir / f"seed_{s}" / e for s in seeds} for e in estimators}
  figures = {e: {k: seeds_lib.mean_std([_num(per_seed[s]["summary"][e].get(k)) for s in seeds])
                 for k in SEED_FIGURES} for e in estimators}
  curves = seeds_lib.summarise_curves(dirs, SMOOTHNESS)
  settings = next(iter(per_seed.values()))["settings"]
  shared = " ".join(x for x in settings["set"] if not x.startswith("seed="))
  lines = [f"# KL-estimator stability over seeds {', '.join(map(str, seeds))}", "",
           f"{settings['config']} {shared}; SFT warm-up {settings['sft_steps']} steps; RL {settings['rl_steps']} steps at lr "
           f"{settings['lr']:g}, beta {settings['beta']:g}. Mean ± std over seeds.", "",
           "| estimator | " + " | ".join(SEED_FIGURES) + " |",
           "|---|" + "---|" * len(SEED_FIGURES)]
  for e in estimators:
    lines.append(f"| {e} | " + " | ".join(f"{m:.3g} ± {sd:.2g}" for m, sd in
                                           (figures[e][k] for k in SEED_FIGURES)) + " |")
  paired = {}
  if len(estimators) == 2:
    # both estimators of a seed start from its warm-up with the same first rollouts: pair them
    a, b = estimators
    for k in SEED_FIGURES:
      d = [_num(per_seed[s]["summary"][b].get(k)) - _num(per_seed[s]["summary"][a].get(k))
           for s in seeds]
      if all(math.isfinite(x) for x in d):
        paired[k] = {"per_seed": d, "t": seeds_lib.t_interval(d)}
    lines += ["", f"{b} - {a} per seed (paired: one warm-up and the same first rollouts), "
              "Student-t 95% interval over seeds:", "",
              "| figure | per seed | mean | t 95% CI over seeds | vs 0 |", "|---|---|---|---|---|"]
    for k, e in paired.items():
      m, lo, hi = e["t"]
      ci = f"[{lo:+.3g}, {hi:+.3g}]" if math.isfinite(lo) else "–"
      lines.append(f"| {k} | {', '.join(f'{x:+.3g}' for x in e['per_seed'])} | {m:+.3g} | "
                   f"{ci} | {seeds_lib.claim(e['t'])} |")
  lines += ["", seeds_lib.curves_markdown(curves)]
  text = "\n".join(lines)
  (workdir / "kl_stability_seeds.md").write_text(text)
  # the raw beside the aggregates: each seed's figures and every RL step's curve values, so
  # each number of the table (and any interval over seeds) is recomputable from this file
  steps = {e: {str(s): [{k: r[k] for k in ("step", "kl", *SMOOTHNESS) if k in r}
                        for r in read_rl_rows(dirs[e][s])] for s in seeds} for e in estimators}
  (workdir / "kl_stability_seeds.json").write_text(json.dumps(
      {"seeds": list(seeds), "settings": settings, "figures": figures, "paired": paired,
       "curves": curves, "per_seed": {str(s): per_seed[s]["summary"] for s in seeds},
       "steps": steps, "host": fingerprint.host()}, indent=1))
  seeds_lib.plot_curves(dirs, workdir / "kl_stability_seeds.png", metrics=SMOOTHNESS)
  return text


def run_seeds(args) -> str:
  """--seeds: the experiment once per seed in <workdir>/seed_<S> (a seed with its
  kl_stability.json is not rerun), then `aggregate_seeds`."""
  seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
  root = pathlib.Path(args.workdir)
  for s in seeds:
    sub = root / f"seed_{s}"
    if (sub / "kl_stability.json").exists():
      print(f"seed {s}: done already ({sub})")
      continue
    run_experiment(argparse.Namespace(**{**vars(args), "workdir": str(sub),
                                         "set": list(args.set) + [f"seed={s}"]}))
  text = aggregate_seeds(root, seeds)
  print(text)
  return text


def build_parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser(prog="python -m rlrag_jax.experiments.kl_stability",
                               description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--workdir", default="runs/kl_stability")
  ap.add_argument("--config", default="configs/arena.py", help="config file[:preset]")
  ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                  help="config override, repeatable (e.g. --set rl.group_size=4)")
  ap.add_argument("--estimators", default="k2,k3")
  ap.add_argument("--sft-steps", type=int, default=100,
                  help="shared SFT warm-up steps (0: RL from the config's model as is)")
  ap.add_argument("--rl-steps", type=int, default=24)
  ap.add_argument("--lr", type=float, default=None, help="RL learning rate (absolute)")
  ap.add_argument("--lr-mult", type=float, default=20.0,
                  help="RL learning rate as a multiple of the config's rl.lr (when no --lr)")
  ap.add_argument("--beta", type=float, default=0.5, help="KL loss coefficient")
  ap.add_argument("--eval-examples", type=int, default=32,
                  help="held-out examples evaluated before / after each run")
  ap.add_argument("--spike-factor", type=float, default=3.0)
  ap.add_argument("--final-window", type=int, default=5)
  ap.add_argument("--reuse-warmup", action="store_true",
                  help="keep <workdir>/warmup/hf when it exists instead of training it again")
  ap.add_argument("--quiet", action="store_true", help="no progress bars")
  ap.add_argument("--seeds", default="",
                  help="e.g. 0,1,2: run once per seed in <workdir>/seed_<S> (finished seeds are "
                  "kept) and write mean ± std over seeds to <workdir>/kl_stability_seeds.md")
  return ap


def main(argv=None):
  import logging
  logging.basicConfig(level=logging.WARNING)
  args = build_parser().parse_args(argv)
  return run_seeds(args) if args.seeds else run_experiment(args)


if __name__ == "__main__":
  main()
