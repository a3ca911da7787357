"""Run fingerprints: which keys count, what a run directory records, and the trainer refusing a
start into a run of another config (before anything is built: no training here; a legacy run
directory resuming is covered in test_train)."""
import json
import logging

import pytest

from configs import arena
from rlrag_jax import fingerprint


def _config(workdir, **rl):
  c = arena.get_config("")
  c.workdir = str(workdir)
  c.rl.update(rl)
  return c


def test_the_fingerprint_counts_results_keys_only(tmp_path):
  a = _config(tmp_path / "a")
  fp = fingerprint.fingerprint(a)
  b = _config(tmp_path / "elsewhere")
  b.log_every, b.compile_cache, b.export_hf = 1, "", False
  b.checkpoint.every, b.mesh.data, b.distributed.process_id = 7, 1, 3
  assert fingerprint.fingerprint(b) == fp                      # all EXCLUDED
  c = _config(tmp_path / "a", lr=1e-3)
  c.seed, c.model.remat = 1, True
  assert fingerprint.fingerprint(c) != fp
  assert fingerprint.differences(a, c) == {"model.remat": (False, True), "rl.lr": (1e-4, 1e-3),
                                           "seed": (0, 1)}
  d = fingerprint.resolved(a)
  del d["rl"]["top_p"]                                          # a key the old config lacked
  assert fingerprint.differences(d, a) == {"rl.top_p": ("(absent)", 1.0)}


def test_a_new_run_records_its_config_and_fingerprint_and_keeps_the_first_config(tmp_path):
  wd = tmp_path / "run"
  a = _config(wd)
  assert fingerprint.check(wd, a).status == "new"
  (wd / "train.log").parent.mkdir()
  (wd / "train.log").write_text("")               # the seeds harness's log is not a run
  fingerprint.record(wd, fingerprint.verify(wd, a), resume=False)
  rec = json.loads((wd / "fingerprint.json").read_text())
  assert rec["fingerprint"] == fingerprint.fingerprint(a)
  assert rec["config"] == json.loads(a.to_json_best_effort()) == json.loads(
      (wd / "config.json").read_text())
  assert set(rec["excluded"]) == set(fingerprint.EXCLUDED)
  assert [(s["status"], s["resume"]) for s in rec["starts"]] == [("new", False)]
  # each start says which host made it: results depend on its CPU (docs/reliability.md)
  host = rec["starts"][0]["host"]
  assert host == fingerprint.host() and host["cores"] >= 1 and host["cpu"]
  assert set(host["vector"]) <= set(fingerprint.VECTOR_FLAGS) and host["device"].startswith("cpu")
  again = fingerprint.verify(wd, _config(wd))
  assert again.status == "same"
  fingerprint.record(wd, again, resume=True)
  assert [s["status"] for s in fingerprint.read(wd)["starts"]] == ["new", "same"]


def test_force_records_the_differing_keys_and_makes_the_new_config_the_runs(tmp_path, caplog):
  wd = tmp_path / "run"
  first = _config(wd)
  fingerprint.record(wd, fingerprint.verify(wd, first), resume=False)
  b = _config(wd, lr=1e-3, steps=80)
  with caplog.at_level(logging.WARNING, logger="rlrag_jax.fingerprint"):
    c = fingerprint.verify(wd, b, force=True)
  assert "--force" in caplog.text and "rl.lr: 0.0001 -> 0.001" in caplog.text
  fingerprint.record(wd, c, resume=True)
  rec = fingerprint.read(wd)
  assert rec["fingerprint"] == fingerprint.fingerprint(b)
  assert rec["starts"][-1]["status"] == "forced"
  assert rec["starts"][-1]["differs"] == {"rl.lr": [1e-4, 1e-3], "rl.steps": [60, 80]}
  # config.json keeps the first start's config; the forced config is the directory's now.
  assert json.loads((wd / "config.json").read_text())["rl"]["lr"] == 1e-4
  assert fingerprint.verify(wd, b).status == "same"


def test_keys_added_or_removed_since_the_run_started_are_accepted_with_a_warning(tmp_path,
                                                                               caplog):
  """A newer rlrag_jax declares a key the run's recorded config lacks (its default is what the
  run did) and drops one it had: not a mismatch, a warning naming both; a changed shared key
  beside them still is one."""
  wd = tmp_path / "run"
  first = _config(wd)
  fingerprint.record(wd, fingerprint.verify(wd, first), resume=False)
  rec = fingerprint.read(wd)
  del rec["config"]["rl"]["top_p"]                        # declared since the run started
  rec["config"]["rl"]["retired_knob"] = 3                 # removed since
  rec["fingerprint"] = fingerprint.fingerprint(rec["config"])
  (wd / "fingerprint.json").write_text(json.dumps(rec))
  with caplog.at_level(logging.WARNING, logger="rlrag_jax.fingerprint"):
    c = fingerprint.verify(wd, _config(wd))
  assert c.status == "upgraded"
  assert c.differs == {"rl.retired_knob": (3, "(absent)"), "rl.top_p": ("(absent)", 1.0)}
  assert "rl.top_p: (absent) -> 1.0" in caplog.text and "rl.retired_knob: 3 -> (absent)" in caplog.text
  fingerprint.record(wd, c, resume=True)
  assert fingerprint.read(wd)["starts"][-1]["status"] == "upgraded"
  assert fingerprint.verify(wd, _config(wd)).status == "same"
  rec = fingerprint.read(wd)
  del rec["config"]["rl"]["top_p"]
  rec["fingerprint"] = fingerprint.fingerprint(rec["config"])
  (wd / "fingerprint.json").write_text(json.dumps(rec))
  with pytest.raises(fingerprint.ConfigMismatch, match="rl.lr: 0.0001 -> 0.001"):
    fingerprint.verify(wd, _config(wd, lr=1e-3))


def test_a_directory_made_before_fingerprints_is_accepted_with_a_warning(tmp_path, caplog):
  wd = tmp_path / "run"
  (wd / "checkpoints").mkdir(parents=True)
  old = _config(wd, lr=3e-4)
  (wd / "config.json").write_text(old.to_json_best_effort(indent=2))   # today's code wrote this
  a = _config(wd)
  with caplog.at_level(logging.WARNING, logger="rlrag_jax.fingerprint"):
    c = fingerprint.verify(wd, a)
  assert c.status == "unchecked"
  assert "no fingerprint.json" in caplog.text and "cannot be checked" in caplog.text
  assert "differs from this config in 1 key(s)" in caplog.text and "rl.lr: 0.0003" in caplog.text
  fingerprint.record(wd, c, resume=True)
  assert fingerprint.read(wd)["starts"][-1]["status"] == "unchecked"
  assert json.loads((wd / "config.json").read_text())["rl"]["lr"] == 3e-4    # left as it was
  assert fingerprint.check(wd, a).status == "same"


def test_the_trainer_refuses_a_run_directory_of_another_config_naming_the_keys(tmp_path):
  from rlrag_jax import trainer
  wd = tmp_path / "run"
  fingerprint.record(wd, fingerprint.verify(wd, _config(wd)), resume=False)
  before = sorted(p.name for p in wd.iterdir())
  b = _config(wd, lr=1e-3, kl_estimator="k3")
  b.seed = 4
  with pytest.raises(fingerprint.ConfigMismatch) as e:
    trainer.run(b, resume=True, progress=False)
  msg = str(e.value)
  assert f"{wd}: this run directory holds a run of another config" in msg
  for line in ('  rl.kl_estimator: "k2" -> "k3"', "  rl.lr: 0.0001 -> 0.001", "  seed: 0 -> 4"):
    assert line in msg
  assert "3 differing key(s)" in msg and "--force" in msg
  assert sorted(p.name for p in wd.iterdir()) == before           # nothing written or built


def test_config_from_argv_resolves_as_the_train_command_does(tmp_path):
  from rlrag_jax.train import config_from_argv
  c = config_from_argv(["--config=configs/arena.py", "--config.seed=3", "--config.rl.lr=0.001",
                        f"--config.workdir={tmp_path}", "--quiet", "--resume", "--force"])
  want = _config(tmp_path, lr=0.001)
  want.seed = 3
  assert fingerprint.fingerprint(c) == fingerprint.fingerprint(want)
  assert c.workdir == str(tmp_path)


def test_the_host_record_carries_the_xla_flags_it_ran_with(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_max_isa=AVX2")
  assert fingerprint.host()["xla_flags"] == "--xla_cpu_max_isa=AVX2"


def test_each_start_records_the_code_version_and_a_resume_by_other_code_warns(tmp_path, caplog,
                                                                               monkeypatch):
  """The code (git commit, dirty flag) is recorded per start and for the run, beside the config
  hash and not in it: the same config at another commit keeps its fingerprint, but resuming
  the run there warns, naming both commits."""
  import subprocess
  head = subprocess.run(["git", "-C", str(fingerprint.pathlib.Path(fingerprint.__file__).parent),
                         "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
  now = fingerprint.code_version(refresh=True)
  assert now is None or now["commit"] == head            # None outside a git checkout
  wd = tmp_path / "run"
  monkeypatch.setattr(fingerprint, "_CODE_VERSION", {"commit": "a" * 40, "dirty": False})
  fingerprint.record(wd, fingerprint.verify(wd, _config(wd)), resume=False)
  rec = fingerprint.read(wd)
  assert rec["code"] == rec["starts"][0]["code"] == {"commit": "a" * 40, "dirty": False}
  with caplog.at_level(logging.WARNING, logger="rlrag_jax.fingerprint"):
    assert not fingerprint.verify(wd, _config(wd)).code_differs        # same commit, clean
    assert "made by code" not in caplog.text
    monkeypatch.setattr(fingerprint, "_CODE_VERSION", {"commit": "b" * 40, "dirty": True})
    c = fingerprint.verify(wd, _config(wd))
  assert c.status == "same" and c.code_differs                # the config hash is unchanged
  assert f"made by code {'a' * 12}, this is {'b' * 12} (dirty)" in caplog.text
  assert fingerprint.code_differs({"commit": "a", "dirty": False}, {"commit": "a", "dirty": True})
  assert fingerprint.code_differs(None, {"commit": "a", "dirty": False})
