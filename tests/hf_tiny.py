"""Tiny random Hugging Face checkpoints built with `transformers` + CPU torch, for parity tests.

  path = make_tiny_checkpoint(tmp_path, "qwen2")            # or "llama", "qwen3"
  ref = transformers.AutoModelForCausalLM.from_pretrained(path)
  lm = rlrag_jax.models.load_hf(path)

The tokenizer is the byte-level one from `rlrag_jax.generate` (<pad>=0, <s>=1, </s>=2, then one
token per byte), so string stops and text round-trips can be tested too. Weights use a wider init
than HF's default (std 0.02) so that greedy decoding has clear winners instead of near-ties that
float round-off could flip.
"""
from __future__ import annotations

import pathlib

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, rope_theta=10000.0,
             rms_norm_eps=1e-6, initializer_range=0.15, tie_word_embeddings=False)

# The end-to-end tests' checkpoints: long enough for the presets' prompts, and one layer, since
# XLA compiles each layer of the unrolled stack apart and these tests check plumbing, not depth
# (the parity tests keep SMALL's two layers). One layer instead of two took a paper-preset test
# from 71 s to 54 s.
E2E_HF = dict(max_position_embeddings=4096, num_hidden_layers=1)


def make_tiny_checkpoint(tmp_path, model_type: str = "qwen2", *, seed: int = 0,
                         name: str = None, with_tokenizer: bool = True, **overrides) -> pathlib.Path:
  """Builds, saves (save_pretrained, safetensors) and returns the dir of a tiny random model.

  `overrides` are `transformers` config fields (e.g. tie_word_embeddings=True, vocab_size=...).
  """
  import torch
  import transformers
  from rlrag_jax.generate import byte_level_tokenizer

  tokenizer = byte_level_tokenizer()
  fields = dict(SMALL, vocab_size=len(tokenizer), bos_token_id=1, eos_token_id=2, pad_token_id=0)
  fields.update(overrides)
  if model_type == "qwen2":
    config = transformers.Qwen2Config(**fields)
  elif model_type == "llama":
    config = transformers.LlamaConfig(**fields)
  elif model_type == "qwen3":
    fields.setdefault("head_dim", 16)
    config = transformers.Qwen3Config(**fields)
  else:
    raise ValueError(f"model_type must be 'qwen2', 'qwen3' or 'llama'; got {model_type!r}")
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
  out = pathlib.Path(tmp_path) / (name or f"tiny_{model_type}_{seed}")
  model.save_pretrained(out, safe_serialization=True)
  if with_tokenizer:
    tokenizer.save_pretrained(out)
  return out


def load_reference(path):
  """The `transformers` model of a checkpoint dir, in eval mode, float32."""
  import torch
  import transformers
  return transformers.AutoModelForCausalLM.from_pretrained(
      path, dtype=torch.float32).eval()
