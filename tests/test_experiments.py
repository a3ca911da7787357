"""The KL-stability experiment's plumbing: overrides, configs per stage, summaries, plot, and a
tiny end-to-end run (slow)."""
import json
import math

import numpy as np
import pytest

from rlrag_jax import fingerprint
from rlrag_jax.experiments import kl_stability as kls


def _row(step, grad_norm, reward, kl=0.0, kl_k3=0.0, skipped=0.0):
  return {"step": step, "stage": "rl", "grad_norm": grad_norm, "reward/total": reward,
          "kl": kl, "kl_k3": kl_k3, "skipped": skipped}


def test_summarize_against_hand_computed_figures():
  rows = [_row(1, 1.0, 0.0, kl=0.1, kl_k3=0.2), _row(2, 1.0, 1.0, kl=0.3, kl_k3=0.1),
          _row(3, 2.0, 2.0, kl=0.2, kl_k3=0.7), _row(4, 10.0, 3.0),
          _row(5, "nan", 4.0, skipped=1.0)]
  s = kls.summarize(rows, spike_factor=3.0, final_window=2)
  # Finite grad norms 1, 1, 2, 10: median 1.5, threshold 4.5 -> only 10 is a spike.
  assert s["median_grad_norm"] == 1.5 and s["spikes"] == 1
  assert s["max_grad_norm"] == 10.0 and s["nonfinite_grad_norm"] == 1
  assert s["max_kl_k3"] == 0.7 and s["max_kl_own"] == 0.3 and s["final_kl_k3"] == 0.0
  assert s["skipped"] == 1 and s["steps"] == 5
  assert s["final_reward"] == 3.5 and s["first_reward"] == 0.5      # (3+4)/2, (0+1)/2
  # A lower factor counts more spikes: 2 and 10 exceed 1.2 x 1.5 = 1.8.
  assert kls.summarize(rows, spike_factor=1.2)["spikes"] == 2


def test_summarize_without_k3_metric_falls_back_to_the_run_kl():
  rows = [{"step": 1, "stage": "rl", "grad_norm": 1.0, "kl": 0.4, "reward/total": 1.0}]
  s = kls.summarize(rows)
  assert s["max_kl_k3"] == 0.4 and s["spikes"] == 0 and s["skipped"] == 0
  assert kls.summarize([]) == {"steps": 0}


def test_read_eval_after(tmp_path):
  assert kls.read_eval_after(tmp_path) == {}
  (tmp_path / "eval_summary.json").write_text(json.dumps(
      {"before": {"reward": 1.0}, "after": {"reward": 2.5, "format": 0.75, "em": 0.25, "n": 8}}))
  assert kls.read_eval_after(tmp_path) == {"eval_reward_after": 2.5, "eval_format_after": 0.75,
                                           "eval_em_after": 0.25}


def test_overrides_cast_to_the_field_type_and_refuse_unknown_keys():
  c = kls.load_config("configs/arena.py")
  kls.apply_overrides(c, ["rl.group_size=4", "rl.lr=0.5", "export_hf=false",
                          "rl.kl_estimator=k3", "data.mix=a:b,c:d"])
  assert c.rl.group_size == 4 and isinstance(c.rl.group_size, int)
  assert c.rl.lr == 0.5 and c.export_hf is False and c.rl.kl_estimator == "k3"
  assert c.data.mix == ("a:b", "c:d")
  with pytest.raises(ValueError, match="rl.no_such_key"):
    kls.apply_overrides(c, ["rl.no_such_key=1"])
  with pytest.raises(ValueError, match="expected a int"):
    kls.apply_overrides(c, ["rl.group_size=many"])
  with pytest.raises(ValueError, match="key.path=value"):
    kls.apply_overrides(c, ["rl.group_size"])


def test_stage_configs_leave_the_base_untouched(tmp_path):
  base = kls.load_config("configs/arena.py")
  w = kls.warmup_config(base, tmp_path / "w", sft_steps=7, eval_examples=3)
  r = kls.rl_config(base, tmp_path / "k3", tmp_path / "w" / "hf", "k3", rl_steps=5, lr=0.01,
                    beta=0.7, eval_examples=3)
  assert (w.sft.steps, w.rl.steps, w.export_hf) == (7, 0, True)
  assert (r.sft.steps, r.rl.steps, r.rl.lr, r.rl.kl_beta, r.rl.kl_estimator) == (
      0, 5, 0.01, 0.7, "k3")
  assert r.model.init == "hf" and r.model.path == str(tmp_path / "w" / "hf")
  assert base.to_dict() == kls.load_config("configs/arena.py").to_dict()


def test_plot_writes_a_png(tmp_path):
  runs = {"k2": [_row(1, 1.0, 0.0), _row(2, 2.0, 1.0)], "k3": [_row(1, 1.5, 0.5)]}
  out = kls.plot(runs, tmp_path / "curves.png")
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert kls.plot({}, tmp_path / "none.png") is None


@pytest.mark.slow
def test_tiny_experiment_end_to_end(tmp_path):
  base = kls.load_config("configs/arena.py")
  base.data.world = dict(seed=0, num_questions=400)
  base.data.max_eval = 8
  for k, v in dict(vocab_size=512, hidden_size=32, intermediate_size=64, num_layers=1,
                   num_heads=2, num_kv_heads=1, head_dim=16).items():
    base.model[k] = v
  base.sft.batch_size = 4
  base.rl.prompts_per_step, base.rl.group_size, base.rl.max_new_tokens = 2, 2, 8
  base.eval.max_new_tokens, base.eval.batch_size = 8, 4
  args = kls.build_parser().parse_args(
      ["--workdir", str(tmp_path), "--sft-steps", "2", "--rl-steps", "3", "--eval-examples",
       "4", "--beta", "0.3", "--lr", "0.01", "--quiet"])
  summaries = kls.run_experiment(args, base=base)
  assert set(summaries) == {"k2", "k3"}
  for name in ("kl_stability.txt", "kl_stability.json", "kl_stability.png"):
    assert (tmp_path / name).exists(), name
  runs = {e: kls.read_rl_rows(tmp_path / e) for e in ("k2", "k3")}
  for est, rows in runs.items():
    assert [r["step"] for r in rows] == [1, 2, 3] and summaries[est]["steps"] == 3
    # The estimator override reached the loss: the run's 'kl' is its own estimator's value.
    for r in rows:
      assert math.isclose(r["kl"], r[f"kl_{est}"], rel_tol=1e-6, abs_tol=1e-9)
    # Step 1 measures the warm-up policy against itself (the reference): no KL yet.
    assert abs(rows[0]["kl_k3"]) < 1e-4
  # Both runs start from the same warm-up checkpoint with the same rollout keys.
  assert runs["k2"][0]["reward/total"] == runs["k3"][0]["reward/total"]
  saved = json.loads((tmp_path / "kl_stability.json").read_text())
  assert saved["settings"]["lr"] == 0.01 and saved["settings"]["beta"] == 0.3


def test_kl_stability_seeds_aggregate_by_hand(tmp_path):
  """--seeds: finished seeds are not rerun; figures are mean ± std over the seeds' summaries."""
  for s, (a, b) in enumerate([(0.1, 0.3), (0.2, 0.5)]):
    sub = tmp_path / f"seed_{s}"
    for est, kl in (("k2", a), ("k3", b)):
      (sub / est).mkdir(parents=True)
      rows = [{"step": i + 1, "stage": "rl", "kl_k3": kl * i, "reward/total": 1.0,
               "grad_norm": 1.0} for i in range(4)]
      (sub / est / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {est: {"max_kl_k3": kl, "spikes": s, "final_reward": 1.0}
               for est, kl in (("k2", a), ("k3", b))}
    (sub / "kl_stability.json").write_text(json.dumps({"settings": {
        "config": "configs/arena.py", "set": [f"seed={s}"], "sft_steps": 1, "rl_steps": 4,
        "lr": 0.1, "beta": 0.5}, "summary": summary}))
  args = kls.build_parser().parse_args(["--workdir", str(tmp_path), "--seeds", "0,1"])
  text = kls.run_seeds(args)                      # nothing to run: both seeds are finished
  saved = json.loads((tmp_path / "kl_stability_seeds.json").read_text())
  assert saved["figures"]["k3"]["max_kl_k3"] == pytest.approx([0.4, np.std([0.3, 0.5], ddof=1)])
  assert saved["figures"]["k2"]["spikes"] == pytest.approx([0.5, np.std([0, 1], ddof=1)])
  # kl_k3 rises by `kl` a step: its step-to-step changes have std 0
  assert saved["curves"]["k3"]["kl_k3"]["step_change_std"] == pytest.approx([0.0, 0.0])
  assert saved["curves"]["k3"]["kl_k3"]["last_quarter"][0] == pytest.approx(3 * 0.4)
  assert "| k3 | 0.4 ± 0.14 |" in text
  # k3 - k2 per seed: max KL +0.2, +0.3; t(1) interval 0.25 ± 12.706 * 0.0707 / sqrt(2)
  assert saved["paired"]["max_kl_k3"]["per_seed"] == pytest.approx([0.2, 0.3])
  assert saved["paired"]["max_kl_k3"]["t"] == pytest.approx([0.25, 0.25 - 0.6353, 0.25 + 0.6353],
                                                            abs=1e-3)
  assert "| max_kl_k3 | +0.2, +0.3 | +0.25 | [-0.385, +0.885] | includes 0 |" in text
  assert (tmp_path / "kl_stability_seeds.png").exists()
  # the raw travels with the aggregate: each seed's figures and every step's curve values
  assert saved["per_seed"]["1"]["k3"]["max_kl_k3"] == 0.5
  assert [r["kl_k3"] for r in saved["steps"]["k3"]["1"]] == pytest.approx([0.0, 0.5, 1.0, 1.5])
  assert [r["step"] for r in saved["steps"]["k2"]["0"]] == [1, 2, 3, 4]
  assert saved["host"] == json.loads(json.dumps(fingerprint.host()))
