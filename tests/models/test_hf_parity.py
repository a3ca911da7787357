"""load_hf / save_hf against `transformers` (CPU torch) on tiny random Qwen2/Llama/Qwen3 models."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _deps import require

torch = require("torch")
transformers = require("transformers")

from rlrag_jax.models import (LM, DecoderLM, ModelConfig, ValueLM, encode_prompt, init_params,  # noqa: E402
                              load_hf, save_hf, value_params_from_policy)
from hf_tiny import load_reference, make_tiny_checkpoint  # noqa: E402

VARIANTS = [
    ("qwen2", {}),
    ("qwen2", {"tie_word_embeddings": True}),
    ("llama", {}),
    ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
               "rope_theta": 500000.0}),
    ("llama", {"head_dim": 24, "attention_bias": True}),
    ("qwen3", {}),                                            # q/k RMS norms per head
    ("qwen3", {"head_dim": 24, "attention_bias": True, "tie_word_embeddings": True}),
]


def _batch(vocab, seed=0):
  rs = np.random.RandomState(seed)
  ids = rs.randint(3, vocab, size=(3, 17))
  mask = np.ones_like(ids)
  mask[1, :5] = 0          # left padding of different lengths
  mask[2, :11] = 0
  return ids, mask


def _ref_logits(model, ids, mask):
  with torch.no_grad():
    return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()


def _max_valid_diff(a, b, mask):
  return float(np.max(np.abs(a - b)[mask.astype(bool)]))


@pytest.mark.parametrize("model_type,overrides", VARIANTS)
def test_logits_match_transformers(tmp_path, model_type, overrides):
  path = make_tiny_checkpoint(tmp_path, model_type, **overrides)
  ref = load_reference(path)
  lm = load_hf(path)
  ids, mask = _batch(lm.config.vocab_size)
  diff = _max_valid_diff(np.asarray(lm.logits(ids, mask)), _ref_logits(ref, ids, mask), mask)
  assert diff <= 1e-4, diff


@pytest.mark.parametrize("model_type,overrides",
                         [VARIANTS[0], VARIANTS[1], VARIANTS[4], VARIANTS[6], VARIANTS[7]])
def test_save_hf_reloads_in_transformers(tmp_path, model_type, overrides):
  path = make_tiny_checkpoint(tmp_path, model_type, **overrides)
  ref = load_reference(path)
  lm = load_hf(path)
  out = tmp_path / "exported"
  save_hf(lm, out)
  reloaded = load_reference(out)
  ids, mask = _batch(lm.config.vocab_size, seed=1)
  np.testing.assert_array_equal(_ref_logits(reloaded, ids, mask), _ref_logits(ref, ids, mask))
  # The tokenizer travels with the export.
  tok = transformers.AutoTokenizer.from_pretrained(str(out))
  assert tok("hello")["input_ids"] == lm.tokenizer("hello")["input_ids"]


def test_sharded_checkpoint_loads_and_exports_sharded(tmp_path):
  path = make_tiny_checkpoint(tmp_path, "llama")
  ref = load_reference(path)
  sharded = tmp_path / "sharded"
  ref.save_pretrained(sharded, max_shard_size="40KB")
  assert (sharded / "model.safetensors.index.json").exists()
  lm = load_hf(sharded)
  ids, mask = _batch(lm.config.vocab_size, seed=2)
  assert _max_valid_diff(np.asarray(lm.logits(ids, mask)), _ref_logits(ref, ids, mask), mask) <= 1e-4
  out = tmp_path / "ours_sharded"
  save_hf(lm, out, max_shard_bytes=50_000)
  index = json.loads((out / "model.safetensors.index.json").read_text())
  assert len(set(index["weight_map"].values())) > 1
  np.testing.assert_array_equal(_ref_logits(load_reference(out), ids, mask),
                                _ref_logits(ref, ids, mask))


def test_bfloat16_load_is_close_to_float32(tmp_path):
  path = make_tiny_checkpoint(tmp_path, "qwen2")
  lm32 = load_hf(path)
  lm16 = load_hf(path, dtype=jnp.bfloat16)
  leaves = jax.tree_util.tree_leaves(lm16.params)
  assert all(x.dtype == jnp.bfloat16 for x in leaves)
  ids, mask = _batch(lm32.config.vocab_size)
  a, b = np.asarray(lm32.logits(ids, mask)), np.asarray(lm16.logits(ids, mask))
  assert b.dtype == np.float32
  # bf16 keeps ~3 significant digits; the argmax should agree almost everywhere.
  agree = (a.argmax(-1) == b.argmax(-1))[mask.astype(bool)].mean()
  assert agree > 0.9, agree


def test_rope_parameters_layout_is_read():
  base = dict(model_type="llama", vocab_size=10, hidden_size=8, intermediate_size=16,
              num_hidden_layers=1, num_attention_heads=2)
  old = ModelConfig.from_hf_dict({**base, "rope_theta": 5e5,
                                  "rope_scaling": {"rope_type": "linear", "factor": 4.0}})
  new = ModelConfig.from_hf_dict({**base, "rope_parameters": {"rope_type": "linear", "factor": 4.0,
                                                              "rope_theta": 5e5}})
  assert old == new
  assert new.rope_theta == 5e5 and new.rope_scaling.factor == 4.0


def test_clear_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    load_hf(tmp_path / "nope")
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError, match="config.json"):
    load_hf(tmp_path / "empty")
  path = make_tiny_checkpoint(tmp_path, "llama")
  for f in path.glob("*.safetensors"):
    f.unlink()
  with pytest.raises(FileNotFoundError, match="safetensors"):
    load_hf(path)
  cfg = json.loads((path / "config.json").read_text())
  cfg["model_type"] = "gpt2"
  (path / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match="model_type"):
    load_hf(path)
  (path / "config.json").write_text("{not json")
  with pytest.raises(ValueError, match=r"config.json:1"):
    load_hf(path)


def test_missing_tensor_is_named(tmp_path):
  from safetensors.numpy import load_file, save_file
  path = make_tiny_checkpoint(tmp_path, "llama")
  f = path / "model.safetensors"
  tensors = load_file(str(f))
  del tensors["model.layers.1.mlp.up_proj.weight"]
  save_file(tensors, str(f), metadata={"format": "pt"})
  with pytest.raises(ValueError, match="lacks 1 tensors"):
    load_hf(path)


def test_value_model_starts_from_policy(tmp_path):
  lm = load_hf(make_tiny_checkpoint(tmp_path, "qwen2"))
  vm = ValueLM(lm.config)
  vparams = value_params_from_policy(lm.params, init_params(vm, jax.random.PRNGKey(1)))
  ids, mask = _batch(lm.config.vocab_size)
  values, _ = vm.apply({"params": vparams}, jnp.asarray(ids), jnp.asarray(mask))
  assert values.shape == ids.shape and values.dtype == jnp.float32
  # The critic's backbone is the policy's: its hidden states give the same logits through lm_head.
  hidden, _ = DecoderLM(lm.config).apply({"params": lm.params}, jnp.asarray(ids), jnp.asarray(mask),
                                         method=lambda m, *a: m.model(*a))
  w = vparams["value_head"]
  expected = hidden @ w["kernel"][:, 0] + w["bias"][0]
  np.testing.assert_allclose(np.asarray(values), np.asarray(expected), rtol=1e-5, atol=1e-5)


def test_chat_template_applied_when_present(tmp_path):
  lm = load_hf(make_tiny_checkpoint(tmp_path, "qwen2"))
  tok = lm.tokenizer
  plain = encode_prompt(tok, "hi")
  assert plain == tok("hi")["input_ids"]
  tok.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"
  templated = encode_prompt(tok, [{"role": "user", "content": "hi"}])
  assert tok.decode(templated) .endswith("<user>hi<assistant>")


def test_qwen3_norms_are_trained_and_round_trip_bit_identical(tmp_path):
  path = make_tiny_checkpoint(tmp_path, "qwen3")
  lm = load_hf(path)
  attn = lm.params["model"]["layers_0"]["self_attn"]
  assert attn["q_norm"]["weight"].shape == attn["k_norm"]["weight"].shape == (16,)
  ids, mask = _batch(lm.config.vocab_size)
  grads = jax.grad(lambda p: jnp.sum(LM(lm.config, p).logits(ids, mask) ** 2))(lm.params)
  g = grads["model"]["layers_0"]["self_attn"]
  assert float(jnp.abs(g["q_norm"]["weight"]).max()) > 0
  assert float(jnp.abs(g["k_norm"]["weight"]).max()) > 0
  save_hf(lm, tmp_path / "out")
  back = load_hf(tmp_path / "out")
  for a, b in zip(jax.tree_util.tree_leaves(lm.params), jax.tree_util.tree_leaves(back.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == [
      "Qwen3ForCausalLM"]


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_sliding_window_configs_are_refused(tmp_path, model_type):
  path = make_tiny_checkpoint(tmp_path, model_type, use_sliding_window=True, sliding_window=8)
  with pytest.raises(ValueError, match="use_sliding_window"):
    load_hf(path)
