"""GRPO groups: G samples per prompt from one shared prefill vs G prefills of copied prompts.

  python -m rlrag_jax.bench.group_prefill [--sizes tiny,100m --prompts 4 --group 8
                                           --prompt-tokens 512 --new-tokens 32 --repeats 3]

Workload, identical for both paths: `--prompts` random prompts of `--prompt-tokens` tokens each,
`--group` samples of each at temperature 1 with one key, `--new-tokens` new tokens (EOS
disabled), a random Qwen2 model of each size (`bench.sampling.SIZES`).

  shared     `generate_with_params(..., group_size=G)`: each prompt prefilled once, its KV rows
             forked to its G samples inside the jitted program (what `single_turn` does).
  copies     the reference path: the prompt list repeated G times, every copy prefilled.

Printed per size: prefill tokens of each path (prompts x tokens, and G times that), wall time
of the whole call (best of the repeats after one warm-up call each, interleaved), the speed-up,
and whether the two paths drew the same tokens (they should: same logits, same key).
"""
from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

from rlrag_jax.bench import HELP_SMOKE


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--sizes", default="tiny")
  p.add_argument("--prompts", type=int, default=4)
  p.add_argument("--group", type=int, default=8)
  p.add_argument("--prompt-tokens", type=int, default=512)
  p.add_argument("--new-tokens", type=int, default=32)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--smoke", action="store_true", help=HELP_SMOKE)
  args = p.parse_args(argv)
  if args.smoke:
    p.set_defaults(prompts=2, group=2, prompt_tokens=16, new_tokens=4, repeats=1)
    args = p.parse_args(argv)
  import jax
  from rlrag_jax.bench.sampling import SIZES, build_checkpoint
  from rlrag_jax.models import load_hf
  from rlrag_jax.sampling import generate_with_params

  print(f"workload: {args.prompts} prompts x {args.prompt_tokens} tokens, group {args.group}, "
        f"{args.new_tokens} new tokens, temperature 1, EOS off")
  for size in args.sizes.split(","):
    if size not in SIZES:
      p.error(f"--sizes: {size!r} unknown; expected some of {sorted(SIZES)}")
    with tempfile.TemporaryDirectory() as d:
      build_checkpoint(size, d)
      lm = load_hf(d)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, lm.config.vocab_size, args.prompt_tokens).tolist()
               for _ in range(args.prompts)]
    copies = [q for q in prompts for _ in range(args.group)]
    kw = dict(max_new_tokens=args.new_tokens, temperature=1.0, eos_ids=(),
              rng=jax.random.PRNGKey(0))
    run = {"shared": lambda: generate_with_params(lm.config, lm.params, prompts,
                                                  group_size=args.group, **kw),
           "copies": lambda: generate_with_params(lm.config, lm.params, copies, **kw)}
    out = {k: f() for k, f in run.items()}                       # warm-up (compiles)
    best = {k: float("inf") for k in run}
    for _ in range(args.repeats):
      for k, f in run.items():
        t0 = time.perf_counter()
        f()
        best[k] = min(best[k], time.perf_counter() - t0)
    same = bool(np.array_equal(out["shared"].tokens, out["copies"].tokens))
    pre = {"shared": args.prompts * args.prompt_tokens,
           "copies": args.prompts * args.group * args.prompt_tokens}
    print(f"[{size}] prefill tokens: shared {pre['shared']:,}  copies {pre['copies']:,} "
          f"({pre['copies'] / pre['shared']:.1f}x fewer)")
    print(f"[{size}] wall: shared {best['shared'] * 1e3:.1f} ms  copies "
          f"{best['copies'] * 1e3:.1f} ms  speed-up {best['copies'] / best['shared']:.2f}x;  "
          f"same tokens: {same}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
