"""`model.remat`: the same gradients as without it, and the backward pass really recomputes
(XLA's memory analysis of the compiled gradient keeps one layer's activations, not all)."""
import jax
import jax.numpy as jnp
import numpy as np

from rlrag_jax.models.config import ModelConfig
from rlrag_jax.models.decoder import DecoderLM, init_params

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=256, num_layers=6, num_heads=4,
                  num_kv_heads=2, head_dim=8, tie_word_embeddings=True)


def _loss(cfg):
  model = DecoderLM(cfg)

  def loss(params, ids, mask):
    logits, _ = model.apply({"params": params}, ids, mask)
    return jnp.mean(jax.nn.logsumexp(logits, -1)) + jnp.mean(logits[..., 3])
  return loss


def test_remat_gradients_equal_and_activations_recomputed():
  rng = np.random.default_rng(0)
  ids = rng.integers(0, CFG.vocab_size, (4, 64)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[1, :5] = 0
  params = init_params(DecoderLM(CFG), jax.random.PRNGKey(0))
  grads, temps = {}, {}
  for remat in (False, True):
    fn = jax.jit(jax.value_and_grad(_loss(CFG.replace(remat=remat))))
    grads[remat] = fn(params, ids, mask)
    big = jax.ShapeDtypeStruct((64, 256), jnp.int32)   # long enough for activations to dominate
    temps[remat] = fn.lower(params, big, big).compile().memory_analysis().temp_size_in_bytes
  np.testing.assert_allclose(grads[True][0], grads[False][0], rtol=1e-6)
  for a, b in zip(jax.tree_util.tree_leaves(grads[True][1]),
                  jax.tree_util.tree_leaves(grads[False][1])):
    np.testing.assert_allclose(a, b, atol=1e-6)
  # Six layers' activations kept vs about one layer's recomputed at a time.
  assert temps[True] < 0.5 * temps[False], temps


def test_scanned_layers_equal_the_unrolled_stack_and_compile_one_block():
  """`model.scan_layers`: the same loss and gradients (with and without remat) as the unrolled
  blocks, and the compiled gradient holds one block's code, not six."""
  rng = np.random.default_rng(1)
  ids = rng.integers(0, CFG.vocab_size, (4, 32)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[2, :7] = 0
  params = init_params(DecoderLM(CFG), jax.random.PRNGKey(2))
  sizes = {}
  for remat in (False, True):
    out = {}
    for scan in (False, True):
      fn = jax.jit(jax.value_and_grad(_loss(CFG.replace(remat=remat, scan_layers=scan))))
      out[scan] = fn(params, ids, mask)
      sizes[remat, scan] = len(fn.lower(params, ids, mask).compile().as_text())
    np.testing.assert_allclose(out[True][0], out[False][0], rtol=1e-6)
    flat = {jax.tree_util.keystr(k): v for k, v in
            jax.tree_util.tree_leaves_with_path(out[False][1])}
    for k, v in jax.tree_util.tree_leaves_with_path(out[True][1]):
      np.testing.assert_allclose(v, flat[jax.tree_util.keystr(k)], atol=1e-6, err_msg=str(k))
  for remat in (False, True):
    assert sizes[remat, True] < 0.5 * sizes[remat, False], sizes
  # The forward alone (the log-prob and value passes) equal too.
  cfg = CFG.replace(scan_layers=True)
  want, _ = DecoderLM(CFG).apply({"params": params}, ids, mask)
  got, _ = DecoderLM(cfg).apply({"params": params}, ids, mask)
  np.testing.assert_allclose(got, want, atol=1e-5)
