"""experiments.seeds: statistics against hand computations, resumable runs, outputs (with a fake
training runner: no real training here; the trainer's eval_rows.json is covered in test_train)."""
import json

import numpy as np
import pytest

from rlrag_jax import fingerprint
from rlrag_jax.experiments import seeds

_REAL_RUN_ALL = seeds.run_all

def test_paired_bootstrap_against_a_direct_computation():
  d = [0.0, 1.0, 1.0, 0.0, 1.0, -1.0]
  mean, lo, hi = seeds.paired_bootstrap(d, resamples=500, seed=3)
  rng = np.random.default_rng(3)
  idx = rng.integers(0, 6, size=(500, 6))
  means = np.asarray(d)[idx].mean(axis=1)
  assert mean == pytest.approx(1 / 3)
  assert (lo, hi) == pytest.approx((np.percentile(means, 2.5), np.percentile(means, 97.5)))
  assert seeds.paired_bootstrap([0.5] * 10) == pytest.approx((0.5, 0.5, 0.5))
  assert np.isnan(seeds.paired_bootstrap([])[0])
  assert seeds.mean_std([1.0, 2.0, 4.0]) == pytest.approx((7 / 3, np.std([1, 2, 4], ddof=1)))
  assert seeds.mean_std([2.0]) == (2.0, 0.0)


def _rows(ems):
  return [{"id": f"q{i}", "em": float(e)} for i, e in enumerate(ems)]


def _fake_run(workdir, before_ems, after_ems, minutes=1.0):
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / "eval_summary.json").write_text(json.dumps({
      "before": {"em": float(np.mean(before_ems))}, "after": {"em": float(np.mean(after_ems))},
      "minutes": minutes}))
  (workdir / "eval_rows.json").write_text(json.dumps(
      {"before": _rows(before_ems), "after": _rows(after_ems)}))
  rows = [{"step": 0, "stage": "eval_before", "em": float(np.mean(before_ems))},
          {"step": 1, "stage": "rl", "reward/total": 1.0},
          {"step": 2, "stage": "eval_after", "em": float(np.mean(after_ems))}]
  (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_summary_by_hand(tmp_path):
  runs = {}
  data = {0: ([0, 0, 1, 1], [1, 0, 1, 1]), 1: ([0, 1, 1, 1], [1, 1, 1, 1]),
          2: ([0, 0, 0, 1], [0, 0, 1, 1])}
  for s, (b, a) in data.items():
    _fake_run(tmp_path / f"s{s}", b, a, minutes=2.0 + s)
  runs = {"main": {s: seeds.load_run(tmp_path / f"s{s}") for s in data}}
  st = seeds.summarise(runs, resamples=200)["arms"]["main"]
  em = st["metrics"]["em"]
  assert em["before_per_seed"] == [0.5, 0.75, 0.25] and em["after_per_seed"] == [0.75, 1.0, 0.5]
  assert em["gain"] == pytest.approx((0.25, 0.0))
  assert em["gain_all_seeds_positive"] and em["paired_examples"] == 12
  assert em["gain_ci"][0] == pytest.approx(3 / 12)        # pooled mean of the 12 paired diffs
  # per seed the paired diffs are [1,0,0,0], [1,0,0,0], [0,0,1,0]: every seed's mean is 0.25
  assert em["gain_ci_t"] == pytest.approx((0.25, 0.25, 0.25))
  assert em["gain_ci_hier"] == seeds.hierarchical_bootstrap(
      [[1, 0, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0]], 200)
  # crossed: the same four questions under every seed, paired by id
  assert em["gain_ci_crossed"] == seeds.crossed_bootstrap(
      [{"q0": 1, "q1": 0, "q2": 0, "q3": 0}, {"q0": 1, "q1": 0, "q2": 0, "q3": 0},
       {"q0": 0, "q1": 0, "q2": 1, "q3": 0}], 200)
  assert em["gain_claim"] == "includes 0"                # 4 examples a seed: wide bootstrap
  assert em["gain_p"] == 0.0                             # 0.25 on every seed: no spread
  assert st["minutes"] == pytest.approx((3.0, 1.0))
  text = seeds.write_markdown(seeds.summarise(runs, 200), tmp_path / "s.md", "t")
  assert "| em | 0.500 ± 0.250 | 0.750 ± 0.250 | 0.250 ± 0.000 |" in text
  lo, hi = em["gain_ci_hier"][1:]
  clo, chi = em["gain_ci_crossed"][1:]
  assert (f"| [{lo:+.3f}, {hi:+.3f}] | [{clo:+.3f}, {chi:+.3f}] | [+0.250, +0.250] | includes 0 "
          "| <0.0001 | – | yes |") in text


def test_cli_resumes_compares_arms_and_writes_outputs(tmp_path, monkeypatch):
  calls = []

  def fake_runner(cmd, log_path):
    calls.append(cmd)
    wd = log_path.parent
    seed = int(next(a for a in cmd if a.startswith("--config.seed=")).split("=")[1])
    better = "--config.rl.steps=9" in cmd
    after = [1, 1, seed % 2, 0] if better else [1, 0, seed % 2, 0]
    _fake_run(wd, [0, 0, seed % 2, 0], after)
    return 0

  real_run_all = seeds.run_all
  monkeypatch.setattr(seeds, "run_all", lambda jobs, parallel: real_run_all(
      jobs, parallel, runner=fake_runner))
  out = tmp_path / "cmp"
  argv = ["--config=configs/arena.py", "--seeds=0,1", f"--out={out}", "--resamples=100",
          "--config.rl.lr=0.001", "--arm", "a=", "--arm", "b=--config.rl.steps=9"]
  assert seeds.main(argv) == 0
  assert len(calls) == 4
  assert all("--config.rl.lr=0.001" in c and "--resume" in c for c in calls)
  assert sum("--config.rl.steps=9" in c for c in calls) == 2
  res = json.loads((out / "seeds.json").read_text())
  assert res["host"] == fingerprint.host()          # which machine made the table
  cmp_em = res["summary"]["comparison"]["em"]
  assert cmp_em["arms"] == ["a", "b"] and cmp_em["diff_per_seed"] == [0.25, 0.25]
  assert cmp_em["diff_ci"][0] == pytest.approx(0.25)
  md = (out / "seeds.md").read_text()
  assert "## b - a (after RL, paired on seed and example)" in md
  assert cmp_em["diff_ci_t"] == pytest.approx((0.25, 0.25, 0.25))
  assert cmp_em["paired_examples"] == 8 and cmp_em["diff_claim"] == "includes 0"   # 4 a seed
  assert (out / "seeds.png").stat().st_size > 1000
  assert res["plot"]["series"]["a"]["0"]["em"] == [[0, 2], [0.0, 0.25]]   # [1,0,0,0] after
  assert seeds.main(argv) == 0 and len(calls) == 4         # resumed: nothing rerun
  # --summarize: the same tables from seeds.json alone, nothing run, the plot redrawn
  again = tmp_path / "again"
  assert seeds.main([f"--summarize={out / 'seeds.json'}", f"--out={again}",
                     "--resamples=100"]) == 0 and len(calls) == 4
  assert (again / "seeds.md").read_text() == md
  assert json.loads((again / "seeds.json").read_text()) == res
  assert (again / "seeds.png").stat().st_size > 1000
  # a seeds.json from before the plotted curves were kept: the png is left alone
  old = dict(res)
  del old["plot"], old["contrast"]
  (tmp_path / "old").mkdir()
  (tmp_path / "old" / "seeds.json").write_text(json.dumps(old))
  assert seeds.main([f"--summarize={tmp_path / 'old' / 'seeds.json'}", "--resamples=100"]) == 0
  assert (tmp_path / "old" / "seeds.md").read_text() == md
  assert not (tmp_path / "old" / "seeds.png").exists()
  with pytest.raises(SystemExit):
    seeds.main([f"--summarize={tmp_path / 'missing.json'}"])
  with pytest.raises(SystemExit):
    seeds.main([f"--out={out}"])                           # no --config, no --summarize
  with pytest.raises(SystemExit):
    seeds.main(["--config=x", f"--out={out}", "--bogus=1"])


def _seed_table(tmp_path, monkeypatch, name, seed_list, flags=()):
  """seeds.json of the fake runs of `seed_list` (after EM depends on the seed), via the CLI."""
  def fake_runner(cmd, log_path):
    seed = int(next(a for a in cmd if a.startswith("--config.seed=")).split("=")[1])
    _fake_run(log_path.parent, [0, 0, seed % 2, 0], [1, seed % 3 == 0, seed % 2, 0])
    return 0
  monkeypatch.setattr(seeds, "run_all", lambda jobs, parallel: _REAL_RUN_ALL(
      jobs, parallel, runner=fake_runner))
  out = tmp_path / name
  assert seeds.main(["--config=configs/arena.py", f"--seeds={seed_list}", f"--out={out}",
                     "--resamples=100", "--plot=em", *flags]) == 0
  return out / "seeds.json"


def test_merged_tables_equal_the_table_of_all_seeds_run_at_once(tmp_path, monkeypatch):
  """--summarize=A.json,B.json: two runs of one command on disjoint seeds give, merged, the
  record and markdown that one run over all their seeds gives (runs, curves, every interval);
  --seeds keeps a subset, equal to running that subset."""
  whole = _seed_table(tmp_path, monkeypatch, "whole", "0,1,2,3")
  part_a = _seed_table(tmp_path, monkeypatch, "a", "2,0")
  part_b = _seed_table(tmp_path, monkeypatch, "b", "3,1")
  merged = tmp_path / "merged"
  assert seeds.main([f"--summarize={part_a},{part_b}", f"--out={merged}",
                     "--resamples=100"]) == 0
  want, got = json.loads(whole.read_text()), json.loads((merged / "seeds.json").read_text())
  assert got["seeds"] == [0, 1, 2, 3] and list(got["runs"]["main"]) == ["0", "1", "2", "3"]
  assert got == want
  text = (merged / "seeds.md").read_text()
  assert text == (whole.parent / "seeds.md").read_text()
  assert (merged / "seeds.png").stat().st_size > 1000
  # --seeds on one file: the subset, as if only those seeds had run
  sub = _seed_table(tmp_path, monkeypatch, "sub", "1,3")
  assert seeds.main([f"--summarize={whole}", "--seeds=3,1", f"--out={tmp_path / 'kept'}",
                     "--name=odd", "--resamples=100"]) == 0
  kept = json.loads((tmp_path / "kept" / "odd.json").read_text())
  assert kept["seeds"] == [1, 3]
  assert kept["runs"] == json.loads(sub.read_text())["runs"]
  assert kept["summary"] == json.loads(sub.read_text())["summary"]
  assert (tmp_path / "kept" / "odd.md").read_text() == (sub.parent / "seeds.md").read_text()


def test_merge_refuses_records_of_other_commands_and_names_the_field(tmp_path, monkeypatch):
  a = _seed_table(tmp_path, monkeypatch, "a", "0,1")
  other = _seed_table(tmp_path, monkeypatch, "o", "2", ["--config.rl.lr=0.5"])
  named = [("a.json", json.loads(a.read_text())), ("o.json", json.loads(other.read_text()))]
  with pytest.raises(seeds.MergeError, match=r"o.json field 'overrides'"):
    seeds.merge_records(named)
  same = json.loads(a.read_text())
  with pytest.raises(seeds.MergeError, match=r"arm 'main' seed 0 is in \['a.json', 'b.json'\]"):
    seeds.merge_records([("a.json", same), ("b.json", same)])
  only_1 = seeds.merge_records([("a.json", same)], seeds=[1])
  assert list(only_1["runs"]["main"]) == ["1"] and list(only_1["plot"]["series"]["main"]) == ["1"]
  # a seed two files hold is fine when --seeds leaves it out
  assert seeds.merge_records([("a.json", same), ("d.json", only_1)], seeds=[0])["seeds"] == [0]
  with pytest.raises(seeds.MergeError, match=r"seed\(s\) \[7\] are in none"):
    seeds.merge_records([("a.json", same)], seeds=[0, 7])
  # hosts: one entry per file when they differ, so the table says which machine made which seed
  b = _seed_table(tmp_path, monkeypatch, "b", "2,3")
  rec_b = json.loads(b.read_text())
  rec_b["host"] = dict(rec_b["host"], cpu="another")
  got = seeds.merge_records([("a.json", same), ("b.json", rec_b)])
  assert got["host"] == {"seeds 0, 1 (a.json)": same["host"], "seeds 2, 3 (b.json)": rec_b["host"]}
  assert seeds.merge_records([("a.json", same), ("b.json", rec_b)], seeds=[0])["host"] == \
      same["host"]
  # the CLI: the same errors as a one-line usage error (exit 2), nothing written
  with pytest.raises(SystemExit) as e:
    seeds.main([f"--summarize={a},{other}", f"--out={tmp_path / 'x'}"])
  assert e.value.code == 2 and not (tmp_path / "x").exists()
  md = a.parent / "seeds.md"
  with pytest.raises(SystemExit):
    seeds.main([f"--summarize={a},{md}"])           # a markdown table has no rows to merge
  with pytest.raises(SystemExit):
    seeds.main([f"--summarize={md}", "--seeds=0"])
  with pytest.raises(SystemExit):
    seeds.main(["--summarize=,"])


def test_mid_run_points_pair_against_a_stage_boundary(tmp_path):
  # A run evaluated after 10 RL steps too: compare warm-up -> rl10 and rl10 -> final.
  wd = tmp_path / "s0"
  _fake_run(wd, [0, 0, 0, 1], [1, 1, 0, 1])
  (wd / "eval_rows_rl10.json").write_text(json.dumps(
      {"all": {"em": 0.25, "rc": 2.0}, "rows": _rows([0, 1, 0, 0])}))
  first = seeds.load_run(wd, "warmup", "rl10")
  second = seeds.load_run(wd, "rl10", "final")
  assert first["after"]["em"] == 0.25 and second["before"]["em"] == 0.25
  assert seeds.pair_rows(first["rows"]["before"], first["rows"]["after"], "em") == {
      "q0": 0, "q1": 1, "q2": 0, "q3": -1}
  assert seeds.pair_rows(second["rows"]["before"], second["rows"]["after"], "em") == {
      "q0": 1, "q1": 0, "q2": 0, "q3": 1}
  text = seeds.write_markdown(seeds.summarise({"main": {0: second}}, 100), tmp_path / "m.md",
                              "t", "rl10", "final")
  assert "| metric | after 10 RL steps | after RL |" in text
  with pytest.raises(FileNotFoundError, match="no evaluation after 20 RL steps"):
    seeds.load_run(wd, "rl20", "final")
  with pytest.raises(ValueError, match="evaluation point 'mid'"):
    seeds.load_run(wd, "mid", "final")


def test_curve_statistics_by_hand(tmp_path):
  """Last-quarter mean and the std of step-to-step changes of a training curve, per arm."""
  curves = {"a": {0: [0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0], 1: [1.0, 1.0, 1.0, 1.0]},
            "b": {0: [0.0, 0.1, 0.2, 0.3]}}
  dirs = {}
  for arm, by_seed in curves.items():
    for seed, ys in by_seed.items():
      wd = tmp_path / arm / str(seed)
      wd.mkdir(parents=True)
      rows = [{"step": i + 1, "stage": "rl", "kl": y} for i, y in enumerate(ys)]
      rows.insert(1, {"step": 1, "stage": "eval", "em": 0.5})      # not a training row
      (wd / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
      dirs.setdefault(arm, {})[seed] = wd
  st = seeds.curve_stats(dirs["a"][0], "kl")
  assert st["last_quarter"] == pytest.approx(0.5)               # mean of the last 2 of 8
  assert st["step_change_std"] == pytest.approx(np.std([1, -1] * 3 + [1], ddof=1))
  assert seeds.curve_stats(dirs["a"][1], "kl") == {"last_quarter": 1.0, "step_change_std": 0.0}
  assert seeds.curve_stats(dirs["a"][0], "missing") is None
  out = seeds.summarise_curves(dirs, ["kl"])
  assert out["a"]["kl"]["step_change_std"][0] == pytest.approx(
      np.mean([np.std([1, -1] * 3 + [1], ddof=1), 0.0]))
  assert out["b"]["kl"]["step_change_std"] == pytest.approx((0.0, 0.0), abs=1e-12)
  assert out["b"]["kl"]["seeds"] == 1
  text = seeds.curves_markdown(out)
  assert "| kl | b | 0.300 ± 0.000 | 0.000 ± 0.000 | 1 |" in text


def test_a_methods_own_metric_is_summarised(tmp_path):
  """A metric outside METRICS (APEX's 'sepr') is summarised and plotted from its evaluations;
  'n' and counts with a '/' are not."""
  w = tmp_path / "s0"
  w.mkdir()
  (w / "eval_summary.json").write_text(json.dumps({
      "before": {"sepr": 0.25, "n": 2}, "after": {"sepr": 0.75, "n": 2, "judge/failures": 1.0},
      "minutes": 1.0}))
  (w / "eval_rows.json").write_text(json.dumps({
      "before": [{"id": "a", "sepr": 0.0}, {"id": "b", "sepr": 0.5}],
      "after": [{"id": "a", "sepr": 1.0}, {"id": "b", "sepr": 0.5}]}))
  rows = [{"step": 0, "stage": "eval_before", "sepr": 0.25},
          {"step": 1, "stage": "rl", "sepr": 9.0, "reward/total": 1.0},
          {"step": 1, "stage": "eval_after", "sepr": 0.75}]
  (w / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  runs = {"main": {0: seeds.load_run(w)}}
  assert seeds.metric_names(runs) == list(seeds.METRICS) + ["sepr"]
  st = seeds.summarise(runs, resamples=50)["arms"]["main"]["metrics"]["sepr"]
  assert st["gain_per_seed"] == [0.5] and st["paired_examples"] == 2
  assert seeds._curve(w, "sepr") == ([0, 1], [0.25, 0.75])    # pylint: disable=protected-access
  assert seeds._curve(w, "reward/total") == ([1], [1.0])       # pylint: disable=protected-access


def test_sft_only_runs_are_labelled_final(tmp_path):
  """Runs without RL (APEX's executor) have one evaluation: no gain, and no 'after RL' label."""
  w = tmp_path / "s0"
  w.mkdir()
  (w / "eval_summary.json").write_text(json.dumps({"before": None, "after": {"em": 0.5, "n": 2},
                                                   "minutes": 1.0}))
  (w / "eval_rows.json").write_text(json.dumps({"before": None, "after": [
      {"id": "a", "em": 1.0}, {"id": "b", "em": 0.0}]}))
  (w / "metrics.jsonl").write_text(json.dumps({"step": 1, "stage": "eval_after", "em": 0.5}))
  runs = {"main": {0: seeds.load_run(w)}}
  text = seeds.write_markdown(seeds.summarise(runs, 50), tmp_path / "m.md", "t")
  assert "| metric | warm-up (before RL) | final |" in text and "after RL" not in text
  assert "| em | – | 0.500 ± 0.000 | – | – | – |" in text


def test_contrast_of_two_metrics_of_one_evaluation_by_hand(tmp_path):
  """--contrast=top2_map-map: per seed the difference of the two means, and the bootstrap over
  the (seed, example) differences, before and after RL."""
  for s, (m1, m2) in enumerate([([0.5, 1.0], [0.25, 0.5]), ([1.0, 1.0], [0.5, 1.0])]):
    w = tmp_path / f"s{s}"
    w.mkdir()
    rows = [{"id": f"q{i}", "map": a, "top2_map": b} for i, (a, b) in enumerate(zip(m1, m2))]
    mean = {"map": float(np.mean(m1)), "top2_map": float(np.mean(m2))}
    (w / "eval_summary.json").write_text(json.dumps({"before": mean, "after": mean,
                                                     "minutes": 1.0}))
    (w / "eval_rows.json").write_text(json.dumps({"before": rows, "after": rows}))
  runs = {"main": {s: seeds.load_run(tmp_path / f"s{s}") for s in (0, 1)}}
  con = seeds.contrasts(runs, ["top2_map-map"], resamples=100)["top2_map-map"]["main"]
  assert con["after"]["diff_per_seed"] == pytest.approx([-0.375, -0.25])
  assert con["after"]["diff_ci"][0] == pytest.approx((-0.25 - 0.5 + -0.5 + 0.0) / 4)
  assert con["after"]["paired_examples"] == 4 and "before" in con
  summary = seeds.summarise(runs, 50)
  summary["contrasts"] = seeds.contrasts(runs, ["top2_map-map"], 50)
  text = seeds.write_markdown(summary, tmp_path / "m.md", "t")
  assert "| top2_map-map | main | after RL | -0.312 ± 0.088 |" in text
  with pytest.raises(ValueError, match="METRIC_A-METRIC_B"):
    seeds.contrasts(runs, ["map"])


def test_seed_level_section_of_a_committed_table(tmp_path):
  """--summarize=seeds.md (no seeds.json committed): a t interval over seeds per gain, arm
  difference and contrast row from its mean ± std, equal to t_interval of the per-seed values
  up to the table's rounding."""
  gains = {0: ([0, 0, 1, 1], [1, 0, 1, 1]), 1: ([0, 1, 1, 1], [1, 1, 1, 1]),
           2: ([0, 0, 0, 1], [0, 0, 0, 1])}
  runs = {}
  for arm, extra in (("a", 0), ("b", 1)):
    for s, (b, a) in gains.items():
      wd = tmp_path / arm / f"s{s}"
      _fake_run(wd, b, [1] * extra * 2 + a[extra * 2:])
      runs.setdefault(arm, {})[s] = seeds.load_run(wd)
  summary = seeds.summarise(runs, 100)
  text = seeds.write_markdown(summary, tmp_path / "seeds.md", "t")
  section = seeds.seed_level_section(text, rerun="python -m x --seeds=0,1,2")
  assert "per-example raw was not committed" in section and "`python -m x --seeds=0,1,2`" in section
  per_seed = summary["arms"]["a"]["metrics"]["em"]["gain_per_seed"]      # 0.25, 0.0, 0.0
  _, lo, hi = seeds.t_interval(per_seed)
  row = next(l for l in section.splitlines() if l.startswith("| a | em |"))
  got = [float(x) for x in row.split("| [")[2].split("]")[0].split(", ")]
  assert got == pytest.approx([lo, hi], abs=0.0005 * (1 + 4.303 / 3 ** 0.5) + 5e-4)
  assert row.endswith("| includes 0 |") and "| 3 |" in row
  diff = summary["comparison"]["em"]["diff_per_seed"]
  row = next(l for l in section.splitlines() if l.startswith("| b - a | em |"))
  got = [float(x) for x in row.split("| [")[2].split("]")[0].split(", ")]
  assert got == pytest.approx(seeds.t_interval(diff)[1:], abs=2e-3)
  # written into the file, replacing an earlier section; idempotent
  seeds.annotate_markdown(tmp_path / "seeds.md", tmp_path)
  once = (tmp_path / "seeds.md").read_text()
  assert seeds.main([f"--summarize={tmp_path / 'seeds.md'}"]) == 0
  assert (tmp_path / "seeds.md").read_text() == once and once.startswith(text.rstrip("\n"))
  assert once.count(seeds.SEED_LEVEL_HEADING) == 1
  # an SFT-only table has no gain: the section says so
  w = tmp_path / "sft"
  w.mkdir()
  (w / "eval_summary.json").write_text(json.dumps({"before": None, "after": {"em": 0.5},
                                                   "minutes": 1.0}))
  (w / "eval_rows.json").write_text(json.dumps({"before": None, "after": _rows([1, 0])}))
  sft = seeds.write_markdown(seeds.summarise({"main": {0: seeds.load_run(w)}}, 50),
                             tmp_path / "sft.md", "t")
  assert "no interval applies" in seeds.seed_level_section(sft)


def _finished_run(workdir, config):
  """A finished run directory whose fingerprint.json was made from `config` (as trainer.run
  records it)."""
  from rlrag_jax import fingerprint
  _fake_run(workdir, [0, 1], [1, 1])
  fingerprint.record(workdir, fingerprint.check(workdir, config), resume=False)


def test_a_finished_run_is_reused_only_when_its_fingerprint_matches(tmp_path):
  flags = {"seed": 0, "workdir": "x", "rl": {"lr": 1e-4, "steps": 60}}
  wd = tmp_path / "main" / "seed_0"
  _finished_run(wd, flags)
  assert seeds.job_state(wd, {**flags, "workdir": "elsewhere"})[0] == "done"   # not counted
  assert seeds.job_state(wd, {**flags, "new_key": 1})[0] == "done"   # declared since: upgraded
  state, check = seeds.job_state(wd, {**flags, "rl": {"lr": 1e-3, "steps": 60}})
  assert state == "stale" and check.differs == {"rl.lr": (1e-4, 1e-3)}
  (wd / "eval_summary.json").unlink()                    # killed before it finished
  assert seeds.job_state(wd, flags)[0] == "todo"
  assert seeds.job_state(wd, {**flags, "seed": 1})[0] == "stale"
  legacy = tmp_path / "main" / "seed_1"                  # made before fingerprints
  _fake_run(legacy, [0, 1], [1, 1])
  assert seeds.job_state(legacy, flags)[0] == "done"
  assert seeds.job_state(tmp_path / "nothing", flags)[0] == "todo"


def test_run_all_reruns_a_seed_of_other_flags_and_keeps_the_old_run(tmp_path, capsys):
  from rlrag_jax import fingerprint
  old = {"seed": 0, "rl": {"lr": 1e-4}}
  new = {"seed": 0, "rl": {"lr": 1e-3}}
  stale, same, legacy = (tmp_path / "main" / f"seed_{s}" for s in (0, 1, 2))
  _finished_run(stale, old)
  _finished_run(same, {**new, "seed": 1})
  _fake_run(legacy, [0, 1], [1, 1])
  ran = []

  def runner(cmd, log_path):
    ran.append(cmd)
    _finished_run(log_path.parent, new)
    return 0
  jobs = [("main", 0, stale, ["train", "0"], new), ("main", 1, same, ["train", "1"],
                                                     {**new, "seed": 1}),
          ("main", 2, legacy, ["train", "2"], {**new, "seed": 2})]
  out = seeds.run_all(jobs, runner=runner)
  assert ran == [["train", "0"]] and [r[:3] for r in out] == [("main", 0, 0)]
  moved = tmp_path / "main" / f"seed_0.stale-{fingerprint.fingerprint(old)[:12]}"
  assert json.loads((moved / "fingerprint.json").read_text())["config"] == old   # kept whole
  assert (moved / "eval_summary.json").exists()
  assert fingerprint.read(stale)["fingerprint"] == fingerprint.fingerprint(new)
  text = capsys.readouterr().out
  assert f"moved it to {moved} and training again" in text and "rl.lr: 0.0001 -> 0.001" in text
  assert "seed 1: done already" in text
  assert "seed 2: done already" in text and "cannot be checked" in text
  assert seeds.load_run(same)["fingerprint"] == fingerprint.fingerprint({**new, "seed": 1})
  assert seeds.load_run(legacy)["fingerprint"] is None


def _arm_runs(values_by_seed, shuffle_seed=None):
  """{seed: run} with rows {id, em} for the given per-question values, the rows of each
  evaluation point in a shuffled order when `shuffle_seed` is given."""
  rng = np.random.default_rng(shuffle_seed)
  out = {}
  for s, (before, after) in values_by_seed.items():
    rows = {}
    for point, vals in (("before", before), ("after", after)):
      r = [{"id": f"q{i}", "em": float(v)} for i, v in enumerate(vals)]
      if shuffle_seed is not None:
        r = [r[i] for i in rng.permutation(len(r))]
      rows[point] = r
    out[s] = {"before": {"em": float(np.mean(before))}, "after": {"em": float(np.mean(after))},
              "rows": rows, "minutes": 1.0}
  return out


def test_rows_pair_by_question_id_not_by_position(monkeypatch):
  """One arm's rows shuffled (as another evaluation order would give them): every gain and arm
  difference, each interval included, is unchanged. A summary that paired rows by position
  fails this: with its pairing the shuffled table differs (checked below, so the test has the
  power to catch it)."""
  rng = np.random.default_rng(0)
  a = {s: (rng.integers(0, 2, 12), rng.integers(0, 2, 12)) for s in (0, 1, 2)}
  b = {s: (rng.integers(0, 2, 12), rng.integers(0, 2, 12)) for s in (0, 1, 2)}
  plain = {"A": _arm_runs(a), "B": _arm_runs(b)}
  shuffled = {"A": _arm_runs(a), "B": _arm_runs(b, shuffle_seed=1)}
  base = seeds.summarise(plain, 300)
  assert seeds.summarise(shuffled, 300) == base
  # the arm difference by hand: per seed mean over questions of B - A after RL, paired by id
  per_seed = [float(np.mean(b[s][1] - a[s][1])) for s in (0, 1, 2)]
  assert base["comparison"]["em"]["diff_per_seed"] == pytest.approx(per_seed)
  tables = [{f"q{i}": float(d) for i, d in enumerate(b[s][1] - a[s][1])} for s in (0, 1, 2)]
  assert base["comparison"]["em"]["diff_ci_crossed"] == seeds.crossed_bootstrap(tables, 300)

  def by_position(rows_a, rows_b, metric):
    return [float(y[metric]) - float(x[metric]) for x, y in zip(rows_a, rows_b)
            if metric in x and metric in y]
  monkeypatch.setattr(seeds, "pair_rows", by_position)
  assert seeds.summarise(shuffled, 300)["comparison"] != seeds.summarise(plain, 300)["comparison"]


def test_seeds_json_records_the_code_of_each_run_and_the_table_says_it(tmp_path):
  """load_run reads the code versions a run's starts recorded (fingerprint.json); seeds.md
  names them, and says so when runs of several commits are mixed or none was recorded."""
  flags = {"seed": 0, "rl": {"lr": 1e-4}}
  wd = tmp_path / "main" / "seed_0"
  _finished_run(wd, flags)
  now = fingerprint.code_version()
  run = seeds.load_run(wd)
  assert run["code"] == ([now] if now else [])
  record = {"runs": {"main": {"0": {"code": [{"commit": "a" * 40, "dirty": False}]},
                              "1": {"code": [{"commit": "b" * 40, "dirty": True}]},
                              "2": {}}}}
  line = seeds.provenance_line(record)
  assert "aaaaaaaaaaaa (main 0)" in line and "bbbbbbbbbbbb (dirty) (main 1)" in line
  assert "unrecorded (main 2)" in line and "More than one code version" in line
  assert "not recorded" in seeds.provenance_line({"runs": {"main": {"0": {}}}})


def test_reusing_a_run_made_by_other_code_warns(tmp_path, capsys, monkeypatch):
  flags = {"seed": 0, "rl": {"lr": 1e-4}}
  wd = tmp_path / "main" / "seed_0"
  monkeypatch.setattr(fingerprint, "_CODE_VERSION", {"commit": "a" * 40, "dirty": False})
  _finished_run(wd, flags)
  seeds.run_all([("main", 0, wd, ["train"], flags)], runner=lambda c, l: 1 / 0)
  assert "WARNING" not in capsys.readouterr().out        # same commit, clean: reused quietly
  monkeypatch.setattr(fingerprint, "_CODE_VERSION", {"commit": "b" * 40, "dirty": False})
  seeds.run_all([("main", 0, wd, ["train"], flags)], runner=lambda c, l: 1 / 0)
  text = capsys.readouterr().out
  assert "done already" in text
  assert f"WARNING: main seed 0: reusing a run made by code {'a' * 12}, this is {'b' * 12}" in text
