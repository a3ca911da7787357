"""Export a trained policy to a Hugging Face checkpoint directory.

  python -m rlrag_jax.export --checkpoint runs/arena --out exported/arena-hf [--step N]

`--checkpoint` is a training run directory (or its checkpoints/ folder); the output loads with
`transformers.AutoModelForCausalLM.from_pretrained(out)` and `AutoTokenizer.from_pretrained(out)`.
"""
from __future__ import annotations

import sys

from absl import app, flags

_CKPT = flags.DEFINE_string("checkpoint", None, "run directory or its checkpoints/ folder")
_OUT = flags.DEFINE_string("out", None, "output HF checkpoint directory")
_STEP = flags.DEFINE_integer("step", None, "checkpoint step (default: latest)")
_SHARD = flags.DEFINE_integer("max_shard_mb", 5120, "split weights into files of at most this size")


def main(argv):
  del argv
  from rlrag_jax.models import save_hf
  from rlrag_jax.run_dirs import load_trained
  try:
    lm = load_trained(_CKPT.value, step=_STEP.value)
  except FileNotFoundError as e:
    print(f"export: {e}", file=sys.stderr)
    return 2
  save_hf(lm, _OUT.value, max_shard_bytes=_SHARD.value * 2**20)
  print(f"exported {lm.config.num_params():,} parameters to {_OUT.value}")
  return 0


if __name__ == "__main__":
  flags.mark_flags_as_required(["checkpoint", "out"])
  app.run(lambda argv: sys.exit(main(argv)))
