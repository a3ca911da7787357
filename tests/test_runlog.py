"""runlog's run-directory files: atomic writes and the metrics.jsonl reader's torn lines."""
import json
import logging
import os
import re

import pytest

from rlrag_jax import runlog


def test_atomic_write_replaces_whole_and_leaves_nothing_when_the_write_raises(tmp_path):
  path = tmp_path / "eval_summary.json"
  runlog.write_atomic(path, json.dumps({"after": {"em": 0.5}}))
  assert json.loads(path.read_text()) == {"after": {"em": 0.5}}
  # A lone surrogate cannot be encoded: the write raises after the temporary file was opened.
  with pytest.raises(UnicodeEncodeError):
    runlog.write_atomic(path, '{"after": {"em": 0.75, "note": "\ud800"}}')
  assert json.loads(path.read_text()) == {"after": {"em": 0.5}}     # the old file, whole
  assert os.listdir(tmp_path) == ["eval_summary.json"]              # no temporary left
  with pytest.raises(UnicodeEncodeError):
    runlog.write_atomic(tmp_path / "eval_rows.json", "\ud800")
  assert os.listdir(tmp_path) == ["eval_summary.json"]              # no new file, no partial


def _write_lines(path, lines):
  path.write_text("".join(line + "\n" for line in lines[:-1]) + lines[-1])


def test_a_torn_last_metrics_line_is_dropped_with_a_warning(tmp_path, caplog):
  rows = [{"step": s, "stage": "rl", "loss": 0.5 * s} for s in (1, 2, 3)]
  _write_lines(tmp_path / "metrics.jsonl",
               [json.dumps(r) for r in rows] + ['{"step": 4, "stage": "rl", "lo'])
  rlog = runlog.RunLog(tmp_path, tensorboard=False)
  with caplog.at_level(logging.WARNING, logger="rlrag_jax.runlog"):
    assert rlog.rows() == rows
  assert f"{tmp_path / 'metrics.jsonl'}:4: dropped a torn last line" in caplog.text
  rlog.truncate_after(2)                      # what --resume does: the torn line goes too
  assert (tmp_path / "metrics.jsonl").read_text() == "".join(
      json.dumps(r) + "\n" for r in rows[:2])
  caplog.clear()
  rlog.write(3, "rl", {"loss": 1.5})
  with caplog.at_level(logging.WARNING, logger="rlrag_jax.runlog"):
    assert rlog.rows() == rows
  assert not caplog.records


def test_a_bad_line_before_the_last_is_an_error_naming_file_and_line(tmp_path):
  path = tmp_path / "metrics.jsonl"
  _write_lines(path, ['{"step": 1, "stage": "rl"}', '{"step": 2, "sta',
                      '{"step": 3, "stage": "rl"}', ""])
  with pytest.raises(ValueError,
                     match=re.escape(f"{path}:2: not a JSON row") + ".*only the last line"):
    runlog.read_rows(path)
  _write_lines(path, ['{"step": 1, "stage": "rl"}', "[1, 2]", '{"step": 3, "stage": "rl"}'])
  with pytest.raises(ValueError, match=re.escape(f"{path}:2: not a JSON row (a JSON list")):
    runlog.RunLog(tmp_path, tensorboard=False).truncate_after(3)
  assert runlog.read_rows(tmp_path / "missing.jsonl") == []
