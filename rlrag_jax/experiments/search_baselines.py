"""The search agent against two reference pipelines on a checkpoint (the pipelines, their table
and the post-training report live in `rlrag_jax.methods.search.baselines`).

  python -m rlrag_jax.experiments.search_baselines --config=configs/search.py --checkpoint=runs/search \\
      [--pipelines=agent,no_retrieval,naive_rag] [--out=results.json]
"""
from __future__ import annotations

import json
import pathlib
import sys

from rlrag_jax import settings
from rlrag_jax.data import sources
from rlrag_jax.methods.search import baselines


def main(argv=None) -> int:
  del argv
  cfg = _FLAGS["config"].value
  from rlrag_jax.trainer import task_for_checkpoint
  try:
    task, lm = task_for_checkpoint(cfg, _FLAGS["checkpoint"].value)
  except FileNotFoundError as e:
    print(f"search_baselines: {e}", file=sys.stderr)
    return 2
  s = settings.Settings.from_config(cfg)
  examples = sources.cut_eval(list(task.eval), s.eval.num_examples, "eval.num_examples")
  pipelines = tuple(p for p in _FLAGS["pipelines"].value.split(",") if p)
  res = baselines.evaluate_pipelines(task, eval_policy(lm, task.tokenizer, s), examples,
                                     pipelines=pipelines, batch_size=s.eval.batch_size,
                                     seed=s.seed, progress=True)
  print(baselines.format_pipelines(res))
  if _FLAGS["out"].value:
    pathlib.Path(_FLAGS["out"].value).write_text(json.dumps(res, indent=2))
  return 0


def eval_policy(lm, tokenizer, cfg):
  """The checkpoint's policy as the trainer's final evaluation samples: eval.max_new_tokens,
  the RL sampling settings where a pipeline samples at all, eval.batch_size rows a call.
  `cfg`: `rlrag_jax.settings.Settings` (or a config, parsed)."""
  from rlrag_jax.rollout.policy import checkpoint_policy
  s = settings.of(cfg)
  return checkpoint_policy(lm, tokenizer, s.eval.max_new_tokens,
                           temperature=s.rl.temperature, top_k=s.rl.top_k,
                           top_p=s.rl.top_p, rows_per_call=s.eval.batch_size)


_FLAGS = {}


def _define_flags():
  from absl import flags
  from ml_collections import config_flags
  _FLAGS["config"] = config_flags.DEFINE_config_file("config", "configs/search.py",
                                                     "configs/search.py[:preset]")
  _FLAGS["checkpoint"] = flags.DEFINE_string("checkpoint", None,
                                             "run directory or HF checkpoint directory")
  _FLAGS["pipelines"] = flags.DEFINE_string("pipelines", "agent,no_retrieval,naive_rag",
                                            "comma-separated pipelines")
  _FLAGS["out"] = flags.DEFINE_string("out", None, "write the results JSON here")


if __name__ == "__main__":
  from absl import app, flags
  _define_flags()
  flags.mark_flag_as_required("checkpoint")
  app.run(lambda argv: sys.exit(main(argv)))
