"""Helpers shared by the retrieval tests (imported by name: tests/retrieval is on sys.path)."""
import hashlib

import numpy as np


TINY = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=64, type_vocab_size=2)


def tiny_torch_model(model_type="bert", seed=0, task=None, **overrides):
  """A random tiny `transformers` encoder (eval mode); `task='mlm'` adds a prefixed MLM head."""
  import torch
  import transformers
  torch.manual_seed(seed)
  fields = dict(TINY, **overrides)
  if model_type == "bert":
    config = transformers.BertConfig(**fields)
    cls = transformers.BertForMaskedLM if task == "mlm" else transformers.BertModel
  elif model_type == "roberta":
    fields.setdefault("pad_token_id", 1)
    fields["max_position_embeddings"] = fields["max_position_embeddings"] + 2
    fields["type_vocab_size"] = 1
    config = transformers.RobertaConfig(**fields)
    cls = transformers.RobertaModel
  else:
    raise ValueError(model_type)
  model = cls(config).eval()
  with torch.no_grad():   # wider than HF's 0.02 init so that layers do visible work
    for name, p in model.named_parameters():
      if p.ndim == 2:
        p.normal_(0.0, 0.2)
  return model


class HashEncoder:
  """A deterministic bag-of-words encoder: each lower-cased word is a fixed random vector."""

  def __init__(self, dim=32):
    self.dim = dim
    self.id = f"hash-bow-{dim}@{dim:016x}"

  def _word(self, w):
    seed = int.from_bytes(hashlib.sha256(w.encode()).digest()[:8], "little")
    return np.random.default_rng(seed).standard_normal(self.dim).astype(np.float32)

  def encode(self, texts, batch_size=64):
    del batch_size
    out = np.zeros((len(texts), self.dim), np.float32)
    for i, t in enumerate(texts):
      for w in t.lower().split():
        out[i] += self._word(w)
      out[i] /= max(np.linalg.norm(out[i]), 1e-12)
    return out

  encode_queries = encode_passages = encode

  def conventions(self):
    return {"pooling": "bag-of-words", "normalize": True, "query_prefix": "",
            "passage_prefix": ""}


def random_unit(n, d, seed):
  x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
  return x / np.linalg.norm(x, axis=1, keepdims=True)
