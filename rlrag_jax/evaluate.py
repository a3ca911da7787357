"""Evaluate a policy on a method's held-out data: EM, F1, format, relevance, per-hop breakdown.

  python -m rlrag_jax.evaluate --config=configs/arena.py --checkpoint=runs/arena
  python -m rlrag_jax.evaluate --config=configs/arena.py:paper --checkpoint=/path/to/hf_dir \\
      --config.eval.judge_url=http://localhost:8000/v1 --config.eval.judge_model=NAME

`--checkpoint` is a training run directory or an HF checkpoint directory. After the shared table
it prints the task's own summary of the result (`Task.eval_report`; e.g. Search-R1's EM per
dataset with intervals beside the published row). The optional LLM judge
(an OpenAI-compatible endpoint you run) is off unless `eval.judge_url` is set; it asks with the
method's own prompt (`task.judge_prompt`, a `judge.JudgePrompt`; `Task`'s default is the neutral
one).
"""
from __future__ import annotations

import json
import pathlib
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/<method>.py[:preset]")
_CKPT = flags.DEFINE_string("checkpoint", None, "run directory or HF checkpoint directory")
_STEP = flags.DEFINE_integer("step", None, "checkpoint step (default: latest)")
_OUT = flags.DEFINE_string("out", None, "write the summary JSON here (default: print only)")


def main(argv):
  del argv
  from rlrag_jax import evaluation, judge, runlog, settings
  from rlrag_jax.data import sources
  from rlrag_jax.experiments import load_checkpoint
  from rlrag_jax.rollout.policy import checkpoint_policy
  runlog.cli_logging()        # what the task built (e.g. which ScaNN mode the index runs in)
  config = _CONFIG.value
  loaded = load_checkpoint("evaluate", config, _CKPT.value, _STEP.value)
  if loaded is None:
    return 2
  task, lm = loaded
  s = settings.Settings.from_config(config)
  policy = checkpoint_policy(lm, task.tokenizer, s.eval.max_new_tokens,
                             rows_per_call=s.eval.batch_size)
  examples = sources.cut_eval(list(task.eval), s.eval.num_examples, "eval.num_examples")
  result = evaluation.evaluate(task, policy, examples, batch_size=s.eval.batch_size,
                               seed=s.seed,
                               judge=judge.from_config(s.eval, prompt=task.judge_prompt,
                                                       where="eval"))
  keys = [k for k in result["all"] if k != "n"]
  rows = [{"split": k, **v} for k, v in result.items() if k == "all" or k.startswith(("hops=", "dataset="))]
  print(runlog.format_table(rows, ["split"] + keys + ["n"], title=f"{config.method} evaluation"))
  extra = task.eval_report(result)
  if extra:
    print(extra)
  if _OUT.value:
    runlog.write_atomic(pathlib.Path(_OUT.value), json.dumps(
        {k: v for k, v in result.items() if k != "rows"} | {"rows": result["rows"]}
        | ({"report": extra} if extra else {}), indent=2))
  return 0


if __name__ == "__main__":
  flags.mark_flags_as_required(["config", "checkpoint"])
  app.run(lambda argv: sys.exit(main(argv)))
