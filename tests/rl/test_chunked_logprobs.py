"""Log-probs in chunks of tokens against the LM head (`rl.logits_chunk`) against the full
[B, T, V] logits: values, gradients, the update steps, and the memory the update keeps."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlrag_jax import rl
from rlrag_jax.models import sharding as shd
from rlrag_jax.models.config import ModelConfig
from rlrag_jax.models.decoder import DecoderLM, init_params
from rlrag_jax.rl import logprobs as lp_lib
from rlrag_jax.rl import optim_state, step_factories

V = 256


def _np_log_softmax(x):
  x = np.asarray(x, np.float64)
  m = x.max(-1, keepdims=True)
  return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("chunk", [V * 2 * 3, V * 2 * 7, V * 2])   # 3, 7 (uneven), 1 position
def test_chunked_head_equals_full_logits_and_numpy(transposed, chunk):
  rng = np.random.default_rng(0)
  b, n, e = 2, 17, 8
  h = rng.normal(size=(b, n, e)).astype(np.float32)
  w = (0.4 * rng.normal(size=(V, e) if transposed else (e, V))).astype(np.float32)
  tg = rng.integers(0, V, (b, n)).astype(np.int32)
  temp = 0.7

  def full(h, w):
    logits = jnp.einsum("bne,ve->bnv" if transposed else "bne,ev->bnv", h, w) / temp
    return {"lp": rl.token_logprobs(logits, tg), "ent": rl.token_entropy(logits),
            "hit": (jnp.argmax(logits, -1) == tg).astype(jnp.float32)}

  def chunked(h, w):
    return lp_lib.chunked_head_logprobs(h, w, tg, chunk=chunk, transposed=transposed,
                                        temperature=temp, with_entropy=True, with_hits=True,
                                        entropy_grad=True)

  assert lp_lib.chunk_positions(b, n, V, chunk) < n            # really chunked
  got, want = jax.jit(chunked)(h, w), jax.jit(full)(h, w)
  logits = np.einsum("bne,ve->bnv" if transposed else "bne,ev->bnv", h, w) / temp
  ls = _np_log_softmax(logits)
  for k in ("lp", "ent"):                  # the same float32 function, chunked or not
    np.testing.assert_allclose(got[k], want[k], atol=1e-5)
  # ... and that function against a float64 numpy log-softmax
  np.testing.assert_allclose(got["lp"], np.take_along_axis(ls, tg[..., None], -1)[..., 0],
                             atol=5e-5)
  np.testing.assert_allclose(got["ent"], -(np.exp(ls) * ls).sum(-1), atol=5e-5)
  np.testing.assert_array_equal(got["hit"], want["hit"])
  np.testing.assert_array_equal(got["hit"], (logits.argmax(-1) == tg).astype(np.float32))
  # Gradients of a loss that reads log-probs and entropies, through both paths.
  wts = rng.normal(size=(b, n)).astype(np.float32)
  loss = lambda f: lambda h, w: jnp.sum(f(h, w)["lp"] * wts) + 0.3 * jnp.sum(f(h, w)["ent"])
  g_got = jax.jit(jax.grad(loss(chunked), argnums=(0, 1)))(h, w)
  g_want = jax.jit(jax.grad(loss(full), argnums=(0, 1)))(h, w)
  for a, c in zip(g_got, g_want):
    np.testing.assert_allclose(a, c, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("temp", [1.0, 0.7])
def test_fused_backward_equals_autodiff_and_numpy(transposed, temp):
  """`fused=True` (the hand-written chunk backward): the same log-probs, entropies and hits,
  and the gradients of a loss on the log-probs equal autodiff's to 1e-5 in float32 and to the
  rounding of bf16 in bf16; and against float64 numpy: d lp / d logits = onehot - softmax."""
  rng = np.random.default_rng(3)
  b, n, e = 2, 19, 8
  h = rng.normal(size=(b, n, e)).astype(np.float32)
  w = (0.4 * rng.normal(size=(V, e) if transposed else (e, V))).astype(np.float32)
  tg = rng.integers(0, V, (b, n)).astype(np.int32)
  wts = rng.normal(size=(b, n)).astype(np.float32)
  chunk = V * 2 * 5                                   # 5 positions a chunk, the last one short

  def run(fused, dtype):
    def loss(h, w):
      out = lp_lib.chunked_head_logprobs(h, w, tg, chunk=chunk, transposed=transposed,
                                         temperature=temp, with_entropy=True, with_hits=True,
                                         fused=fused)
      return jnp.sum(out["lp"] * wts), out
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(
        jnp.asarray(h, dtype), jnp.asarray(w, dtype))

  (_, got), g_got = run(True, jnp.float32)
  (_, want), g_want = run(False, jnp.float32)
  for k in ("lp", "ent", "hit"):
    np.testing.assert_array_equal(got[k], want[k])    # the same forward
  for a, c in zip(g_got, g_want):
    np.testing.assert_allclose(a, c, atol=1e-5, rtol=1e-5)
  logits = np.einsum("bne,ve->bnv" if transposed else "bne,ev->bnv", h, w) / temp
  p = np.exp(_np_log_softmax(logits))
  dlogits = (np.eye(V)[tg] - p) * wts[..., None] / temp
  dh = np.einsum("bnv,ve->bne" if transposed else "bnv,ev->bne", dlogits, w)
  np.testing.assert_allclose(g_got[0], dh, atol=1e-5)
  (_, got16), g16 = run(True, jnp.bfloat16)
  (_, want16), g16_ad = run(False, jnp.bfloat16)
  np.testing.assert_array_equal(got16["lp"], want16["lp"])
  for a, c in zip(g16, g16_ad):
    a, c = np.asarray(a, np.float32), np.asarray(c, np.float32)
    assert np.max(np.abs(a - c)) <= 2e-2 * np.max(np.abs(c)), (np.max(np.abs(a - c)),)
  with pytest.raises(ValueError, match="entropy_grad"):
    lp_lib.chunked_head_logprobs(h, w, tg, chunk=chunk, transposed=transposed,
                                 entropy_grad=True, with_entropy=True, fused=True)


BF16_U = 2.0 ** -8        # bf16's unit roundoff (8 significant bits): 3.9e-3


@pytest.mark.parametrize("transposed,fused", [(False, False), (True, False), (False, True),
                                              (True, True)])
def test_bf16_head_gradient_error_does_not_grow_with_the_chunk_count(transposed, fused):
  """In bf16 the head's (tied embedding's) gradient is summed over the chunks in float32 and
  cast once, so its error against float64 numpy (on the same bf16-rounded inputs) stays flat
  from 1 to 8 to 64 chunks. Summed in bf16, as autodiff of the scan did, it grew from 1.7e-3
  to 8e-3 here (1.2e-2 at 512). What remains is two bf16 roundings (each chunk's logit
  gradient before its GEMMs, the final cast), each at most u/2 of an element, so the relative
  error stays below u = 2^-8. The autodiff variant's loss has an entropy bonus too."""
  rng = np.random.default_rng(5)
  b, n, e, vocab, temp = 2, 512, 64, 1024, 0.8
  h = jnp.asarray(rng.normal(size=(b, n, e)), jnp.bfloat16)
  w = jnp.asarray(rng.normal(size=(vocab, e) if transposed else (e, vocab)) / np.sqrt(e),
                  jnp.bfloat16)
  tg = rng.integers(0, vocab, (b, n)).astype(np.int32)
  wts = rng.normal(size=(b, n)).astype(np.float32)
  coef = 0.0 if fused else 0.3
  # float64 reference: d/dz of sum(wts * lp) + coef * sum(wts * ent), z = logits / temp
  h64, w64 = np.asarray(h, np.float64), np.asarray(w, np.float64)
  z = np.einsum("bne,ve->bnv" if transposed else "bne,ev->bnv", h64, w64) / temp
  ls = _np_log_softmax(z)
  p = np.exp(ls)
  ent = -(p * ls).sum(-1, keepdims=True)
  dz = (np.eye(vocab)[tg] - p) * wts[..., None] - coef * wts[..., None] * p * (ls + ent)
  ref = np.einsum("bne,bnv->ve" if transposed else "bne,bnv->ev", h64, dz / temp)

  def loss(w, chunks):
    out = lp_lib.chunked_head_logprobs(h, w, tg, chunk=(n // chunks) * b * vocab,
                                       transposed=transposed, temperature=temp,
                                       with_entropy=not fused, entropy_grad=not fused,
                                       fused=fused)
    return jnp.sum(out["lp"] * wts) + (coef * jnp.sum(out["ent"] * wts) if not fused else 0.0)

  err = {}
  for chunks in (1, 8, 64):
    assert lp_lib.chunk_positions(b, n, vocab, (n // chunks) * b * vocab) == n // chunks
    g = jax.jit(jax.grad(loss), static_argnums=1)(w, chunks)
    assert g.dtype == jnp.bfloat16
    err[chunks] = np.linalg.norm(np.asarray(g, np.float64) - ref) / np.linalg.norm(ref)
  assert err[64] <= 2 * err[1] and err[8] <= 2 * err[1], err
  assert max(err.values()) < BF16_U, err


def test_entropy_carries_no_gradient_unless_asked():
  rng = np.random.default_rng(1)
  h = rng.normal(size=(1, 9, 4)).astype(np.float32)
  w = rng.normal(size=(4, V)).astype(np.float32)
  tg = np.zeros((1, 9), np.int32)
  f = lambda h: jnp.sum(lp_lib.chunked_head_logprobs(h, w, tg, chunk=V * 2,
                                                     with_entropy=True)["ent"])
  assert float(jnp.abs(jax.grad(f)(h)).max()) == 0.0


CFG = ModelConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=1,
                  num_heads=4, num_kv_heads=2, head_dim=8)


def _batch(b=4, t=24):
  rng = np.random.default_rng(0)
  ids = rng.integers(0, V, (b, t)).astype(np.int32)
  attn = np.ones((b, t), np.int32)
  attn[0, :3] = 0
  loss_mask = np.zeros((b, t), np.float32)
  loss_mask[:, 10:] = 1
  loss_mask[1, 15:18] = 0
  return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss_mask,
          "advantages": np.array([1.0, -0.5, 2.0, 0.3], np.float32)}


@pytest.mark.slow
@pytest.mark.parametrize("tied", [False, True])
def test_update_steps_equal_with_and_without_chunks(tied):
  """Policy (with KL, entropy bonus, 2 micro-batches), SFT and log-prob forward: chunked (3
  positions per chunk) vs the full logits, to 1e-5 in float32 (SGD, so params move by the
  gradient)."""
  cfg = CFG.replace(tie_word_embeddings=tied)
  model = DecoderLM(cfg)
  params = init_params(model, jax.random.PRNGKey(0))
  mesh = shd.make_mesh()
  batch = _batch()
  loss_cfg = rl.LossConfig.preset("grpo", entropy_coef=0.01, temperature=0.8)
  small = 2 * 3 * V                          # micro-batch of 2 rows x 3 positions x vocab
  out = {}
  for chunk in (0, small):
    logp = step_factories.make_logprob_fn(model, mesh, temperature=0.8, micro_batches=2,
                              logits_chunk=chunk)(params, batch, 8)
    b = dict(batch, ref_logp=np.asarray(logp) - 0.05, old_logp=np.asarray(logp) + 0.02)
    opt = optax.sgd(1.0)
    pol = step_factories.make_policy_step(model, opt, mesh, loss_cfg, micro_batches=2, logits_chunk=chunk)
    st, pm = pol(rl.create_train_state(model, opt, mesh, params=params), b, 8)
    sft = step_factories.make_sft_step(model, opt, mesh, micro_batches=2, logits_chunk=chunk)
    st2, sm = sft(rl.create_train_state(model, opt, mesh, params=params), batch, 0)
    out[chunk] = (np.asarray(logp), jax.device_get(st.params), pm, jax.device_get(st2.params),
                  sm)
  (lp0, p0, m0, s0, sm0), (lp1, p1, m1, s1, sm1) = out[0], out[small]
  np.testing.assert_allclose(lp1, lp0, atol=1e-5)
  assert np.all(lp1[:, :9] == 0)
  for a, c in zip(jax.tree_util.tree_leaves(p1) + jax.tree_util.tree_leaves(s1),
                  jax.tree_util.tree_leaves(p0) + jax.tree_util.tree_leaves(s0)):
    np.testing.assert_allclose(a, c, atol=1e-5)
  for k in m0:
    assert float(m1[k]) == pytest.approx(float(m0[k]), abs=1e-5), k
  for k in sm0:
    assert float(sm1[k]) == pytest.approx(float(sm0[k]), abs=1e-5), k
  assert float(m0["entropy"]) > 0 and 0 <= float(sm0["accuracy"]) <= 1


@pytest.mark.parametrize("tied", [False, True])
def test_head_backward_setting_reaches_the_policy_and_sft_steps(tied):
  """`head_backward` 'fused' against 'autodiff' through the real policy (GRPO with KL, no
  entropy bonus: the fused backward gives the entropy no gradient) and SFT steps, chunked, in
  float32 to 1e-5; an unknown mode is refused."""
  model = DecoderLM(CFG.replace(tie_word_embeddings=tied))
  params = init_params(model, jax.random.PRNGKey(1))
  mesh = shd.make_mesh()
  batch = _batch()
  loss_cfg = rl.LossConfig.preset("grpo", temperature=0.8)
  small = 2 * 3 * V
  b = dict(batch, ref_logp=np.full((4, 24), -5.0, np.float32))
  out = {}
  for mode in ("autodiff", "fused"):
    opt = optax.sgd(1.0)
    pol = step_factories.make_policy_step(model, opt, mesh, loss_cfg, micro_batches=2, logits_chunk=small,
                              head_backward=mode)
    st, pm = pol(rl.create_train_state(model, opt, mesh, params=params), b, 8)
    sft = step_factories.make_sft_step(model, opt, mesh, logits_chunk=small, head_backward=mode)
    st2, _ = sft(rl.create_train_state(model, opt, mesh, params=params), batch, 0)
    out[mode] = jax.device_get((st.params, st2.params)), float(pm["loss"])
  (pa, la), (pf, lf) = out["autodiff"], out["fused"]
  assert lf == pytest.approx(la, abs=1e-6)
  moved = 0.0
  for a, c, p0 in zip(jax.tree_util.tree_leaves(pf), jax.tree_util.tree_leaves(pa),
                      jax.tree_util.tree_leaves((params, params))):
    np.testing.assert_allclose(a, c, atol=1e-5)
    moved = max(moved, float(np.max(np.abs(np.asarray(c) - np.asarray(p0)))))
  assert moved > 1e-3                          # the steps did move the params
  with pytest.raises(ValueError, match="head_backward='fast'"):
    step_factories.make_sft_step(model, optax.sgd(1.0), mesh, logits_chunk=small, head_backward="fast")(
        rl.create_train_state(model, optax.sgd(1.0), mesh, params=params), batch, 0)


def test_update_memory_does_not_grow_with_the_vocabulary():
  """XLA's memory analysis of the compiled policy update at vocab 1,024 and 16,384, everything
  else equal: with the full logits the temporaries grow by more than the [B, T, V] f32 logits
  grow; in chunks by less than a quarter of the large vocabulary's logits."""
  mesh = shd.make_mesh(devices=jax.devices()[:1])
  opt = optax.sgd(1.0)
  b, t = 8, 128
  spec = lambda shape, dt: jax.ShapeDtypeStruct(shape, dt, sharding=shd.batch_sharding(mesh))
  batch = {"input_ids": spec((b, t), jnp.int32), "attention_mask": spec((b, t), jnp.int32),
           "loss_mask": spec((b, t), jnp.int32), "advantages": spec((b,), jnp.float32)}
  temps = {}
  for vocab in (1024, 16384):
    cfg = CFG.replace(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_heads=2,
                      num_kv_heads=1)
    model = DecoderLM(cfg)
    state = optim_state.abstract_train_state(model, opt, mesh)
    for chunk in (0, 2 ** 20):
      step = step_factories.make_policy_step(model, opt, mesh, rl.LossConfig.preset("dapo"),
                                 logits_chunk=chunk)
      compiled = step.lower(state, batch, 0).compile()
      temps[vocab, chunk] = compiled.memory_analysis().temp_size_in_bytes
  logits = lambda vocab: b * t * vocab * 4
  assert temps[16384, 0] - temps[1024, 0] > logits(16384) - logits(1024), temps
  assert temps[16384, 2 ** 20] - temps[1024, 2 ** 20] < logits(16384) / 4, temps


@pytest.mark.parametrize("mode", ["autodiff", "fused", "bf16"])
def test_traced_first_skips_chunks_and_equals_the_window_cut_there(mode):
  """`first` (traced, one program for any value) against the window cut at it (a static
  start): the same statistics from `first` on, and the same gradients of a loss read there,
  for the float32 autodiff and fused chunk backwards and the bf16 float32-sum scan."""
  rng = np.random.default_rng(1)
  b, n, e = 2, 17, 8
  dt = jnp.bfloat16 if mode == "bf16" else jnp.float32
  h = jnp.asarray(rng.normal(size=(b, n, e)), dt)
  w = jnp.asarray(0.4 * rng.normal(size=(e, V)), dt)
  tg = jnp.asarray(rng.integers(0, V, (b, n)), jnp.int32)
  wts = jnp.asarray(rng.normal(size=(b, n)), jnp.float32)
  kw = dict(chunk=V * 2 * 3, with_entropy=True, fused=mode == "fused")

  def loss_traced(h, w, first):
    out = lp_lib.chunked_head_logprobs(h, w, tg, first=first, **kw)
    keep = jnp.arange(n)[None, :] >= first
    return jnp.sum(jnp.where(keep, out["lp"] * wts, 0.0)), out

  def loss_window(h, w, first):
    out = lp_lib.chunked_head_logprobs(h[:, first:], w, tg[:, first:], **kw)
    return jnp.sum(out["lp"] * wts[:, first:]), out

  grad_traced = jax.jit(jax.value_and_grad(loss_traced, argnums=(0, 1), has_aux=True))
  tol = 2e-2 if mode == "bf16" else 1e-5
  for first in (0, 5, 11):
    (l_t, out_t), g_t = grad_traced(h, w, jnp.int32(first))
    (l_w, out_w), g_w = jax.value_and_grad(loss_window, argnums=(0, 1), has_aux=True)(
        h, w, first)
    np.testing.assert_allclose(l_t, l_w, rtol=tol, atol=tol)
    for k in ("lp", "ent"):
      np.testing.assert_allclose(np.asarray(out_t[k])[:, first:], out_w[k], rtol=tol, atol=tol)
    assert not np.asarray(g_t[0], np.float32)[:, :first].any()     # nothing before first
    for got, want in zip(g_t, g_w):
      np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                                 rtol=tol, atol=tol)
  # chunks of 3 positions: first = 11 skips chunks 0..2 (positions 0..8) at run time
  assert grad_traced._cache_size() == 1
