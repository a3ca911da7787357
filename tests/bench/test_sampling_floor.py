"""The sampling benchmark's matmul floor multiplies by exactly the model's linear layers."""
import pytest

from _deps import require
from hf_tiny import make_tiny_checkpoint

torch = require("torch")


@pytest.mark.parametrize("tied", [False, True])
def test_weight_matrices_are_the_linear_layers_of_transformers(tmp_path, tied):
  import transformers
  from rlrag_jax.bench import sampling
  from rlrag_jax.models import load_hf
  path = make_tiny_checkpoint(tmp_path, "qwen2", tie_word_embeddings=tied)
  ref = transformers.AutoModelForCausalLM.from_pretrained(path)
  # every nn.Linear's weight is [out, in]; ours come as [in, out]
  want = sorted(tuple(m.weight.shape[::-1]) for m in ref.modules()
                if isinstance(m, torch.nn.Linear))
  got = sorted(tuple(w.shape) for w in sampling.weight_matrices(load_hf(path)))
  assert got == want
  assert sampling.matmul_floor(load_hf(path), batch=2, steps=3, repeats=1) > 0


def test_nucleus_compare_prints_ours_against_the_bisection_and_keeps_the_same_tokens():
  """`--nucleus`: the top-p mask against the bisection it replaced, one row per kind of logits;
  peaked rows are decided by the candidates, flat ones fall back; both keep the same tokens."""
  from rlrag_jax.bench import sampling
  rows = sampling.nucleus_compare(batch=4, vocab=3000, repeats=1)
  assert [r["kind"] for r in rows] == ["peaked", "flat"]
  assert all(r["same"] and r["ours"] > 0 and r["reference"] > 0 for r in rows)
  assert rows[0]["decided"] == 4 and rows[1]["decided"] == 0
