"""Decoder configuration shared by the Flax modules, the HF converter and the sampler.

`ModelConfig` is a frozen dataclass so it can be a static argument of `jax.jit`.
It reads both layouts that published Llama/Qwen2/Qwen3 checkpoints use for RoPE:
`rope_theta` + `rope_scaling` at the top level, and the newer `rope_parameters`.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Optional

import jax.numpy as jnp

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
DTYPES = tuple(_DTYPES)               # the names model.dtype / model.param_dtype may take
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
_QWEN3_DEFAULT_HEAD_DIM = 128            # transformers.Qwen3Config(head_dim=128)


def dtype_of(name_or_dtype) -> Any:
  """'bfloat16' | jnp.bfloat16 -> jnp dtype."""
  if isinstance(name_or_dtype, str):
    if name_or_dtype not in _DTYPES:
      raise ValueError(f"unknown dtype {name_or_dtype!r}; expected one of {sorted(_DTYPES)}")
    return _DTYPES[name_or_dtype]
  return jnp.dtype(name_or_dtype).type


def dtype_name(dtype) -> str:
  return jnp.dtype(dtype).name


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """RoPE scaling: 'default' (none), 'linear' (positions / factor) or 'llama3'."""
  rope_type: str = "default"
  factor: float = 1.0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position_embeddings: int = 8192

  def to_hf(self) -> Optional[dict]:
    if self.rope_type == "default":
      return None
    d = {"rope_type": self.rope_type, "factor": self.factor}
    if self.rope_type == "llama3":
      d.update(low_freq_factor=self.low_freq_factor, high_freq_factor=self.high_freq_factor,
               original_max_position_embeddings=self.original_max_position_embeddings)
    return d


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape and numerics of a Llama/Qwen2/Qwen3-family decoder."""
  vocab_size: int = 32000
  hidden_size: int = 256
  intermediate_size: int = 688
  num_layers: int = 4
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 64
  max_position_embeddings: int = 2048
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10000.0
  rope_scaling: RopeScaling = RopeScaling()
  attention_bias: bool = False          # q/k/v bias (Qwen2: True)
  o_proj_bias: bool = False             # output-projection bias (Llama / Qwen3 with attention_bias)
  qk_norm: bool = False                 # RMSNorm over each head's q and k before RoPE (Qwen3)
  tie_word_embeddings: bool = False
  model_type: str = "llama"
  bos_token_id: Optional[int] = None
  eos_token_id: tuple = ()              # one or more EOS ids
  pad_token_id: Optional[int] = None
  dtype: str = "float32"                # compute dtype
  param_dtype: str = "float32"
  remat: bool = False                   # rematerialise each block in the backward pass
  attention_block: int = 0              # > 0: attention over key blocks of this size with an
                                        # online softmax (no [T, S] score matrix; long contexts)
  scan_layers: bool = False             # the cache-free forward (updates, log-probs) runs
                                        # the blocks as one `lax.scan` over their stacked
                                        # params: one layer compiled, and gathered, at a time
  attention: str = "xla"                # the attention of every multi-token forward
                                        # (updates, log-probs, the sampler's prefills): 'xla'
                                        # (dense or key-blocked, see attention_block) |
                                        # 'pallas' (models.flash_attention)
  decode_attention: str = "xla"         # the sampler's decode-step attention over the KV
                                        # cache: 'xla' | 'pallas' (sampling.cache_attention)
  decode_attention_splits: int = 0      # 'pallas': ranges the cache is split into (0: the
                                        # fewest that give cache_attention.MIN_PROGRAMS)

  @property
  def compute_dtype(self):
    return dtype_of(self.dtype)

  @property
  def params_dtype(self):
    return dtype_of(self.param_dtype)

  def replace(self, **kw) -> "ModelConfig":
    return dataclasses.replace(self, **kw)

  def num_params(self) -> int:
    e, f, h, kv, d, v = (self.hidden_size, self.intermediate_size, self.num_heads,
                         self.num_kv_heads, self.head_dim, self.vocab_size)
    attn = e * h * d + 2 * e * kv * d + h * d * e
    if self.attention_bias:
      attn += h * d + 2 * kv * d
    if self.o_proj_bias:
      attn += e
    if self.qk_norm:
      attn += 2 * d
    layer = attn + 3 * e * f + 2 * e
    return v * e * (1 if self.tie_word_embeddings else 2) + self.num_layers * layer + e

  # ---------------------------------------------------------------- HF config.json
  @classmethod
  def from_hf_dict(cls, d: dict, *, source: str = "config.json", **overrides) -> "ModelConfig":
    """Builds a config from a `transformers` config dict; errors name the file and field."""
    mt = d.get("model_type")
    if mt not in SUPPORTED_MODEL_TYPES:
      raise ValueError(f"{source}: field 'model_type' is {mt!r}; supported: {SUPPORTED_MODEL_TYPES}")
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads"):
      if key not in d:
        raise ValueError(f"{source}: missing required field {key!r}")
    act = d.get("hidden_act", "silu")
    if act != "silu":
      raise ValueError(f"{source}: field 'hidden_act' is {act!r}; only 'silu' (SwiGLU) is supported")
    heads = int(d["num_attention_heads"])
    head_dim = d.get("head_dim")
    if head_dim is None:
      # transformers' own defaults when config.json has no head_dim: Qwen3Config fixes it at
      # 128 whatever hidden_size / heads is; Llama and Qwen2 divide.
      head_dim = _QWEN3_DEFAULT_HEAD_DIM if mt == "qwen3" else d["hidden_size"] // heads
    rope_params = d.get("rope_parameters") or {}
    theta = d.get("rope_theta", rope_params.get("rope_theta", 10000.0))
    scaling = d.get("rope_scaling") or (rope_params if rope_params else None)
    rope = _rope_from_hf(scaling, source)
    eos = d.get("eos_token_id")
    eos = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (int(eos),))
    bias_default = mt == "qwen2"
    if d.get("use_sliding_window"):
      raise ValueError(f"{source}: field 'use_sliding_window' is true; sliding-window attention "
                       "is not supported (every layer attends to the whole context)")
    if d.get("mlp_bias"):
      raise ValueError(f"{source}: field 'mlp_bias' is true; MLP biases are not supported")
    attn_bias = bool(d.get("attention_bias", bias_default))
    cfg = cls(
        vocab_size=int(d["vocab_size"]),
        hidden_size=int(d["hidden_size"]),
        intermediate_size=int(d["intermediate_size"]),
        num_layers=int(d["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(d.get("num_key_value_heads") or heads),
        head_dim=int(head_dim),
        max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta),
        rope_scaling=rope,
        attention_bias=attn_bias,
        o_proj_bias=attn_bias and mt in ("llama", "qwen3"),
        qk_norm=mt == "qwen3",
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        model_type=mt,
        bos_token_id=d.get("bos_token_id"),
        eos_token_id=eos,
        pad_token_id=d.get("pad_token_id"),
    )
    return cfg.replace(**overrides) if overrides else cfg

  @classmethod
  def from_hf_file(cls, path: str, **overrides) -> "ModelConfig":
    with open(path) as f:
      try:
        d = json.load(f)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    return cls.from_hf_dict(d, source=os.fspath(path), **overrides)

  def to_hf_dict(self) -> dict:
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM"}[self.model_type]
    if self.qk_norm != (self.model_type == "qwen3"):
      raise ValueError(f"qk_norm={self.qk_norm} cannot be exported as model_type="
                       f"{self.model_type!r} (only Qwen3 has q/k norms)")
    d = {
        "architectures": [arch],
        "model_type": self.model_type,
        "vocab_size": self.vocab_size,
        "hidden_size": self.hidden_size,
        "intermediate_size": self.intermediate_size,
        "num_hidden_layers": self.num_layers,
        "num_attention_heads": self.num_heads,
        "num_key_value_heads": self.num_kv_heads,
        "head_dim": self.head_dim,
        "max_position_embeddings": self.max_position_embeddings,
        "rms_norm_eps": self.rms_norm_eps,
        "rope_theta": self.rope_theta,
        "rope_scaling": self.rope_scaling.to_hf(),
        "hidden_act": "silu",
        "tie_word_embeddings": self.tie_word_embeddings,
        "bos_token_id": self.bos_token_id,
        "eos_token_id": (list(self.eos_token_id) if len(self.eos_token_id) > 1
                         else (self.eos_token_id[0] if self.eos_token_id else None)),
        "pad_token_id": self.pad_token_id,
        "torch_dtype": self.param_dtype,
    }
    if self.model_type in ("llama", "qwen3"):
      if self.attention_bias != self.o_proj_bias:
        raise ValueError(f"{self.model_type}'s attention_bias covers q/k/v and o_proj together; "
                         f"this config has attention_bias={self.attention_bias}, "
                         f"o_proj_bias={self.o_proj_bias}")
      d["attention_bias"] = self.attention_bias
      if self.model_type == "llama":
        d["mlp_bias"] = False
      else:
        d["use_sliding_window"] = False
    elif not self.attention_bias or self.o_proj_bias:
      raise ValueError("Qwen2 checkpoints carry q/k/v biases and no o_proj bias; this config "
                       "cannot be exported as model_type='qwen2' (use model_type='llama')")
    return d


def _rope_from_hf(scaling: Optional[dict], source: str) -> RopeScaling:
  if not scaling:
    return RopeScaling()
  rtype = scaling.get("rope_type", scaling.get("type", "default"))
  if rtype not in SUPPORTED_ROPE_TYPES:
    raise ValueError(f"{source}: field 'rope_scaling.rope_type' is {rtype!r}; supported: "
                     f"{SUPPORTED_ROPE_TYPES}")
  if rtype == "default":
    return RopeScaling()
  return RopeScaling(
      rope_type=rtype,
      factor=float(scaling.get("factor", 1.0)),
      low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
      high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
      original_max_position_embeddings=int(scaling.get("original_max_position_embeddings", 8192)),
  )
