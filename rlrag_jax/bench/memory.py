"""Memory and bandwidth of the real update, prefill and decode step, read from XLA before any
hardware is owned: ahead-of-time compiles on abstract shapes (nothing allocated, no weights).

  python -m rlrag_jax.bench.memory --shape qwen2.5-0.5b --sequences 64 --tokens 512
  python -m rlrag_jax.bench.memory --shape qwen2.5-7b --sequences 64 --tokens 4096 \\
      --micro-batches 2 --devices 8          # FSDP over 8 host devices
  python -m rlrag_jax.bench.memory --shape qwen2.5-0.5b --sequences 64 --tokens 512 \\
      --parts update --tokens-per-micro-batch 8192     # token-budget micro-batches
  python -m rlrag_jax.bench.memory --shape path/to/config.json ... [--json]
  python -m rlrag_jax.bench.memory --targets  # the issue-31 targets, PASS / FAIL each
  python -m rlrag_jax.bench.memory --targets --gpu h100   # the same on XLA:GPU's plan

Each compiled function is reported with XLA's memory analysis (arguments, outputs, temporaries:
per device) and cost analysis (flops, bytes accessed: per device), beside an ideal:

  update   the RL policy update of `rl.step_factories.make_policy_step` (GRPO with a reference
           log-prob input; `--algo ppo` adds the critic's value update, `update_critic`), as the
           trainer builds it: bf16 compute over float32 master params, AdamW, rematerialised
           blocks and key-blocked attention (`config_base.use_hf_model`), logits in chunks of
           `--logits-chunk` elements (`rl.logits_chunk`), `--micro-batches` accumulated in the
           step; `--scan-layers` runs the blocks as one `lax.scan` (`model.scan_layers`, on in
           the `paper` presets; XLA then counts one layer's FLOPs and bytes, so none print).
           Ideal: its arguments (params, AdamW moments, the batch) + one float32 gradient
           + the residual stream the rematerialised backward pass keeps (layers x micro-batch
           tokens x hidden, compute dtype).
           With `--tokens-per-micro-batch N` (`rl.tokens_per_micro_batch`) the update is the
           token-budget form (`UpdateStep.accumulated`): 'update' is then its `accumulate`
           step on the largest micro-batch the budget allows at `--tokens` width (the most
           rows, a multiple of the shards, with rows x tokens <= N; column mb: how many such
           micro-batches the sequences make), whose arguments are params + the float32
           gradient accumulator + the micro-batch (the optimizer state stays resident beside
           them), and 'update_apply' the optimizer step that follows (arguments: the state and
           the gradient). Ideal of 'update': its arguments + one float32 gradient + the
           micro-batch's residual stream; of 'update_apply': its arguments.
  logprob  the reference / old-policy log-prob forward (`make_logprob_fn`; with a token budget
           on the micro-batch). Ideal: arguments.
  attention  one layer's attention forward and backward at the update's micro-batch shape
           (`--parts attention`; not in the default parts; `--attention pallas`: the Pallas
           kernels of `models.flash_attention`, also for the update, log-prob and prefill
           rows). Ideal: q, k, v read and the output written, then q, k, v, the output and
           its gradient read and dq, dk, dv written.
  prefill  the sampler's prompt prefill into a fresh KV cache (`sampling.sampler.prefill`,
           empty_cache), the prompt half of `--tokens`; `--prefill-prefix P`: onto a cache
           already holding P slots (prefix reuse). Ideal: arguments (params and cache) + the
           new KV.
  decode   one decode step of the sampler's loop (`sampling.fast_decode.decode_step` over the
           packed compute-dtype weights), `--decode-batch` rows with `--cached` filled slots
           in a cache of `--cache-slots` (default: `--cached`, a full cache), the cache
           donated; `--decode-attention pallas` with the attention as one Pallas kernel a
           layer (`sampling.cache_attention`). The step reads the cache up to its filled
           length (in the sampler a traced length; here the bound is static, `read_slots`, so
           the plan shows that read). Ideal bytes accessed: the packed weights + the live KV
           (the `--cached` filled slots) read once + the new KV slot written + the logits.

`--devices D` (> 1) runs on D host devices (`--xla_force_host_platform_device_count`) with the
presets' FSDP mesh (data=1, fsdp=D): the per-device figures of an 8-way sharded 7B, from a
laptop (as MaxText's `train_compile` checks a training configuration it cannot run).
`--gpu h100` (or a GPU target config's path) compiles for that GPU instead, without one
attached (`gpu_plan`: needs JAX's CUDA plugin, no GPU): the figures are then XLA:GPU's plan, with
its GPU fusions, and `--devices D` makes D such GPUs. XLA:CPU fuses less than XLA:GPU and keeps
more temporaries, so the CPU plan is an upper bound of the GPU's. A deviceless compile has no
cost analysis: its bytes accessed are counted kernel by kernel from the compiled HLO
(`hlo_traffic`: each kernel reads its operands and writes its result once, an in-place update
writes only its slice), and it prints no FLOPs.
`--json` prints one JSON object a line per compiled function (keys `name`, `argument_bytes`,
`output_bytes`, `temp_bytes`, `flops`, `bytes_accessed`, `ideal_bytes`, `plan` and the
settings).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
import time
from typing import Optional

from rlrag_jax.bench import HELP_SMOKE, gpu_plan

# Published config.json fields of the models the paper presets train (no download needed).
SHAPES = {
    "qwen2.5-0.5b": dict(model_type="qwen2", vocab_size=151936, hidden_size=896,
                         intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1e6,
                         max_position_embeddings=32768, rms_norm_eps=1e-6),
    "qwen2.5-7b": dict(model_type="qwen2", vocab_size=152064, hidden_size=3584,
                       intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, tie_word_embeddings=False, rope_theta=1e6,
                       max_position_embeddings=32768, rms_norm_eps=1e-6),
    "qwen3-8b": dict(model_type="qwen3", vocab_size=151936, hidden_size=4096,
                     intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, tie_word_embeddings=False,
                     rope_theta=1e6, max_position_embeddings=40960, rms_norm_eps=1e-6),
}
GIB = 2 ** 30
FIELDS = ("argument_bytes", "output_bytes", "temp_bytes", "flops", "bytes_accessed",
          "ideal_bytes")


class ShapeError(ValueError):
  """A --shape that names no known shape, or a config.json that is not a decoder LM."""


def model_config(shape: str, *, vocab: Optional[int] = None, dtype: str = "bfloat16",
                 param_dtype: str = "float32", remat: bool = True, attention_block: int = 512,
                 scan_layers: bool = False,
                 layers: Optional[int] = None, decode_attention: str = "xla",
                 attention: str = "xla", decode_splits: int = 0):
  """A `ModelConfig` from a SHAPES name or an HF config.json path, with the accelerator
  presets' numerics (`config_base.use_hf_model`; `scan_layers` off unless asked, the model's
  default); `vocab` replaces the vocabulary size, `layers` the number of decoder layers."""
  from rlrag_jax.models.config import ModelConfig
  if shape in SHAPES:
    d, source = dict(SHAPES[shape]), f"--shape {shape}"
  else:
    path = pathlib.Path(shape)
    if path.is_dir():
      path = path / "config.json"
    if path.suffix != ".json" or not path.is_file():
      raise ShapeError(f"--shape {shape!r}: not one of {sorted(SHAPES)} and no config.json "
                       "at that path")
    try:
      d = json.loads(path.read_text())
    except json.JSONDecodeError as e:
      raise ShapeError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(d, dict):
      raise ShapeError(f"{path}: a JSON object expected, found {type(d).__name__}")
    source = str(path)
  try:
    cfg = ModelConfig.from_hf_dict(d, source=source)
  except (ValueError, TypeError, KeyError) as e:
    raise ShapeError(f"{e} (a decoder LM's config.json is needed)") from None
  over = dict(dtype=dtype, param_dtype=param_dtype, remat=remat, attention_block=attention_block,
              scan_layers=scan_layers, decode_attention=decode_attention, attention=attention,
              decode_attention_splits=decode_splits)
  if vocab:
    over["vocab_size"] = int(vocab)
  if layers:
    over["num_layers"] = int(layers)
  return cfg.replace(**over)


def _bytes(tree) -> int:
  import jax
  import numpy as np
  return int(sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
                 for x in jax.tree_util.tree_leaves(tree)))


def _row(name: str, compiled, ideal: float, devices: int, **settings) -> dict:
  """One compiled function's figures. Bytes accessed: XLA's cost analysis where the backend
  has one (`bytes_from` 'xla'), else counted from the compiled HLO (`hlo_traffic`, 'hlo';
  the deviceless GPU compile), which prints no FLOPs."""
  mem = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):         # older jax: one dict per computation
    cost = cost[0] if cost else {}
  if cost:
    flops, accessed, source = (float(cost.get("flops", 0.0)),
                               float(cost.get("bytes accessed", 0.0)), "xla")
  else:
    flops, accessed, source = None, None, "hlo"
  traffic = None
  if source == "hlo" or TOP_KERNELS:
    from rlrag_jax.bench import hlo_traffic
    traffic = hlo_traffic.traffic(compiled.as_text())
    accessed = float(traffic.bytes) if accessed is None else accessed
  if TOP_KERNELS:
    print(f"{name}: the {TOP_KERNELS} kernels with the most memory traffic (hlo_traffic, "
          f"{traffic.bytes / 1e9:.1f} GB in all):\n{traffic.top(TOP_KERNELS)}", file=sys.stderr)
  device = compiled.input_shardings[0]
  return dict(name=name, argument_bytes=int(mem.argument_size_in_bytes),
              output_bytes=int(mem.output_size_in_bytes),
              alias_bytes=int(mem.alias_size_in_bytes), temp_bytes=int(mem.temp_size_in_bytes),
              flops=flops, bytes_accessed=accessed, bytes_from=source,
              plan=_plan_name(device), ideal_bytes=float(ideal), devices=devices, **settings)


TOP_KERNELS = 0        # --top: print each compiled function's heaviest kernels to stderr


def _plan_name(shardings) -> str:
  """'cpu' or the device kind the program was compiled for ('NVIDIA H100 80GB HBM3')."""
  import jax
  leaves = jax.tree_util.tree_leaves(shardings)
  dev = next(iter(leaves[0].device_set)) if leaves else None
  return "cpu" if dev is None or dev.platform == "cpu" else str(dev.device_kind)


def _abstract(tree, sharding):
  import jax
  return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


def _timed_compile(lowerable, *args):
  t = time.perf_counter()
  compiled = lowerable.lower(*args).compile()
  return compiled, time.perf_counter() - t


def budget_micro_batch(sequences: int, tokens: int, budget: int, shards: int) -> tuple:
  """(rows of the largest micro-batch, micro-batch count) the planner
  (`rl.packing.plan_micro_batches`) makes of `sequences` rows of `tokens` under `budget`."""
  from rlrag_jax.rl.packing import plan_micro_batches
  plan = plan_micro_batches([0] * sequences, [tokens] * sequences, budget, bucket=tokens,
                            shards=shards)
  return max(m.size for m in plan), len(plan)


def compile_update(cfg, mesh, sequences: int, tokens: int, *, micro_batches: int = 1,
                   logits_chunk: Optional[int] = None, algo: str = "grpo",
                   logits_start: int = 0, tokens_per_micro_batch: int = 0,
                   head_backward: str = "auto") -> list:
  """Rows 'update' (+ 'update_critic' for PPO) and 'logprob' of the trainer's jitted steps;
  with `tokens_per_micro_batch`, the token-budget form (+ 'update_apply')."""
  if tokens_per_micro_batch:
    return _compile_budget_update(cfg, mesh, sequences, tokens, budget=tokens_per_micro_batch,
                                  logits_chunk=logits_chunk, algo=algo,
                                  logits_start=logits_start, head_backward=head_backward)
  import jax
  import jax.numpy as jnp
  from rlrag_jax.models import sharding as shd
  from rlrag_jax.models.decoder import DecoderLM, ValueLM
  from rlrag_jax.rl import optim_state, step_factories
  from rlrag_jax.rl.logprobs import DEFAULT_LOGITS_CHUNK
  chunk = DEFAULT_LOGITS_CHUNK if logits_chunk is None else int(logits_chunk)
  module = DecoderLM(cfg)
  opt = optim_state.make_optimizer(optim_state.OptimizerConfig(lr=1e-6, total_steps=100))
  state = optim_state.abstract_train_state(module, opt, mesh)
  bsh = shd.batch_sharding(mesh)
  i32, f32 = jnp.int32, jnp.float32
  batch = {"input_ids": jax.ShapeDtypeStruct((sequences, tokens), i32),
           "attention_mask": jax.ShapeDtypeStruct((sequences, tokens), i32),
           "loss_mask": jax.ShapeDtypeStruct((sequences, tokens), i32),
           "advantages": jax.ShapeDtypeStruct((sequences,), f32)}
  if algo == "ppo":
    batch["advantages"] = jax.ShapeDtypeStruct((sequences, tokens), f32)
    batch["old_logp"] = jax.ShapeDtypeStruct((sequences, tokens), f32)
  batch["ref_logp"] = jax.ShapeDtypeStruct((sequences, tokens), f32)
  batch = _abstract(batch, bsh)
  loss = step_factories.LossConfig.preset("grpo")
  devices = mesh.devices.size
  settings = dict(attention=cfg.attention, sequences=sequences, tokens=tokens,
                  micro_batches=micro_batches,
                  logits_chunk=chunk, vocab=cfg.vocab_size, logits_start=logits_start,
                  head_backward=head_backward)
  step = step_factories.make_policy_step(module, opt, mesh, loss, micro_batches=micro_batches,
                             logits_chunk=chunk, head_backward=head_backward)
  compiled, secs = _timed_compile(step, state, batch, logits_start)
  params_f32 = sum(int(x.size) for x in jax.tree_util.tree_leaves(state.params)) * 4
  mb_tokens = sequences // micro_batches * tokens
  residual = cfg.num_layers * mb_tokens * cfg.hidden_size * jnp.dtype(cfg.compute_dtype).itemsize
  ideal = (_bytes(state) + _bytes(batch) + params_f32 + residual) / devices
  rows = [_row("update", compiled, ideal, devices, compile_s=secs, **settings)]
  if algo == "ppo":
    vmod = ValueLM(cfg)
    vopt = optim_state.make_optimizer(optim_state.OptimizerConfig(lr=1e-6, total_steps=100))
    vstate = optim_state.abstract_train_state(vmod, vopt, mesh)
    vbatch = {k: batch[k] for k in ("input_ids", "attention_mask", "loss_mask")}
    vbatch["returns"] = batch["ref_logp"]
    vbatch["old_values"] = batch["ref_logp"]
    vstep = step_factories.make_value_step(vmod, vopt, mesh, micro_batches=micro_batches)
    compiled, secs = _timed_compile(vstep, vstate, vbatch, 0)
    ideal = (_bytes(vstate) + _bytes(vbatch) + params_f32 + residual) / devices
    rows.append(_row("update_critic", compiled, ideal, devices, compile_s=secs, **settings))
  fwd = step_factories.make_logprob_fn(module, mesh, micro_batches=micro_batches, logits_chunk=chunk)
  fbatch = {k: batch[k] for k in ("input_ids", "attention_mask")}
  compiled, secs = _timed_compile(fwd, state.params, fbatch, logits_start)
  ideal = (_bytes(state.params) + _bytes(fbatch)) / devices
  rows.append(_row("logprob", compiled, ideal, devices, compile_s=secs, **settings))
  return rows


def _compile_budget_update(cfg, mesh, sequences: int, tokens: int, *, budget: int,
                           logits_chunk: Optional[int], algo: str, logits_start: int,
                           head_backward: str) -> list:
  """`compile_update` for token-budget micro-batches: the accumulate step (per micro-batch),
  the apply step (once per update), the critic's accumulate for PPO, the log-prob forward."""
  import jax
  import jax.numpy as jnp
  from rlrag_jax.models import sharding as shd
  from rlrag_jax.models.decoder import DecoderLM, ValueLM
  from rlrag_jax.rl import optim_state, step_factories
  from rlrag_jax.rl.logprobs import DEFAULT_LOGITS_CHUNK
  chunk = DEFAULT_LOGITS_CHUNK if logits_chunk is None else int(logits_chunk)
  rows, count = budget_micro_batch(sequences, tokens, budget,
                                   mesh.shape["data"] * mesh.shape["fsdp"])
  module = DecoderLM(cfg)
  opt = optim_state.make_optimizer(optim_state.OptimizerConfig(lr=1e-6, total_steps=100))
  state = optim_state.abstract_train_state(module, opt, mesh)
  bsh, rep = shd.batch_sharding(mesh), shd.replicated(mesh)
  i32, f32 = jnp.int32, jnp.float32
  mb = {"input_ids": jax.ShapeDtypeStruct((rows, tokens), i32),
        "attention_mask": jax.ShapeDtypeStruct((rows, tokens), i32),
        "loss_mask": jax.ShapeDtypeStruct((rows, tokens), i32),
        "advantages": jax.ShapeDtypeStruct((rows,), f32)}
  if algo == "ppo":
    mb["advantages"] = jax.ShapeDtypeStruct((rows, tokens), f32)
    mb["old_logp"] = jax.ShapeDtypeStruct((rows, tokens), f32)
  mb["ref_logp"] = jax.ShapeDtypeStruct((rows, tokens), f32)
  mb = _abstract(mb, bsh)
  norms = _abstract({"den": jax.ShapeDtypeStruct((), f32),
                     "tokens": jax.ShapeDtypeStruct((), f32)}, rep)
  scalar = jax.ShapeDtypeStruct((), f32, sharding=rep)
  traced_start = jax.ShapeDtypeStruct((), jnp.int32, sharding=rep)
  devices = mesh.devices.size
  settings = dict(sequences=sequences, tokens=tokens, micro_batches=count, logits_chunk=chunk,
                  vocab=cfg.vocab_size, logits_start=logits_start,
                  tokens_per_micro_batch=budget, micro_rows=rows, head_backward=head_backward)
  params_f32 = sum(int(x.size) for x in jax.tree_util.tree_leaves(state.params)) * 4
  residual = cfg.num_layers * rows * tokens * cfg.hidden_size * \
      jnp.dtype(cfg.compute_dtype).itemsize

  def accumulate_row(name, step, st, batch, start):
    grads = jax.tree_util.tree_map(
        lambda p: jax.ShapeDtypeStruct(p.shape, f32, sharding=p.sharding), st.params)
    sums = _abstract(step.abstract_sums(st.params, batch, start), rep)
    args = (st.params, grads, sums, scalar, batch, norms)
    # the start is traced (one program for any): its value only skips head chunks at run time
    compiled, secs = _timed_compile(step.accumulate, *args, traced_start)
    ideal = (_bytes(args) + params_f32 + residual) / devices
    return _row(name, compiled, ideal, devices, compile_s=secs, **settings), grads, sums

  policy = step_factories.make_policy_step(module, opt, mesh, step_factories.LossConfig.preset("grpo"),
                               logits_chunk=chunk, head_backward=head_backward)
  row, grads, sums = accumulate_row("update", policy, state, mb, logits_start)
  compiled, secs = _timed_compile(policy.apply, state, grads, sums, scalar, norms)
  out = [row, _row("update_apply", compiled, (_bytes(state) + _bytes(grads)) / devices, devices,
                   compile_s=secs, **settings)]
  if algo == "ppo":
    vmod = ValueLM(cfg)
    vopt = optim_state.make_optimizer(optim_state.OptimizerConfig(lr=1e-6, total_steps=100))
    vmb = {k: mb[k] for k in ("input_ids", "attention_mask", "loss_mask")}
    vmb["returns"] = vmb["old_values"] = mb["ref_logp"]
    out.append(accumulate_row("update_critic", step_factories.make_value_step(vmod, vopt, mesh),
                              optim_state.abstract_train_state(vmod, vopt, mesh), vmb, 0)[0])
  fwd = step_factories.make_logprob_fn(module, mesh, logits_chunk=chunk)
  fbatch = {k: mb[k] for k in ("input_ids", "attention_mask")}
  compiled, secs = _timed_compile(fwd.traced, state.params, fbatch, traced_start)
  out.append(_row("logprob", compiled, (_bytes(state.params) + _bytes(fbatch)) / devices,
                  devices, compile_s=secs, **settings))
  return out


def _cache_abstract(cfg, batch: int, length: int, sharding):
  import jax
  from rlrag_jax.models.decoder import init_cache
  return _abstract(jax.eval_shape(lambda: init_cache(cfg, batch, length)), sharding)


def compile_prefill(cfg, mesh, batch: int, prompt: int, cache_len: int, prefix: int = 0) -> dict:
  """Row 'prefill': the sampler's jitted prefill of `batch` prompts of `prompt` tokens into a
  fresh cache of `cache_len` slots, or (`prefix` > 0) onto one already holding `prefix` slots
  (the sampler's prefix reuse: `sampler.prefill` without empty_cache)."""
  import jax
  import jax.numpy as jnp
  from rlrag_jax.models import sharding as shd
  from rlrag_jax.models.decoder import DecoderLM
  from rlrag_jax.sampling import sampler
  rep = shd.replicated(mesh)
  params = _abstract(shd.param_shapes(DecoderLM(cfg)), rep)
  ids = jax.ShapeDtypeStruct((batch, prompt), jnp.int32, sharding=rep)
  cache = _cache_abstract(cfg, batch, cache_len, rep)
  fill = lambda c, p, i, m, k: sampler.prefill.__wrapped__(c, p, i, m, k,
                                                           empty_cache=not prefix)
  compiled, secs = _timed_compile(jax.jit(fill, static_argnums=0, donate_argnums=4),
                                  cfg, params, ids, ids, cache)
  kv_new = 2 * cfg.num_layers * batch * prompt * cfg.num_kv_heads * cfg.head_dim * \
      jnp.dtype(cfg.compute_dtype).itemsize
  ideal = _bytes(params) + _bytes(cache) + kv_new
  return _row("prefill", compiled, ideal, 1, compile_s=secs, sequences=batch, tokens=prompt,
              vocab=cfg.vocab_size, prefix=prefix)


def attention_ideal_bytes(cfg, rows: int, tokens: int) -> float:
  """A fused attention's forward and backward: q, k, v read and the output written; then q, k,
  v, the output and its gradient read and dq, dk, dv written (the mask from positions and the
  [rows, tokens] key mask, the log-sum-exp a float a query: not counted)."""
  import jax.numpy as jnp
  item = jnp.dtype(cfg.compute_dtype).itemsize
  q = rows * tokens * cfg.num_heads * cfg.head_dim * item
  kv = rows * tokens * cfg.num_kv_heads * cfg.head_dim * item
  return float((q + 2 * kv + q) + (q + 2 * kv + 2 * q) + (q + 2 * kv))


def compile_attention(cfg, mesh, rows: int, tokens: int) -> dict:
  """Row 'attention': one layer's attention forward and backward as the update runs it
  (`models.decoder.attend_blocked` with `model.attention_block` > 0, else dense), on `rows`
  sequences of `tokens` under the causal and key-padding mask the model builds."""
  import jax
  import jax.numpy as jnp
  from rlrag_jax.models import decoder
  from rlrag_jax.models import sharding as shd
  rep = shd.replicated(mesh)
  dt = cfg.compute_dtype
  sd = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=rep)
  q = sd((rows, tokens, cfg.num_heads, cfg.head_dim), dt)
  kv = sd((rows, tokens, cfg.num_kv_heads, cfg.head_dim), dt)

  def fwd_bwd(q, k, v, key_mask, g):
    causal = jnp.arange(tokens)[None, :] <= jnp.arange(tokens)[:, None]
    allowed = (causal[None] & key_mask[:, None, :])[:, None]
    if cfg.attention == "pallas":
      from rlrag_jax.models import flash_attention
      attend = lambda q, k, v: flash_attention.attend(q, k, v, key_mask)
    elif cfg.attention_block > 0:
      attend = lambda q, k, v: decoder.attend_blocked(q, k, v, allowed, cfg.attention_block)
    else:
      attend = lambda q, k, v: decoder._attend(q, k, v, allowed)
    out, vjp = jax.vjp(attend, q, k, v)
    return out, vjp(g)

  compiled, secs = _timed_compile(jax.jit(fwd_bwd), q, kv, kv, sd((rows, tokens), jnp.bool_), q)
  return _row("attention", compiled, attention_ideal_bytes(cfg, rows, tokens), 1,
              compile_s=secs, sequences=rows, tokens=tokens, vocab=cfg.vocab_size,
              attention_block=cfg.attention_block, attention=cfg.attention)


def decode_ideal_bytes(cfg, batch: int, cached: int) -> float:
  """Weights in the compute dtype (the embedding once: gathered rows are negligible, the
  untied head once more) + the live KV read (`cached` filled slots, not the whole cache) + one
  new slot written + f32 logits."""
  import jax.numpy as jnp
  item = jnp.dtype(cfg.compute_dtype).itemsize
  weights = cfg.num_params() * item
  kv_read = 2 * cfg.num_layers * batch * cached * cfg.num_kv_heads * cfg.head_dim * item
  kv_write = 2 * cfg.num_layers * batch * cfg.num_kv_heads * cfg.head_dim * item
  return float(weights + kv_read + kv_write + batch * cfg.vocab_size * 4)


def compile_decode(cfg, mesh, batch: int, cached: int, slots: int = 0) -> dict:
  """Row 'decode': one step of the sampler's inner loop on the packed weights, cache donated:
  `cached` filled slots of a cache of `slots` (0: `cached`)."""
  import functools
  import jax
  import jax.numpy as jnp
  from rlrag_jax.models import sharding as shd
  from rlrag_jax.models.decoder import DecoderLM
  from rlrag_jax.sampling import fast_decode
  rep = shd.replicated(mesh)
  params = shd.param_shapes(DecoderLM(cfg))
  packed = _abstract(jax.eval_shape(functools.partial(fast_decode.pack_params, cfg), params), rep)
  slots = slots or cached
  if slots < cached:
    raise ShapeError(f"--cache-slots {slots} is below --cached {cached}: the filled slots must "
                     "fit in the cache")
  cache = _cache_abstract(cfg, batch, slots, rep)
  tokens = jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=rep)
  active = jax.ShapeDtypeStruct((batch,), jnp.bool_, sharding=rep)
  step = jax.jit(functools.partial(fast_decode.decode_step, read_slots=cached),
                 static_argnums=0, donate_argnums=4)
  compiled, secs = _timed_compile(step, cfg, packed, tokens, active, cache)
  return _row("decode", compiled, decode_ideal_bytes(cfg, batch, cached), 1, compile_s=secs,
              sequences=batch, tokens=cached, cache_slots=slots, vocab=cfg.vocab_size,
              decode_attention=cfg.decode_attention,
              decode_splits=cfg.decode_attention_splits)


def run(shape: str, *, sequences: int = 64, tokens: int = 512, micro_batches: int = 1,
        logits_chunk: Optional[int] = None, algo: str = "grpo", vocab: Optional[int] = None,
        decode_batch: int = 256, cached: int = 512, cache_slots: int = 0,
        parts=("update", "prefill", "decode"),
        remat: bool = True, attention_block: int = 512, logits_start: int = 0,
        devices=None, tokens_per_micro_batch: int = 0, layers: Optional[int] = None,
        scan_layers: bool = False, head_backward: str = "auto",
        decode_attention: str = "xla", attention: str = "xla", decode_splits: int = 0,
        prefill_prefix: int = 0) -> list:
  """The rows of every requested part for one shape; the update is FSDP-sharded over
  `devices` (default: every jax device), prefill and decode run on the first."""
  import jax
  from rlrag_jax.models import sharding as shd
  cfg = model_config(shape, vocab=vocab, remat=remat, attention_block=attention_block,
                     layers=layers, scan_layers=scan_layers, decode_attention=decode_attention,
                     attention=attention, decode_splits=decode_splits)
  mesh = shd.make_mesh(data=1, fsdp=-1, tensor=1,
                       devices=jax.devices() if devices is None else devices)
  rows = []
  if "update" in parts:
    rows += compile_update(cfg, mesh, sequences, tokens, micro_batches=micro_batches,
                           logits_chunk=logits_chunk, algo=algo, logits_start=logits_start,
                           tokens_per_micro_batch=tokens_per_micro_batch,
                           head_backward=head_backward)
  one = shd.make_mesh(devices=mesh.devices.flat[:1])
  if "attention" in parts:
    rows.append(compile_attention(cfg, one, max(1, sequences // max(1, micro_batches)), tokens))
  if "prefill" in parts:
    rows.append(compile_prefill(cfg, one, min(sequences, decode_batch), tokens // 2,
                                prefill_prefix + tokens, prefill_prefix))
  if "decode" in parts:
    rows.append(compile_decode(cfg, one, decode_batch, cached, cache_slots))
  for r in rows:
    r["shape"] = shape
    r["scan_layers"] = bool(scan_layers)
    if scan_layers and r["name"] in SCANNED and r["bytes_from"] == "xla":
      # XLA's cost analysis counts a while loop's body once, not once per layer: no figure
      # (hlo_traffic charges a loop body once per trip)
      r["flops"] = r["bytes_accessed"] = None
  return rows


SCANNED = ("update", "update_critic", "logprob")    # rows whose blocks run in a scan


def format_rows(rows: list) -> str:
  head = (f"{'name':<14}{'vocab':>8}{'seqs':>6}{'tokens':>7}{'mb':>4}{'dev':>4}  "
          f"{'args GiB':>9}{'out GiB':>8}{'temp GiB':>9}{'args+temp':>10}{'TFLOP':>8}"
          f"{'GB acc.':>9}{'ideal GB':>9}{'acc/ideal':>10}{'compile s':>10}")
  lines = [head]
  num = lambda v, scale, width: f"{'-':>{width}}" if v is None else f"{v / scale:{width}.2f}"
  for r in rows:
    acc = (None if r["bytes_accessed"] is None or not r["ideal_bytes"]
           else r["bytes_accessed"] / r["ideal_bytes"])
    lines.append(
        f"{r['name']:<14}{r['vocab']:>8}{r['sequences']:>6}{r['tokens']:>7}"
        f"{r.get('micro_batches', 1):>4}{r['devices']:>4}  {r['argument_bytes'] / GIB:9.2f}"
        f"{r['output_bytes'] / GIB:8.2f}{r['temp_bytes'] / GIB:9.2f}"
        f"{(r['argument_bytes'] + r['temp_bytes']) / GIB:10.2f}{num(r['flops'], 1e12, 8)}"
        f"{num(r['bytes_accessed'], 1e9, 9)}{r['ideal_bytes'] / 1e9:9.2f}{num(acc, 1, 10)}"
        f"{r['compile_s']:10.1f}")
  return "\n".join(lines)


# ------------------------------------------------------------------------------------ targets
@dataclasses.dataclass
class Target:
  what: str
  value: float
  limit: float
  unit: str

  @property
  def ok(self) -> bool:
    return self.value <= self.limit

  def line(self) -> str:
    return (f"{'PASS' if self.ok else 'FAIL'}  {self.what}: {self.value:.3f} {self.unit} "
            f"(target <= {self.limit:g})")


def vocab_targets(rows_big: list, rows_small: list, temp_limit_gib: float = 6.0,
                  ratio_limit: float = 1.15) -> list:
  big = next(r for r in rows_big if r["name"] == "update")
  small = next(r for r in rows_small if r["name"] == "update")
  where = f"{big['shape']} update, {big['sequences']} x {big['tokens']} tokens"
  return [Target(f"{where}, vocab {big['vocab']}: temporaries", big["temp_bytes"] / GIB,
                 temp_limit_gib, "GiB"),
          Target(f"{where}: temporaries at vocab {big['vocab']} / at vocab {small['vocab']}",
                 big["temp_bytes"] / max(small["temp_bytes"], 1), ratio_limit, "x")]


def decode_target(rows: list, limit: float = 1.5) -> Target:
  d = next(r for r in rows if r["name"] == "decode")
  return Target(f"{d['shape']} decode step, batch {d['sequences']}, {d['tokens']} cached, "
                f"{d.get('decode_attention', 'xla')} attention: bytes accessed / ideal",
                d["bytes_accessed"] / d["ideal_bytes"], limit, "x")


def per_device_target(rows: list, limit_gib: float = 40.0) -> Target:
  u = next(r for r in rows if r["name"] == "update")
  return Target(f"{u['shape']} update, {u['sequences']} x {u['tokens']} tokens in "
                f"{u['micro_batches']} micro-batches on {u['devices']} devices: arguments + "
                "temporaries per device", (u["argument_bytes"] + u["temp_bytes"]) / GIB,
                limit_gib, "GiB")


def _set_host_devices(n: int) -> None:
  """Must run before jax initialises its backends."""
  if n > 1:
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = (flags + f" --xla_force_host_platform_device_count={n}").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m rlrag_jax.bench.memory", description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--shape", default="qwen2.5-0.5b",
                  help=f"one of {sorted(SHAPES)}, or an HF config.json (or its folder)")
  ap.add_argument("--sequences", type=int, default=64, help="rows of the update batch")
  ap.add_argument("--tokens", type=int, default=512, help="tokens per row")
  ap.add_argument("--micro-batches", type=int, default=1)
  ap.add_argument("--tokens-per-micro-batch", type=int, default=0,
                  help="token-budget micro-batches (rl.tokens_per_micro_batch; 0: off): the "
                  "update row is the accumulate step of the largest micro-batch, plus "
                  "update_apply")
  ap.add_argument("--logits-chunk", type=int, default=None,
                  help="logit elements per chunk (rl.logits_chunk; 0: full logits)")
  ap.add_argument("--logits-start", type=int, default=0,
                  help="first position whose logits the update computes (0: every position)")
  ap.add_argument("--algo", choices=("grpo", "ppo"), default="grpo")
  ap.add_argument("--head-backward", choices=("auto", "fused", "autodiff"), default="auto",
                  help="the chunked LM head's backward pass (rl.head_backward; 'auto': fused "
                  "in bf16, the shapes' compute dtype)")
  ap.add_argument("--vocab", type=int, default=None, help="replace the shape's vocabulary size")
  ap.add_argument("--layers", type=int, default=None,
                  help="replace the shape's decoder layer count: the difference between two "
                  "counts is the per-layer cost, their extrapolation the full model's, at a "
                  "fraction of the compile time")
  ap.add_argument("--decode-batch", type=int, default=256)
  ap.add_argument("--cached", type=int, default=512,
                  help="filled KV-cache slots the decode step reads (the live KV of its ideal)")
  ap.add_argument("--cache-slots", type=int, default=0,
                  help="the decode step's cache size (0: --cached, a full cache); the sampler's "
                  "is prompt + max new tokens")
  ap.add_argument("--prefill-prefix", type=int, default=0,
                  help="cache slots already filled before the prefill (the sampler's prefix "
                  "reuse; 0: a fresh cache)")
  ap.add_argument("--parts", default="update,prefill,decode")
  ap.add_argument("--attention", choices=("xla", "pallas"), default="xla",
                  help="the update's and log-probs' attention (model.attention; 'pallas': "
                  "forward and backward kernels, models.flash_attention)")
  ap.add_argument("--decode-attention", choices=("xla", "pallas"), default="xla",
                  help="the decode step's attention over the cache (model.decode_attention; "
                  "'pallas': one kernel a layer, sampling.cache_attention)")
  ap.add_argument("--decode-splits", type=int, default=0,
                  help="with --decode-attention pallas: the cache's ranges "
                  "(model.decode_attention_splits; 0: auto, 1: one pass)")
  ap.add_argument("--no-remat", action="store_true")
  ap.add_argument("--scan-layers", action="store_true",
                  help="the blocks as one lax.scan over their stacked params "
                  "(model.scan_layers; the paper presets' setting): update and logprob rows "
                  "then have no FLOP or bytes figures (XLA counts a loop body once)")
  ap.add_argument("--attention-block", type=int, default=512,
                  help="key block of the attention (model.attention_block; 0: dense)")
  ap.add_argument("--devices", type=int, default=1,
                  help="devices of the FSDP mesh: host devices, or GPUs with --gpu")
  ap.add_argument("--gpu", default="",
                  help="compile for this GPU, not attached (gpu_plan: 'h100' or a GPU target "
                  "config .txtpb; needs JAX's CUDA plugin): XLA:GPU's plan")
  ap.add_argument("--json", action="store_true", help="one JSON object a line")
  ap.add_argument("--top", type=int, default=0,
                  help="print each compiled function's N kernels with the most memory "
                  "traffic (hlo_traffic) to stderr: where the bytes go")
  ap.add_argument("--targets", action="store_true",
                  help="check the three targets (0.5B vocab independence and temporaries, "
                  "0.5B decode bytes, 7B on 8 devices): PASS / FAIL lines; exit 1 on a FAIL")
  ap.add_argument("--smoke", action="store_true",
                  help=HELP_SMOKE + ": the 0.5B shape cut to 1 layer and a 4,096 vocabulary, "
                  "every part at 2 rows of 64 tokens")
  args = ap.parse_args(argv)
  if args.smoke:
    ap.set_defaults(layers=1, vocab=4096, sequences=2, tokens=64, decode_batch=2, cached=64,
                    parts="update,attention,prefill,decode", attention_block=32)
    args = ap.parse_args(argv)
  global TOP_KERNELS
  TOP_KERNELS = max(0, args.top)
  if args.targets:
    args.devices = max(args.devices, 8)
  if args.gpu:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")   # the CUDA plugin compiles, never runs
  else:
    _set_host_devices(args.devices)
  try:
    devs = _devices(args)
    if args.targets:
      return _targets(args, devs)
    parts = tuple(p for p in args.parts.split(",") if p)
    unknown = set(parts) - {"update", "attention", "prefill", "decode"}
    if unknown:
      ap.error(f"--parts: unknown {sorted(unknown)}; expected update, attention, prefill, "
               "decode")
    rows = run(args.shape, sequences=args.sequences, tokens=args.tokens,
               micro_batches=args.micro_batches, logits_chunk=args.logits_chunk,
               algo=args.algo, vocab=args.vocab, decode_batch=args.decode_batch,
               cached=args.cached, cache_slots=args.cache_slots, parts=parts,
               remat=not args.no_remat,
               attention_block=args.attention_block, logits_start=args.logits_start,
               scan_layers=args.scan_layers,
               tokens_per_micro_batch=args.tokens_per_micro_batch, layers=args.layers,
               devices=devs, head_backward=args.head_backward,
               decode_attention=args.decode_attention, attention=args.attention,
               decode_splits=args.decode_splits, prefill_prefix=args.prefill_prefix)
  except (ShapeError, gpu_plan.GpuPlanError) as e:
    print(f"bench.memory: {e}", file=sys.stderr)
    return 2
  if args.json:
    for r in rows:
      print(json.dumps(r))
  else:
    print(_header(devs))
    print(format_rows(rows))
  return 0


def _devices(args) -> list:
  """The mesh's devices: `--devices` GPUs of `--gpu`'s card (deviceless), else host devices."""
  if args.gpu:
    return list(gpu_plan.devices(args.gpu, args.devices))
  import jax
  if args.devices > 1 and jax.device_count() < args.devices:
    raise SystemExit(f"--devices {args.devices}: jax sees {jax.device_count()} devices "
                     "(set the flag before anything imports jax)")
  return jax.devices()[:args.devices] if args.devices > 1 else jax.devices()


def _header(devs) -> str:
  import jax
  d = devs[0]
  plan = ("XLA:CPU plan" if d.platform == "cpu" else
          f"XLA:GPU plan for {d.device_kind}, compiled without the GPU (bench.gpu_plan)")
  return f"jax {jax.__version__}, {plan}, {len(devs)} device(s); per-device figures"


def _targets(args, devs) -> int:
  print(_header(devs))
  one = dict(parts=("update",), logits_chunk=args.logits_chunk, devices=devs[:1])
  big = run("qwen2.5-0.5b", sequences=64, tokens=512, **one)
  small = run("qwen2.5-0.5b", sequences=64, tokens=512, vocab=32000, **one)
  dec = run("qwen2.5-0.5b", sequences=64, tokens=512, parts=("decode",), decode_batch=256,
            cached=512, devices=devs[:1], decode_attention=args.decode_attention)
  # The 7B as the paper presets train it: scanned blocks (`model.scan_layers`,
  # `config_base.use_hf_model`); the 0.5B rows on one device unrolled, its better setting there.
  seven = run("qwen2.5-7b", sequences=64, tokens=4096, micro_batches=2, parts=("update",),
              logits_chunk=args.logits_chunk, scan_layers=True, devices=devs[:8])
  rows = big + small + dec + seven
  if args.json:
    for r in rows:
      print(json.dumps(r))
  else:
    print(format_rows(rows))
  checks = vocab_targets(big, small) + [decode_target(dec), per_device_target(seven)]
  print()
  for c in checks:
    print(c.line())
  return 0 if all(c.ok for c in checks) else 1


if __name__ == "__main__":
  sys.exit(main())
