"""The model a run trains and the jitted pieces its loops call: SFT update, RL update, log-probs."""
from __future__ import annotations

import logging

import jax
import jax.numpy as jnp

from rlrag_jax import settings as settings_lib
from rlrag_jax.models import DecoderLM, ModelConfig, init_params, load_hf
from rlrag_jax.rl import optim_state, step_factories
from rlrag_jax.settings import MODEL_INITS, RLSettings  # noqa: F401 (MODEL_INITS: model.init)

log = logging.getLogger("rlrag_jax.trainer")

# ------------------------------------------------------------------------------------ model


def _warn_interpreted_kernels(m) -> None:
  """The Pallas attentions are GPU kernels; elsewhere they run in Pallas' interpreter."""
  slow = [k for k, v in (("attention", m.attention), ("decode_attention", m.decode_attention))
          if str(v) == "pallas"]
  if slow and jax.default_backend() != "gpu":
    log.warning("model.%s='pallas' on %s: the Pallas kernels run in Pallas' interpreter there, "
                "correct but very slow; they are made for GPUs", "/".join(slow),
                jax.default_backend())


def build_model(config, tokenizer) -> tuple:
  """(ModelConfig, params) from `config.model`: a fresh small model, or pretrained weights
  (model.init 'hf'): an HF checkpoint directory or a training run directory (its latest
  checkpoint, e.g. a small LM trained on the world that another run starts from)."""
  m = config.model
  _warn_interpreted_kernels(m)
  if m.init == "hf":
    if not m.path:
      raise ValueError("config key 'model.path' is empty but 'model.init' is 'hf'")
    from rlrag_jax.run_dirs import is_run_dir, load_trained
    if is_run_dir(m.path):
      lm = load_trained(m.path)
    else:
      lm = load_hf(m.path, dtype=jnp.dtype(m.dtype).type, param_dtype=m.param_dtype,
                   progress=True)
    return lm.config.replace(remat=bool(m.remat), attention_block=int(m.attention_block),
                             scan_layers=bool(m.scan_layers), attention=str(m.attention),
                             decode_attention=str(m.decode_attention),
                             decode_attention_splits=int(m.decode_attention_splits)), lm.params
  if m.init != "scratch":
    raise ValueError(f"config key 'model.init' is {m.init!r}; expected one of {MODEL_INITS}")
  eos = tokenizer.eos_token_id
  cfg = ModelConfig(
      vocab_size=_round_vocab(len(tokenizer)), hidden_size=m.hidden_size,
      intermediate_size=m.intermediate_size, num_layers=m.num_layers, num_heads=m.num_heads,
      num_kv_heads=m.num_kv_heads, head_dim=m.head_dim,
      max_position_embeddings=m.max_position_embeddings, model_type="llama",
      tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
      eos_token_id=(eos,) if eos is not None else (), pad_token_id=tokenizer.pad_token_id,
      dtype=m.dtype, param_dtype=m.param_dtype, remat=bool(m.remat),
      attention_block=int(m.attention_block), scan_layers=bool(m.scan_layers),
      attention=str(m.attention), decode_attention=str(m.decode_attention),
      decode_attention_splits=int(m.decode_attention_splits))
  params = init_params(DecoderLM(cfg), jax.random.PRNGKey(config.seed))
  return cfg, params


def _round_vocab(n: int, multiple: int = 64) -> int:
  return -(-n // multiple) * multiple


# ------------------------------------------------------------------------------------ steps
def policy_loss_config(rl: RLSettings, **overrides):
  """The policy loss of the `rl` settings (`rl.step_factories.LossConfig`); `overrides` replace
  fields (e.g. beta=0.0)."""
  fields = dict(
      eps_low=rl.clip_eps_low, eps_high=rl.clip_eps_high, dual_clip=rl.dual_clip or None,
      aggregation=rl.aggregation, max_completion_len=rl.max_new_tokens,
      # rl.kl_form 'reward': the KL is in the PPO rewards (learners), not in the loss
      beta=rl.kl_beta if rl.checked_kl_form == "loss" else 0.0,
      kl_estimator=rl.kl_estimator, temperature=rl.temperature,
      entropy_coef=rl.entropy_coef)
  return step_factories.LossConfig(**{**fields, **overrides})


class Steps:
  """The jitted pieces the loop calls, built once: SFT update, RL update, log-prob forward.
  `config`: the run's `rlrag_jax.settings.Settings` (or a config, parsed)."""

  def __init__(self, config, model_cfg: ModelConfig, mesh, sft_total: int, rl_total: int):
    self.module = DecoderLM(model_cfg)
    self.mesh = mesh
    settings = settings_lib.of(config)
    sft, rl = settings.sft, settings.rl
    self.sft_opt = optim_state.make_optimizer(optim_state.OptimizerConfig(
        lr=sft.lr, schedule=sft.lr_schedule, warmup_ratio=sft.warmup_ratio,
        total_steps=max(sft_total, 2), weight_decay=sft.weight_decay, max_grad_norm=1.0))
    self.rl_opt = optim_state.make_optimizer(optim_state.OptimizerConfig(
        lr=rl.lr, schedule=rl.lr_schedule, warmup_ratio=rl.warmup_ratio,
        total_steps=rl.schedule_length(rl_total),
        weight_decay=rl.weight_decay, max_grad_norm=rl.max_grad_norm),
        by_rl_step=rl.schedule_by_rl_step)
    self.loss_cfg = policy_loss_config(rl)
    # With a token budget the host packs the micro-batches (`accumulated`): no equal splits.
    self.sft_step = step_factories.make_sft_step(
        self.module, self.sft_opt, mesh, micro_batches=sft.equal_micro_batches,
        logits_chunk=sft.logits_chunk, head_backward=sft.head_backward)
    self.rl_step = step_factories.make_policy_step(
        self.module, self.rl_opt, mesh, self.loss_cfg, micro_batches=rl.equal_micro_batches,
        logits_chunk=rl.logits_chunk, head_backward=rl.head_backward)
    self.logp = step_factories.make_logprob_fn(
        self.module, mesh, temperature=rl.temperature, micro_batches=rl.equal_micro_batches,
        logits_chunk=rl.logits_chunk)
    self.with_ref = rl.kl_beta > 0        # the KL loss term or reward needs the reference

  def new_state(self, params, stage: str):
    opt = self.sft_opt if stage == "sft" else self.rl_opt
    return optim_state.create_train_state(self.module, opt, self.mesh, params=params)

  def checkpoint_target(self, critic=None):
    """The saved pytree's abstract shape (with shardings), so restores land sharded; `critic`:
    the learner's abstract critic state, for RL-stage checkpoints of a run with a critic."""
    target = {"train": optim_state.abstract_train_state(self.module, self.rl_opt, self.mesh)}
    if self.with_ref:
      target["ref"] = target["train"].params
    if critic is not None:
      target["critic"] = critic
    return target
