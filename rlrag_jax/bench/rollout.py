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

  python -m rlrag_jax.bench.rollout --kv-reuse [--sizes trained,tiny --prompts 4 --group 8
                                     --prompt-tokens 512 --turns 4 --obs-tokens 256
                                     --turn-tokens 16 --repeats 2]

compares instead, in one process on one workload, `run_tool_loop`'s re-prefill path (every turn
prefills each row's whole context) with its KV-reuse path (`sampling.CachedContexts`: a group's
prompt prefilled once, then only each new observation): prefill tokens (real and padded), wall
time (best of the repeats after a warm-up, interleaved), and whether the completions are equal.
`trained` is `bench.trained_tiny` (greedy ties are rare on it; random weights can break a tie
differently after float reordering, so equality there is a strong but not a guaranteed outcome).
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from rlrag_jax.bench import HELP_SMOKE


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


class IntTokenizer:
  """Text is token ids written in decimal, space separated (so an environment can return exact
  ids)."""

  def batch_decode(self, seqs, skip_special_tokens=False):
    del skip_special_tokens
    return [" ".join(map(str, s)) for s in seqs]

  def __call__(self, texts, add_special_tokens=False):
    del add_special_tokens
    return {"input_ids": [[int(w) for w in t.split()] for t in texts]}


class CountingPolicy:
  """Wraps a `Policy`: counts what the re-prefill path prefills (real tokens, padded slots) and
  keeps the `CachedContexts` of the KV-reuse path for its counters."""

  def __init__(self, policy):
    self.policy, self.max_new_tokens = policy, policy.max_new_tokens
    self.tokens = self.slots = 0
    self.ctx = None

  def sample(self, prompt_ids, rng, **kw):
    self.tokens += sum(len(p) for p in prompt_ids)
    rows = -(-len(prompt_ids) // kw.get("batch_multiple", 1)) * kw.get("batch_multiple", 1)
    self.slots += rows * kw["prompt_length"]
    return self.policy.sample(prompt_ids, rng, **kw)

  def contexts(self, **kw):
    self.ctx = self.policy.contexts(**kw)
    return self.ctx


def kv_reuse_main(args) -> int:
  """Re-prefill vs KV reuse in `run_tool_loop`, one process, same model and workload."""
  import jax
  from rlrag_jax.bench import trained_tiny
  from rlrag_jax.bench.sampling import build_checkpoint
  from rlrag_jax.models import load_hf
  from rlrag_jax.rollout import run_tool_loop
  from rlrag_jax.rollout.policy import Policy
  stop_every = 4
  print(f"workload: {args.prompts} prompts x {args.prompt_tokens} tokens, group {args.group} "
        f"({args.prompts * args.group} rows), <= {args.turns} tool calls per row, each "
        f"answered with a {args.obs_tokens}-token observation, <= {args.turn_tokens} tokens per "
        f"turn, greedy; a turn ends at a tool call = any token id divisible by {stop_every}. "
        f"Load average {os.getloadavg()[0]:.2f}", flush=True)
  print("  re-prefill  run_tool_loop(kv_reuse=False): every turn prefills every row's whole "
        "context (the group's copies too)")
  print("  kv reuse    run_tool_loop(kv_reuse=True, group_size=G): one prefill per distinct "
        "prompt, then each turn prefills only the observation just appended")
  models = []
  for size in args.sizes.split(","):
    if size == "trained":
      t0 = time.perf_counter()
      cfg, params, loss = trained_tiny.train(vocab=256, steps=300, length=128, batch_size=16,
                                             lr=1e-2, num_layers=1)
      print(f"[trained] x[t+1] = x[t-1] model trained in {time.perf_counter() - t0:.0f}s "
            f"(loss {loss:.3f})", flush=True)
      models.append((size, cfg, params))
    else:
      with tempfile.TemporaryDirectory() as d:
        build_checkpoint(size, d)
        lm = load_hf(d)
      models.append((size, lm.config, lm.params))
  for size, cfg, params in models:
    vocab = cfg.vocab_size
    rng = np.random.default_rng(0)
    fix = lambda t: int(t) + 1 if int(t) % stop_every == 0 else int(t)
    # prompts end in a tool call token and observations too: a model that repeats its last two
    # tokens (the trained one) calls again at once; random weights call at random.
    prompts = [[fix(t) for t in rng.integers(3, vocab - 1, args.prompt_tokens - 1)] + [stop_every]
               for _ in range(args.prompts)]
    obs = " ".join(str(fix(t)) for t in rng.integers(3, vocab - 1, args.obs_tokens - 1))
    obs += f" {2 * stop_every}"
    rows = [p for p in prompts for _ in range(args.group)]
    stops = [[t] for t in range(stop_every, vocab, stop_every)]
    base = Policy(cfg, params, max_new_tokens=args.turn_tokens, eos_ids=(), pad_id=0)

    def run(kv):
      pol = CountingPolicy(base)
      out = run_tool_loop(pol, rows, lambda r, t, c: obs, rng=jax.random.PRNGKey(0),
                          tokenizer=IntTokenizer(), max_turns=args.turns,
                          max_obs_tokens=args.obs_tokens, max_total_len=8192, stop=stops,
                          greedy=True, group_size=args.group if kv else 1, kv_reuse=kv,
                          context_bucket=64)
      if kv:
        return out, pol.ctx.prefill_tokens, pol.ctx.prefill_slots
      return out, pol.tokens, pol.slots

    names = {False: "re-prefill", True: "kv reuse"}
    first, best, res = {}, {}, {}
    for kv in (False, True):                  # warm-up: compiles
      t0 = time.perf_counter()
      res[kv] = run(kv)
      first[kv] = time.perf_counter() - t0
    for _ in range(args.repeats):             # interleaved
      for kv in (False, True):
        t0 = time.perf_counter()
        run(kv)
        best[kv] = min(best.get(kv, float("inf")), time.perf_counter() - t0)
    a, b = res[False][0], res[True][0]
    same = np.mean([x == y for x, y in zip(a.completion_ids, b.completion_ids)])
    for kv in (False, True):
      out, tok, slots = res[kv]
      print(f"[{size}] {names[kv]:10s}: prefill {tok:,} tokens ({slots:,} padded slots), "
            f"{sum(out.num_tool_calls)} tool calls, "
            f"{sum(sum(m) for m in out.loss_mask)} policy tokens, wall {best[kv]:.2f}s "
            f"(first run {first[kv]:.2f}s)")
    print(f"[{size}] prefill tokens {res[False][1] / res[True][1]:.1f}x fewer, padded slots "
          f"{res[False][2] / res[True][2]:.1f}x fewer, wall {best[False] / best[True]:.2f}x "
          f"faster; rows with identical completions: {same:.0%}", flush=True)
  return 0


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
  ap.add_argument("--kv-reuse", action="store_true",
                  help="compare run_tool_loop's re-prefill and KV-reuse paths instead (sizes: "
                  "'trained' = a tiny model trained in seconds, or bench.sampling sizes)")
  ap.add_argument("--prompts", type=int, default=4, help="--kv-reuse: distinct prompts")
  ap.add_argument("--group", type=int, default=8, help="--kv-reuse: samples per prompt")
  ap.add_argument("--prompt-tokens", type=int, default=512, help="--kv-reuse: prompt length")
  ap.add_argument("--smoke", action="store_true", help=HELP_SMOKE)
  args = ap.parse_args(argv)
  if args.smoke:
    ap.set_defaults(sizes="tiny", batch=2, turns=2, turn_tokens=4, obs_tokens=4, prompt_min=4,
                    prompt_max=8, repeats=1, prompts=2, group=2, prompt_tokens=16)
    args = ap.parse_args(argv)
  if args.kv_reuse:
    return kv_reuse_main(args)

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
