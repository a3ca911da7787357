"""The Flax BERT encoder against `transformers` and `sentence-transformers`."""
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from retrieval_helpers import tiny_torch_model
from rlrag_jax.retrieval import Encoder
from rlrag_jax.retrieval import encoder as encoder_lib
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


# ------------------------------------------------------------------ pooling and prefix conventions
@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory, minilm_tokenizer):
  """One tiny random BERT (torch reference, saved folder) shared by the convention tests."""
  model = tiny_torch_model("bert", seed=7)
  folder = tmp_path_factory.mktemp("conventions") / "tiny-bert"
  folder.mkdir()
  return model, _save_tiny(folder, model, minilm_tokenizer)


def _copy_as(folder, name, tmp_path):
  import shutil
  return pathlib.Path(shutil.copytree(folder, tmp_path / name))


def _reference_pooled(model, ids, mask, pooling, normalize):
  """Sentence vectors from `transformers.BertModel`, pooled and normalised in numpy."""
  import torch
  with torch.no_grad():
    hidden = model(input_ids=torch.tensor(ids),
                   attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
  if pooling == "cls":
    pooled = hidden[:, 0]
  else:
    pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
  if normalize:
    pooled = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
  return pooled


@pytest.mark.parametrize("pooling,normalize", [("cls", True), ("mean", True), ("cls", False),
                                               ("mean", False)])
def test_pooling_and_normalize_match_transformers(tiny_bert, pooling, normalize):
  model, folder = tiny_bert
  enc = Encoder.from_pretrained(folder, pooling=pooling, normalize=normalize)
  assert (enc.pooling, enc.normalize) == (pooling, normalize)
  ids, mask = _ids_and_mask(seed=8)
  ref = _reference_pooled(model, ids, mask, pooling, normalize)
  ours = enc.embed_fn(enc.params, ids.astype(np.int32), mask.astype(np.int32))
  assert ours.shape == ref.shape and ours.dtype == np.float32
  np.testing.assert_allclose(np.asarray(ours), ref, atol=1e-5)   # measured max error ~2e-6
  if not normalize:
    assert np.all(np.linalg.norm(ref, axis=1) > 2)   # unnormalised rows differ from unit rows
  np.testing.assert_array_equal(enc.embed_ids(ids, mask), np.asarray(ours))


def test_sentence_transformers_files_set_the_conventions(tiny_bert, tmp_path):
  model, folder = tiny_bert
  st = _copy_as(folder, "st-model", tmp_path)
  modules = [{"idx": 0, "name": "0", "path": "",
              "type": "sentence_transformers.models.Transformer"},
             {"idx": 1, "name": "1", "path": "1_Pooling",
              "type": "sentence_transformers.models.Pooling"}]
  (st / "modules.json").write_text(json.dumps(modules))
  (st / "1_Pooling").mkdir()
  (st / "1_Pooling" / "config.json").write_text(json.dumps(
      {"word_embedding_dimension": 32, "pooling_mode_cls_token": True,
       "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False}))
  (st / "config_sentence_transformers.json").write_text(json.dumps(
      {"prompts": {"query": "q> ", "document": "d> "}}))
  enc = Encoder.from_pretrained(st)
  assert enc.conventions() == {"pooling": "cls", "normalize": False, "query_prefix": "q> ",
                               "passage_prefix": "d> ", "max_length": 64}
  ids, mask = _ids_and_mask(seed=9)
  np.testing.assert_allclose(enc.embed_ids(ids, mask),
                             _reference_pooled(model, ids, mask, "cls", False), atol=1e-5)
  # a listed Normalize module turns normalisation on; explicit arguments still win
  modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                  "type": "sentence_transformers.models.Normalize"})
  (st / "modules.json").write_text(json.dumps(modules))
  assert encoder_lib.sentence_transformers_conventions(st)["normalize"] is True
  enc = Encoder.from_pretrained(st, pooling="mean", query_prefix="")
  assert (enc.pooling, enc.normalize, enc.query_prefix) == ("mean", True, "")
  # what the encoder cannot reproduce is refused, naming the file
  (st / "1_Pooling" / "config.json").write_text(json.dumps(
      {"pooling_mode_cls_token": False, "pooling_mode_max_tokens": True}))
  with pytest.raises(ValueError, match=r"1_Pooling.config\.json.*pooling_mode_max_tokens"):
    Encoder.from_pretrained(st)
  modules.append({"idx": 3, "name": "3", "path": "3_Dense",
                  "type": "sentence_transformers.models.Dense"})
  (st / "modules.json").write_text(json.dumps(modules))
  with pytest.raises(ValueError, match=r"modules\.json: module 3 .*Dense"):
    Encoder.from_pretrained(st)


def test_e5_and_bge_names_set_prefixes(tiny_bert, tmp_path):
  _, folder = tiny_bert
  e5_dir = _copy_as(folder, "e5-tiny", tmp_path)
  # the empty prompts recent sentence-transformers versions save say nothing: the name decides
  (e5_dir / "config_sentence_transformers.json").write_text(json.dumps(
      {"prompts": {"query": "", "document": ""}}))
  e5 = Encoder.from_pretrained(e5_dir)
  assert e5.conventions() == {"pooling": "mean", "normalize": True, "query_prefix": "query: ",
                              "passage_prefix": "passage: ", "max_length": 64}
  np.testing.assert_array_equal(e5.encode_queries(["x"]), e5.encode(["query: x"]))
  np.testing.assert_array_equal(e5.encode_passages(["x", "y z"]), e5.encode(["passage: x",
                                                                             "passage: y z"]))
  assert not np.array_equal(e5.encode_queries(["x"]), e5.encode(["x"]))
  # explicit arguments override the name
  plain = Encoder.from_pretrained(tmp_path / "e5-tiny", query_prefix="", passage_prefix="",
                                  pooling="cls", normalize=False)
  assert plain.conventions()["query_prefix"] == plain.conventions()["passage_prefix"] == ""
  assert (plain.pooling, plain.normalize) == ("cls", False)
  assert plain.id == e5.id      # the id stays name@fingerprint; conventions travel apart
  # config.json '_name_or_path' is read when the folder name says nothing
  cfg = json.loads((folder / "config.json").read_text())
  cfg["_name_or_path"] = "BAAI/bge-small-en-v1.5"
  conv = encoder_lib.resolve_conventions(folder, cfg, "snapshot-123")
  assert conv == {"pooling": "cls", "normalize": True, "query_prefix": encoder_lib.BGE_QUERY_PREFIX,
                  "passage_prefix": ""}
  assert encoder_lib.BGE_QUERY_PREFIX == "Represent this sentence for searching relevant passages: "
  assert encoder_lib.name_conventions("multilingual-e5-small")["query_prefix"] == "query: "
  assert encoder_lib.name_conventions("bge-m3")["query_prefix"] == ""
  assert encoder_lib.name_conventions("nreimers/MiniLM-L6-H384-uncased", "hebe5x") == {}
  assert encoder_lib.resolve_conventions(folder, {}, "tiny-bert") == encoder_lib.DEFAULT_CONVENTIONS
  with pytest.raises(ValueError, match="pooling 'max'"):
    Encoder.from_pretrained(folder, pooling="max")


def test_packaged_minilm_keeps_mean_normalize_and_no_prefix():
  enc = Encoder.from_pretrained()
  assert enc.conventions() == {"pooling": "mean", "normalize": True, "query_prefix": "",
                               "passage_prefix": "", "max_length": 256}


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_decoder_folder_is_refused_in_one_line(tmp_path, model_type):
  import transformers
  folder = tmp_path / f"tiny-{model_type}"
  config_cls = transformers.LlamaConfig if model_type == "llama" else transformers.Qwen2Config
  config_cls(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
             num_attention_heads=4).save_pretrained(folder)   # no weights: refused before them
  with pytest.raises(ValueError) as info:
    Encoder.from_pretrained(folder)
  msg = str(info.value)
  assert "\n" not in msg and str(folder) in msg, msg
  assert f"'model_type' is '{model_type}'" in msg and "bert, roberta, xlm-roberta" in msg, msg
  (folder / "config.json").unlink()
  with pytest.raises(FileNotFoundError) as info:
    Encoder.from_pretrained(folder)
  msg = str(info.value)
  assert "\n" not in msg and str(folder) in msg and "'model_type'" in msg, msg
