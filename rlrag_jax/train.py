"""Training entry point: `python -m rlrag_jax.train --config=configs/<method>.py[:preset]`.

Overrides use ml_collections syntax, e.g. `--config.rl.kl_estimator=k3 --config.rl.steps=200`.
`--resume` continues from the latest checkpoint in the config's workdir. A workdir that holds a
run of another config (its fingerprint.json, `rlrag_jax.fingerprint`) is refused with the
differing keys; `--force` starts anyway and records that it did. The runs the config depends
on (`model.train_config`, `models.<name>.train_config`) are trained first where their paths hold
no finished run (`trainer.train_dependencies`), each resuming a run a kill interrupted.
"""
from __future__ import annotations

import sys
from typing import Optional, Sequence

from absl import app, flags
from ml_collections import config_flags


def define_flags(flag_values: flags.FlagValues = flags.FLAGS,
                 argv: Optional[Sequence[str]] = None) -> None:
  """The command's flags on `flag_values`; `argv` (default sys.argv) is where config_flags
  finds the --config.<key> overrides it defines."""
  config_flags.DEFINE_config_file("config", None, "configs/<method>.py[:preset]",
                                  flag_values=flag_values,
                                  sys_argv=None if argv is None else list(argv))
  flags.DEFINE_string("workdir", None, "overrides config.workdir", flag_values=flag_values)
  flags.DEFINE_bool("resume", False, "continue from the latest checkpoint in workdir",
                    flag_values=flag_values)
  flags.DEFINE_bool("force", False, "start even when workdir holds a run of another config "
                    "(the differing keys are recorded in its fingerprint.json)",
                    flag_values=flag_values)
  flags.DEFINE_bool("quiet", False, "no progress bars", flag_values=flag_values)


def _config(flag_values: flags.FlagValues):
  config = flag_values["config"].value
  if config is None:
    raise app.UsageError("--config is required, e.g. --config=configs/arena.py")
  if flag_values["workdir"].value:
    config.workdir = flag_values["workdir"].value
  return config


def config_from_argv(argv: Sequence[str]):
  """The config `python -m rlrag_jax.train ARGV` trains, resolved as that command resolves it
  (experiments.seeds fingerprints a run's flags with it, without starting the process)."""
  argv = ["train", *argv]
  fv = flags.FlagValues()
  define_flags(fv, argv)
  fv(argv)
  return _config(fv)


def main(argv):
  del argv
  from rlrag_jax import fingerprint, runlog, trainer
  runlog.cli_logging()
  FLAGS = flags.FLAGS              # pylint: disable=invalid-name
  config = _config(FLAGS)
  try:
    # The runs this config depends on (a reader, a generator, the policy's start), each trained
    # once into its own path; then the run, which loads them.
    trainer.train_dependencies(config, force=FLAGS.force)
    trainer.run(config, resume=FLAGS.resume, progress=not FLAGS.quiet, force=FLAGS.force)
  except fingerprint.ConfigMismatch as e:
    print(f"train: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  define_flags()
  flags.mark_flag_as_required("config")
  app.run(lambda argv: sys.exit(main(argv)))
