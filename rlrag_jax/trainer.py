"""The shared training pipeline over any `Task`: optional SFT warm-up, then RL, then evaluation.

Data flows one way: task data -> rollout (sampling + environment + rewards) -> rl (loss, update)
-> checkpoint. The pipeline knows nothing of any one method; `config.method` names the task.

Steps are counted globally: SFT steps 1..S, then RL steps S+1..S+R. Every step's randomness is
`fold_in(seed_key, step)`, and the data iterators' positions are checkpointed, so a run resumed
from a checkpoint repeats exactly the steps an uninterrupted run would have taken.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import pathlib
import time
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from rlrag_jax import evaluation, runlog
from rlrag_jax.data.pipeline import BatchIterator
from rlrag_jax.models import DecoderLM, LM, ModelConfig, hf_io, init_params, load_hf, save_hf
from rlrag_jax.rollout.batch import logits_start, pack
from rlrag_jax.training import aux_models, collection, compiles, learners
from rlrag_jax.rollout.policy import Policy
from rlrag_jax.tasks import get_task

log = logging.getLogger("rlrag_jax.trainer")


# ------------------------------------------------------------------------------------ model
def build_model(config, tokenizer) -> tuple:
  """(ModelConfig, params) from `config.model`: a fresh small model or an HF checkpoint."""
  m = config.model
  if m.init == "hf":
    if not m.path:
      raise ValueError("config key 'model.path' is empty but 'model.init' is 'hf'")
    lm = load_hf(m.path, dtype=jnp.dtype(m.dtype).type, param_dtype=m.param_dtype,
                 progress=True)
    return lm.config.replace(remat=bool(m.remat),
                             attention_block=int(m.attention_block)), lm.params
  if m.init != "scratch":
    raise ValueError(f"config key 'model.init' is {m.init!r}; expected 'scratch' or 'hf'")
  eos = tokenizer.eos_token_id
  cfg = ModelConfig(
      vocab_size=_round_vocab(len(tokenizer)), hidden_size=m.hidden_size,
      intermediate_size=m.intermediate_size, num_layers=m.num_layers, num_heads=m.num_heads,
      num_kv_heads=m.num_kv_heads, head_dim=m.head_dim,
      max_position_embeddings=m.max_position_embeddings, model_type="llama",
      tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
      eos_token_id=(eos,) if eos is not None else (), pad_token_id=tokenizer.pad_token_id,
      dtype=m.dtype, param_dtype=m.param_dtype, remat=bool(m.remat),
      attention_block=int(m.attention_block))
  params = init_params(DecoderLM(cfg), jax.random.PRNGKey(config.seed))
  return cfg, params


def _round_vocab(n: int, multiple: int = 64) -> int:
  return -(-n // multiple) * multiple


# ------------------------------------------------------------------------------------ steps
class Steps:
  """The jitted pieces the loop calls, built once: SFT update, RL update, log-prob forward."""

  def __init__(self, config, model_cfg: ModelConfig, mesh, sft_total: int, rl_total: int):
    from rlrag_jax.rl import train_step as ts
    self.ts = ts
    self.module = DecoderLM(model_cfg)
    self.mesh = mesh
    rl = config.rl
    self.sft_opt = ts.make_optimizer(ts.OptimizerConfig(
        lr=config.sft.lr, schedule=config.sft.lr_schedule, warmup_ratio=config.sft.warmup_ratio,
        total_steps=max(sft_total, 2),
        weight_decay=config.sft.weight_decay, max_grad_norm=1.0))
    self.rl_opt = ts.make_optimizer(ts.OptimizerConfig(
        lr=rl.lr, schedule=rl.lr_schedule, warmup_ratio=rl.warmup_ratio,
        total_steps=max(rl_total * learners.updates_per_step(rl), 2),
        weight_decay=rl.weight_decay, max_grad_norm=rl.max_grad_norm))
    self.loss_cfg = ts.LossConfig(
        eps_low=rl.clip_eps_low, eps_high=rl.clip_eps_high, dual_clip=rl.dual_clip or None,
        aggregation=rl.aggregation, max_completion_len=rl.max_new_tokens, beta=rl.kl_beta,
        kl_estimator=rl.kl_estimator, temperature=rl.temperature)
    self.sft_step = ts.make_sft_step(self.module, self.sft_opt, mesh)
    self.rl_step = ts.make_policy_step(self.module, self.rl_opt, mesh, self.loss_cfg,
                                       micro_batches=rl.micro_batches)
    self.logp = ts.make_logprob_fn(self.module, mesh, temperature=rl.temperature,
                                   micro_batches=rl.micro_batches)
    self.with_ref = rl.kl_beta > 0

  def new_state(self, params, stage: str):
    opt = self.sft_opt if stage == "sft" else self.rl_opt
    return self.ts.create_train_state(self.module, opt, self.mesh, params=params)

  def checkpoint_target(self, critic=None):
    """The saved pytree's abstract shape (with shardings), so restores land sharded; `critic`:
    the learner's abstract critic state, for RL-stage checkpoints of a run with a critic."""
    target = {"train": self.ts.abstract_train_state(self.module, self.rl_opt, self.mesh)}
    if self.with_ref:
      target["ref"] = target["train"].params
    if critic is not None:
      target["critic"] = critic
    return target


# ------------------------------------------------------------------------------------ run
@dataclasses.dataclass
class RunResult:
  workdir: pathlib.Path
  before: Optional[dict]
  after: Optional[dict]
  model_config: ModelConfig
  params: Any


def run(config, *, resume: bool = False, progress: bool = True,
        stop_after: Optional[int] = None) -> Optional[RunResult]:
  """Trains as `config` says. `stop_after=k` abandons the run right after global step k, without
  any final save (what a killed process leaves behind: checkpoints up to the last interval)."""
  from rlrag_jax.checkpoint import CheckpointManager
  from rlrag_jax.models import sharding

  if config.distributed.initialize:
    sharding.maybe_initialize_distributed(
        coordinator_address=config.distributed.coordinator_address or None,
        num_processes=config.distributed.num_processes or None,
        process_id=None if config.distributed.process_id < 0 else config.distributed.process_id)
  workdir = pathlib.Path(config.workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))
  task = get_task(config.method, config)
  tok = task.tokenizer
  model_cfg, params = build_model(config, tok)
  hf_io.write_config(model_cfg, workdir / "model")          # what export/evaluate rebuild from
  tok.save_pretrained(str(workdir / "model"))
  log.info("model: %s params, %d train / %d eval examples", f"{model_cfg.num_params():,}",
           len(task.train), len(task.eval))
  mesh = sharding.make_mesh(**dict(config.mesh))
  aux_models.bind(task, aux_models.load(config.get("models"), mesh))
  sft_total, rl_total = int(config.sft.steps), int(config.rl.steps)
  steps = Steps(config, model_cfg, mesh, sft_total, rl_total)
  learner = learners.make_learner(config, steps, mesh, model_cfg,
                                  tok.pad_token_id if tok.pad_token_id is not None else 0)
  ckpt = CheckpointManager(workdir / "checkpoints", max_to_keep=config.checkpoint.keep)
  rlog = runlog.RunLog(workdir)
  base_key = jax.random.PRNGKey(config.seed)
  eos = tuple(model_cfg.eos_token_id)
  pad = tok.pad_token_id if tok.pad_token_id is not None else 0
  policy = Policy(model_cfg, None, temperature=config.rl.temperature, top_k=config.rl.top_k,
                  top_p=config.rl.top_p, max_new_tokens=config.rl.max_new_tokens, eos_ids=eos,
                  pad_id=pad)
  eval_policy = dataclasses.replace(policy, max_new_tokens=config.eval.max_new_tokens)
  eval_examples = list(task.eval)[: config.eval.num_examples]

  sft_iter, rl_iter = stage_iterators(task.train, config, sft_items=sft_samples(task, config))

  # ---- resume
  step, stage, state, ref_params, before = 0, "sft" if sft_total > 0 else "rl", None, None, None
  critic = None          # the learner's critic TrainState (PPO), made when RL starts
  if resume and ckpt.latest_step() is not None:
    with_critic = learner.has_critic and ckpt.read_meta()["stage"] == "rl"
    restored = ckpt.restore_latest(target=steps.checkpoint_target(
        learner.abstract_critic() if with_critic else None))
    step, stage = restored.step, restored.meta["stage"]
    for it, name in ((sft_iter, "sft"), (rl_iter, "rl")):
      if it is not None and restored.data_position.get(name) is not None:
        it.load_state_dict(restored.data_position[name])
    before = restored.meta.get("before")
    if restored.data_position.get("task") is not None:
      task.load_state_dict(restored.data_position["task"])
    state = restored.state["train"]
    if stage == "rl":
      ref_params = restored.state.get("ref")
      critic = restored.state.get("critic")
    rlog.truncate_after(step)
    log.info("resumed from step %d (%s stage)", step, stage)
  elif resume:
    log.info("--resume: no checkpoint under %s, starting fresh", ckpt.directory)
  if state is None:
    state = steps.new_state(params, stage)
  del params

  def save(step_, stage_):
    tree = {"train": state}
    if steps.with_ref:
      tree["ref"] = ref_params if ref_params is not None else state.params
    if critic is not None:
      tree["critic"] = critic
    ckpt.save(step_, tree, rng=base_key, config=config.to_json_best_effort(),
              data_position={"sft": sft_iter and sft_iter.state_dict(),
                             "rl": rl_iter and rl_iter.state_dict(),
                             # a task's own growing state (e.g. a training pool built from its
                             # rollouts), JSON, through optional state_dict / load_state_dict
                             "task": task.state_dict() if hasattr(task, "state_dict") else None},
              meta={"stage": stage_, "before": before}, force=True)

  bar = _progress(sft_total + rl_total, step, progress)
  t_start = time.time()
  compile_counter = compiles.CompileCounter()     # compile/count and compile/seconds per step

  # ---- SFT warm-up
  while stage == "sft" and step < sft_total:
    step += 1
    exs = next(sft_iter)
    if hasattr(task, "sft_samples"):         # items are already (prompt, target, mask) samples
      prompts, targets, masks = (list(x) for x in zip(*exs))
      masks = [m if m is not None else [1] * len(t) for m, t in zip(masks, targets)]
    else:
      prompts = [task.prompt_ids(ex) for ex in exs]
      targets = [task.sft_target_ids(ex) for ex in exs]
      masks = ([task.sft_loss_mask(ex) for ex in exs] if hasattr(task, "sft_loss_mask")
               else None)      # optional: 0 on target tokens the environment wrote
    batch = pack(prompts, targets, masks, pad_id=pad, max_len=config.sft.max_len,
                 bucket=config.sft.pack_bucket, prompt_loss=config.sft.get("prompt_loss", 0.0))
    start = logits_start(batch["loss_mask"], config.sft.pack_bucket)
    state, m = steps.sft_step(state, sharding.shard_batch(batch, mesh), start)
    m = {**m, **compile_counter.take()}
    _log_step(rlog, step, "sft", m, config.log_every, bar)
    if config.checkpoint.every and step % config.checkpoint.every == 0:
      save(step, "sft")
    if stop_after is not None and step >= stop_after:
      ckpt.close()
      compile_counter.close()
      return None

  # ---- switch to RL: the warm-up policy is the reference and the "before" baseline
  if stage == "sft":
    stage = "rl"
    if rl_total > 0:          # an SFT-only run is evaluated once, at the end
      before = _evaluate(task, eval_policy.with_params(state.params), eval_examples, config,
                         "before RL")
      rlog.write(step, "eval_before", before["all"])
    state = steps.new_state(state.params, "rl")
  if ref_params is None and steps.with_ref:
    ref_params = jax.tree_util.tree_map(jnp.copy, state.params)
  if critic is None and learner.has_critic and rl_total > 0:
    critic = learner.init_critic(state.params, jax.random.fold_in(base_key, 0))
  if before is None and rl_total > 0:
    before = _evaluate(task, eval_policy.with_params(state.params), eval_examples, config,
                       "before RL")
    rlog.write(step, "eval_before", before["all"])

  # ---- RL
  while step < sft_total + rl_total:
    step += 1
    key = jax.random.fold_in(base_key, step)
    t0 = time.time()
    episodes, scores, fill = collection.collect(task, policy.with_params(state.params), rl_iter,
                                                key,
                                      config, step)
    rollout_s = time.time() - t0
    state, critic, m = learner.update(state, critic, episodes, scores, ref_params,
                                      jax.random.fold_in(key, 0))
    for comp in scores[0]:
      m[f"reward/{comp}"] = float(np.mean([s[comp] for s in scores]))
    m["completion_len"] = float(np.mean([sum(e.loss_mask) for e in episodes]))
    m["rollout_s"] = rollout_s
    m["step_s"] = time.time() - t0
    m.update({f"dynamic/{k}": v for k, v in fill.items()})
    m.update(compile_counter.take())
    _log_step(rlog, step, "rl", m, config.log_every, bar)
    if (config.eval.every and (step - sft_total) % config.eval.every == 0
        and step < sft_total + rl_total):        # the last step gets the "after RL" eval
      mid = _evaluate(task, eval_policy.with_params(state.params), eval_examples, config, "eval")
      rlog.write(step, "eval", mid["all"])
      # Per-example rows of this evaluation too (paired comparisons against a mid-run point,
      # e.g. the end of a reward stage): eval_rows_rl<k>.json, k = RL steps done.
      (workdir / f"eval_rows_rl{step - sft_total}.json").write_text(json.dumps(
          {"all": mid["all"], "rows": _slim(mid["rows"])}))
    if config.checkpoint.every and step % config.checkpoint.every == 0:
      save(step, "rl")
    if stop_after is not None and step >= stop_after:
      ckpt.close()
      compile_counter.close()
      return None
  if bar is not None:
    bar.close()
  if config.checkpoint.every and ckpt.latest_step() != step:
    save(step, "rl")
  ckpt.close()
  compile_counter.close()
  log.info("XLA compiles over the run: %d (%.1f s)", compile_counter.count,
           compile_counter.seconds)

  after = _evaluate(task, eval_policy.with_params(state.params), eval_examples, config, "after RL")
  rlog.write(step, "eval_after", after["all"])
  _report(workdir, rlog, before, after, time.time() - t_start)
  if hasattr(task, "report"):
    task.report(workdir, rlog)
  if config.export_hf:
    save_hf(LM(model_cfg, jax.device_get(state.params), tok), workdir / "hf")
  rlog.close()
  return RunResult(workdir, before, after, model_cfg, state.params)


# ------------------------------------------------------------------------------------ helpers
def sft_samples(task, config) -> Optional[list]:
  """With the optional `task.sft_samples(example) -> [(prompt_ids, target_ids, loss_mask or
  None), ...]` hook (several SFT samples per example, e.g. one per agent role or turn), the
  flattened samples of every training example; the SFT stage then batches samples, not
  examples. None without the hook or when SFT does not run."""
  if not hasattr(task, "sft_samples") or int(config.sft.steps) <= 0:
    return None
  out = []
  for ex in task.train:
    for i, sample in enumerate(task.sft_samples(ex)):
      prompt, target, mask = sample
      if mask is not None and len(mask) != len(target):
        raise ValueError(f"{type(task).__name__}.sft_samples: example "
                         f"{getattr(ex, 'id', ex)!r} sample {i}: loss mask has {len(mask)} "
                         f"entries for {len(target)} target tokens")
      out.append((list(prompt), list(target), None if mask is None else list(mask)))
  return out


def stage_iterators(train, config, sft_items=None) -> tuple[Optional[BatchIterator],
                                                             Optional[BatchIterator]]:
  """(SFT, RL) batch iterators over the training examples (SFT: over `sft_items` when given,
  see `sft_samples`), each built only when its stage runs (steps > 0; else None). A training
  set smaller than a stage's batch is an error naming that stage and its batch key; a stage
  that does not run asks nothing of the data."""
  out = []
  for stage, batch_key, seed in (("sft", "batch_size", config.seed),
                                 ("rl", "prompts_per_step", config.seed + 1)):
    section = config[stage]
    if int(section.steps) <= 0:
      out.append(None)
      continue
    items = sft_items if stage == "sft" and sft_items is not None else train
    batch = int(section[batch_key])
    what = "SFT samples" if items is sft_items else "training examples"
    if len(items) < batch:
      raise ValueError(
          f"{stage} stage: {len(items)} {what}, fewer than one batch "
          f"(config key '{stage}.{batch_key}' = {batch}); lower it, add data, or set "
          f"'{stage}.steps=0' to skip the stage")
    out.append(BatchIterator(items, batch_size=batch, seed=seed))
  return tuple(out)


def _evaluate(task, policy, examples, config, desc):
  return evaluation.evaluate(task, policy, examples, batch_size=config.eval.batch_size,
                             seed=config.seed, desc=desc)


def _progress(total, initial, enabled):
  if not enabled:
    return None
  from tqdm.auto import tqdm
  return tqdm(total=total, initial=initial, desc="train", unit="step", dynamic_ncols=True)


def _log_step(rlog, step, stage, m, every, bar):
  m = {k: float(v) for k, v in m.items()}
  if not math.isfinite(m.get("loss", 0.0)) or m.get("skipped", 0.0):
    log.warning("step %d (%s): non-finite loss or gradient, update skipped", step, stage)
  rlog.write(step, stage, m)
  if bar is not None:
    bar.update(1)
    if step % max(every, 1) == 0:
      shown = {k: m[k] for k in ("loss", "reward/total", "reward/format", "kl") if k in m}
      bar.set_postfix({stage: " ".join(f"{k.split('/')[-1]}={v:.3f}" for k, v in shown.items())})


def _report(workdir, rlog, before, after, seconds):
  keys = [k for k in (after or {}).get("all", {}) if k != "n"]
  rows = []
  if before:
    rows.append({"checkpoint": "warm-up (before RL)", **before["all"]})
  rows.append({"checkpoint": "after RL", **after["all"]})
  table = runlog.format_table(rows, ["checkpoint"] + keys + ["n"], title="Held-out evaluation")
  hop_rows = [{"checkpoint": "after RL", "split": k, **v} for k, v in after.items()
              if k.startswith(("hops=", "dataset="))]
  if hop_rows:
    table += "\n\n" + runlog.format_table(hop_rows, ["split"] + keys + ["n"],
                                          title="By hops and dataset")
  table += f"\n\nwall time: {seconds / 60:.1f} min"
  (workdir / "eval_table.txt").write_text(table + "\n")
  (workdir / "eval_summary.json").write_text(json.dumps(
      {"before": before and before["all"], "after": after["all"],
       "after_by_hops": {k: v for k, v in after.items() if k.startswith("hops=")},
       "after_by_dataset": {k: v for k, v in after.items() if k.startswith("dataset=")},
       "minutes": seconds / 60}, indent=2))
  # Per-example results (for paired comparisons across runs, e.g. experiments.seeds).
  (workdir / "eval_rows.json").write_text(json.dumps(
      {"before": _slim(before["rows"]) if before else [], "after": _slim(after["rows"])}))
  rl_rows = rlog.rows("rl")
  reward_keys = sorted({k for r in rl_rows for k in r if k.startswith("reward/")},
                       key=lambda k: (k != "reward/total", k))
  runlog.plot_curves(rl_rows, reward_keys + ["kl", "grad_norm", "loss", "completion_len"],
                     workdir / "rl_curves.png", title="RL")
  sft_rows = rlog.rows("sft")
  runlog.plot_curves(sft_rows, ["loss"], workdir / "sft_curves.png", title="SFT")
  print(table)


def _slim(rows) -> list:
  return [{k: v for k, v in r.items() if k != "completion"} for r in rows]


def load_trained(path, step: Optional[int] = None) -> LM:
  """An `LM` from a run directory (its latest or given checkpoint) or from an HF checkpoint dir.

  A run directory is what `run` writes: `model/` (config.json + tokenizer) and `checkpoints/`.
  """
  from rlrag_jax.checkpoint import CheckpointManager
  p = pathlib.Path(path).expanduser()
  if p.name == "checkpoints" and (p.parent / "model").is_dir():
    p = p.parent
  if (p / "checkpoints").is_dir() and (p / "model" / "config.json").exists():
    cfg = ModelConfig.from_hf_file(p / "model" / "config.json")
    mgr = CheckpointManager(p / "checkpoints", max_to_keep=None)
    if mgr.latest_step() is None:
      raise FileNotFoundError(f"{p / 'checkpoints'}: no checkpoint saved yet")
    restored = mgr.restore(step=step)
    mgr.close()
    train = restored.state["train"]
    params = train["params"] if isinstance(train, dict) else train.params
    return LM(cfg, params, hf_io.load_tokenizer(p / "model"))
  if (p / "config.json").exists():
    return load_hf(p)
  raise FileNotFoundError(f"{p}: neither a training run directory (model/ + checkpoints/) nor a "
                          "Hugging Face checkpoint directory (config.json)")
