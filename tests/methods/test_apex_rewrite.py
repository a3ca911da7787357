"""MuSiQue's symbolic decomposition steps as questions, counted; the command on the samples."""
import json

import pytest

from rlrag_jax.methods.apex import plans, rewrite


def test_rewrite_step_kinds():
  assert rewrite.rewrite_step("Akinoshu Kenji >> place of birth") == (
      "Where was Akinoshu Kenji born?", "template")
  assert rewrite.rewrite_step("#1 >> spouse") == ("Who is the spouse of #1?", "template")
  assert rewrite.rewrite_step("Humboldt Peak (#1 ) >> part of") == (
      "What is Humboldt Peak (#1) part of?", "template")
  assert rewrite.rewrite_step("WILM >> licensed to broadcast to") == (
      "What is the licensed to broadcast to of WILM?", "generic")
  assert rewrite.rewrite_step("Who directed Inception?") == ("Who directed Inception?", "natural")
  for bad in (">> spouse", "#1 >>", "a >> b >> c"):
    assert rewrite.rewrite_step(bad) == (bad, "failed")
  assert rewrite.rewrite_step(None)[1] == "failed"
  steps, counts = rewrite.rewrite_plan(["#1 >> country", "Who is X?", ">> y"])
  assert steps[0] == "Which country is #1 in?" and dict(counts) == {
      "template": 1, "natural": 1, "failed": 1}


def test_command_on_the_musique_samples(shared_data_dir, tmp_path):
  out = tmp_path / "plans.jsonl"
  counts = rewrite.main(["--split", "dev", "--path", str(shared_data_dir / "musique"),
                         "--out", str(out)])
  got = rewrite.read_plans(out)
  assert len(got) == len(out.read_text().splitlines()) > 0
  assert counts["template"] > 0 and sum(counts.values()) == sum(len(v) for v in got.values())
  # Every rewritten plan parses as a plan, and no '>>' is left unless counted as failed.
  left = sum(">>" in s for steps in got.values() for s in steps)
  assert left == counts["failed"]
  for steps in got.values():
    assert not plans.parse(plans.render(steps), "q", max_steps=8).fallback


def test_read_plans_names_file_and_line(tmp_path):
  p = tmp_path / "bad.jsonl"
  p.write_text(json.dumps({"id": "a", "steps": ["x?"]}) + "\n" + json.dumps({"id": "b"}) + "\n")
  with pytest.raises(ValueError, match=r"bad.jsonl:2"):
    rewrite.read_plans(p)
