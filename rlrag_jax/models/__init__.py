"""Decoder LMs (Llama/Qwen2/Qwen3 family), value heads, and Hugging Face interop."""
from rlrag_jax.models.config import ModelConfig, RopeScaling
from rlrag_jax.models.decoder import (DecoderLM, ValueLM, init_cache, init_params, logical_axes,
                                      value_params_from_policy)
from rlrag_jax.models.lm import LM, encode_prompt, load_hf, save_hf

__all__ = ["ModelConfig", "RopeScaling", "DecoderLM", "ValueLM", "init_cache", "init_params",
           "logical_axes", "value_params_from_policy", "LM", "encode_prompt", "load_hf", "save_hf"]
