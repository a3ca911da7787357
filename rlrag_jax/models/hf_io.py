"""Hugging Face checkpoint <-> param pytree, table-driven and streaming (no torch at run time).

Each row of `_TABLE` names an HF tensor (a regex), our param path, and the reshape between the
two. Loading opens the safetensors files lazily and converts one tensor at a time straight onto the
device (optionally with a target sharding), so host RAM holds about one tensor, not the model.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open

from rlrag_jax.models.config import ModelConfig, dtype_name, dtype_of

_L = r"model\.layers\.(\d+)\."


def _rows(cfg: ModelConfig):
  """(hf regex, our path template, hf->ours, ours->hf)."""
  e, h, k, d = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  t = lambda w: w.T
  ident = lambda w: w
  heads_in = lambda n: (lambda w: w.T.reshape(e, n, d), lambda w: w.reshape(e, n * d).T)
  heads_bias = lambda n: (lambda w: w.reshape(n, d), lambda w: w.reshape(n * d))
  rows = [
      (r"model\.embed_tokens\.weight", "model/embed_tokens/embedding", ident, ident),
      (r"model\.norm\.weight", "model/norm/weight", ident, ident),
      (_L + r"input_layernorm\.weight", "model/layers_{}/input_layernorm/weight", ident, ident),
      (_L + r"post_attention_layernorm\.weight", "model/layers_{}/post_attention_layernorm/weight",
       ident, ident),
      (_L + r"self_attn\.q_proj\.weight", "model/layers_{}/self_attn/q_proj/kernel", *heads_in(h)),
      (_L + r"self_attn\.k_proj\.weight", "model/layers_{}/self_attn/k_proj/kernel", *heads_in(k)),
      (_L + r"self_attn\.v_proj\.weight", "model/layers_{}/self_attn/v_proj/kernel", *heads_in(k)),
      (_L + r"self_attn\.q_proj\.bias", "model/layers_{}/self_attn/q_proj/bias", *heads_bias(h)),
      (_L + r"self_attn\.k_proj\.bias", "model/layers_{}/self_attn/k_proj/bias", *heads_bias(k)),
      (_L + r"self_attn\.v_proj\.bias", "model/layers_{}/self_attn/v_proj/bias", *heads_bias(k)),
      (_L + r"self_attn\.o_proj\.weight", "model/layers_{}/self_attn/o_proj/kernel",
       lambda w: w.T.reshape(h, d, e), lambda w: w.reshape(h * d, e).T),
      (_L + r"self_attn\.o_proj\.bias", "model/layers_{}/self_attn/o_proj/bias", ident, ident),
      (_L + r"self_attn\.q_norm\.weight", "model/layers_{}/self_attn/q_norm/weight", ident, ident),
      (_L + r"self_attn\.k_norm\.weight", "model/layers_{}/self_attn/k_norm/weight", ident, ident),
      (_L + r"mlp\.gate_proj\.weight", "model/layers_{}/mlp/gate_proj/kernel", t, t),
      (_L + r"mlp\.up_proj\.weight", "model/layers_{}/mlp/up_proj/kernel", t, t),
      (_L + r"mlp\.down_proj\.weight", "model/layers_{}/mlp/down_proj/kernel", t, t),
  ]
  if not cfg.tie_word_embeddings:
    rows.append((r"lm_head\.weight", "lm_head/kernel", t, t))
  return [(re.compile(rx + "$"), path, fwd, bwd) for rx, path, fwd, bwd in rows]


_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")


def _set(tree: dict, path: str, value):
  *parents, leaf = path.split("/")
  for p in parents:
    tree = tree.setdefault(p, {})
  tree[leaf] = value


def _get(tree: dict, path: str):
  for p in path.split("/"):
    tree = tree[p]
  return tree


def _has_tensor(cfg: ModelConfig, path: str) -> bool:
  if path.endswith(("q_norm/weight", "k_norm/weight")):
    return cfg.qk_norm
  if path.endswith("o_proj/bias"):
    return cfg.o_proj_bias
  if path.endswith("bias"):
    return cfg.attention_bias
  return True


def _expected_paths(cfg: ModelConfig) -> set:
  out = set()
  for rx, path, _, _ in _rows(cfg):
    if "{}" in path:
      if not _has_tensor(cfg, path):
        continue
      out.update(path.format(i) for i in range(cfg.num_layers))
    else:
      out.add(path)
  return out


def _weight_files(path: pathlib.Path) -> list:
  index = path / "model.safetensors.index.json"
  if index.exists():
    try:
      weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError) as e:
      raise ValueError(f"{index}: not a safetensors index with a 'weight_map' field ({e})") from None
    files = sorted(set(weight_map.values()))
    missing = [f for f in files if not (path / f).exists()]
    if missing:
      raise FileNotFoundError(f"{index}: names shard(s) that do not exist: {missing}")
    return [path / f for f in files]
  single = path / "model.safetensors"
  if single.exists():
    return [single]
  files = sorted(path.glob("*.safetensors"))
  if files:
    return files
  if list(path.glob("*.bin")) or list(path.glob("*.pt")):
    raise ValueError(f"{path}: only PyTorch *.bin weights found; convert them to safetensors "
                     "(transformers: model.save_pretrained(dir, safe_serialization=True))")
  raise FileNotFoundError(f"{path}: no *.safetensors weights found (is this a checkpoint dir?)")


def check_checkpoint_dir(path) -> pathlib.Path:
  """Raises a clear error unless `path` is a directory with config.json."""
  p = pathlib.Path(path).expanduser()
  if not p.exists():
    raise FileNotFoundError(f"checkpoint directory {p} does not exist")
  if not p.is_dir():
    raise NotADirectoryError(f"{p} is not a directory (expected a Hugging Face checkpoint dir)")
  if not (p / "config.json").exists():
    raise FileNotFoundError(f"{p}: no config.json, so this is not a Hugging Face checkpoint dir")
  return p


def load_params(path, cfg: ModelConfig, dtype=jnp.float32,
                shardings: Optional[Any] = None, progress: bool = False) -> dict:
  """Streams safetensors tensors into our param pytree (cast to `dtype`, placed per `shardings`)."""
  p = pathlib.Path(path)
  rows = _rows(cfg)
  params: dict = {}
  seen = set()
  files = _weight_files(p)
  it = files
  if progress and len(files) > 1:
    from tqdm.auto import tqdm
    it = tqdm(files, desc="loading shards", unit="file")
  for f in it:
    with safe_open(os.fspath(f), framework="flax") as sf:
      for name in sf.keys():
        if _IGNORED.match(name):
          continue
        if cfg.tie_word_embeddings and name == "lm_head.weight":
          continue
        for rx, tmpl, fwd, _ in rows:
          m = rx.match(name)
          if m:
            ours = tmpl.format(*m.groups())
            break
        else:
          raise ValueError(f"{f}: tensor {name!r} has no mapping for model_type "
                           f"{cfg.model_type!r} (unsupported architecture variant?)")
        w = fwd(sf.get_tensor(name)).astype(dtype)
        if shardings is not None:
          w = jax.device_put(w, _get(shardings, ours))
        _set(params, ours, w)
        seen.add(ours)
  missing = _expected_paths(cfg) - seen
  if missing:
    raise ValueError(f"{p}: checkpoint lacks {len(missing)} tensors, e.g. {sorted(missing)[:3]}")
  return params


def load_tokenizer(path):
  """`transformers.AutoTokenizer` from the local dir, or None when it has no tokenizer files."""
  p = pathlib.Path(path)
  names = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
  if not any((p / n).exists() for n in names):
    return None
  import transformers
  return transformers.AutoTokenizer.from_pretrained(os.fspath(p), local_files_only=True)


def _tensor_bytes(x) -> int:
  return int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize


def save_params(params: dict, cfg: ModelConfig, out_dir, max_shard_bytes: int = 5 * 2**30):
  """Writes model.safetensors (or shards + index) in HF names and layout."""
  from safetensors.flax import save_file
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  tensors = []
  for rx, tmpl, _, bwd in _rows(cfg):
    name_tmpl = rx.pattern[:-1].replace(r"(\d+)", "{}").replace("\\.", ".")
    if "{}" in tmpl:
      if not _has_tensor(cfg, tmpl):
        continue
      for i in range(cfg.num_layers):
        tensors.append((name_tmpl.format(i), bwd(_get(params, tmpl.format(i)))))
    else:
      tensors.append((name_tmpl, bwd(_get(params, tmpl))))
  shards, cur, cur_bytes = [], {}, 0
  for name, w in tensors:
    b = _tensor_bytes(w)
    if cur and cur_bytes + b > max_shard_bytes:
      shards.append(cur)
      cur, cur_bytes = {}, 0
    cur[name] = jnp.asarray(w)
    cur_bytes += b
  shards.append(cur)
  meta = {"format": "pt"}
  if len(shards) == 1:
    save_file(shards[0], os.fspath(out / "model.safetensors"), metadata=meta)
    return
  weight_map, total = {}, 0
  for i, shard in enumerate(shards):
    fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    save_file(shard, os.fspath(out / fname), metadata=meta)
    for name, w in shard.items():
      weight_map[name] = fname
      total += _tensor_bytes(w)
  (out / "model.safetensors.index.json").write_text(
      json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


def config_for_load(path, dtype, param_dtype=None) -> ModelConfig:
  p = check_checkpoint_dir(path)
  name = dtype_name(dtype_of(dtype))
  pname = name if param_dtype is None else dtype_name(dtype_of(param_dtype))
  return ModelConfig.from_hf_file(p / "config.json", dtype=name, param_dtype=pname)


def write_config(cfg: ModelConfig, out_dir):
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  (out / "config.json").write_text(json.dumps(cfg.to_hf_dict(), indent=2))
  gen = {"bos_token_id": cfg.bos_token_id, "eos_token_id": list(cfg.eos_token_id) or None,
         "pad_token_id": cfg.pad_token_id}
  (out / "generation_config.json").write_text(json.dumps(gen, indent=2))
