"""Qwen3 trains: one SFT step on a tiny random Qwen3 checkpoint, checked against `transformers`.

The step's loss is compared with the masked next-token cross-entropy that the `transformers`
model computes on the same left-padded batch; the update must reach every param (the per-head
q/k norms included), and the trained params, exported with `save_hf`, must load in
`transformers` with logits equal to ours.
"""
import jax
import numpy as np
import pytest

from _deps import require

torch = require("torch")
transformers = require("transformers")

from rlrag_jax import rl  # noqa: E402
from rlrag_jax.models import LM, load_hf, save_hf  # noqa: E402
from rlrag_jax.models import sharding as shd  # noqa: E402
from hf_tiny import load_reference, make_tiny_checkpoint  # noqa: E402


def _sft_batch(vocab):
  rs = np.random.RandomState(3)
  ids = rs.randint(3, vocab, size=(2, 12)).astype(np.int32)
  attn = np.ones_like(ids)
  attn[1, :4] = 0                                   # left padding
  loss = np.zeros(ids.shape, np.float32)
  loss[0, 7:] = 1                                   # targets: the tail of each row
  loss[1, 9:] = 1
  return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss}


def _torch_sft_loss(model, batch):
  """Mean over target tokens of -log p(token | prefix), by `transformers`."""
  with torch.no_grad():
    logits = model(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                   attention_mask=torch.tensor(batch["attention_mask"])).logits
  logp = torch.log_softmax(logits[:, :-1].double(), dim=-1)
  tgt = torch.tensor(batch["input_ids"][:, 1:], dtype=torch.long)[..., None]
  nll = -logp.gather(-1, tgt)[..., 0].numpy()
  m = batch["loss_mask"][:, 1:]
  return float((nll * m).sum() / m.sum())


def test_qwen3_sft_step_trains_every_param_and_exports(tmp_path):
  path = make_tiny_checkpoint(tmp_path, "qwen3", attention_bias=True)
  ref = load_reference(path)
  lm = load_hf(path)
  batch = _sft_batch(lm.config.vocab_size)

  opt = rl.make_optimizer(rl.OptimizerConfig(lr=1e-2, total_steps=2, schedule="constant"))
  mesh = shd.make_mesh()
  step = rl.make_sft_step(lm.module, opt, mesh)
  before = jax.tree_util.tree_map(np.array, jax.device_get(lm.params))
  state = rl.create_train_state(lm.module, opt, mesh, params=lm.params)
  state, metrics = step(state, batch)

  assert float(metrics["loss"]) == pytest.approx(_torch_sft_loss(ref, batch), rel=1e-4)
  after = jax.device_get(state.params)
  flat_b = jax.tree_util.tree_flatten_with_path(before)[0]
  flat_a = jax.tree_util.tree_leaves(after)
  unchanged = [jax.tree_util.keystr(k) for (k, b), a in zip(flat_b, flat_a)
               if np.array_equal(b, np.asarray(a))]
  assert not unchanged, unchanged                  # Adam moves every param with a gradient
  assert any("q_norm" in jax.tree_util.keystr(k) for k, _ in flat_b)

  trained = LM(lm.config, after, lm.tokenizer)
  save_hf(trained, tmp_path / "export")
  reloaded = load_reference(tmp_path / "export")
  ids, attn = batch["input_ids"], batch["attention_mask"]
  with torch.no_grad():
    want = reloaded(input_ids=torch.tensor(ids, dtype=torch.long),
                    attention_mask=torch.tensor(attn)).logits.numpy()
  ours = np.asarray(trained.logits(ids, attn))
  valid = attn.astype(bool)
  assert float(np.max(np.abs(ours - want)[valid])) <= 1e-4
  # The trained model is a different model: the export is not the untouched checkpoint.
  with torch.no_grad():
    old = ref(input_ids=torch.tensor(ids, dtype=torch.long),
              attention_mask=torch.tensor(attn)).logits.numpy()
  assert float(np.max(np.abs(old - want)[valid])) > 1e-3


def test_qwen3_config_without_head_dim_reads_as_transformers_does(tmp_path):
  """Qwen3Config defaults head_dim to 128, not hidden_size / heads (here 64 / 4 = 16)."""
  import json
  path = make_tiny_checkpoint(tmp_path, "qwen3", head_dim=128)
  cfg = json.loads((path / "config.json").read_text())
  del cfg["head_dim"]
  (path / "config.json").write_text(json.dumps(cfg))
  ref = load_reference(path)
  assert ref.config.head_dim == 128
  lm = load_hf(path)
  assert lm.config.head_dim == 128
  batch = _sft_batch(lm.config.vocab_size)
  ids, attn = batch["input_ids"], batch["attention_mask"]
  with torch.no_grad():
    want = ref(input_ids=torch.tensor(ids, dtype=torch.long),
               attention_mask=torch.tensor(attn)).logits.numpy()
  diff = np.abs(np.asarray(lm.logits(ids, attn)) - want)[attn.astype(bool)]
  assert float(diff.max()) <= 1e-4
