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
  kernel's with the share of its greedy tokens equal to XLA's; a batch whose kernel splits the
  cache (here 4 rows over 144 slots: 2 ranges of 128) is timed in one pass too; and the update
  with the Pallas attention kernels (here the kernels' CPU interpreter)."""
  clock = accelerator.Clock(600)
  dev = dict(copy_bandwidth_tbs=1.0)
  spec = dict(accelerator.REDUCED, prompt=136)
  rows = accelerator.bench_sampler(spec, dev, clock, attentions=("xla", "pallas"))
  assert [(r["decode_attention"], r.get("splits")) for r in rows] == [
      ("xla", None), ("pallas", 2), ("pallas", 1)]
  assert "tokens_equal_xla" not in rows[0]
  assert all(0.0 <= r["tokens_equal_xla"] <= 1.0 for r in rows[1:])
  assert {r["batch"] for r in rows} == {4} and all(r["tok_s"] > 0 for r in rows)
  assert "cache in 2 ranges" in accelerator.summary(dict(sampler=rows))
  u = accelerator.bench_update(accelerator.REDUCED, dict(dev, matmul_bf16_tflops=1.0), clock,
                               "pallas")
  assert u["attention"] == "pallas" and u["skipped"] == 0.0 and u["tokens_per_s"] > 0


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
