"""How far RL could raise a policy's reward: greedy against sampled against best-of-k.

  python -m rlrag_jax.experiments.headroom --config=configs/arena.py --checkpoint=runs/arena \\
      [--k=8 --temperatures=1.0,0.7,0.5 --split=eval --num=200 --out=DIR]

A group-relative update (GRPO, DAPO) learns only from groups whose rewards differ, and what it
can teach is bounded by what the policy already samples: it sharpens the sampling distribution
towards the completions that scored well. So before spending an RL run, measure on a checkpoint
(a warm-up, say) with the method's own training rollout and reward:

  greedy      mean reward of the greedy completion (what greedy evaluation sees);
  sampled     mean reward of one sample at temperature T (what the RL step sees);
  best-of-k   mean over questions of the best of k samples' rewards (for a 0/1 reward,
              pass@k): a policy that always picked its best sample would reach it;
  spread      the fraction of groups of k whose rewards are not all equal (the groups that
              carry a gradient; DAPO's dynamic sampling redraws the rest).

If best-of-k at the training temperature is not above greedy, RL at that temperature cannot
raise greedy evaluation much whatever its step size: nothing it samples is better than what
greedy decoding already does. Each reward component (`task.rewards(...)`'s keys) gets the same
four numbers. A table goes to stdout, and with --out to `DIR/headroom.txt` and `.json`.
"""
from __future__ import annotations

import sys
from typing import Sequence

import numpy as np
from absl import app, flags
from ml_collections import config_flags

# Command-line flags are defined in define_flags(), only when this module runs as a command:
# tests import it beside other commands, and a second 'config' flag is a DuplicateFlagError.
_CONFIG = _CKPT = _STEP = _K = _TEMPS = _SPLIT = _NUM = _CHUNK = _OUT = None


def define_flags() -> None:
  global _CONFIG, _CKPT, _STEP, _K, _TEMPS, _SPLIT, _NUM, _CHUNK, _OUT
  _CONFIG = config_flags.DEFINE_config_file("config", None, "configs/<method>.py[:preset]")
  _CKPT = flags.DEFINE_string("checkpoint", None, "run directory or HF checkpoint directory")
  _STEP = flags.DEFINE_integer("step", None, "checkpoint step (default: latest)")
  _K = flags.DEFINE_integer("k", 8, "samples per question")
  _TEMPS = flags.DEFINE_list("temperatures", ["1.0", "0.7", "0.5"], "sampling temperatures")
  _SPLIT = flags.DEFINE_enum("split", "eval", ["eval", "train"], "which questions")
  _NUM = flags.DEFINE_integer("num", 200, "questions (the first N of the split)")
  _CHUNK = flags.DEFINE_integer("chunk", 25, "questions per rollout call")
  _OUT = flags.DEFINE_string("out", None, "write headroom.txt and headroom.json here")


def summarize(rewards) -> dict:
  """`rewards` [questions, k] -> {'sampled', 'best', 'spread'}: the mean over all samples, the
  mean over questions of each row's maximum, and the fraction of rows whose values differ."""
  r = np.asarray(rewards, dtype=np.float64)
  if r.ndim != 2 or r.shape[0] == 0 or r.shape[1] == 0:
    raise ValueError(f"headroom.summarize: expected a non-empty [questions, k] array, got shape "
                     f"{r.shape}")
  return {"sampled": float(r.mean()), "best": float(r.max(axis=1).mean()),
          "spread": float((r.max(axis=1) > r.min(axis=1)).mean())}


def headroom(task, policy, examples: Sequence, *, k: int, temperatures: Sequence[float],
             rng, chunk: int = 25, progress: bool = True) -> dict:
  """{reward key: {'greedy': float, T: {'sampled', 'best', 'spread'}}} over `examples`, from
  `task.rollout` (greedy, then k samples per question at each temperature) and `task.rewards`.
  A rollout that ignores `group_size` (one episode per question) is given each question k
  times instead. Every component that `task.rewards` returns for every episode is reported."""
  import dataclasses
  import jax
  from tqdm.auto import tqdm
  examples = list(examples)
  if not examples:
    raise ValueError("headroom: no examples")
  if k < 2:
    raise ValueError(f"headroom: k is {k}; best-of-k and spread need k >= 2")

  repeat = {"on": False}      # True once the task's rollout is seen to ignore group_size

  def rewards(pol, greedy, group):
    nonlocal rng
    rows = []
    starts = range(0, len(examples), chunk)
    it = tqdm(starts, desc="greedy" if greedy else f"T={pol.temperature:g}", leave=False,
              unit="chunk") if progress else starts
    for s in it:
      part = examples[s:s + chunk]
      rng, sub = jax.random.split(rng)
      repeated = [ex for ex in part for _ in range(group)]
      if repeat["on"]:
        eps = task.rollout(pol, repeated, sub, greedy=greedy)
      else:
        eps = task.rollout(pol, part, sub, group_size=group, greedy=greedy)
        if group > 1 and len(eps) == len(part):   # a rollout that ignores group_size
          repeat["on"] = True
          eps = task.rollout(pol, repeated, sub, greedy=greedy)
      if len(eps) != len(part) * group:
        raise ValueError(f"headroom: {type(task).__name__}.rollout returned {len(eps)} episodes "
                         f"for {len(part)} questions x {group}")
      rows += list(task.rewards(eps, 0))
    return rows

  greedy_rows = rewards(policy, True, 1)
  keys = [key for key in greedy_rows[0] if all(isinstance(r.get(key), (int, float))
                                               for r in greedy_rows)]
  out = {key: {"greedy": float(np.mean([r[key] for r in greedy_rows]))} for key in keys}
  for t in temperatures:
    rows = rewards(dataclasses.replace(policy, temperature=float(t)), False, k)
    for key in keys:
      grid = np.array([r.get(key, np.nan) for r in rows], np.float64).reshape(len(examples), k)
      out[key][float(t)] = summarize(grid)
  return out


def format_table(result: dict, k: int) -> str:
  lines = [f"{'reward':<14} {'T':>5} {'greedy':>8} {'sampled':>8} {f'best-of-{k}':>10} "
           f"{'spread':>7}"]
  for key, row in result.items():
    temps = [t for t in row if t != "greedy"]
    for t in temps:
      v = row[t]
      lines.append(f"{key:<14} {t:>5g} {row['greedy']:>8.3f} {v['sampled']:>8.3f} "
                   f"{v['best']:>10.3f} {v['spread']:>7.3f}")
  return "\n".join(lines)


def main(argv):
  del argv
  import jax
  from rlrag_jax import settings
  from rlrag_jax.experiments import load_checkpoint, write_report
  from rlrag_jax.rollout.policy import checkpoint_policy
  config = _CONFIG.value
  loaded = load_checkpoint("headroom", config, _CKPT.value, _STEP.value)
  if loaded is None:
    return 2
  task, lm = loaded
  s = settings.Settings.from_config(config)
  policy = checkpoint_policy(lm, task.tokenizer, s.rl.max_new_tokens,
                             top_k=s.rl.top_k, top_p=s.rl.top_p,
                             rows_per_call=s.eval.batch_size)
  split = task.eval if _SPLIT.value == "eval" else task.train
  examples = list(split)[: _NUM.value]
  temps = [float(t) for t in _TEMPS.value]
  result = headroom(task, policy, examples, k=_K.value, temperatures=temps,
                    rng=jax.random.PRNGKey(config.seed), chunk=_CHUNK.value)
  table = (f"headroom of {_CKPT.value} on {len(examples)} {_SPLIT.value} questions, "
           f"k = {_K.value}\n" + format_table(result, _K.value))
  print(table)
  if _OUT.value:
    write_report(_OUT.value, "headroom", table, {
        "checkpoint": _CKPT.value, "split": _SPLIT.value, "n": len(examples), "k": _K.value,
        "result": {key: {str(t): v for t, v in row.items()} for key, row in result.items()}})
  return 0


if __name__ == "__main__":
  define_flags()
  flags.mark_flags_as_required(["config", "checkpoint"])
  app.run(lambda argv: sys.exit(main(argv)))
