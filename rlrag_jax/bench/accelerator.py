"""The accelerator figures in one command: sampler, RL update, memory plan, main job.

  python -m rlrag_jax.bench.accelerator [--out DIR] [--budget-s 480]
  python -m rlrag_jax.bench.accelerator --reduced        # a tiny shape, any backend (CPU test)

Measured on whatever device jax sees first (made for one H100), against the hardware:

  sampler   greedy decoding of exactly `--new-tokens` tokens (no EOS) from `--prompt` random
            prompt tokens, batch 64 and 256, with the Qwen2.5-0.5B shape (random weights, bf16),
            with each decode attention of `--decode-attention` (on a GPU both 'xla' and the
            Pallas kernel, `sampling.cache_attention`, with the share of greedy tokens the two
            agree on): tok/s; the same with `transformers` `generate` on the same GPU (bf16, its own random
            weights of the same shape: timing does not depend on their values; a subprocess, so
            torch and jax do not share the GPU); and the decode roofline: tok/s if every step
            read the bf16 weights and the live KV cache once at the measured copy bandwidth
            (and at the datasheet's). Also one decode step alone (jitted, cache donated), which
            splits the loop's overheads from the step.
  update    the trainer's RL update (`rl.step_factories.make_policy_step`, GRPO with a reference
            log-prob input, AdamW over float32 master params, bf16 compute, rematerialised
            blocks, chunked logits) at 64 sequences x 512 tokens: tokens/s, model FLOPs
            utilisation against the datasheet bf16 peak and a measured matmul, peak device
            memory, compile seconds. More micro-batches are tried when one does not fit. On a
            GPU again with the Pallas attention kernels (`models.flash_attention`, the
            `update_pallas` figures).
  memory    `bench.memory`'s ahead-of-time analysis of the same update (vocab 151,936 and
            32,000) and of the decode step, compiled for this device.
  main job  `python -m rlrag_jax.train --config=configs/arena.py` (the README's main job) in a
            subprocess, twice with one persistent compilation cache: wall time and compile
            seconds of the cold and the cached run.

Sections print as they finish (the last lines are a summary table) and `--out` receives a JSON
of every figure. Each section is skipped, saying so, when the time left in `--budget-s` is
less than it needs; a section that fails prints its error and the rest still run.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
import traceback

from rlrag_jax.bench import HELP_SMOKE

H100_BF16_TFLOPS = 989.4        # dense bf16 tensor-core peak of an H100 SXM (datasheet)
H100_HBM_TBS = 3.35             # HBM3 bandwidth of an H100 SXM (datasheet)

FULL = dict(shape="qwen2.5-0.5b", batches=(64, 256), prompt=128, new_tokens=256,
            update_sequences=64, update_tokens=512, hf_batches=(64, 256), steps=3)
REDUCED = dict(shape="reduced", batches=(4,), prompt=16, new_tokens=8,
               update_sequences=4, update_tokens=64, hf_batches=(4,), steps=2)
REDUCED_SHAPE = dict(model_type="qwen2", vocab_size=4096, hidden_size=64, intermediate_size=128,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     tie_word_embeddings=True, rope_theta=1e6, max_position_embeddings=4096)
REDUCED_MAIN_ARGS = ("--config.data.world.num_questions=400", "--config.data.max_eval=4",
                     "--config.model.hidden_size=32", "--config.model.intermediate_size=64",
                     "--config.model.num_layers=1", "--config.model.num_heads=2",
                     "--config.model.num_kv_heads=1", "--config.model.head_dim=16",
                     "--config.sft.steps=2", "--config.sft.batch_size=4", "--config.rl.steps=1",
                     "--config.rl.prompts_per_step=2", "--config.rl.group_size=2",
                     "--config.rl.max_new_tokens=8", "--config.eval.num_examples=4",
                     "--config.eval.max_new_tokens=8", "--config.eval.batch_size=4",
                     "--config.export_hf=false")


class Clock:
  """The time left of the command's budget."""

  def __init__(self, budget_s: float):
    self.start, self.budget = time.perf_counter(), budget_s

  def left(self) -> float:
    return self.budget - (time.perf_counter() - self.start)


def _say(*a):
  print(*a, flush=True)


# ------------------------------------------------------------------------------------ shapes
def _hf_dict(spec: dict) -> dict:
  from rlrag_jax.bench import memory
  return dict(memory.SHAPES[spec["shape"]]) if spec["shape"] in memory.SHAPES else \
      dict(REDUCED_SHAPE)


def _model_config(spec: dict, **over):
  from rlrag_jax.models.config import ModelConfig
  cfg = ModelConfig.from_hf_dict(_hf_dict(spec), source=spec["shape"])
  return cfg.replace(**{**dict(dtype="bfloat16", param_dtype="bfloat16"), **over})


def kv_bytes_per_token(cfg) -> int:
  return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2          # k and v, bf16


def decode_roofline_tok_s(cfg, batch: int, prompt: int, new: int, bandwidth: float) -> float:
  """tok/s if each decode step read the bf16 weights and the live KV cache once."""
  weights = cfg.num_params() * 2
  live = prompt + (new - 1) / 2.0                                          # mean cached tokens
  step = weights + batch * live * kv_bytes_per_token(cfg)
  return batch * bandwidth / step


def update_model_flops(cfg, rows: int, width: int, predicted: int) -> float:
  """Model FLOPs of one training step (PaLM's MFU convention, no recomputation counted): 6 x
  the non-embedding matmul params per token, 6 x the LM head (vocab x hidden) per position
  whose logits the update computes (`predicted` per row: the completion window, see
  `logits_start`), and attention's 12 x layers x heads x head_dim x context per token."""
  e, v = cfg.hidden_size, cfg.vocab_size
  body = cfg.num_params() - v * e * (1 if cfg.tie_word_embeddings else 2)
  attention = 12.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * width
  return rows * (width * (6.0 * body + attention) + predicted * 6.0 * v * e)


# ------------------------------------------------------------------------------------ device
def measure_device(reduced: bool) -> dict:
  """A device-to-device copy's bandwidth (bytes read + written) and a bf16 matmul's rate."""
  import jax
  import jax.numpy as jnp
  n = (1 << 20) if reduced else (1 << 29)                  # 2 GiB of f32 on the GPU
  # In place (the input donated): each call reads and writes the array once, allocates nothing.
  # (A first version wrote a fresh 2 GiB output per call and measured 0.5 TB/s on an H100.)
  step = jax.jit(lambda a: a * 1.0001, donate_argnums=0)
  x = step(jnp.ones((n,), jnp.float32))
  x.block_until_ready()
  reps = 3 if reduced else 20
  t = time.perf_counter()
  for _ in range(reps):
    x = step(x)
  x.block_until_ready()
  bw = 2 * n * 4 * reps / (time.perf_counter() - t)
  del x
  m = 256 if reduced else 8192
  a = jax.random.normal(jax.random.PRNGKey(0), (m, m), jnp.bfloat16)
  mm = jax.jit(lambda a: a @ a)
  mm(a).block_until_ready()
  t = time.perf_counter()
  for _ in range(reps):
    b = mm(a)
  b.block_until_ready()
  tflops = 2 * m ** 3 * reps / (time.perf_counter() - t) / 1e12
  dev = jax.devices()[0]
  return dict(device=str(dev.device_kind), backend=jax.default_backend(),
              copy_bandwidth_tbs=bw / 1e12, matmul_bf16_tflops=tflops, jax=jax.__version__)


def _peak_bytes() -> float:
  import jax
  stats = jax.devices()[0].memory_stats() or {}
  return float(stats.get("peak_bytes_in_use", float("nan")))


# ------------------------------------------------------------------------------------ sampler
def default_decode_attentions() -> tuple:
  """The decode attentions the sampler section times: both on a GPU, 'xla' elsewhere (the
  Pallas kernel runs in the interpreter off a GPU: `sampling.cache_attention`)."""
  import jax
  return ("xla", "pallas") if jax.default_backend() == "gpu" else ("xla",)


def auto_cache_ranges(spec: dict, batch: int, kv_heads: int) -> int:
  """How many cache ranges the 'pallas' decode kernel splits into at `batch` under
  `model.decode_attention_splits=0` (auto), for the spec's full cache length."""
  from rlrag_jax.sampling import cache_attention
  return cache_attention.auto_splits(batch, kv_heads, spec["prompt"] + spec["new_tokens"],
                                     cache_attention.BLOCK)


def sampler_runs(spec: dict, attentions: tuple, kv_heads: int) -> list:
  """[(decode attention, model.decode_attention_splits, batch)] the sampler section times: each
  attention at each batch (splits 0: auto), and for 'pallas' the first batch whose kernel splits
  the cache once more in one pass (splits 1)."""
  runs = []
  for impl in attentions:
    runs += [(impl, 0, b) for b in spec["batches"]]
    if impl == "pallas":
      runs += [(impl, 1, b) for b in spec["batches"]
               if auto_cache_ranges(spec, b, kv_heads) > 1][:1]
  return runs


def bench_sampler(spec: dict, dev: dict, clock: Clock, profile: str = "",
                  attentions: tuple = ("xla",)) -> list:
  """Rows per (decode attention, batch); a 'pallas' row also gives the share of its greedy
  tokens equal to the 'xla' row's (`tokens_equal_xla`: bf16 rounding may flip near-ties) and
  the cache ranges its kernel used (`splits`). Where the kernel splits the cache (a batch too
  small to fill the GPU), the same batch is timed in one pass too (splits 1)."""
  import jax
  from rlrag_jax.models.decoder import DecoderLM, init_params
  base = _model_config(spec)
  params = init_params(DecoderLM(base), jax.random.PRNGKey(0))
  rows, tokens = [], {}
  for impl, splits, b in sampler_runs(spec, attentions, base.num_kv_heads):
    cfg = base.replace(decode_attention=impl, decode_attention_splits=splits)
    name = impl if not splits else f"{impl} (splits {splits})"
    if clock.left() < 45:
      _say(f"[sampler] {name} attention, batch {b}: skipped (budget)")
      continue
    row, out_tokens = _sampler_row(cfg, params, spec, dev, b, profile)
    if impl == "pallas":
      row["splits"] = splits or auto_cache_ranges(spec, b, base.num_kv_heads)
    if not splits:                   # the auto row is the one compared with 'xla'
      tokens[impl, b] = out_tokens
    if impl != "xla" and ("xla", b) in tokens:
      row["tokens_equal_xla"] = float((out_tokens == tokens["xla", b]).mean())
    rows.append(row)
    _say(f"[sampler] {name} attention, batch {b}: {row['tok_s']:,.0f} tok/s "
         f"({row['seconds']:.3f} s per call; first call {row['first_call_s']:.1f} s with "
         f"compile); roofline {row['roofline_tok_s']:,.0f} tok/s at the measured copy "
         f"bandwidth ({row['frac_roofline']:.1%}), {row['roofline_datasheet_tok_s']:,.0f} at "
         f"{H100_HBM_TBS} TB/s; per step: loop {row['loop_step_ms']:.2f} ms, decode step "
         f"alone {row['decode_step_ms']:.2f} ms"
         + (f"; greedy tokens equal to xla's: {row['tokens_equal_xla']:.1%}"
            if "tokens_equal_xla" in row else ""))
  return rows


def _sampler_row(cfg, params, spec: dict, dev: dict, b: int, profile: str) -> tuple:
  import jax
  import jax.numpy as jnp
  import numpy as np
  from rlrag_jax.models.decoder import init_cache
  from rlrag_jax.sampling import fast_decode, sampler
  rng = np.random.default_rng(b)
  prompts = rng.integers(3, cfg.vocab_size, (b, spec["prompt"])).tolist()
  gen = lambda seed: sampler.generate_with_params(
      cfg, params, prompts, max_new_tokens=spec["new_tokens"], temperature=0.0, eos_ids=(),
      rng=seed)
  t = time.perf_counter()
  out = gen(0)
  first = time.perf_counter() - t
  assert out.tokens.shape == (b, spec["new_tokens"]) and bool(np.all(out.mask))
  times = []
  for i in range(spec["steps"]):
    t = time.perf_counter()
    gen(i + 1)
    times.append(time.perf_counter() - t)
  sec = float(np.median(times))
  tok_s = b * spec["new_tokens"] / sec
  # One decode step alone: the loop's share = (loop time / steps) - step time.
  packed = jax.jit(lambda p: fast_decode.pack_params(cfg, p))(params)
  length = spec["prompt"] + spec["new_tokens"]
  cache = jax.jit(lambda: init_cache(cfg, b, length), out_shardings=None)()
  cache["mask"] = cache["mask"].at[:, :spec["prompt"] + spec["new_tokens"] // 2].set(True)
  cache["index"] = jnp.int32(spec["prompt"] + spec["new_tokens"] // 2)
  step = jax.jit(fast_decode.decode_step, static_argnums=0, donate_argnums=4)
  toks, act = jnp.zeros((b,), jnp.int32), jnp.ones((b,), jnp.bool_)
  logits, cache = step(cfg, packed, toks, act, cache)
  cache["index"] = jnp.int32(spec["prompt"] + spec["new_tokens"] // 2)
  logits.block_until_ready()
  n = 20
  t = time.perf_counter()
  for _ in range(n):
    logits, cache = step(cfg, packed, toks, act, cache)
    cache["index"] = jnp.int32(spec["prompt"] + spec["new_tokens"] // 2)
  logits.block_until_ready()
  step_s = (time.perf_counter() - t) / n
  if profile:      # a trace of a few decode steps: the kernels of one step and their times
    name = f"decode_{cfg.decode_attention}_b{b}" + (
        f"_splits{cfg.decode_attention_splits}" if cfg.decode_attention_splits else "")
    with jax.profiler.trace(str(pathlib.Path(profile) / name)):
      for _ in range(5):
        logits, cache = step(cfg, packed, toks, act, cache)
        cache["index"] = jnp.int32(spec["prompt"] + spec["new_tokens"] // 2)
      logits.block_until_ready()
  del cache, packed
  roof = decode_roofline_tok_s(cfg, b, spec["prompt"], spec["new_tokens"],
                               dev["copy_bandwidth_tbs"] * 1e12)
  roof_ds = decode_roofline_tok_s(cfg, b, spec["prompt"], spec["new_tokens"],
                                  H100_HBM_TBS * 1e12)
  row = dict(batch=b, decode_attention=cfg.decode_attention, prompt=spec["prompt"],
             new_tokens=spec["new_tokens"], seconds=sec,
             first_call_s=first, tok_s=tok_s, roofline_tok_s=roof,
             roofline_datasheet_tok_s=roof_ds, frac_roofline=tok_s / roof,
             loop_step_ms=1e3 * sec / spec["new_tokens"], decode_step_ms=1e3 * step_s,
             decode_step_alone_tok_s=b / step_s)
  return row, np.asarray(out.tokens)


HF_SCRIPT = r"""
import json, sys, time, torch, transformers
spec = json.loads(sys.argv[1])
cfg = transformers.Qwen2Config(**spec["hf"])
torch.manual_seed(0)
dev = "cuda" if torch.cuda.is_available() else "cpu"
with torch.device(dev):
  model = transformers.Qwen2ForCausalLM(cfg).to(torch.bfloat16).eval()
out = []
for b in spec["batches"]:
  ids = torch.randint(3, cfg.vocab_size, (b, spec["prompt"]), device=dev)
  kw = dict(max_new_tokens=spec["new_tokens"], min_new_tokens=spec["new_tokens"],
            do_sample=False, pad_token_id=0, eos_token_id=None)
  with torch.no_grad():
    model.generate(ids, **kw)
    if dev == "cuda": torch.cuda.synchronize()
    t = time.perf_counter()
    res = model.generate(ids, **kw)
    if dev == "cuda": torch.cuda.synchronize()
    sec = time.perf_counter() - t
  assert res.shape[1] == spec["prompt"] + spec["new_tokens"], res.shape
  out.append(dict(batch=b, seconds=sec, tok_s=b * spec["new_tokens"] / sec))
print("HF_RESULT " + json.dumps(dict(rows=out, torch=torch.__version__,
                                     transformers=transformers.__version__)))
"""


def bench_hf_generate(spec: dict, clock: Clock) -> dict:
  hf = _hf_dict(spec)
  hf.pop("model_type", None)
  arg = json.dumps(dict(hf=hf, batches=list(spec["hf_batches"]), prompt=spec["prompt"],
                        new_tokens=spec["new_tokens"]))
  timeout = max(30.0, min(150.0, clock.left() - 300))
  proc = subprocess.run([sys.executable, "-c", HF_SCRIPT, arg], capture_output=True, text=True,
                        timeout=timeout)
  line = [l for l in proc.stdout.splitlines() if l.startswith("HF_RESULT ")]
  if proc.returncode or not line:
    raise RuntimeError(f"transformers generate failed (exit {proc.returncode}): "
                       f"{proc.stderr[-1500:]}")
  res = json.loads(line[-1][len("HF_RESULT "):])
  for r in res["rows"]:
    _say(f"[hf generate] batch {r['batch']}: {r['tok_s']:,.0f} tok/s ({r['seconds']:.2f} s; "
         f"torch {res['torch']}, transformers {res['transformers']})")
  return res


# ------------------------------------------------------------------------------------ update
def bench_update(spec: dict, dev: dict, clock: Clock, attention: str = "xla") -> dict:
  import jax
  import numpy as np
  from rlrag_jax import rl
  from rlrag_jax.models import sharding as shd
  from rlrag_jax.models.decoder import DecoderLM
  from rlrag_jax.rl import optim_state, step_factories
  cfg = _model_config(spec, param_dtype="float32", remat=True, attention_block=0,
                      attention=attention)
  module = DecoderLM(cfg)
  mesh = shd.make_mesh(data=1, fsdp=-1, tensor=1, devices=jax.devices()[:1])
  n, t = spec["update_sequences"], spec["update_tokens"]
  rng = np.random.default_rng(0)
  prompt = t // 2
  batch = {"input_ids": rng.integers(3, cfg.vocab_size, (n, t)).astype(np.int32),
           "attention_mask": np.ones((n, t), np.int32),
           "loss_mask": np.zeros((n, t), np.int32),
           "advantages": rng.normal(size=(n,)).astype(np.float32)}
  batch["loss_mask"][:, prompt:] = 1
  start = prompt - 1
  opt = optim_state.make_optimizer(optim_state.OptimizerConfig(lr=1e-6, total_steps=100))
  result = {}
  for micro in (1, 2, 4, 8):
    if n % micro or clock.left() < 60:
      continue
    try:
      state = rl.create_train_state(module, opt, mesh, rng=jax.random.PRNGKey(0))
      step = step_factories.make_policy_step(module, opt, mesh, step_factories.LossConfig.preset("grpo"),
                                 micro_batches=micro)
      logp = step_factories.make_logprob_fn(module, mesh, micro_batches=micro)
      dev_batch = shd.shard_batch(batch, mesh)
      dev_batch["ref_logp"] = logp(state.params, dev_batch, start)
      c0 = time.perf_counter()
      compiled = step.lower(state, dev_batch, start).compile()     # the step's one compile
      compile_s = time.perf_counter() - c0
      mem = compiled.memory_analysis()
      state, m = compiled(state, dev_batch)
      float(m["loss"])
      times = []
      for _ in range(spec["steps"]):
        t0 = time.perf_counter()
        state, m = compiled(state, dev_batch)
        float(m["loss"])
        times.append(time.perf_counter() - t0)
      sec = float(np.median(times))
      tokens = n * t
      flops = update_model_flops(cfg, n, t, t - 1 - start)
      tflops = flops / sec / 1e12
      result = dict(attention=attention, sequences=n, tokens=t, micro_batches=micro,
                    seconds=sec,
                    tokens_per_s=tokens / sec, model_tflops=tflops,
                    mfu=tflops / H100_BF16_TFLOPS,
                    mfu_vs_matmul=tflops / dev["matmul_bf16_tflops"],
                    peak_bytes=_peak_bytes(), compile_s=compile_s,
                    temp_bytes=int(mem.temp_size_in_bytes),
                    argument_bytes=int(mem.argument_size_in_bytes),
                    loss=float(m["loss"]), skipped=float(m["skipped"]))
      _say(f"[update] {n} x {t} tokens, {micro} micro-batch(es): {tokens / sec:,.0f} tokens/s "
           f"({sec:.3f} s/step), {tflops:.1f} model TFLOP/s = MFU {result['mfu']:.1%} of "
           f"{H100_BF16_TFLOPS:g} ({result['mfu_vs_matmul']:.1%} of the measured matmul); "
           f"peak memory {result['peak_bytes'] / 2 ** 30:.2f} GiB (XLA: arguments "
           f"{result['argument_bytes'] / 2 ** 30:.2f} + temporaries "
           f"{result['temp_bytes'] / 2 ** 30:.2f} GiB); compile {compile_s:.1f} s")
      del state
      break
    except Exception as e:          # out of memory: try more micro-batches
      _say(f"[update] {micro} micro-batch(es): {type(e).__name__}: {str(e)[:300]}")
  return result


def bench_memory_plan(spec: dict, clock: Clock) -> list:
  import jax
  from rlrag_jax.bench import memory
  shape = spec["shape"]
  if shape not in memory.SHAPES:
    path = pathlib.Path(tempfile.mkdtemp()) / "config.json"
    path.write_text(json.dumps(REDUCED_SHAPE))
    shape = str(path)
  one = jax.devices()[:1]
  kw = dict(sequences=spec["update_sequences"], tokens=spec["update_tokens"], devices=one,
            attention_block=0)
  rows = memory.run(shape, parts=("update",), **kw)
  if clock.left() > 60:
    rows += memory.run(shape, parts=("update",), vocab=32000 if shape in memory.SHAPES else 1024,
                       **kw)
  for impl in default_decode_attentions():
    rows += memory.run(shape, parts=("decode",), decode_batch=spec["batches"][-1],
                       cached=spec["prompt"] + spec["new_tokens"], decode_attention=impl, **kw)
  _say("[memory] XLA's analysis, compiled for this device:")
  _say(memory.format_rows(rows))
  return rows


# ------------------------------------------------------------------------------------ main job
def bench_main_job(reduced: bool, clock: Clock, runs: int = 2) -> list:
  rows = []
  cache = tempfile.mkdtemp(prefix="rlrag_xla_cache_")
  root = pathlib.Path(__file__).resolve().parents[2]
  for i in range(runs):
    need = 60 if reduced else (200 if i == 0 else 90)
    if clock.left() < need:
      _say(f"[main job] run {i + 1}: skipped (budget: {clock.left():.0f} s left)")
      continue
    workdir = tempfile.mkdtemp(prefix=f"rlrag_main_{i}_")
    cmd = [sys.executable, "-m", "rlrag_jax.train", "--config=configs/arena.py",
           f"--workdir={workdir}", "--quiet", f"--config.compile_cache={cache}"]
    if reduced:
      cmd += list(REDUCED_MAIN_ARGS)
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True,
                          timeout=max(30.0, clock.left() - 5))
    wall = time.perf_counter() - t
    log = proc.stdout + proc.stderr
    if proc.returncode:
      raise RuntimeError(f"main job exit {proc.returncode}: {log[-2000:]}")
    row = dict(run=i + 1, wall_s=wall, **parse_compile_line(log))
    row["compile_share"] = row["compile_s"] / wall
    rows.append(row)
    _say(f"[main job] run {i + 1}: {wall:.1f} s wall, {row['compiles']} XLA programs in "
         f"{row['compile_s']:.1f} s ({row['compile_share']:.0%} of the wall time), "
         f"{row['cache_hits']} from the persistent cache")
  return rows


def parse_compile_line(log: str) -> dict:
  """The trainer's 'XLA compiles over the run: N (S s): C compiled, H read from the persistent
  cache (R s)' line -> {'compiles', 'compile_s', 'cache_hits'}; a RuntimeError if it is missing."""
  m = re.search(r"XLA compiles over the run: (\d+) \(([\d.]+) s\)(?:: \d+ compiled, (\d+) read "
                r"from the persistent cache)?", log)
  if not m:
    raise RuntimeError("the main job's log has no 'XLA compiles over the run' line")
  return dict(compiles=int(m.group(1)), compile_s=float(m.group(2)),
              cache_hits=int(m.group(3)) if m.group(3) is not None else 0)


# ------------------------------------------------------------------------------------ main
def summary(res: dict) -> str:
  lines = ["", "summary (ours vs reference, and vs the hardware)"]
  dev = res.get("device", {})
  if dev:
    lines.append(f"  device {dev['device']} ({dev['backend']}, jax {dev['jax']}): copy "
                 f"{dev['copy_bandwidth_tbs']:.2f} TB/s, bf16 matmul "
                 f"{dev['matmul_bf16_tflops']:.0f} TFLOP/s")
  hf = {r["batch"]: r for r in res.get("hf_generate", {}).get("rows", [])}
  for r in res.get("sampler", []):
    ref = hf.get(r["batch"])
    vs = f"; HF generate {ref['tok_s']:,.0f} tok/s, ratio {r['tok_s'] / ref['tok_s']:.1f}x" \
        if ref else ""
    split = f" (cache in {r['splits']} ranges)" if r.get("splits", 1) > 1 else \
        (" (one pass)" if "splits" in r else "")
    lines.append(f"  sampler {r.get('decode_attention', 'xla')} attention{split}, batch "
                 f"{r['batch']}: {r['tok_s']:,.0f} tok/s = "
                 f"{r['frac_roofline']:.1%} of the decode roofline "
                 f"({r['roofline_tok_s']:,.0f}){vs}")
  for u in (res.get("update"), res.get("update_pallas")):
    if not u:
      continue
    lines.append(f"  update, {u.get('attention', 'xla')} attention, {u['sequences']} x "
                 f"{u['tokens']} ({u['micro_batches']} micro-batch): "
                 f"{u['tokens_per_s']:,.0f} tokens/s, MFU {u['mfu']:.1%}, peak "
                 f"{u['peak_bytes'] / 2 ** 30:.1f} GiB")
  for r in res.get("main_job", []):
    lines.append(f"  main job run {r['run']}: {r['wall_s']:.0f} s, compile {r['compile_s']:.0f} s "
                 f"({r['compile_share']:.0%})")
  for name in res.get("failed", []):
    lines.append(f"  FAILED: {name}")
  return "\n".join(lines)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m rlrag_jax.bench.accelerator", description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--reduced", action="store_true", help="tiny shapes (a CPU test)")
  ap.add_argument("--budget-s", type=float, default=480.0)
  ap.add_argument("--out", default="", help="folder for accelerator.json")
  ap.add_argument("--profile", default="",
                  help="folder for a jax.profiler trace of five decode steps per batch size "
                  "(open with TensorBoard's profile plugin or xprof)")
  ap.add_argument("--decode-attention", default="",
                  help="comma list of the attentions to time (xla, pallas): the sampler's "
                  "decode attention and, with pallas, the update's too (default: both on a "
                  "GPU, xla elsewhere)")
  ap.add_argument("--sections", default="sampler,hf,update,memory,main",
                  help="comma list of sampler, hf, update, memory, main")
  ap.add_argument("--smoke", action="store_true",
                  help="--reduced with one main job run, not two (" + HELP_SMOKE + ")")
  args = ap.parse_args(argv)
  args.reduced = args.reduced or args.smoke
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")   # torch runs beside us
  spec = REDUCED if args.reduced else FULL
  sections = set(args.sections.split(","))
  clock = Clock(args.budget_s)
  res: dict = {"spec": {k: list(v) if isinstance(v, tuple) else v for k, v in spec.items()},
               "failed": []}

  def attempt(name, fn):
    try:
      res[name] = fn()
    except Exception:                # a failed section must not hide the others' figures
      _say(f"[{name}] FAILED:\n{traceback.format_exc()[-3000:]}")
      res["failed"].append(name)

  # transformers first, in a subprocess, before jax holds any device memory.
  if "hf" in sections:
    attempt("hf_generate", lambda: bench_hf_generate(spec, clock))
  attempt("device", lambda: measure_device(args.reduced))
  dev = res.get("device") or dict(copy_bandwidth_tbs=H100_HBM_TBS, matmul_bf16_tflops=
                                  H100_BF16_TFLOPS, device="?", backend="?", jax="?")
  _say(f"[device] {dev}")
  impls = tuple(a for a in args.decode_attention.split(",") if a) or \
      default_decode_attentions()
  if "sampler" in sections:
    attempt("sampler", lambda: bench_sampler(spec, dev, clock, args.profile, impls))
  if "update" in sections:
    attempt("update", lambda: bench_update(spec, dev, clock))
    if "pallas" in impls:            # the Pallas attention kernels (models.flash_attention)
      attempt("update_pallas", lambda: bench_update(spec, dev, clock, "pallas"))
  if "main" in sections:
    attempt("main_job", lambda: bench_main_job(args.reduced, clock, runs=1 if args.smoke else 2))
  if "memory" in sections and clock.left() > 40:
    attempt("memory", lambda: bench_memory_plan(spec, clock))
  res["elapsed_s"] = clock.budget - clock.left()
  _say(summary(res))
  _say(f"  elapsed {res['elapsed_s']:.0f} s of a {args.budget_s:.0f} s budget")
  if args.out:
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "accelerator.json").write_text(json.dumps(res, indent=1, default=str))
  return 1 if res["failed"] else 0


if __name__ == "__main__":
  sys.exit(main())
