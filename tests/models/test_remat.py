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
