"""What a run shows and leaves behind: the progress bar, per-step logging, the final tables,
per-example rows and curves."""
from __future__ import annotations

import json
import logging
import math

from rlrag_jax import runlog
from rlrag_jax import settings as settings_lib

log = logging.getLogger("rlrag_jax.trainer")


def progress_bar(total, initial, enabled):
  if not enabled:
    return None
  from tqdm.auto import tqdm
  return tqdm(total=total, initial=initial, desc="train", unit="step", dynamic_ncols=True)


def log_step(rlog, step, stage, m, every, bar):
  m = {k: float(v) for k, v in m.items()}
  if not math.isfinite(m.get("loss", 0.0)) or m.get("skipped", 0.0):
    log.warning("step %d (%s): non-finite loss or gradient, update skipped", step, stage)
  rlog.write(step, stage, m)
  if bar is not None:
    bar.update(1)
    if step % max(every, 1) == 0:
      shown = {k: m[k] for k in ("loss", "reward/total", "reward/format", "kl") if k in m}
      text = " ".join(f"{k.split('/')[-1]}={v:.3f}" for k, v in shown.items())
      for name in sorted(k[:-len("/failure_rate")] for k in m if k.endswith("/failure_rate")):
        text += (f" {name}_failed={m[name + '/failures']:.0f}/{m[name + '/calls']:.0f}"
                 f" ({m[name + '/failure_rate']:.0%})")
      bar.set_postfix({stage: text})


def final_label(settings) -> str:
  """What the final evaluation is called: after the last stage that trained ("after RL",
  "after SFT"), or "untrained" when no stage ran a step. The summary JSON keeps the key
  "after" whatever the label. `settings`: `rlrag_jax.settings.Settings` (or a config)."""
  settings = settings_lib.of(settings)
  if settings.rl.steps > 0:
    return "after RL"
  if settings.sft.steps > 0:
    return "after SFT"
  return "untrained"


def write_report(workdir, rlog, before, after, seconds, label="after RL"):
  keys = [k for k in (after or {}).get("all", {}) if k != "n"]
  rows = []
  if before:
    rows.append({"checkpoint": "warm-up (before RL)", **before["all"]})
  rows.append({"checkpoint": label, **after["all"]})
  table = runlog.format_table(rows, ["checkpoint"] + keys + ["n"], title="Held-out evaluation")
  hop_rows = [{"checkpoint": label, "split": k, **v} for k, v in after.items()
              if k.startswith(("hops=", "dataset="))]
  if hop_rows:
    table += "\n\n" + runlog.format_table(hop_rows, ["split"] + keys + ["n"],
                                          title="By hops and dataset")
  table += f"\n\nwall time: {seconds / 60:.1f} min"
  # Atomic writes: experiments.seeds reads a run whose summary and rows exist as finished.
  runlog.write_atomic(workdir / "eval_table.txt", table + "\n")
  runlog.write_atomic(workdir / "eval_summary.json", json.dumps(
      {"before": before and before["all"], "after": after["all"],
       "after_by_hops": {k: v for k, v in after.items() if k.startswith("hops=")},
       "after_by_dataset": {k: v for k, v in after.items() if k.startswith("dataset=")},
       "minutes": seconds / 60}, indent=2))
  # Per-example results (for paired comparisons across runs, e.g. experiments.seeds).
  runlog.write_atomic(workdir / "eval_rows.json", json.dumps(
      {"before": slim(before["rows"]) if before else [], "after": slim(after["rows"])}))
  rl_rows = rlog.rows("rl")
  reward_keys = sorted({k for r in rl_rows for k in r if k.startswith("reward/")},
                       key=lambda k: (k != "reward/total", k))
  runlog.plot_curves(rl_rows, reward_keys + ["kl", "grad_norm", "loss", "completion_len"],
                     workdir / "rl_curves.png", title="RL")
  sft_rows = rlog.rows("sft")
  runlog.plot_curves(sft_rows, ["loss"], workdir / "sft_curves.png", title="SFT")
  print(table)


def slim(rows) -> list:
  return [{k: v for k, v in r.items() if k != "completion"} for r in rows]
