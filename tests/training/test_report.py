"""The final report names the stage that trained: an SFT-only run is not labelled "after RL"."""
import json

from rlrag_jax import config_base, runlog, settings
from rlrag_jax.training import report


def _config(sft_steps, rl_steps):
  c = config_base.trainer_config("stub", "unused")
  c.sft.steps, c.rl.steps = sft_steps, rl_steps
  return settings.Settings.from_config(c)


def test_final_label_follows_the_last_stage_that_ran():
  assert report.final_label(_config(400, 60)) == "after RL"
  assert report.final_label(_config(0, 60)) == "after RL"
  assert report.final_label(_config(400, 0)) == "after SFT"
  assert report.final_label(_config(0, 0)) == "untrained"


def test_sft_only_report_has_no_rl_rows(tmp_path):
  rlog = runlog.RunLog(tmp_path, tensorboard=False)
  rlog.write(1, "sft", {"loss": 2.0})
  rlog.write(2, "sft", {"loss": 1.5})
  after = {"all": {"em": 0.25, "n": 4}, "hops=2": {"em": 0.5, "n": 2},
           "rows": [{"id": "a", "em": 1.0, "completion": "x"}]}
  label = report.final_label(_config(2, 0))
  report.write_report(tmp_path, rlog, None, after, 60.0, label)
  rlog.close()
  table = (tmp_path / "eval_table.txt").read_text()
  assert "after SFT" in table and "RL" not in table
  summary = json.loads((tmp_path / "eval_summary.json").read_text())
  assert summary["before"] is None and summary["after"]["em"] == 0.25   # the key stays "after"
  assert not (tmp_path / "rl_curves.png").exists()
  rows = json.loads((tmp_path / "eval_rows.json").read_text())
  assert rows["after"] == [{"id": "a", "em": 1.0}]
