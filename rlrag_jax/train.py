"""Training entry point: `python -m rlrag_jax.train --config=configs/<method>.py[:preset]`.

Overrides use ml_collections syntax, e.g. `--config.rl.kl_estimator=k3 --config.rl.steps=200`.
`--resume` continues from the latest checkpoint in the config's workdir.
"""
from __future__ import annotations


from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/<method>.py[:preset]")
_WORKDIR = flags.DEFINE_string("workdir", None, "overrides config.workdir")
_RESUME = flags.DEFINE_bool("resume", False, "continue from the latest checkpoint in workdir")
_QUIET = flags.DEFINE_bool("quiet", False, "no progress bars")


def main(argv):
  del argv
  from rlrag_jax import runlog
  runlog.cli_logging()
  config = _CONFIG.value
  if config is None:
    raise app.UsageError("--config is required, e.g. --config=configs/arena.py")
  if _WORKDIR.value:
    config.workdir = _WORKDIR.value
  from rlrag_jax import trainer
  trainer.run(config, resume=_RESUME.value, progress=not _QUIET.value)


if __name__ == "__main__":
  flags.mark_flag_as_required("config")
  app.run(main)
