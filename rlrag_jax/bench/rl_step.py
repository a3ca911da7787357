"""Seconds per RL step (rollout + update): our trainer's pieces vs TRL's `GRPOTrainer`.

  python -m rlrag_jax.bench.rl_step [--sizes tiny,57m --steps 4 --warmup 2 --no-reference
                                     --prompts 8 --group 8 --new-tokens 64 ...]

For each model size a random Qwen2 model is built with `transformers` (CPU torch), saved, and
loaded by both sides (ours through `load_hf`), so both start from identical weights. One step on
both sides is the same work:

  * rollout: `prompts x group` completions of exactly `--new-tokens` tokens (ours: no EOS ids;
    TRL: `min_new_tokens` = `max_completion_length`), temperature 1, no top-k / top-p;
  * rewards: the same cheap, length-independent Python reward on the decoded text (the share of
    lowercase ASCII letters), group-normalised advantages (mean and std over each group);
  * a reference forward (beta = 0.04, k3 on both sides: TRL's only estimator) and ONE optimizer
    update over the whole batch (TRL: num_iterations=1, gradient_accumulation_steps=1,
    steps_per_generation=1; ours: mu=1, micro_batches=1), GRPO's per-sequence loss mean (TRL
    loss_type='grpo', ours aggregation='sequence_mean'), AdamW with global-norm clipping at 1;
  * no activation checkpointing on either side (TRL's GRPOConfig turns it on by default, which
    would make TRL recompute its forward in the backward pass);
  * logits only where a loss token needs them (TRL's `logits_to_keep`, ours `logits_start`).

Ours is the trainer's RL step rebuilt from its public pieces (`trainer.Steps` from the ARENA
config with overrides, `Policy`, `single_turn`, `group_advantages`, `pack`, `shard_batch`), the
same calls `trainer.run` makes. TRL runs offline on CPU in float32 with report_to='none', no
vLLM, over an in-memory `datasets.Dataset` of text prompts. The first `--warmup` steps (compiles
on our side, allocator warm-up on TRL's) are excluded on both sides; a step's time on TRL's side
is the gap between consecutive `on_step_end` callbacks (it includes TRL's data loading and
bookkeeping, as our step includes ours). Needs torch, transformers, trl, datasets (the `bench`
extra).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import pathlib
import statistics
import tempfile
import time

import numpy as np

from rlrag_jax.bench import HELP_SMOKE

SIZES = {
    # ~0.2M params: per-step overheads dominate.
    "tiny": dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=1024),
    # ~1.2M params: the model `configs/arena.py`'s CPU default trains (hidden 128, 4 layers).
    "arena": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=2048),
    # ~57M params (~41M without the untied lm_head): arithmetic dominates.
    "57m": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                num_attention_heads=8, num_key_value_heads=2, vocab_size=32000),
}
# Per-size batch defaults (prompts per step, group size, new tokens, prompt length range), so the
# larger model's step stays a few seconds on a 2-core CPU. Flags override them.
SHAPES = {
    "tiny": dict(prompts=8, group=8, new_tokens=64, prompt_min=32, prompt_max=64),
    "arena": dict(prompts=8, group=8, new_tokens=72, prompt_min=96, prompt_max=192),
    "57m": dict(prompts=4, group=4, new_tokens=32, prompt_min=16, prompt_max=32),
}
BETA = 0.04
LR = 1e-5
WORDS = ("the river city was founded by a king who ruled over the northern hills and the old "
         "bridge near the market where merchants sold salt grain and wool").split()


# ------------------------------------------------------------------------------------ shared
@dataclasses.dataclass
class Shape:
  prompts: int
  group: int
  new_tokens: int
  prompt_min: int
  prompt_max: int


def build_checkpoint(size: str, out_dir, seed: int = 0) -> pathlib.Path:
  """A random Qwen2 model saved with `save_pretrained` (+ the byte-level tokenizer)."""
  import torch
  import transformers
  from rlrag_jax.generate import byte_level_tokenizer
  tok = byte_level_tokenizer()
  cfg = transformers.Qwen2Config(max_position_embeddings=4096, tie_word_embeddings=False,
                                 bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.pad_token_id, **SIZES[size])
  torch.manual_seed(seed)
  model = transformers.Qwen2ForCausalLM(cfg)
  out = pathlib.Path(out_dir)
  model.save_pretrained(out, safe_serialization=True)
  tok.save_pretrained(out)
  return out


def make_prompts(n: int, lo: int, hi: int, seed: int = 0) -> list:
  """n text prompts of lo..hi characters (= tokens under the byte-level tokenizer)."""
  rng = np.random.default_rng(seed)
  out = []
  for length in rng.integers(lo, hi + 1, n):
    words = []
    while sum(len(w) + 1 for w in words) < length:
      words.append(WORDS[int(rng.integers(len(WORDS)))])
    out.append(" ".join(words)[:int(length)])
  return out


def toy_reward(text: str) -> float:
  """Share of lowercase ASCII letters in the text: cheap, length-independent, spread in a group."""
  if not text:
    return 0.0
  return sum("a" <= c <= "z" for c in text) / len(text)


# ------------------------------------------------------------------------------------ ours
def _arena_base_config():
  path = pathlib.Path(__file__).resolve().parents[2] / "configs" / "arena.py"
  spec = importlib.util.spec_from_file_location("_arena_config", path)
  if spec is None or not path.exists():
    raise FileNotFoundError(f"{path}: the ARENA config file is needed for the trainer's defaults")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.base_config()


def our_config(shape: Shape, total_steps: int):
  """configs/arena.py's base with the benchmark's RL settings (mirrored on TRL's side)."""
  c = _arena_base_config()
  r = c.rl
  r.prompts_per_step, r.group_size, r.max_new_tokens = shape.prompts, shape.group, shape.new_tokens
  r.steps = total_steps
  r.temperature, r.top_k, r.top_p = 1.0, 0, 1.0
  r.lr, r.warmup_ratio, r.weight_decay, r.max_grad_norm = LR, 0.0, 0.0, 1.0
  r.kl_beta, r.kl_estimator = BETA, "k3"
  r.clip_eps_low = r.clip_eps_high = 0.2
  r.aggregation, r.scale_std, r.mu, r.micro_batches = "sequence_mean", True, 1, 1
  r.dynamic_sampling = False
  return c


def bench_ours(ckpt: pathlib.Path, prompts: list, shape: Shape, steps: int, warmup: int):
  """Runs warmup + steps RL steps; returns per-step timings (dicts) of the timed steps."""
  import jax
  import jax.numpy as jnp
  from rlrag_jax import trainer
  from rlrag_jax.models import load_hf, sharding
  from rlrag_jax.rl import group_advantages
  from rlrag_jax.rl.packing import logits_start, pack
  from rlrag_jax.rollout.policy import Policy
  from rlrag_jax.rollout.single_turn import single_turn
  from rlrag_jax.sampling import sampler

  lm = load_hf(ckpt)
  tok = lm.tokenizer
  config = our_config(shape, warmup + steps)
  mesh = sharding.make_mesh(**dict(config.mesh))
  st = trainer.Steps(config, lm.config, mesh, 0, warmup + steps)
  state = st.new_state(lm.params, "rl")
  ref = jax.tree_util.tree_map(jnp.copy, state.params)
  pad = tok.pad_token_id
  policy = Policy(lm.config, None, temperature=1.0, max_new_tokens=shape.new_tokens, eos_ids=(),
                  pad_id=pad)
  encode = lambda text: tok(text, add_special_tokens=True)["input_ids"]   # as TRL tokenizes
  decode = lambda ids: tok.decode(list(ids), skip_special_tokens=True)
  base_key = jax.random.PRNGKey(0)
  # The compiled programs of the jits a step runs (rl_step is an UpdateStep: its one-jit form;
  # logp a Forward: its static-start and traced-start jits).
  programs = lambda: (sampler._generate_jit._cache_size(),
                      st.logp.static._cache_size() + st.logp.traced._cache_size(),
                      st.rl_step.jit._cache_size())
  from rlrag_jax.training.compiles import CompileCounter
  counter = CompileCounter()
  out, before = [], None
  for i in range(warmup + steps):
    counter.take()
    if i == warmup:
      before = programs()
    lo = (i * shape.prompts) % len(prompts)
    exs = (prompts + prompts)[lo:lo + shape.prompts]
    t0, c0 = time.perf_counter(), time.process_time()
    eps = single_turn(policy.with_params(state.params), exs, encode, decode,
                      jax.random.fold_in(base_key, i), group_size=shape.group)
    t1 = time.perf_counter()
    rewards = np.array([toy_reward(e.text) for e in eps], np.float32)
    index = np.repeat(np.arange(len(rewards) // shape.group), shape.group)   # group ids
    adv = np.asarray(group_advantages(jnp.asarray(rewards), jnp.asarray(index)))
    batch = pack([e.prompt_ids for e in eps], [e.completion_ids for e in eps],
                 [e.loss_mask for e in eps], pad_id=pad, bucket=config.rl.pack_bucket)
    batch["advantages"] = adv.astype(np.float32)
    start = logits_start(batch["loss_mask"], config.rl.pack_bucket)
    batch = sharding.shard_batch(batch, mesh)
    t2 = time.perf_counter()
    batch["ref_logp"] = jax.block_until_ready(st.logp(ref, batch, start))
    t3 = time.perf_counter()
    state, m = st.rl_step(state, batch, start)
    m = {k: float(v) for k, v in m.items()}
    t4, c4 = time.perf_counter(), time.process_time()
    lengths = {len(e.completion_ids) for e in eps}
    if lengths != {shape.new_tokens}:
      raise RuntimeError(f"ours: completion lengths {sorted(lengths)}; expected exactly "
                         f"{shape.new_tokens} tokens per row")
    if i >= warmup:
      compiled = counter.take()
      out.append(dict(total=t4 - t0, cpu=c4 - c0, generate=t1 - t0, host=t2 - t1, ref=t3 - t2,
                      update=t4 - t3, loss=m["loss"], kl=m["kl"],
                      compiles=compiled["compile/count"],
                      compile_s=compiled["compile/seconds"]))
  counter.close()
  recompiles = sum(a - b for a, b in zip(programs(), before))
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(lm.params))
  return out, recompiles, n_params


# ------------------------------------------------------------------------------------ TRL
def bench_trl(ckpt: pathlib.Path, prompts: list, shape: Shape, steps: int, warmup: int,
              workdir: pathlib.Path, threads: int):
  """Runs TRL's GRPOTrainer for warmup + steps steps; returns timings of the timed steps."""
  import datasets
  import torch
  import transformers
  import trl

  torch.set_num_threads(threads)

  class Clock(transformers.TrainerCallback):
    def __init__(self):
      self.ends, self.cpu = [], []

    def on_train_begin(self, args, state, control, **kw):
      self.ends.append(time.perf_counter())
      self.cpu.append(time.process_time())

    def on_step_end(self, args, state, control, **kw):
      self.ends.append(time.perf_counter())
      self.cpu.append(time.process_time())

  class TimedGRPO(trl.GRPOTrainer):
    """Records the rollout share (generation, rewards, advantages, reference forward)."""
    rollout_s: list = []

    def _generate_and_score_completions(self, inputs):
      t = time.perf_counter()
      res = super()._generate_and_score_completions(inputs)
      self.rollout_s.append(time.perf_counter() - t)
      lens = res["completion_mask"].sum(1).unique().tolist()
      if lens != [shape.new_tokens]:
        raise RuntimeError(f"TRL: completion lengths {lens}; expected exactly {shape.new_tokens}")
      return res

  def reward_fn(completions, **kw):
    return [toy_reward(c) for c in completions]

  torch.manual_seed(0)
  b = shape.prompts * shape.group
  args = trl.GRPOConfig(
      output_dir=str(workdir), report_to="none", use_cpu=True, bf16=False, fp16=False,
      seed=0, max_steps=warmup + steps, per_device_train_batch_size=b,
      gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1,
      num_generations=shape.group, max_completion_length=shape.new_tokens,
      generation_kwargs={"min_new_tokens": shape.new_tokens},
      temperature=1.0, top_k=0, top_p=1.0, beta=BETA, epsilon=0.2, loss_type="grpo",
      scale_rewards="group", learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0,
      weight_decay=0.0, max_grad_norm=1.0, optim="adamw_torch", use_vllm=False,
      activation_checkpointing=False,      # TRL's GRPO default is on; ours does not remat here
      logging_steps=10_000, save_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
      log_completions=False, model_init_kwargs={"dtype": torch.float32})
  tok = transformers.AutoTokenizer.from_pretrained(str(ckpt), local_files_only=True)
  data = datasets.Dataset.from_dict({"prompt": prompts})
  TimedGRPO.rollout_s = []
  trainer = TimedGRPO(model=str(ckpt), reward_funcs=reward_fn, args=args, train_dataset=data,
                      processing_class=tok)
  clock = Clock()
  trainer.add_callback(clock)
  trainer.train()
  gaps = np.diff(clock.ends)
  if len(gaps) != warmup + steps:
    raise RuntimeError(f"TRL ran {len(gaps)} steps; expected {warmup + steps}")
  cpu = np.diff(clock.cpu)
  out = [dict(total=float(g), cpu=float(c), rollout=float(r)) for g, c, r in
         zip(gaps[warmup:], cpu[warmup:], trainer.rollout_s[warmup:])]
  return out


# ------------------------------------------------------------------------------------ main
def _med(rows, key):
  return statistics.median(r[key] for r in rows)


def _list(rows):
  return ", ".join(f"{r['total']:.3f}" for r in rows)


def main(argv=None):
  ap = argparse.ArgumentParser(prog="python -m rlrag_jax.bench.rl_step", description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--sizes", default="tiny", help=f"comma list of {sorted(SIZES)}")
  ap.add_argument("--steps", type=int, default=4, help="timed steps per side")
  ap.add_argument("--warmup", type=int, default=2, help="untimed first steps per side")
  for k in ("prompts", "group", "new_tokens", "prompt_min", "prompt_max"):
    ap.add_argument("--" + k.replace("_", "-"), type=int, default=None,
                    help="overrides the per-size default (see SHAPES)")
  ap.add_argument("--torch-threads", default="1,2",
                  help="comma list: TRL runs once per torch thread count; the fastest is the "
                  "reference (on a loaded machine 2 threads can be many times slower than 1)")
  ap.add_argument("--no-reference", action="store_true", help="time only our step")
  ap.add_argument("--variable-lengths", action="store_true",
                  help="the variable-length case: 4 prompts x 4 of 64-1536 tokens (unless "
                  "flags say otherwise), our side only, 12 timed steps; prints the XLA compiles "
                  "of each timed step (bounded by the length buckets)")
  ap.add_argument("--smoke", action="store_true",
                  help=HELP_SMOKE + " (TRL's side too when trl and datasets are installed)")
  args = ap.parse_args(argv)
  if args.smoke:
    ap.set_defaults(sizes="tiny", steps=1, warmup=1, prompts=2, group=2, new_tokens=8,
                    prompt_min=8, prompt_max=16, torch_threads="1")
    args = ap.parse_args(argv)
    missing = [m for m in ("trl", "datasets") if importlib.util.find_spec(m) is None]
    if missing and not args.no_reference:
      print(f"--smoke: {', '.join(missing)} not installed (the `bench` extra): our side only")
      args.no_reference = True
  if args.variable_lengths:
    args.no_reference = True
    args.prompt_min = args.prompt_min or 64
    args.prompt_max = args.prompt_max or 1536
    args.prompts = args.prompts or 4
    args.group = args.group or 4
    args.steps = max(args.steps, 12)
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
  os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
  os.environ.setdefault("WANDB_DISABLED", "true")

  import jax
  import torch
  load = os.getloadavg()
  print(f"jax {jax.__version__} ({jax.default_backend()}, {jax.device_count()} device), torch "
        f"{torch.__version__}, {os.cpu_count()} CPUs, load "
        f"average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; beta {BETA} (k3) with a reference "
        f"model on both sides, fp32")
  rows = []
  for size in args.sizes.split(","):
    if size not in SIZES:
      raise SystemExit(f"--sizes: unknown size {size!r}; expected one of {sorted(SIZES)}")
    shape = Shape(**{k: (getattr(args, k) if getattr(args, k) is not None else v)
                     for k, v in SHAPES[size].items()})
    prompts = make_prompts(max(64, shape.prompts * (args.steps + args.warmup)), shape.prompt_min,
                           shape.prompt_max)
    with tempfile.TemporaryDirectory(prefix=f"bench_rl_{size}_") as tmp:
      ckpt = build_checkpoint(size, pathlib.Path(tmp) / "model")
      ours, recompiles, n_params = bench_ours(ckpt, prompts, shape, args.steps, args.warmup)
      print(f"[{size}] {n_params / 1e6:.1f}M params; {shape.prompts} prompts x {shape.group} "
            f"generations, {shape.new_tokens} new tokens, prompts {shape.prompt_min}-"
            f"{shape.prompt_max} tokens", flush=True)
      print(f"[{size}] ours: {_med(ours, 'total'):.3f} s/step, {_med(ours, 'cpu'):.3f} CPU s/step "
            f"(median of {len(ours)}: {_list(ours)}); recompiles in timed steps: {recompiles}"
            + (" (timings include compiles: new prompt-length buckets; raise --warmup)"
               if recompiles else ""), flush=True)
      print(f"[{size}] XLA compiles per timed step: {[int(r['compiles']) for r in ours]} "
            f"({sum(r['compile_s'] for r in ours):.1f} s in all)", flush=True)
      print(f"[{size}] ours breakdown (median s): generate {_med(ours, 'generate'):.3f}, host "
            f"(decode + reward + advantages + pack) {_med(ours, 'host'):.3f}, reference log-probs "
            f"{_med(ours, 'ref'):.3f}, update {_med(ours, 'update'):.3f}", flush=True)
      row = dict(size=size, params=n_params, ours=_med(ours, "total"), ours_cpu=_med(ours, "cpu"))
      for threads in ([] if args.no_reference else
                      [int(t) for t in args.torch_threads.split(",")]):
        ref = bench_trl(ckpt, prompts, shape, args.steps, args.warmup,
                        pathlib.Path(tmp) / f"trl{threads}", threads)
        print(f"[{size}] TRL GRPOTrainer, {threads} torch thread(s): {_med(ref, 'total'):.3f} "
              f"s/step, {_med(ref, 'cpu'):.3f} CPU s/step (median of {len(ref)}: {_list(ref)}); "
              f"of which generate + score + reference forward {_med(ref, 'rollout'):.3f}",
              flush=True)
        if "ref" not in row or _med(ref, "total") < row["ref"]:
          row.update(ref=_med(ref, "total"), ref_cpu=_med(ref, "cpu"), ref_threads=threads)
    rows.append(row)
  load = os.getloadavg()
  print(f"\nload average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
  print("reference = TRL at its fastest torch thread count; CPU s = process CPU time per step")
  print(f"{'model':>6} {'params':>8} {'ours s/step':>12} {'TRL s/step':>11} {'ratio':>7} "
        f"{'ours CPU s':>11} {'TRL CPU s':>10} {'CPU ratio':>10}")
  for r in rows:
    if "ref" in r:
      ref = (f"{r['ref']:11.3f} {r['ref'] / r['ours']:6.2f}x {r['ours_cpu']:11.3f} "
             f"{r['ref_cpu']:10.3f} {r['ref_cpu'] / r['ours_cpu']:9.2f}x")
    else:
      ref = f"{'-':>11} {'-':>7} {r['ours_cpu']:11.3f} {'-':>10} {'-':>10}"
    print(f"{r['size']:>6} {r['params'] / 1e6:7.1f}M {r['ours']:12.3f} {ref}")
  return rows


if __name__ == "__main__":
  main()
