"""The Flax BERT encoder against `transformers` and `sentence-transformers`."""
import json
import subprocess
import sys

import numpy as np
import pytest

from retrieval_helpers import tiny_torch_model
from rlrag_jax.retrieval import Encoder
from rlrag_jax.retrieval.encoder import BertConfig

TEXTS = [
    "hello world",
    "Who wrote the novel that the 1962 film Lawrence of Arabia was based on?",
    "",
    "Évian-les-Bains 北京 naïve café — 1,234.5 km² (approx.)",
    # long ones: well past the 256-token limit, so both sides must truncate the same way
    " ".join(f"token{i} is followed by another word" for i in range(120)),
    "Evan Morris was a lobbyist for Genentech and its parent corporation Roche. " * 30,
    "short",
]


@pytest.mark.slow
def test_minilm_matches_sentence_transformers(minilm, minilm_dir):
  from sentence_transformers import SentenceTransformer
  ref_model = SentenceTransformer(str(minilm_dir), device="cpu", local_files_only=True)
  assert minilm.max_length == ref_model.max_seq_length
  lengths = [len(x) for x in minilm.tokenize(TEXTS)]
  assert max(lengths) == minilm.max_length          # truncation is exercised
  ours = minilm.encode(TEXTS, batch_size=3)           # several buckets and a partial batch
  ref = ref_model.encode(TEXTS, batch_size=3, convert_to_numpy=True)
  assert ours.shape == ref.shape == (len(TEXTS), 384) and ours.dtype == np.float32
  cos = np.sum(ours * ref, axis=1) / np.linalg.norm(ref, axis=1)
  assert np.all(cos >= 0.9999), cos
  np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


@pytest.mark.slow
def test_batching_and_padding_do_not_change_embeddings(minilm):
  batched = minilm.encode(TEXTS, batch_size=4)
  alone = np.concatenate([minilm.encode([t], batch_size=1) for t in TEXTS])
  np.testing.assert_allclose(batched, alone, atol=2e-5)
  assert minilm.encode([], batch_size=4).shape == (0, 384)
  with pytest.raises(TypeError, match="list of strings"):
    minilm.encode("not a list")


def _save_tiny(tmp_path, model, tokenizer, safetensors=True):
  import torch
  model.config.save_pretrained(tmp_path)
  tokenizer.save_pretrained(tmp_path)
  if safetensors:
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              str(tmp_path / "model.safetensors"))
  else:
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
  return tmp_path


def _ids_and_mask(seed=0, batch=3, length=20, vocab=30522, pad=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, vocab, size=(batch, length)).astype(np.int64)
  lens = [length, length - 7, 4][:batch]
  mask = np.zeros((batch, length), np.int64)
  for b, n in enumerate(lens):
    mask[b, :n] = 1
    ids[b, n:] = pad
  return ids, mask


@pytest.mark.parametrize("safetensors", [True, False])
def test_tiny_bert_matches_transformers(tmp_path, minilm_tokenizer, safetensors):
  import torch
  model = tiny_torch_model("bert", seed=1)
  folder = _save_tiny(tmp_path, model, minilm_tokenizer, safetensors=safetensors)
  enc = Encoder.from_pretrained(folder)
  assert enc.max_length == 64   # no sentence_bert_config: the position table caps it
  ids, mask = _ids_and_mask()
  with torch.no_grad():
    ref = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state
  ref = ref.numpy()
  ours = enc.hidden_states(ids, mask)
  m = mask.astype(bool)
  np.testing.assert_allclose(ours[m], ref[m], atol=2e-4, rtol=1e-4)
  # sentence embedding = masked mean, then L2 norm
  pooled = (ref * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
  pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
  np.testing.assert_allclose(enc.embed_ids(ids, mask), pooled, atol=2e-5)


def test_torch_bin_is_read_without_torch(tmp_path, minilm_tokenizer):
  model = tiny_torch_model("bert", seed=2, task="mlm")   # keys carry the 'bert.' prefix
  folder = _save_tiny(tmp_path, model, minilm_tokenizer, safetensors=False)
  name = "bert.encoder.layer.1.attention.self.query.weight"
  expect = model.state_dict()[name].numpy()
  np.save(tmp_path / "expect.npy", expect)
  code = (
      "import sys; sys.modules['torch'] = None\n"       # any `import torch` now fails
      "import numpy as np\n"
      "from rlrag_jax.retrieval.weights import open_weights\n"
      f"r = open_weights({str(folder)!r})\n"
      f"w = r.get({name!r})\n"
      f"assert np.array_equal(w, np.load({str(tmp_path / 'expect.npy')!r})), 'values differ'\n"
      "print(len(r.names()))\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
  assert out.returncode == 0, out.stderr[-2000:]
  assert int(out.stdout.strip()) == len(model.state_dict())
  # and the prefixed MLM checkpoint loads as an encoder with the backbone's outputs
  import torch
  enc = Encoder.from_pretrained(folder)
  ids, mask = _ids_and_mask(seed=3)
  with torch.no_grad():
    ref = model.bert(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
  m = mask.astype(bool)
  np.testing.assert_allclose(enc.hidden_states(ids, mask)[m], ref.last_hidden_state.numpy()[m],
                             atol=2e-4, rtol=1e-4)


def test_refuses_arbitrary_pickles(tmp_path):
  import pickle
  import zipfile
  from rlrag_jax.retrieval.weights import open_weights
  payload = pickle.dumps({"w": print})     # a global outside the allow-list
  with zipfile.ZipFile(tmp_path / "pytorch_model.bin", "w") as z:
    z.writestr("archive/data.pkl", payload)
  with pytest.raises(pickle.UnpicklingError, match=r"pytorch_model\.bin.*builtins\.print"):
    open_weights(tmp_path)


def test_tiny_roberta_positions_match_transformers(tmp_path, minilm_tokenizer):
  import torch
  model = tiny_torch_model("roberta", seed=4)
  folder = _save_tiny(tmp_path, model, minilm_tokenizer)
  enc = Encoder.from_pretrained(folder)
  assert enc.config.position_offset == 2 and enc.max_length == 64
  ids, mask = _ids_and_mask(seed=5, pad=1)
  with torch.no_grad():
    ref = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state
  m = mask.astype(bool)
  np.testing.assert_allclose(enc.hidden_states(ids, mask)[m], ref.numpy()[m], atol=2e-4, rtol=1e-4)


def test_config_and_weight_errors_name_the_file(tmp_path, minilm_tokenizer):
  with pytest.raises(ValueError, match=r"cfg\.json.*'model_type' is 'mpnet'"):
    BertConfig.from_hf_dict({"model_type": "mpnet"}, source="cfg.json")
  model = tiny_torch_model("bert", seed=6)
  folder = _save_tiny(tmp_path, model, minilm_tokenizer)
  cfg = json.loads((folder / "config.json").read_text())
  cfg["num_hidden_layers"] = 3                      # the file only has 2 layers
  (folder / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match=r"model\.safetensors.*encoder\.layer\.2\."):
    Encoder.from_pretrained(folder)
  cfg["num_hidden_layers"], cfg["intermediate_size"] = 2, 48   # wrong shape
  (folder / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match=r"model\.safetensors.*intermediate\.dense\.weight"):
    Encoder.from_pretrained(folder)
  with pytest.raises(FileNotFoundError, match=r"config\.json"):
    Encoder.from_pretrained(tmp_path / "nowhere")
