"""`python -m rlrag_jax.bench.memory`: one-line errors for bad shapes, the update's memory
independent of the vocabulary once logits are chunked, the decode step's cache updated in place,
and FSDP over host devices dividing the per-device arguments (reduced shapes)."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from rlrag_jax.bench import memory

TINY = dict(model_type="qwen2", vocab_size=1024, hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            tie_word_embeddings=True, max_position_embeddings=2048)
ROOT = pathlib.Path(__file__).resolve().parents[2]


def _write(tmp_path, d, name="config.json"):
  p = tmp_path / name
  p.write_text(json.dumps(d) if not isinstance(d, str) else d)
  return str(p)


@pytest.mark.parametrize("case", ["unknown", "bert", "not_json", "no_layers"])
def test_bad_shapes_are_one_line_errors(tmp_path, capsys, case):
  shape = {"unknown": lambda: "qwen9-1t",
           "bert": lambda: _write(tmp_path, dict(TINY, model_type="bert")),
           "not_json": lambda: _write(tmp_path, "{ nope"),
           "no_layers": lambda: _write(tmp_path, {k: v for k, v in TINY.items()
                                                   if k != "num_hidden_layers"})}[case]()
  assert memory.main(["--shape", shape, "--parts", "decode"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("bench.memory: ") and "\n" not in err, err
  assert {"unknown": "qwen2.5-0.5b", "bert": "model_type", "not_json": "not valid JSON",
          "no_layers": "num_hidden_layers"}[case] in err


def test_update_memory_independent_of_vocab_and_decode_in_place(tmp_path):
  shape = _write(tmp_path, TINY)
  kw = dict(sequences=16, tokens=256, parts=("update",), logits_chunk=2 ** 20)
  small = memory.run(shape, vocab=1024, **kw)
  big = memory.run(shape, vocab=32768, **kw)
  checks = memory.vocab_targets(big, small, temp_limit_gib=1.0, ratio_limit=1.15)
  assert all(c.ok for c in checks), [c.line() for c in checks]
  # Without chunks the same update's temporaries grow with the vocabulary (the check can fail).
  full = memory.run(shape, vocab=32768, **dict(kw, logits_chunk=0))
  assert not memory.vocab_targets(full, small, temp_limit_gib=1.0)[1].ok
  wide = _write(tmp_path, dict(TINY, hidden_size=256, intermediate_size=512), "wide.json")
  dec = memory.run(wide, parts=("decode",), decode_batch=32, cached=512)[0]
  cache_bytes = 2 * 2 * 32 * 512 * 2 * 64 * 2       # layers x k/v x B x S x K x D x bf16
  assert dec["alias_bytes"] >= cache_bytes, dec      # the donated cache is updated in place
  assert dec["temp_bytes"] < cache_bytes / 4, dec     # less than one layer's K: no copy
  assert dec["ideal_bytes"] > cache_bytes and dec["bytes_accessed"] >= dec["ideal_bytes"] * 0.5


def test_decode_with_the_pallas_attention_keeps_the_cache_in_place(tmp_path):
  """`--decode-attention pallas` (on CPU the kernel's interpreter) compiles the same step with
  the cache still donated and updated in place, and says which attention its row measured."""
  wide = _write(tmp_path, dict(TINY, hidden_size=256, intermediate_size=512), "wide.json")
  # 256 slots: 2 blocks, which 8 rows x 2 KV heads split into 2 ranges (decode_splits 0: auto)
  dec = memory.run(wide, parts=("decode",), decode_batch=8, cached=256,
                   decode_attention="pallas")[0]
  cache_bytes = 2 * 2 * 8 * 256 * 2 * 64 * 2
  assert dec["decode_attention"] == "pallas" and dec["alias_bytes"] >= cache_bytes, dec
  assert dec["decode_splits"] == 0
  assert "pallas attention" in memory.decode_target([dict(dec, shape="wide")]).what


def test_attention_row_is_one_layers_forward_and_backward_against_a_fused_ideal(tmp_path):
  """`--parts attention`: one layer's attention, forward and backward, at the update's micro-
  batch; its ideal (hand-computed) is what a fused kernel would read and write."""
  shape = _write(tmp_path, TINY)
  (row,) = memory.run(shape, sequences=8, tokens=128, micro_batches=2, parts=("attention",),
                      attention_block=32)
  q, kv = 4 * 128 * 4 * 16 * 2, 4 * 128 * 2 * 16 * 2   # 4 rows x 128 x heads x head_dim x bf16
  assert row["name"] == "attention" and row["sequences"] == 4 and row["attention_block"] == 32
  assert row["ideal_bytes"] == (2 * q + 2 * kv) + (3 * q + 2 * kv) + (q + 2 * kv)  # fwd, bwd
  assert row["bytes_accessed"] > row["ideal_bytes"]       # the unfused XLA attention
  (pal,) = memory.run(shape, sequences=4, tokens=64, parts=("attention",), attention="pallas")
  assert pal["attention"] == "pallas" and pal["ideal_bytes"] > 0   # (on CPU: the interpreter)


@pytest.mark.slow
def test_fsdp_over_host_devices_divides_the_arguments(tmp_path):
  shape = _write(tmp_path, TINY)
  rows = {}
  for devices in (1, 2):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    out = subprocess.run([sys.executable, "-m", "rlrag_jax.bench.memory", "--shape", shape,
                          "--sequences", "4", "--tokens", "64", "--parts", "update", "--json",
                          "--devices", str(devices)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows[devices] = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
  upd = {d: next(r for r in rows[d] if r["name"] == "update") for d in rows}
  assert set(memory.FIELDS) <= set(upd[1])
  assert upd[2]["devices"] == 2
  # params, AdamW moments and the batch are sharded: about half per device
  assert upd[2]["argument_bytes"] < 0.6 * upd[1]["argument_bytes"], upd


def test_prefill_row_into_a_fresh_cache_or_onto_a_prefix(tmp_path):
  """`--parts prefill`: the prompt half of --tokens into a fresh cache of --tokens slots, or
  with `--prefill-prefix P` onto a cache of P + --tokens slots already holding P; the row's
  arguments hold the params and that cache, its ideal adds the new tokens' K/V."""
  shape = _write(tmp_path, TINY)
  fresh, onto = (memory.run(shape, sequences=4, tokens=64, parts=("prefill",),
                            prefill_prefix=p)[0] for p in (0, 96))
  kv_slot = 2 * 2 * 2 * 16 * 2               # layers x k/v x KV heads x head_dim x bf16
  assert (fresh["prefix"], onto["prefix"]) == (0, 96)
  assert onto["argument_bytes"] - fresh["argument_bytes"] >= 4 * 96 * kv_slot
  assert onto["ideal_bytes"] - fresh["ideal_bytes"] == pytest.approx(4 * 96 * kv_slot, rel=0.01)


def test_decode_ideal_counts_the_live_kv_not_the_whole_cache(tmp_path):
  """`--cache-slots`: the step's cache is larger than its filled slots (the sampler's prompt +
  max_new layout); the ideal counts the `cached` filled slots' KV, by hand, whatever the cache
  size, and the cache (all of it) stays donated; a cache smaller than the fill is refused."""
  wide = _write(tmp_path, dict(TINY, hidden_size=256, intermediate_size=512), "wide.json")
  kw = dict(parts=("decode",), decode_batch=8, cached=128)
  full = memory.run(wide, **kw)[0]
  big = memory.run(wide, cache_slots=512, **kw)[0]
  cfg = memory.model_config(wide)
  weights = cfg.num_params() * 2
  live_kv = 2 * cfg.num_layers * 8 * 128 * cfg.num_kv_heads * cfg.head_dim * 2
  new_kv = live_kv // 128
  logits = 8 * cfg.vocab_size * 4
  assert big["ideal_bytes"] == full["ideal_bytes"] == weights + live_kv + new_kv + logits
  assert big["cache_slots"] == 512 and full["cache_slots"] == 128 and big["tokens"] == 128
  assert big["alias_bytes"] >= 4 * live_kv, big                 # the 512-slot cache in place
  with pytest.raises(memory.ShapeError, match="--cache-slots 64 is below --cached 128"):
    memory.run(wide, cache_slots=64, **kw)
