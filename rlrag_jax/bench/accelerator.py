"""The accelerator figures in one command, each section in its own process.

  python -m rlrag_jax.bench.accelerator [--out DIR] [--budget-s 420]
  python -m rlrag_jax.bench.accelerator --reduced        # a tiny shape, any backend (CPU test)

Measured on whatever device jax sees first, against the hardware's datasheet (`PEAKS`, looked
up by `jax.devices()[0].device_kind`; a kind not in the table is named and its ratios to the
datasheet are left out, never guessed), section by section in this order:

  device          a device-to-device copy's bandwidth and a bf16 matmul's rate, the device kind,
                  jax's version and the datasheet peaks.
  memory          `bench.memory`'s ahead-of-time analysis of the update (vocab 151,936 and
                  32,000) and of the decode step, compiled for this device.
  update          the trainer's RL update (`rl.step_factories.make_policy_step`, GRPO with a
                  reference log-prob input, AdamW over float32 master params, bf16 compute,
                  rematerialised blocks, chunked logits) at 64 sequences x 512 tokens: tokens/s,
                  model FLOPs utilisation against the datasheet bf16 peak and the measured
                  matmul, peak device memory, compile seconds. More micro-batches are tried when
                  one does not fit.
  update_pallas   the same with the Pallas attention kernels (`models.flash_attention`), on a
                  GPU. First a check on the device against the XLA attention at the same
                  weights: the logits, the gradients of a cross-entropy and the share of equal
                  greedy (argmax) tokens; the largest relative errors are reported, and beyond
                  `TOLERANCE` (bf16 rounding) the timing is skipped, saying so.
  sampler_xla     greedy decoding of exactly `new_tokens` tokens (no EOS) from `prompt` random
  sampler_pallas  prompt tokens, batch 64 and 256, with the Qwen2.5-0.5B shape (random weights,
                  bf16), one section per decode attention (`--decode-attention`; on a GPU both,
                  'xla' elsewhere): tok/s; the decode roofline (tok/s if every step read the bf16
                  weights and the live KV cache once, at the measured copy bandwidth and at the
                  datasheet's); one decode step alone (jitted, cache donated). The Pallas kernel
                  (`sampling.cache_attention`) is checked first as above (one decode step's
                  logits over the same cache, and the greedy tokens of a short generation), and
                  where it splits the cache (a batch too small to fill the GPU) the batch is
                  timed in one pass too.
  hf              `transformers` `generate` on the same device (bf16, its own random weights of
                  the same shape: timing does not depend on their values).
  main            `python -m rlrag_jax.train --config=configs/arena.py` (the README's main job),
                  twice with one persistent compilation cache: wall time and compile seconds of
                  the cold and the cached run.

Each section runs in a subprocess of its own (`--child`), under a time limit taken from what is
left of `--budget-s`: a crash there (a Triton or Mosaic fault, a segfault, out of memory, a
Python error) or a timeout ends that section alone, and its record keeps the exit status and
the last lines of its stderr (the Python traceback too: `-X faulthandler`); the next section
runs. Before anything runs the budget is planned from each section's expected seconds
(`NEEDS`): sections are first scaled down (`scaled`: the larger batch only, fewer repeats, one
main-job run) and, when that is not enough, cut (the `CUT_ORDER`); a section whose limit falls
below its scaled need at its turn is cut then. Every cut and scaled section is named in the
output. A section's record is written to `--out` as soon as it ends (a line of
`sections.jsonl` and `<section>.json`), so a run that is killed keeps what it measured;
`accelerator.json` gathers them at the end, and the last lines printed are a summary table.
The exit status is 1 when a section failed or timed out, or a Pallas check disagreed.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import time

from rlrag_jax.bench import HELP_SMOKE

ROOT = pathlib.Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------ peaks
@dataclasses.dataclass(frozen=True)
class Peak:
  """A device's datasheet figures: dense (not sparse) bf16 matrix TFLOP/s, memory TB/s, GB."""
  bf16_tflops: float
  hbm_tbs: float
  memory_gb: float
  name: str


# Keyed by `jax.devices()[0].device_kind` exactly as jax reports it (CUDA's device name for an
# NVIDIA GPU; the TPU runtime's chip name, where v5e is 'TPU v5 lite', v5p 'TPU v5' and v6e
# 'TPU v6 lite'). Sources, dense bf16 (the datasheets also give 2x with 2:4 sparsity):
#   H100: NVIDIA H100 Tensor Core GPU datasheet: SXM5 989 TFLOPS, 3.35 TB/s HBM3, 80 GB;
#         PCIe 756 TFLOPS, 2.0 TB/s HBM2e, 80 GB; NVL 835 TFLOPS, 3.9 TB/s, 94 GB.
#   H200: NVIDIA H200 Tensor Core GPU datasheet: SXM 989 TFLOPS, NVL 835; both 4.8 TB/s HBM3e,
#         141 GB.
#   A100: NVIDIA A100 Tensor Core GPU datasheet: 312 TFLOPS; 40GB 1,555 GB/s; 80GB SXM 2,039
#         GB/s, 80GB PCIe 1,935 GB/s.
#   TPU:  Google Cloud TPU documentation (system architecture, per chip): v4 275 TFLOPS,
#         1,200 GB/s, 32 GiB; v5e 197 TFLOPS, 819 GB/s, 16 GB; v5p 459 TFLOPS, 2,765 GB/s,
#         95 GB; v6e (Trillium) 918 TFLOPS, 1,640 GB/s, 32 GB.
PEAKS = {
    "NVIDIA H100 80GB HBM3": Peak(989.4, 3.35, 80, "H100 SXM5"),
    "NVIDIA H100 PCIe": Peak(756.0, 2.0, 80, "H100 PCIe"),
    "NVIDIA H100 NVL": Peak(835.0, 3.9, 94, "H100 NVL"),
    "NVIDIA H200": Peak(989.4, 4.8, 141, "H200 SXM"),
    "NVIDIA H200 NVL": Peak(835.0, 4.8, 141, "H200 NVL"),
    "NVIDIA A100-SXM4-40GB": Peak(312.0, 1.555, 40, "A100 SXM4 40GB"),
    "NVIDIA A100-PCIE-40GB": Peak(312.0, 1.555, 40, "A100 PCIe 40GB"),
    "NVIDIA A100-SXM4-80GB": Peak(312.0, 2.039, 80, "A100 SXM4 80GB"),
    "NVIDIA A100 80GB PCIe": Peak(312.0, 1.935, 80, "A100 PCIe 80GB"),
    "TPU v4": Peak(275.0, 1.2, 32, "TPU v4"),
    "TPU v5 lite": Peak(197.0, 0.819, 16, "TPU v5e"),
    "TPU v5": Peak(459.0, 2.765, 95, "TPU v5p"),
    "TPU v6 lite": Peak(918.0, 1.64, 32, "TPU v6e"),
}
# Names some tools print for the same chips.
PEAKS.update({"TPU v5e": PEAKS["TPU v5 lite"], "TPU v5p": PEAKS["TPU v5"],
              "TPU v6e": PEAKS["TPU v6 lite"]})


def peak_for(device_kind: str):
  """The datasheet `Peak` of a device kind, or None when the table does not know it (the CPU,
  a card not listed): then no ratio to a datasheet is printed."""
  return PEAKS.get(str(device_kind).strip())


def _ratio(x, peak):
  return None if peak is None or x is None else x / peak


# ------------------------------------------------------------------------------------ specs
FULL = dict(shape="qwen2.5-0.5b", batches=(64, 256), prompt=128, new_tokens=256,
            update_sequences=64, update_tokens=512, hf_batches=(64, 256), steps=3, reps=20,
            runs=2, second_vocab=True, one_pass=True, check_rows=4, check_tokens=128,
            check_new_tokens=32)
REDUCED = dict(FULL, shape="reduced", batches=(4,), prompt=16, new_tokens=8,
               update_sequences=4, update_tokens=64, hf_batches=(4,), steps=2, reps=3,
               check_rows=2, check_tokens=64, check_new_tokens=8)
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


def scaled(spec: dict) -> dict:
  """A section's spec when the budget cannot hold its full form: the largest batch only, two
  timed repeats, a quarter of the device repeats, one vocabulary in the memory plan, no
  one-pass rerun of a split decode kernel, one main-job run (the cold one)."""
  return dict(spec, batches=tuple(spec["batches"][-1:]), hf_batches=tuple(spec["hf_batches"][-1:]),
              steps=min(2, spec["steps"]), reps=max(3, spec["reps"] // 4), runs=1,
              second_vocab=False, one_pass=False)


# ------------------------------------------------------------------------------------ budget
# Expected seconds of each section (its process's start and compiles included), full and
# scaled: at the full spec from the H100 run of 2026-11-26 (docs/results/accelerator/), a
# Pallas section with its check added; in --reduced from CPU runs on 2 busy cores (the Pallas
# kernels in the interpreter).
NEEDS = {
    "full": dict(device=(20, 15), memory=(50, 35), update=(70, 60), update_pallas=(90, 75),
                 sampler_xla=(45, 30), sampler_pallas=(80, 45), hf=(45, 30), main=(230, 140)),
    "reduced": dict(device=(15, 10), memory=(60, 40), update=(60, 45), update_pallas=(150, 100),
                    sampler_xla=(45, 30), sampler_pallas=(150, 100), hf=(40, 30),
                    main=(120, 70)),
}
ORDER = ("device", "memory", "update", "update_pallas", "sampler_xla", "sampler_pallas", "hf",
         "main")
# Which sections give way first when even the scaled plan does not fit: the reference run,
# then the memory plan (XLA:GPU's plan is also had without a GPU: bench.memory --gpu h100).
CUT_ORDER = ("hf", "memory", "main", "sampler_pallas", "update_pallas", "sampler_xla", "update",
             "device")
MARGIN_S = 3.0        # kept back from every limit: killing a process and writing its record


def plan(names, budget_s: float, mode: str) -> dict:
  """{section: 'full' | 'scaled' | 'cut'} for `names` within `budget_s` seconds: every section
  full if that fits, else scaled one by one (last in ORDER first), then cut in CUT_ORDER."""
  need = {n: NEEDS[mode][n] for n in names}
  level = {n: "full" for n in names}
  total = lambda: sum(need[n][0 if lv == "full" else 1] for n, lv in level.items()
                      if lv != "cut") + MARGIN_S * len(names)
  for n in reversed([n for n in ORDER if n in level]):
    if total() <= budget_s:
      return level
    level[n] = "scaled"
  for n in [n for n in CUT_ORDER if n in level]:
    if total() <= budget_s:
      break
    level[n] = "cut"
  return level


def need_s(name: str, level: str, mode: str) -> float:
  return float(NEEDS[mode][name][0 if level == "full" else 1]) if level != "cut" else 0.0


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


def _peak_here():
  import jax
  return peak_for(jax.devices()[0].device_kind)


# ------------------------------------------------------------------------------------ device
def measure_device(spec: dict) -> dict:
  """A device-to-device copy's bandwidth (bytes read + written) and a bf16 matmul's rate, and
  the device's datasheet peaks (`PEAKS`; None for a kind the table does not know)."""
  import jax
  import jax.numpy as jnp
  reduced = spec["shape"] == REDUCED["shape"]
  n = (1 << 20) if reduced else (1 << 29)                  # 2 GiB of f32 on the GPU
  # In place (the input donated): each call reads and writes the array once, allocates nothing.
  # (A first version wrote a fresh 2 GiB output per call and measured 0.5 TB/s on an H100.)
  step = jax.jit(lambda a: a * 1.0001, donate_argnums=0)
  x = step(jnp.ones((n,), jnp.float32))
  x.block_until_ready()
  reps = spec["reps"]
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
  kind = str(jax.devices()[0].device_kind)
  peak = peak_for(kind)
  dev = dict(device=kind, backend=jax.default_backend(), copy_bandwidth_tbs=bw / 1e12,
             matmul_bf16_tflops=tflops, jax=jax.__version__,
             peak=dataclasses.asdict(peak) if peak else None,
             copy_vs_datasheet=_ratio(bw / 1e12, peak and peak.hbm_tbs),
             matmul_vs_datasheet=_ratio(tflops, peak and peak.bf16_tflops))
  _say(f"[device] {kind} ({dev['backend']}, jax {jax.__version__}): copy {bw / 1e12:.3f} TB/s, "
       f"bf16 matmul {tflops:.1f} TFLOP/s; " +
       (f"datasheet ({peak.name}) {peak.hbm_tbs} TB/s, {peak.bf16_tflops} TFLOP/s"
        if peak else f"device kind {kind!r} is not in the peak table: no datasheet ratios"))
  return dev


def _peak_bytes() -> float:
  import jax
  stats = jax.devices()[0].memory_stats() or {}
  return float(stats.get("peak_bytes_in_use", float("nan")))


# ------------------------------------------------------------------------------------ checks
# Largest error relative to the reference's largest magnitude that bf16 arithmetic in another
# order may give (bf16 keeps 8 significant bits: 0.4% per rounding, over a few layers of sums).
TOLERANCE = dict(forward=3e-2, gradients=1e-1, decode=3e-2)


def rel_err(got, want) -> float:
  """max |got - want| / max |want| (float32)."""
  import numpy as np
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))


def verdict(errors: dict, **extra) -> dict:
  """A check's record: each error, the tolerance it is held to, and `agree` (all within)."""
  over = sorted(k for k, v in errors.items() if not v <= TOLERANCE[k])     # NaN is over
  return dict(errors=errors, tolerance={k: TOLERANCE[k] for k in errors}, agree=not over,
              over_tolerance=over, **extra)


def check_attention(spec: dict) -> dict:
  """'pallas' against 'xla' attention in the model at the same float32 master weights and bf16
  compute, on the device: logits, gradients of the next-token cross-entropy (the largest
  error of any parameter, relative to that parameter's largest gradient) and the share of
  positions whose argmax token is equal."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from rlrag_jax.models.decoder import DecoderLM, init_params
  cfg = _model_config(spec, param_dtype="float32", attention_block=0)
  params = init_params(DecoderLM(cfg), jax.random.PRNGKey(0))
  rows, t = spec["check_rows"], spec["check_tokens"]
  ids = jnp.asarray(np.random.default_rng(1).integers(3, cfg.vocab_size, (rows, t)), jnp.int32)
  mask = jnp.ones((rows, t), jnp.int32)

  def run(impl):
    module = DecoderLM(cfg.replace(attention=impl))

    def loss(p):
      logits, _ = module.apply({"params": p}, ids, mask)
      logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
      return -jnp.mean(jnp.take_along_axis(logp, ids[:, 1:, None], -1)), logits
    return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)

  (_, lx), gx = run("xla")
  (_, lp), gp = run("pallas")
  grads = [rel_err(a, b) for a, b in zip(jax.tree_util.tree_leaves(gp),
                                         jax.tree_util.tree_leaves(gx))]
  greedy = float(np.mean(np.asarray(jnp.argmax(lp, -1) == jnp.argmax(lx, -1))))
  return verdict(dict(forward=rel_err(lp, lx), gradients=max(grads)), greedy_equal=greedy,
                 rows=rows, tokens=t)


def check_decode(spec: dict) -> dict:
  """The 'pallas' decode attention against 'xla' on the device: one decode step's logits over
  the same prefilled cache, and the share of equal greedy tokens over a short generation from
  the same prompts (one flipped near-tie changes the rest of its row)."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from rlrag_jax.models.decoder import DecoderLM, init_cache, init_params
  from rlrag_jax.sampling import fast_decode, prefill, sampler
  cfg = _model_config(spec)
  params = init_params(DecoderLM(cfg), jax.random.PRNGKey(0))
  rows, t, new = spec["check_rows"], spec["check_tokens"], spec["check_new_tokens"]
  rng = np.random.default_rng(2)
  ids = jnp.asarray(rng.integers(3, cfg.vocab_size, (rows, t)), jnp.int32)
  _, cache = jax.jit(lambda p, i: prefill(cfg, p, i, jnp.ones_like(i, jnp.bool_),
                                          init_cache(cfg, rows, t + 8)))(params, ids)
  tok, act = ids[:, -1], jnp.ones((rows,), jnp.bool_)
  step = jax.jit(fast_decode.decode_step, static_argnums=0)
  logits = {}
  tokens = {}
  for impl in ("xla", "pallas"):
    c = cfg.replace(decode_attention=impl)
    logits[impl], _ = step(c, fast_decode.pack_params(c, params), tok, act, cache)
    tokens[impl] = np.asarray(sampler.generate_with_params(
        c, params, ids[:, :t // 2].tolist(), max_new_tokens=new, temperature=0.0, eos_ids=(),
        rng=0).tokens)
  greedy = float(np.mean(tokens["pallas"] == tokens["xla"]))
  return verdict(dict(decode=rel_err(logits["pallas"], logits["xla"])), greedy_equal=greedy,
                 rows=rows, cached=t, new_tokens=new)


def checked(name: str, check, timed) -> dict:
  """{'check': check(), **timed()} when the check agrees; else the check alone, with
  `timing_skipped` saying why (a kernel whose values are wrong is not worth timing)."""
  c = check()
  errs = ", ".join(f"{k} {v:.2e} (tolerance {c['tolerance'][k]:g})"
                   for k, v in c["errors"].items())
  _say(f"[{name}] check against xla on this device: {errs}; greedy tokens equal "
       f"{c['greedy_equal']:.1%}" + ("" if c["agree"] else " -- DISAGREES, timing skipped"))
  if not c["agree"]:
    return dict(check=c, timing_skipped=f"values beyond bf16 tolerance: "
                f"{', '.join(c['over_tolerance'])}")
  return dict(check=c, **timed())


# ------------------------------------------------------------------------------------ sampler
def auto_cache_ranges(spec: dict, batch: int, kv_heads: int) -> int:
  """How many cache ranges the 'pallas' decode kernel splits into at `batch` under
  `model.decode_attention_splits=0` (auto), for the spec's full cache length."""
  from rlrag_jax.sampling import cache_attention
  return cache_attention.auto_splits(batch, kv_heads, spec["prompt"] + spec["new_tokens"],
                                     cache_attention.BLOCK)


def sampler_runs(spec: dict, impl: str, kv_heads: int) -> list:
  """[(decode attention, model.decode_attention_splits, batch)] a sampler section times: each
  batch (splits 0: auto), and for 'pallas' (unless scaled) the first batch whose kernel
  splits the cache once more in one pass (splits 1)."""
  runs = [(impl, 0, b) for b in spec["batches"]]
  if impl == "pallas" and spec["one_pass"]:
    runs += [(impl, 1, b) for b in spec["batches"]
             if auto_cache_ranges(spec, b, kv_heads) > 1][:1]
  return runs


def bench_sampler(spec: dict, dev: dict, impl: str = "xla", profile: str = "") -> list:
  """Rows per (batch, splits) of one decode attention; a 'pallas' row gives the cache ranges
  its kernel used (`splits`)."""
  import jax
  from rlrag_jax.models.decoder import DecoderLM, init_params
  base = _model_config(spec)
  params = init_params(DecoderLM(base), jax.random.PRNGKey(0))
  peak = _peak_here()
  rows = []
  for impl, splits, b in sampler_runs(spec, impl, base.num_kv_heads):
    cfg = base.replace(decode_attention=impl, decode_attention_splits=splits)
    row = _sampler_row(cfg, params, spec, b)
    step_s = _decode_step_alone(cfg, params, spec, b, profile)
    row.update(decode_step_ms=1e3 * step_s, decode_step_alone_tok_s=b / step_s)
    if impl == "pallas":
      row["splits"] = splits or auto_cache_ranges(spec, b, base.num_kv_heads)
    bw = dev.get("copy_bandwidth_tbs")
    roof = lambda tbs: None if tbs is None else decode_roofline_tok_s(
        cfg, b, spec["prompt"], spec["new_tokens"], tbs * 1e12)
    row.update(roofline_tok_s=roof(bw), roofline_datasheet_tok_s=roof(peak and peak.hbm_tbs))
    row.update(frac_roofline=_ratio(row["tok_s"], row["roofline_tok_s"]),
               frac_roofline_datasheet=_ratio(row["tok_s"], row["roofline_datasheet_tok_s"]))
    rows.append(row)
    name = impl if not splits else f"{impl} (splits {splits})"
    _say(f"[sampler] {name} attention, batch {b}: {row['tok_s']:,.0f} tok/s "
         f"({row['seconds']:.3f} s per call; first call {row['first_call_s']:.1f} s with "
         f"compile); roofline: {_pct(row['frac_roofline'])} at the measured copy bandwidth, "
         f"{_pct(row['frac_roofline_datasheet'])} at the datasheet's; per step: loop "
         f"{row['loop_step_ms']:.2f} ms, decode step alone {row['decode_step_ms']:.2f} ms")
  return rows


def _pct(x) -> str:
  return "n/a" if x is None else f"{x:.1%}"


def _sampler_row(cfg, params, spec: dict, b: int) -> dict:
  import numpy as np
  from rlrag_jax.sampling import sampler
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
  return dict(batch=b, decode_attention=cfg.decode_attention, prompt=spec["prompt"],
              new_tokens=spec["new_tokens"], seconds=sec, first_call_s=first,
              tok_s=b * spec["new_tokens"] / sec, loop_step_ms=1e3 * sec / spec["new_tokens"])


def _decode_step_alone(cfg, params, spec: dict, b: int, profile: str) -> float:
  """Seconds of one decode step (jitted, cache donated) outside the loop: the loop's share is
  (loop time / steps) - this. With `profile`, a trace of five steps."""
  import jax
  import jax.numpy as jnp
  from rlrag_jax.models.decoder import init_cache
  from rlrag_jax.sampling import fast_decode
  packed = jax.jit(lambda p: fast_decode.pack_params(cfg, p))(params)
  mid = spec["prompt"] + spec["new_tokens"] // 2
  cache = jax.jit(lambda: init_cache(cfg, b, spec["prompt"] + spec["new_tokens"]))()
  cache["mask"] = cache["mask"].at[:, :mid].set(True)
  step = jax.jit(fast_decode.decode_step, static_argnums=0, donate_argnums=4)
  toks, act = jnp.zeros((b,), jnp.int32), jnp.ones((b,), jnp.bool_)

  def steps(n):
    nonlocal cache
    for _ in range(n):
      cache["index"] = jnp.int32(mid)
      logits, cache = step(cfg, packed, toks, act, cache)
    logits.block_until_ready()

  steps(1)
  t = time.perf_counter()
  steps(spec["reps"])
  step_s = (time.perf_counter() - t) / spec["reps"]
  if profile:      # a trace of a few decode steps: the kernels of one step and their times
    name = f"decode_{cfg.decode_attention}_b{b}" + (
        f"_splits{cfg.decode_attention_splits}" if cfg.decode_attention_splits else "")
    with jax.profiler.trace(str(pathlib.Path(profile) / name)):
      steps(5)
  return step_s


def hf_generate(spec: dict) -> dict:
  """`transformers` `generate`, greedy, exactly `new_tokens` new tokens, bf16, on the GPU when
  torch sees one (this section's process imports no jax, so the two do not share the GPU)."""
  import torch
  import transformers
  hf = _hf_dict(spec)
  hf.pop("model_type", None)
  cfg = transformers.Qwen2Config(**hf)
  torch.manual_seed(0)
  dev = "cuda" if torch.cuda.is_available() else "cpu"
  sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
  with torch.device(dev):
    model = transformers.Qwen2ForCausalLM(cfg).to(torch.bfloat16).eval()
  rows = []
  for b in spec["hf_batches"]:
    ids = torch.randint(3, cfg.vocab_size, (b, spec["prompt"]), device=dev)
    kw = dict(max_new_tokens=spec["new_tokens"], min_new_tokens=spec["new_tokens"],
              do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
      model.generate(ids, **kw)
      sync()
      t = time.perf_counter()
      res = model.generate(ids, **kw)
      sync()
      sec = time.perf_counter() - t
    assert res.shape[1] == spec["prompt"] + spec["new_tokens"], res.shape
    rows.append(dict(batch=b, seconds=sec, tok_s=b * spec["new_tokens"] / sec))
    _say(f"[hf generate] batch {b}: {rows[-1]['tok_s']:,.0f} tok/s ({sec:.2f} s; torch "
         f"{torch.__version__}, transformers {transformers.__version__}, {dev})")
  return dict(rows=rows, torch=torch.__version__, transformers=transformers.__version__,
              device=dev)


# ------------------------------------------------------------------------------------ update
def _update_batch(cfg, n: int, t: int) -> dict:
  import numpy as np
  rng = np.random.default_rng(0)
  batch = {"input_ids": rng.integers(3, cfg.vocab_size, (n, t)).astype(np.int32),
           "attention_mask": np.ones((n, t), np.int32),
           "loss_mask": np.zeros((n, t), np.int32),
           "advantages": rng.normal(size=(n,)).astype(np.float32)}
  batch["loss_mask"][:, t // 2:] = 1                    # the completion: the second half
  return batch


def bench_update(spec: dict, dev: dict, attention: str = "xla") -> dict:
  """The update's figures at the first micro-batch count (1, 2, 4, 8) that fits."""
  cfg = _model_config(spec, param_dtype="float32", remat=True, attention_block=0,
                      attention=attention)
  for micro in (1, 2, 4, 8):
    if spec["update_sequences"] % micro:
      continue
    try:
      result = _time_update(cfg, spec, micro)
    except Exception as e:          # out of memory: try more micro-batches
      _say(f"[update] {micro} micro-batch(es): {type(e).__name__}: {str(e)[:300]}")
      continue
    peak = _peak_here()
    result.update(mfu=_ratio(result["model_tflops"], peak and peak.bf16_tflops),
                  mfu_vs_matmul=_ratio(result["model_tflops"], dev.get("matmul_bf16_tflops")))
    _say(f"[update] {attention} attention, {result['sequences']} x {result['tokens']} tokens, "
         f"{micro} micro-batch(es): {result['tokens_per_s']:,.0f} tokens/s "
         f"({result['seconds']:.3f} s/step), {result['model_tflops']:.2f} model TFLOP/s = MFU "
         f"{_pct(result['mfu'])} of the datasheet ({_pct(result['mfu_vs_matmul'])} of the "
         f"measured matmul); peak memory {result['peak_bytes'] / 2 ** 30:.2f} GiB (XLA: "
         f"arguments {result['argument_bytes'] / 2 ** 30:.2f} + temporaries "
         f"{result['temp_bytes'] / 2 ** 30:.2f} GiB); compile {result['compile_s']:.1f} s")
    return result
  raise RuntimeError(f"the update did not run at any micro-batch count (see the lines above)")


def _time_update(cfg, spec: dict, micro: int) -> dict:
  import jax
  import numpy as np
  from rlrag_jax import rl
  from rlrag_jax.models import sharding as shd
  from rlrag_jax.models.decoder import DecoderLM
  from rlrag_jax.rl import optim_state, step_factories
  module = DecoderLM(cfg)
  mesh = shd.make_mesh(data=1, fsdp=-1, tensor=1, devices=jax.devices()[:1])
  n, t = spec["update_sequences"], spec["update_tokens"]
  start = t // 2 - 1
  opt = optim_state.make_optimizer(optim_state.OptimizerConfig(lr=1e-6, total_steps=100))
  state = rl.create_train_state(module, opt, mesh, rng=jax.random.PRNGKey(0))
  step = step_factories.make_policy_step(module, opt, mesh,
                                         step_factories.LossConfig.preset("grpo"),
                                         micro_batches=micro)
  logp = step_factories.make_logprob_fn(module, mesh, micro_batches=micro)
  batch = shd.shard_batch(_update_batch(cfg, n, t), mesh)
  batch["ref_logp"] = logp(state.params, batch, start)
  c0 = time.perf_counter()
  compiled = step.lower(state, batch, start).compile()     # the step's one compile
  compile_s = time.perf_counter() - c0
  mem = compiled.memory_analysis()
  state, m = compiled(state, batch)
  float(m["loss"])
  times = []
  for _ in range(spec["steps"]):
    t0 = time.perf_counter()
    state, m = compiled(state, batch)
    float(m["loss"])
    times.append(time.perf_counter() - t0)
  sec = float(np.median(times))
  tflops = update_model_flops(cfg, n, t, t - 1 - start) / sec / 1e12
  return dict(attention=cfg.attention, sequences=n, tokens=t, micro_batches=micro, seconds=sec,
              tokens_per_s=n * t / sec, model_tflops=tflops, peak_bytes=_peak_bytes(),
              compile_s=compile_s, temp_bytes=int(mem.temp_size_in_bytes),
              argument_bytes=int(mem.argument_size_in_bytes), loss=float(m["loss"]),
              skipped=float(m["skipped"]))


def bench_memory_plan(spec: dict) -> list:
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
  if spec["second_vocab"]:
    rows += memory.run(shape, parts=("update",), vocab=32000 if shape in memory.SHAPES else 1024,
                       **kw)
  impls = ("xla", "pallas") if jax.default_backend() == "gpu" else ("xla",)
  for impl in impls:
    rows += memory.run(shape, parts=("decode",), decode_batch=spec["batches"][-1],
                       cached=spec["prompt"] + spec["new_tokens"], decode_attention=impl, **kw)
  _say("[memory] XLA's analysis, compiled for this device:")
  _say(memory.format_rows(rows))
  return rows


# ------------------------------------------------------------------------------------ main job
def bench_main_job(spec: dict, limit_s: float) -> list:
  """The README's main job `spec['runs']` times with one persistent compilation cache (the
  first run cold), each within what is left of `limit_s`."""
  rows = []
  cache = tempfile.mkdtemp(prefix="rlrag_xla_cache_")
  clock = Clock(limit_s)
  for i in range(spec["runs"]):
    workdir = tempfile.mkdtemp(prefix=f"rlrag_main_{i}_")
    cmd = [sys.executable, "-m", "rlrag_jax.train", "--config=configs/arena.py",
           f"--workdir={workdir}", "--quiet", f"--config.compile_cache={cache}"]
    if spec["shape"] == REDUCED["shape"]:
      cmd += list(REDUCED_MAIN_ARGS)
    t = time.perf_counter()
    # The first run has no limit of its own: past the section's limit the parent kills the
    # section (a timeout); a later run stops in time to keep the rows before it.
    try:
      proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                            timeout=max(1.0, clock.left() - 2) if rows else None)
    except subprocess.TimeoutExpired:
      rows.append(dict(run=i + 1, timed_out=True))      # the runs before it are kept
      _say(f"[main job] run {i + 1}: not finished within the section's limit")
      break
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


# ------------------------------------------------------------------------------------ child
FAULT_ENV = "RLRAG_ACCEL_FAULT"
# A test hook, no option: RLRAG_ACCEL_FAULT="update=abort,memory=raise" makes each named
# section's process fail that way before it starts: raise (a Python error), exit (status 3),
# abort (SIGABRT, as a failed CHECK in XLA), segv (SIGSEGV, as a kernel fault), hang (sleeps
# until its limit kills it).


def _inject_fault(name: str) -> None:
  for item in os.environ.get(FAULT_ENV, "").split(","):
    section, _, kind = item.partition("=")
    if section != name:
      continue
    _say(f"[{name}] {FAULT_ENV}: injecting {kind!r}")
    if kind == "raise":
      raise RuntimeError(f"{FAULT_ENV}: a fault injected into section {name}")
    if kind == "exit":
      os._exit(3)
    if kind == "abort":
      os.abort()
    if kind == "segv":
      os.kill(os.getpid(), signal.SIGSEGV)
    if kind == "hang":
      time.sleep(1e9)


def run_section(name: str, job: dict):
  """One section's figures, in this process (the `--child` side)."""
  spec, dev = job["spec"], job.get("device") or {}
  if name == "device":
    return measure_device(spec)
  if name == "memory":
    return dict(rows=bench_memory_plan(spec))
  if name == "update":
    return bench_update(spec, dev)
  if name == "update_pallas":
    return checked(name, lambda: check_attention(spec), lambda: bench_update(spec, dev, "pallas"))
  if name in ("sampler_xla", "sampler_pallas"):
    impl = name.split("_")[1]
    timed = lambda: dict(rows=bench_sampler(spec, dev, impl, job.get("profile", "")))
    return checked(name, lambda: check_decode(spec), timed) if impl == "pallas" else timed()
  if name == "hf":
    return hf_generate(spec)
  if name == "main":
    return dict(rows=bench_main_job(spec, job["limit_s"]))
  raise ValueError(f"unknown section {name!r}; expected one of {', '.join(ORDER)}")


def child_main(name: str, job_json: str, result_path: str) -> int:
  job = json.loads(job_json)
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  _inject_fault(name)
  result = run_section(name, job)
  tmp = pathlib.Path(result_path + ".tmp")
  tmp.write_text(json.dumps(result, default=str))
  tmp.replace(result_path)
  return 0


# ------------------------------------------------------------------------------------ parent
def exit_meaning(rc) -> str:
  if rc is None:
    return "not started"
  if rc < 0:
    try:
      return f"killed by {signal.Signals(-rc).name}"
    except ValueError:
      return f"killed by signal {-rc}"
  return "ok" if rc == 0 else f"exit status {rc}"


def _tail(path: pathlib.Path, lines: int = 25, chars: int = 4000) -> list:
  text = path.read_text(errors="replace") if path.exists() else ""
  return [l[-500:] for l in text[-chars:].splitlines()[-lines:]]


def spawn_section(name: str, job: dict, out: pathlib.Path, limit_s: float) -> dict:
  """Runs one section in its own process group under `limit_s` seconds; its record. Its
  stdout is ours (the progress lines), its stderr goes to `<section>.stderr.log`."""
  result = out / f".{name}.result.json"
  err_path = out / f"{name}.stderr.log"
  cmd = [sys.executable, "-X", "faulthandler", "-m", "rlrag_jax.bench.accelerator",
         "--child", name, "--job", json.dumps(dict(job, limit_s=limit_s)), "--result",
         str(result)]
  paths = [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), PYTHONUNBUFFERED="1")
  t = time.perf_counter()
  with open(err_path, "w") as err:
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=err, start_new_session=True)
    try:
      rc, status = proc.wait(timeout=max(1.0, limit_s)), None
    except subprocess.TimeoutExpired:
      rc, status = None, "timeout"
    finally:
      if proc.poll() is None:                        # timed out, or we were interrupted
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
  rec = dict(section=name, status=status or ("ok" if rc == 0 else "failed"),
             exit=proc.returncode, exit_meaning=exit_meaning(proc.returncode),
             seconds=time.perf_counter() - t, limit_s=limit_s, level=job["level"])
  if rec["status"] == "ok":
    try:
      rec["result"] = json.loads(result.read_text())
      result.unlink()
    except (OSError, ValueError) as e:
      rec.update(status="failed", exit_meaning=f"exit 0 but no result ({e})")
  if rec["status"] != "ok":
    rec["stderr_tail"] = _tail(err_path)
  return rec


def write_record(out: pathlib.Path, rec: dict) -> None:
  """The section's record, at once: a line of sections.jsonl and <section>.json."""
  line = json.dumps(rec, default=str)
  with open(out / "sections.jsonl", "a") as f:
    f.write(line + "\n")
    f.flush()
    os.fsync(f.fileno())
  (out / f"{rec['section']}.json").write_text(json.dumps(rec, indent=1, default=str))


def section_limit(name: str, levels: dict, pending: list, left_s: float, mode: str) -> tuple:
  """(level, limit in seconds) for `name` now: what is left less the scaled needs of the
  sections planned after it (each is scaled in turn if time runs short: a slow section takes
  the slack, never their minimum); scaled when the full need no longer fits, 'cut' below the
  scaled need."""
  reserve = sum(need_s(n, "scaled" if levels[n] != "cut" else "cut", mode) + MARGIN_S
                for n in pending)
  limit = left_s - reserve - MARGIN_S
  level = levels[name]
  if level == "full" and limit < need_s(name, "full", mode):
    level = "scaled"
  if level == "cut" or limit < need_s(name, "scaled", mode):
    return "cut", limit
  return level, limit


def candidate_sections(selected, attentions) -> list:
  """The sections of ORDER that `--sections` names ('sampler' and 'update' stand for their
  attentions' sections), Pallas ones only with 'pallas' in `attentions`; 'device' always."""
  expand = dict(sampler=("sampler_xla", "sampler_pallas"), update=("update", "update_pallas"))
  wanted = {"device"} | {n for s in selected for n in expand.get(s, (s,))}
  unknown = wanted - set(ORDER)
  if unknown:
    raise SystemExit(f"--sections: unknown {sorted(unknown)}; expected sampler, update, "
                     f"{', '.join(ORDER)}")
  return [n for n in ORDER if n in wanted and
          (not n.endswith("_pallas") or "pallas" in attentions) and
          (n != "sampler_xla" or "xla" in attentions)]


def describe_plan(levels: dict, mode: str) -> str:
  return ", ".join(f"{n} {lv}" + (f" (~{need_s(n, lv, mode):.0f} s)" if lv != "cut" else "")
                   for n, lv in levels.items())


def run_plan(names, levels, spec, mode, clock, out, auto, profile) -> list:
  """Each section in turn, under the limit `section_limit` gives it; each record written as
  soon as the section ends. With `auto` attentions the Pallas sections are dropped once the
  device section has found no GPU (the kernels would only run in Pallas' interpreter)."""
  records, pending, device = [], list(names), {}
  while pending:
    name = pending.pop(0)
    level, limit = section_limit(name, levels, pending, clock.left(), mode)
    if level == "cut":
      why = ("the plan: it does not fit beside the sections kept (CUT_ORDER)"
             if levels[name] == "cut" else
             f"{max(limit, 0):.0f} s left for it, needs ~{need_s(name, 'scaled', mode):.0f} s")
      rec = dict(section=name, status="cut", level="cut", reason=f"budget: {why}")
      _say(f"[{name}] CUT ({rec['reason']})")
    else:
      job = dict(spec=scaled(spec) if level == "scaled" else spec, level=level,
                 device=device, profile=profile)
      _say(f"[{name}] start: {level}, limit {limit:.0f} s")
      rec = spawn_section(name, job, out, limit)
      _say(f"[{name}] {rec['status']}" + (f" ({rec['exit_meaning']})" if rec["exit"] else "")
           + f" in {rec['seconds']:.1f} s"
           + "".join(f"\n  | {l}" for l in rec.get("stderr_tail", [])))
    write_record(out, rec)
    records.append(rec)
    if name == "device":
      device = rec.get("result") or {}
      if auto and device and device.get("backend") != "gpu":
        for n in [n for n in pending if n.endswith("_pallas")]:
          pending.remove(n)
          skip = dict(section=n, status="skipped", level="cut",
                      reason=f"not a GPU ({device.get('backend')}): the Pallas kernels would "
                      "run in the interpreter (--decode-attention pallas asks for it)")
          write_record(out, skip)
          records.append(skip)
        levels = plan(pending, clock.left(), mode)
        _say(f"[plan] {describe_plan(levels, mode)}")
  return records


def summary(res: dict) -> str:
  secs = res["sections"]
  lines = ["", "sections (status, level, seconds of the limit):"]
  for name, r in secs.items():
    lines.append(f"  {name:<15} {r['status'].upper() if r['status'] != 'ok' else 'ok':<8} "
                 f"{r.get('level', ''):<7}" +
                 (f"{r['seconds']:.0f} of {r['limit_s']:.0f} s" if "seconds" in r else
                  r.get("reason", "")) +
                 (f"; {r['exit_meaning']}" if r["status"] in ("failed", "timeout") else "") +
                 (f"; timing skipped: {r['result']['timing_skipped']}"
                  if "timing_skipped" in r.get("result", {}) else ""))
  lines.append("summary (ours vs reference, and vs the hardware)")
  dev = secs.get("device", {}).get("result")
  if dev:
    peak = dev.get("peak")
    lines.append(f"  device {dev['device']} ({dev['backend']}, jax {dev['jax']}): copy "
                 f"{dev['copy_bandwidth_tbs']:.2f} TB/s, bf16 matmul "
                 f"{dev['matmul_bf16_tflops']:.1f} TFLOP/s; " +
                 (f"datasheet {peak['name']}: {peak['hbm_tbs']} TB/s, {peak['bf16_tflops']} "
                  "TFLOP/s" if peak else "not in the peak table: no datasheet ratios"))
  lines += _summary_figures(secs)
  return "\n".join(lines)


def _summary_figures(secs: dict) -> list:
  lines = []
  res = lambda n: secs.get(n, {}).get("result") or {}
  hf = {r["batch"]: r for r in res("hf").get("rows", [])}
  for n in ("sampler_xla", "sampler_pallas"):
    check = res(n).get("check")
    if check:
      lines.append(f"  {n} check: errors {check['errors']}, greedy equal "
                   f"{check['greedy_equal']:.1%}, agree {check['agree']}")
    for r in res(n).get("rows", []):
      ref = hf.get(r["batch"])
      vs = f"; HF generate {ref['tok_s']:,.0f} tok/s, ratio {r['tok_s'] / ref['tok_s']:.1f}x" \
          if ref else ""
      split = f" (cache in {r['splits']} ranges)" if r.get("splits", 1) > 1 else \
          (" (one pass)" if "splits" in r else "")
      lines.append(f"  sampler {r.get('decode_attention', 'xla')} attention{split}, batch "
                   f"{r['batch']}: {r['tok_s']:,.0f} tok/s = {_pct(r.get('frac_roofline'))} "
                   f"of the measured roofline, {_pct(r.get('frac_roofline_datasheet'))} of the "
                   f"datasheet's{vs}")
  for n in ("update", "update_pallas"):
    u = res(n)
    if u.get("check"):
      lines.append(f"  {n} check: errors {u['check']['errors']}, agree {u['check']['agree']}")
    if "tokens_per_s" in u:
      lines.append(f"  update, {u['attention']} attention, {u['sequences']} x {u['tokens']} "
                   f"({u['micro_batches']} micro-batch): {u['tokens_per_s']:,.0f} tokens/s, "
                   f"MFU {_pct(u.get('mfu'))}, peak {u['peak_bytes'] / 2 ** 30:.1f} GiB")
  for r in res("main").get("rows", []):
    if "wall_s" in r:
      lines.append(f"  main job run {r['run']}: {r['wall_s']:.0f} s, compile "
                   f"{r['compile_s']:.0f} s ({r['compile_share']:.0%})")
  return lines


def _parse(argv):
  ap = argparse.ArgumentParser(prog="python -m rlrag_jax.bench.accelerator", description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--reduced", action="store_true", help="tiny shapes (a CPU test)")
  ap.add_argument("--budget-s", type=float, default=420.0,
                  help="wall-clock seconds for the whole run, kept (sections scaled or cut)")
  ap.add_argument("--out", default="",
                  help="folder for sections.jsonl, <section>.json, <section>.stderr.log and "
                  "accelerator.json (default: a new temporary folder)")
  ap.add_argument("--profile", default="",
                  help="folder for a jax.profiler trace of five decode steps per batch size "
                  "(open with TensorBoard's profile plugin or xprof)")
  ap.add_argument("--decode-attention", default="",
                  help="comma list of the attentions to time (xla, pallas): the sampler's "
                  "decode attention and, with pallas, the update's too (default: both on a "
                  "GPU, xla elsewhere)")
  ap.add_argument("--sections", default="memory,update,sampler,hf,main",
                  help="comma list of memory, update, sampler, hf, main (or single sections: "
                  + ", ".join(ORDER) + "); device always runs")
  ap.add_argument("--smoke", action="store_true",
                  help="--reduced with one main job run, not two (" + HELP_SMOKE + ")")
  ap.add_argument("--child", default="", help=argparse.SUPPRESS)    # one section, in-process
  ap.add_argument("--job", default="{}", help=argparse.SUPPRESS)
  ap.add_argument("--result", default="", help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  args.reduced = args.reduced or args.smoke
  return args


def main(argv=None) -> int:
  args = _parse(argv)
  if args.child:
    return child_main(args.child, args.job, args.result)
  spec = dict(REDUCED, runs=1) if args.smoke else (REDUCED if args.reduced else FULL)
  mode = "reduced" if args.reduced else "full"
  out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="rlrag_accelerator_"))
  out.mkdir(parents=True, exist_ok=True)
  (out / "sections.jsonl").unlink(missing_ok=True)
  auto = not args.decode_attention
  attentions = ("xla", "pallas") if auto else tuple(a for a in args.decode_attention.split(",")
                                                     if a)
  names = candidate_sections([s for s in args.sections.split(",") if s], attentions)
  # `timeout` (or a scheduler) ends us with SIGTERM: as an exception, so that the running
  # section's process group is killed with us (spawn_section's `finally`), not orphaned.
  before = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
  clock = Clock(args.budget_s)
  levels = plan(names, args.budget_s, mode)
  _say(f"[plan] budget {args.budget_s:.0f} s, {mode}, records in {out}: "
       f"{describe_plan(levels, mode)}")
  try:
    records = run_plan(names, levels, spec, mode, clock, out, auto, args.profile)
  finally:
    signal.signal(signal.SIGTERM, before)
  sections = {r["section"]: r for r in sorted(records, key=lambda r: ORDER.index(r["section"]))}
  res = dict(spec={k: list(v) if isinstance(v, tuple) else v for k, v in spec.items()},
             budget_s=args.budget_s, sections=sections,
             failed=[n for n, r in sections.items() if r["status"] in ("failed", "timeout")],
             cut=[n for n, r in sections.items() if r["status"] == "cut"],
             scaled=[n for n, r in sections.items() if r.get("level") == "scaled"],
             disagree=[n for n, r in sections.items()
                       if "timing_skipped" in (r.get("result") or {})],
             elapsed_s=clock.budget - clock.left())
  (out / "accelerator.json").write_text(json.dumps(res, indent=1, default=str))
  _say(summary(res))
  _say(f"  elapsed {res['elapsed_s']:.0f} s of a {args.budget_s:.0f} s budget; failed: "
       f"{', '.join(res['failed']) or 'none'}; cut: {', '.join(res['cut']) or 'none'}; "
       f"scaled: {', '.join(res['scaled']) or 'none'}; Pallas values off XLA's: "
       f"{', '.join(res['disagree']) or 'none'}; records in {out}")
  return 1 if res["failed"] or res["disagree"] else 0


if __name__ == "__main__":
  sys.exit(main())
