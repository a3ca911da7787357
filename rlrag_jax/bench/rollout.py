"""Multi-turn tool rollout throughput: `run_tool_loop` vs the same loop on `transformers` generate.

  python -m rlrag_jax.bench.rollout [--sizes tiny,100m --batch 32 --turns 4 --turn-tokens 24
                                     --obs-tokens 48 --repeats 2]

Workload, identical for both sides: a batch of prompts (16-64 random tokens) from a random Qwen2
model (`bench.sampling.SIZES`), greedy decoding, EOS disabled. A turn ends at a "tool call": any
token whose id is a multiple of `--stop-every` (one stop table of single-token stops), or at
`--turn-tokens`; after a tool call the environment appends a fixed observation of `--obs-tokens`
tokens; at most `--turns` tool calls per row. Rows finish independently (a turn that ends without
a tool call, or one call too many), and each turn samples only the rows still active.

  ours       `rollout.run_tool_loop` with a `Policy` over the `load_hf` weights: per turn one
             jitted generate call (re-prefill of the whole context, KV-cache decode, batch and
             context padded to buckets).
  reference  the same loop written over `transformers` `generate` (CPU torch, same weights): per
             turn one `generate(..., eos_token_id=<stop ids>)` call over the active rows,
             left-padded, then the same environment.

tokens/s counts policy-generated tokens (observations excluded) over the wall time of the whole
rollout, environment and bookkeeping included; tool calls/s counts observations appended. Both
are warmed up once on the same workload (ours compiles its programs then; the compile time is
printed apart) and the repeats are interleaved, best run reported. Greedy decoding on random
weights: the two sides can part ways at a near-tie, so token and call counts are printed per side.
Needs torch (the `bench` extra).
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np


class IdTokenizer:
  """What the loop needs from a tokenizer, over raw ids: decoding writes ids as text, encoding
  maps each character of an observation to an id (mod the vocab, above the stop ids)."""

  def __init__(self, vocab: int, stop_every: int):
    self.vocab, self.stop_every = vocab, stop_every

  def batch_decode(self, seqs, skip_special_tokens=False):
    del skip_special_tokens
    return [" ".join(map(str, s)) for s in seqs]

  def __call__(self, texts, add_special_tokens=False):
    del add_special_tokens
    out = []
    for t in texts:
      ids = [(ord(ch) * 7 + 1) % self.vocab for ch in t]
      out.append([i + 1 if i % self.stop_every == 0 else i for i in ids])   # never a stop
    return {"input_ids": out}


class FixedEnv:
  """Every tool call gets the same observation (`n` characters -> `n` tokens)."""

  def __init__(self, n: int):
    self.text = "".join(chr(ord("a") + i % 26) for i in range(n))

  def batch(self, rows, turn_texts, completions):
    return [self.text] * len(rows)


def ours_loop(lm, prompts, args, stops):
  import jax
  from rlrag_jax.rollout import run_tool_loop
  from rlrag_jax.rollout.policy import Policy
  policy = Policy(lm.config, lm.params, max_new_tokens=args.turn_tokens, eos_ids=(), pad_id=0)
  tok = IdTokenizer(lm.config.vocab_size, args.stop_every)

  def run():
    out = run_tool_loop(policy, prompts, FixedEnv(args.obs_tokens), rng=jax.random.PRNGKey(0),
                        tokenizer=tok, max_turns=args.turns, max_obs_tokens=args.obs_tokens,
                        max_total_len=4096, stop=[[s] for s in stops], greedy=True)
    gen = sum(sum(m) for m in out.loss_mask)
    return gen, sum(out.num_tool_calls), out.completion_ids
  return run


def reference_loop(model, prompts, args, stops):
  """The loop of `run_tool_loop`, over transformers generate."""
  import torch
  env = FixedEnv(args.obs_tokens)
  tok = IdTokenizer(model.config.vocab_size, args.stop_every)
  stop_set = set(stops)

  def run():
    n = len(prompts)
    comp = [[] for _ in range(n)]
    calls = [0] * n
    active = list(range(n))
    generated = 0
    while active:
      ctx = [list(prompts[i]) + comp[i] for i in active]
      width = max(len(c) for c in ctx)
      ids = torch.zeros((len(ctx), width), dtype=torch.long)
      att = torch.zeros((len(ctx), width), dtype=torch.long)
      for j, c in enumerate(ctx):
        ids[j, width - len(c):] = torch.tensor(c)
        att[j, width - len(c):] = 1
      with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=args.turn_tokens,
                             do_sample=False, eos_token_id=list(stops), pad_token_id=0)
      new = out[:, width:].tolist()
      asking = []
      for j, i in enumerate(active):
        seq = new[j]
        cut = next((k + 1 for k, t in enumerate(seq) if t in stop_set), len(seq))
        seq = seq[:cut]
        comp[i] += seq
        generated += len(seq)
        if seq and seq[-1] in stop_set and calls[i] < args.turns:
          asking.append(i)
      tok.batch_decode([comp[i] for i in asking])          # what the env would read
      obs = tok(env.batch(asking, None, None))["input_ids"]
      for i, o in zip(asking, obs):
        comp[i] += o[:args.obs_tokens]
        calls[i] += 1
      active = asking
    return generated, sum(calls), comp
  return run


def main(argv=None):
  ap = argparse.ArgumentParser(prog="python -m rlrag_jax.bench.rollout", description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--sizes", default="tiny,100m")
  ap.add_argument("--batch", type=int, default=32)
  ap.add_argument("--turns", type=int, default=4, help="tool calls per row at most")
  ap.add_argument("--turn-tokens", type=int, default=24, help="policy tokens per turn at most")
  ap.add_argument("--obs-tokens", type=int, default=48)
  ap.add_argument("--stop-every", type=int, default=8,
                  help="token ids divisible by this end a turn with a tool call")
  ap.add_argument("--prompt-min", type=int, default=16)
  ap.add_argument("--prompt-max", type=int, default=64)
  ap.add_argument("--repeats", type=int, default=2)
  ap.add_argument("--no-reference", action="store_true")
  args = ap.parse_args(argv)

  import jax
  import torch
  from rlrag_jax.bench.sampling import build_checkpoint, make_prompts
  from rlrag_jax.models import load_hf
  print(f"jax {jax.__version__} ({jax.default_backend()}), torch {torch.__version__} "
        f"({torch.get_num_threads()} threads); batch {args.batch}, <= {args.turns} tool calls of "
        f"{args.obs_tokens} tokens, <= {args.turn_tokens} tokens per turn, greedy; load average "
        f"{os.getloadavg()[0]:.2f}", flush=True)
  table = []
  for size in args.sizes.split(","):
    with tempfile.TemporaryDirectory(prefix=f"bench_rollout_{size}_") as tmp:
      model = build_checkpoint(size, tmp)
      lm = load_hf(tmp)
    vocab = lm.config.vocab_size
    stops = [t for t in range(args.stop_every, vocab, args.stop_every)]
    prompts = [[t + 1 if t % args.stop_every == 0 else t for t in p]
               for p in make_prompts(args.batch, args.prompt_min, args.prompt_max, vocab)]
    runs = {"ours": ours_loop(lm, prompts, args, stops)}
    if not args.no_reference:
      runs["reference"] = reference_loop(model, prompts, args, stops)
    first = {}
    for name, run in runs.items():           # warm-up on the same workload
      t = time.perf_counter()
      run()
      first[name] = time.perf_counter() - t
    best, counts, outs = {}, {}, {}
    for _ in range(args.repeats):            # interleaved: background load hits both alike
      for name, run in runs.items():
        t = time.perf_counter()
        gen, calls, comp = run()
        dt = time.perf_counter() - t
        if dt < best.get(name, float("inf")):
          best[name], counts[name], outs[name] = dt, (gen, calls), comp
    for name in runs:
      gen, calls = counts[name]
      print(f"[{size}] {name:9s}: {gen} tokens, {calls} tool calls in {best[name]:.2f}s -> "
            f"{gen / best[name]:.0f} tok/s, {calls / best[name]:.1f} calls/s (first run "
            f"{first[name]:.2f}s)", flush=True)
    if "reference" in outs:
      same = np.mean([a == b for a, b in zip(outs["ours"], outs["reference"])])
      print(f"[{size}] rows with identical completions: {same:.0%}")
    row = {"size": size, "params": sum(int(np.prod(x.shape))
                                       for x in jax.tree_util.tree_leaves(lm.params))}
    for name in runs:
      gen, calls = counts[name]
      row[f"{name}_tok"] = gen / best[name]
      row[f"{name}_calls"] = calls / best[name]
    table.append(row)

  print(f"\nrun_tool_loop throughput at batch {args.batch} (best of {args.repeats}; load average "
        f"now {os.getloadavg()[0]:.2f})")
  print(f"{'model':>12} {'metric':>13} {'ours':>10} {'reference':>10} {'ratio':>7}")
  for r in table:
    label = f"{r['size']} ({r['params'] / 1e6:.1f}M)"
    for metric, key in (("tokens/s", "tok"), ("tool calls/s", "calls")):
      ours = r[f"ours_{key}"]
      ref = r.get(f"reference_{key}")
      ratio = f"{ours / ref:.2f}x" if ref else "-"
      print(f"{label:>12} {metric:>13} {ours:10.1f} {ref if ref else float('nan'):10.1f} "
            f"{ratio:>7}")


if __name__ == "__main__":
  main()
