"""`python -m rlrag_jax.bench.accelerator`: sections in processes of their own, each recorded
as it ends; a section that crashes or overruns ends alone; the budget planned, kept and named;
peaks by device kind; the Pallas checks. The end-to-end run is `--reduced` on CPU, and nothing
here asserts a time: budgets are chosen so that what is cut follows from the plan alone."""
import json

import pytest

from rlrag_jax.bench import accelerator, memory


def _records(out):
  return [json.loads(l) for l in (out / "sections.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_crashed_section_is_recorded_the_next_runs_and_the_budget_cuts_by_plan(
    tmp_path, monkeypatch):
  """update dies of SIGSEGV (as a Triton fault would); sampler_xla after it still runs; a
  120 s budget holds device, update and sampler scaled (~94 s planned) but not main or
  memory as well (+70, +40), so those two are cut by the plan and named."""
  monkeypatch.setenv(accelerator.FAULT_ENV, "update=segv")
  rc = accelerator.main(["--reduced", "--sections", "memory,update,sampler,main",
                         "--decode-attention", "xla", "--budget-s", "120",
                         "--out", str(tmp_path)])
  assert rc == 1
  recs = _records(tmp_path)
  assert [r["section"] for r in recs] == ["device", "memory", "update", "sampler_xla", "main"]
  by = {r["section"]: r for r in recs}
  for name in by:                            # a file per section, written with its line
    assert json.loads((tmp_path / f"{name}.json").read_text()) == by[name]
  assert by["update"]["status"] == "failed" and by["update"]["exit"] == -11
  assert by["update"]["exit_meaning"] == "killed by SIGSEGV"
  assert any("Segmentation fault" in l for l in by["update"]["stderr_tail"])
  s = by["sampler_xla"]
  assert s["status"] == "ok" and s["level"] == "scaled", s
  (row,) = s["result"]["rows"]
  assert row["decode_attention"] == "xla" and row["tok_s"] > 0 and row["decode_step_ms"] > 0
  assert row["frac_roofline"] == pytest.approx(row["tok_s"] / row["roofline_tok_s"])
  assert row["roofline_datasheet_tok_s"] is None          # the CPU has no datasheet entry
  dev = by["device"]["result"]
  assert dev["device"] == "cpu" and dev["peak"] is None and dev["copy_vs_datasheet"] is None
  for name in ("memory", "main"):
    assert by[name]["status"] == "cut" and by[name]["reason"].startswith("budget: the plan")
  res = json.loads((tmp_path / "accelerator.json").read_text())
  assert res["failed"] == ["update"] and sorted(res["cut"]) == ["main", "memory"]
  assert all(r.get("limit_s", 0) <= 120 for r in recs)


def _section(tmp_path, monkeypatch, fault, limit=60.0):
  monkeypatch.setenv(accelerator.FAULT_ENV, f"device={fault}")
  job = dict(spec=accelerator.REDUCED, level="full", device={})
  return accelerator.spawn_section("device", job, tmp_path, limit)


@pytest.mark.parametrize("fault,meaning,line", [
    ("raise", "exit status 1", "RuntimeError: RLRAG_ACCEL_FAULT: a fault injected"),
    ("exit", "exit status 3", None),
    ("abort", "killed by SIGABRT", "Fatal Python error: Aborted")])
def test_a_failing_section_keeps_its_exit_and_last_stderr_lines(tmp_path, monkeypatch, fault,
                                                                meaning, line):
  rec = _section(tmp_path, monkeypatch, fault)
  assert rec["status"] == "failed" and rec["exit_meaning"] == meaning and "result" not in rec
  assert line is None or any(line in l for l in rec["stderr_tail"]), rec["stderr_tail"]


def test_a_section_past_its_limit_is_killed_and_recorded(tmp_path, monkeypatch):
  rec = _section(tmp_path, monkeypatch, "hang", limit=2.0)    # sleeps forever: always over
  assert rec["status"] == "timeout" and rec["exit_meaning"] == "killed by SIGKILL"


def test_the_plan_scales_first_then_cuts_in_order():
  full = accelerator.plan(accelerator.ORDER, 1e4, "full")
  assert set(full.values()) == {"full"}
  p = accelerator.plan(accelerator.ORDER, 420, "full")          # the default budget
  assert [n for n, lv in p.items() if lv == "cut"] == ["memory", "hf"]
  assert {lv for n, lv in p.items() if n not in ("memory", "hf")} == {"scaled"}
  tiny = accelerator.plan(accelerator.ORDER, 100, "full")
  assert [n for n, lv in tiny.items() if lv != "cut"] == ["device", "update"]
  # at its turn: the scaled needs after it are kept back; below its own scaled need it is cut
  levels = dict(update="full", main="full")
  need = lambda n, lv: accelerator.need_s(n, lv, "full")
  after = need("main", "scaled") + 2 * accelerator.MARGIN_S
  assert accelerator.section_limit("update", levels, ["main"], after + 100, "full") == (
      "full", 100)
  assert accelerator.section_limit("update", levels, ["main"], after + 61, "full")[0] == "scaled"
  assert accelerator.section_limit("update", levels, ["main"], after + 59, "full")[0] == "cut"


def test_scaled_spec_drops_repeats_and_shapes():
  s = accelerator.scaled(accelerator.FULL)
  assert s["batches"] == (256,) and s["hf_batches"] == (256,) and s["runs"] == 1
  assert s["steps"] == 2 and s["reps"] == 5 and not s["second_vocab"] and not s["one_pass"]
  assert accelerator.sampler_runs(s, "pallas", 2) == [("pallas", 0, 256)]


def test_peaks_by_the_device_kind_jax_reports():
  p = accelerator.peak_for
  assert (p("NVIDIA H100 80GB HBM3").bf16_tflops, p("NVIDIA H100 80GB HBM3").hbm_tbs) == \
      (989.4, 3.35)
  assert p("NVIDIA H100 PCIe").hbm_tbs == 2.0 and p("NVIDIA H200").hbm_tbs == 4.8
  assert p("NVIDIA H200").memory_gb == 141
  assert {p(k).bf16_tflops for k in ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB")} == {312}
  assert p("NVIDIA A100-SXM4-80GB").hbm_tbs > p("NVIDIA A100-SXM4-40GB").hbm_tbs
  assert p("TPU v4").bf16_tflops == 275 and p("TPU v5 lite").name == "TPU v5e"
  assert p("TPU v5").name == "TPU v5p" and p("TPU v6 lite").bf16_tflops == 918
  for unknown in ("cpu", "NVIDIA GeForce RTX 4090", "TPU v7x", ""):
    assert p(unknown) is None                  # named and skipped, never an H100 stand-in


def test_a_pallas_check_that_disagrees_skips_the_timing():
  ok = accelerator.verdict(dict(forward=1e-3, gradients=2e-2), greedy_equal=1.0)
  bad = accelerator.verdict(dict(forward=0.5, gradients=float("nan")), greedy_equal=0.2)
  assert ok["agree"] and not bad["agree"] and bad["over_tolerance"] == ["forward", "gradients"]
  timed = []
  res = accelerator.checked("update_pallas", lambda: bad, lambda: timed.append(1) or {})
  assert timed == [] and res["check"] is bad and "forward, gradients" in res["timing_skipped"]
  res = accelerator.checked("update_pallas", lambda: ok, lambda: dict(tokens_per_s=1.0))
  assert res == dict(check=ok, tokens_per_s=1.0)


@pytest.mark.slow
def test_the_pallas_checks_agree_with_xla_in_the_interpreter():
  """The checks themselves, on CPU (the kernels in Pallas' interpreter): within bf16
  tolerance, every greedy token equal."""
  spec = dict(accelerator.REDUCED, check_tokens=32, check_new_tokens=4)
  for check in (accelerator.check_attention, accelerator.check_decode):
    c = check(spec)
    assert c["agree"] and c["greedy_equal"] == 1.0, c


def test_a_batch_whose_kernel_splits_the_cache_is_timed_in_one_pass_too():
  """FULL (0.5B: 2 KV heads, 384 slots = 3 blocks): batch 64 gives 128 programs, so its kernel
  splits the cache (auto: 2 ranges) and is timed again in one pass; batch 256 gives 512 and
  does not. The summary names the ranges."""
  runs = accelerator.sampler_runs(accelerator.FULL, "pallas", 2)
  assert runs == [("pallas", 0, 64), ("pallas", 0, 256), ("pallas", 1, 64)]
  assert accelerator.sampler_runs(accelerator.FULL, "xla", 2) == [("xla", 0, 64), ("xla", 0, 256)]
  assert accelerator.sampler_runs(accelerator.REDUCED, "pallas", 2) == [("pallas", 0, 4)]
  assert [accelerator.auto_cache_ranges(accelerator.FULL, b, 2) for b in (64, 256)] == [2, 1]
  row = dict(batch=64, tok_s=1.0, frac_roofline=0.5, roofline_tok_s=2.0)
  secs = dict(sampler_pallas=dict(status="ok", level="full", seconds=1.0, limit_s=9.0, result=dict(
      rows=[dict(row, decode_attention="pallas", splits=2),
            dict(row, decode_attention="pallas", splits=1)])))
  text = accelerator.summary(dict(sections=secs))
  assert "pallas attention (cache in 2 ranges), batch 64" in text
  assert "pallas attention (one pass), batch 64" in text


def test_sections_selected_and_unknown_ones_refused():
  c = accelerator.candidate_sections
  assert c(["update", "sampler"], ("xla",)) == ["device", "update", "sampler_xla"]
  assert c(["sampler", "update", "main"], ("xla", "pallas")) == [
      "device", "update", "update_pallas", "sampler_xla", "sampler_pallas", "main"]
  assert c(["sampler_pallas"], ("pallas",)) == ["device", "sampler_pallas"]
  with pytest.raises(SystemExit, match="unknown"):
    c(["samplers"], ("xla",))


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
