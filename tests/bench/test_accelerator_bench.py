"""`python -m rlrag_jax.bench.accelerator --reduced`: every section but the main job runs on CPU at
a tiny shape and reports its figures; the main job's compile line is parsed."""
import json

import pytest

from rlrag_jax.bench import accelerator, memory


def test_reduced_run_reports_every_figure(tmp_path):
  rc = accelerator.main(["--reduced", "--sections", "hf,sampler,update", "--out", str(tmp_path)])
  res = json.loads((tmp_path / "accelerator.json").read_text())
  assert rc == 0 and res["failed"] == []
  (s,) = res["sampler"]                     # off a GPU only the XLA decode attention
  assert s["decode_attention"] == "xla" and "tokens_equal_xla" not in s
  assert s["tok_s"] > 0 and s["roofline_tok_s"] > 0 and s["decode_step_ms"] > 0
  assert s["frac_roofline"] == pytest.approx(s["tok_s"] / s["roofline_tok_s"])
  assert res["hf_generate"]["rows"][0]["batch"] == s["batch"]
  u = res["update"]
  assert u["skipped"] == 0.0 and u["tokens_per_s"] > 0 and u["micro_batches"] == 1
  assert u["mfu"] == pytest.approx(u["model_tflops"] / accelerator.H100_BF16_TFLOPS)


def test_sampler_and_update_sections_time_the_pallas_attentions():
  """`--decode-attention xla,pallas` (on a GPU the default): a sampler row per attention, the
  kernel's with the share of its greedy tokens equal to XLA's and its cache ranges, and the
  update with the Pallas attention kernels (here the kernels' CPU interpreter)."""
  clock = accelerator.Clock(600)
  dev = dict(copy_bandwidth_tbs=1.0)
  rows = accelerator.bench_sampler(accelerator.REDUCED, dev, clock, attentions=("xla", "pallas"))
  assert [(r["decode_attention"], r.get("splits")) for r in rows] == [("xla", None), ("pallas", 1)]
  assert "tokens_equal_xla" not in rows[0] and 0.0 <= rows[1]["tokens_equal_xla"] <= 1.0
  assert rows[1]["batch"] == rows[0]["batch"] and rows[1]["tok_s"] > 0
  u = accelerator.bench_update(accelerator.REDUCED, dict(dev, matmul_bf16_tflops=1.0), clock,
                               "pallas")
  assert u["attention"] == "pallas" and u["skipped"] == 0.0 and u["tokens_per_s"] > 0


def test_a_batch_whose_kernel_splits_the_cache_is_timed_in_one_pass_too():
  """FULL (0.5B: 2 KV heads, 384 slots = 3 blocks): batch 64 gives 128 programs, so its kernel
  splits the cache (auto: 2 ranges) and is timed again in one pass; batch 256 gives 512 and
  does not. The summary names the ranges."""
  runs = accelerator.sampler_runs(accelerator.FULL, ("xla", "pallas"), 2)
  assert runs == [("xla", 0, 64), ("xla", 0, 256), ("pallas", 0, 64), ("pallas", 0, 256),
                  ("pallas", 1, 64)]
  assert accelerator.sampler_runs(accelerator.REDUCED, ("xla", "pallas"), 2) == [
      ("xla", 0, 4), ("pallas", 0, 4)]                   # 24 slots: one block, nothing to split
  assert [accelerator.auto_cache_ranges(accelerator.FULL, b, 2) for b in (64, 256)] == [2, 1]
  row = dict(batch=64, tok_s=1.0, frac_roofline=0.5, roofline_tok_s=2.0)
  text = accelerator.summary(dict(sampler=[dict(row, decode_attention="pallas", splits=2),
                                           dict(row, decode_attention="pallas", splits=1)]))
  assert "pallas attention (cache in 2 ranges), batch 64" in text
  assert "pallas attention (one pass), batch 64" in text


def test_model_flops_and_roofline_by_hand():
  cfg = memory.model_config("qwen2.5-0.5b")
  n, ve = cfg.num_params(), cfg.vocab_size * cfg.hidden_size
  want = 64 * (512 * (6 * (n - ve) + 12 * 24 * 14 * 64 * 512) + 256 * 6 * ve)
  assert accelerator.update_model_flops(cfg, 64, 512, 256) == pytest.approx(want)
  bf16 = accelerator._model_config(accelerator.FULL)
  step = bf16.num_params() * 2 + 64 * (128 + 255 / 2) * (2 * 24 * 2 * 64 * 2)
  assert accelerator.decode_roofline_tok_s(bf16, 64, 128, 256, 3.35e12) == \
      pytest.approx(64 * 3.35e12 / step)


def test_compile_line_parsing():
  line = ("I1127 rlrag_jax.trainer XLA compiles over the run: 42 (7.1 s): 0 compiled, 42 read "
          "from the persistent cache (6.7 s)")
  assert accelerator.parse_compile_line(line) == dict(compiles=42, compile_s=7.1, cache_hits=42)
  assert accelerator.parse_compile_line("XLA compiles over the run: 3 (1.5 s)")["cache_hits"] == 0
  with pytest.raises(RuntimeError, match="no 'XLA compiles"):
    accelerator.parse_compile_line("nothing here")
