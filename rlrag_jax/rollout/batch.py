"""Length buckets shared by the sampler's calls and the learner's token batches: `round_up`
and `geometric_round`, which map every length a run meets onto a bounded set of sizes (compiled
programs). Packing prompts + completions into the learner's batches lives in `rl.packing`.
"""
from __future__ import annotations


def round_up(n: int, bucket: int) -> int:
  return max(bucket, -(-n // bucket) * bucket)


def geometric_round(n: int, unit: int, per_octave: int = 8) -> int:
  """Rounds n up to a multiple of `unit`, coarser as n grows: multiples of `unit` up to
  2 * per_octave * unit, then of unit * 2^k, keeping at most ~per_octave sizes per doubling.
  Every length a run meets maps to a bounded set of sizes (compiled programs): ~per_octave *
  log2(max / (2 * per_octave * unit)) beyond the 2 * per_octave linear ones."""
  if unit < 1 or per_octave < 1:
    raise ValueError(f"geometric_round: unit and per_octave must be >= 1; got {unit}, "
                     f"{per_octave}")
  step = unit
  while n > step * per_octave * 2:
    step *= 2
  return round_up(n, step)
