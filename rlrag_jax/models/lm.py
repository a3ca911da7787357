"""`LM`: a config, a param pytree and (optionally) a tokenizer, plus the public load/save."""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional, Sequence, Union

import jax
import jax.numpy as jnp

from rlrag_jax.models import hf_io
from rlrag_jax.models.config import ModelConfig
from rlrag_jax.models.decoder import DecoderLM


@functools.partial(jax.jit, static_argnums=0)
def _logits(module: DecoderLM, params, input_ids, attention_mask):
  return module.apply({"params": params}, input_ids, attention_mask)[0]


@dataclasses.dataclass
class LM:
  """A decoder LM: `.config`, `.params` (plain pytree), `.tokenizer` (or None)."""
  config: ModelConfig
  params: Any
  tokenizer: Any = None

  @property
  def module(self) -> DecoderLM:
    return DecoderLM(self.config)

  def logits(self, input_ids, attention_mask=None) -> jax.Array:
    """input_ids [B, T] (left padding allowed) -> logits [B, T, V] float32."""
    ids = jnp.asarray(input_ids, jnp.int32)
    mask = jnp.ones_like(ids, jnp.bool_) if attention_mask is None else jnp.asarray(attention_mask)
    return _logits(self.module, self.params, ids, mask.astype(jnp.bool_))

  def encode(self, text_or_messages: Union[str, Sequence[dict]],
             use_chat_template: bool = True, thinking: bool = False) -> list:
    """Token ids of a prompt; chat messages (or plain text, wrapped as one user turn) go through
    the tokenizer's chat template when it has one (`thinking`: see encode_prompt)."""
    if self.tokenizer is None:
      raise ValueError("this LM has no tokenizer; pass token ids instead")
    return encode_prompt(self.tokenizer, text_or_messages, use_chat_template, thinking)


def template_reads_thinking(tokenizer) -> bool:
  """Whether the tokenizer's chat template reads `enable_thinking` (Qwen3's does; Llama's and
  Qwen2's do not)."""
  return "enable_thinking" in str(getattr(tokenizer, "chat_template", None) or "")


def encode_prompt(tokenizer, text_or_messages, use_chat_template: bool = True,
                  thinking: bool = False) -> list:
  """Token ids of a prompt, through the chat template with the generation prompt when the
  tokenizer has one and `use_chat_template`, else plain text with the tokenizer's special tokens.
  `thinking` reaches a template that reads `enable_thinking` (Qwen3's): False (a direct answer)
  renders its empty `<think>\\n\\n</think>` block after the assistant header, True leaves the
  model to open one; templates without the switch are rendered without it."""
  has_template = getattr(tokenizer, "chat_template", None)
  if use_chat_template and has_template:
    msgs = ([{"role": "user", "content": text_or_messages}]
            if isinstance(text_or_messages, str) else list(text_or_messages))
    kw = {"enable_thinking": bool(thinking)} if template_reads_thinking(tokenizer) else {}
    out = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, **kw)
    if isinstance(out, dict) or hasattr(out, "keys"):
      out = out["input_ids"]
    return list(out)
  if not isinstance(text_or_messages, str):
    text_or_messages = "\n".join(m["content"] for m in text_or_messages)
  return tokenizer(text_or_messages, add_special_tokens=True)["input_ids"]


def load_hf(path, dtype=jnp.float32, shardings: Optional[Any] = None,
            progress: bool = False, param_dtype=None) -> LM:
  """Loads a `transformers` Llama/Qwen2/Qwen3 checkpoint dir (config.json, safetensors, tokenizer).

  `dtype` is the compute dtype; the params are stored in `param_dtype` (default: `dtype`).
  Training wants float32 master params under bfloat16 compute: at lr 3e-6 an Adam step is far
  below bfloat16's spacing near 1 (2^-8) and would round away."""
  cfg = hf_io.config_for_load(path, dtype, param_dtype)
  params = hf_io.load_params(path, cfg, dtype=cfg.params_dtype, shardings=shardings,
                             progress=progress)
  return LM(cfg, params, hf_io.load_tokenizer(path))


def save_hf(lm: LM, out_dir, max_shard_bytes: int = 5 * 2**30) -> None:
  """Exports params + config (+ tokenizer) to a dir `transformers.AutoModelForCausalLM` loads."""
  hf_io.write_config(lm.config, out_dir)
  hf_io.save_params(lm.params, lm.config, out_dir, max_shard_bytes=max_shard_bytes)
  if lm.tokenizer is not None:
    lm.tokenizer.save_pretrained(str(out_dir))
