"""Every committed multi-seed table is what its committed raw regenerates, byte for byte: the
seeds.md tables from their seeds.json (`experiments.seeds --summarize`), the APEX pipeline's
from its per-seed summaries and notes. The README quotes these tables; a table edited by hand,
or code that changes a figure, fails here."""
import json
import pathlib

import pytest

from rlrag_jax.experiments import seeds

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"


def _seed_records() -> list:
  out = []
  for p in sorted(RESULTS.rglob("*.json")):
    try:
      rec = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
      continue
    if isinstance(rec, dict) and "runs" in rec and "summary" in rec:
      out.append(p)
  return out


RECORDS = _seed_records()


def test_the_committed_seed_tables_are_found():
  names = {str(p.relative_to(RESULTS)) for p in RECORDS}
  for expected in ("apex_planner/seeds.json", "r2ag/seeds.json", "sparkle/seeds.json",
                   "r2ag_long_warmup_fresh/seeds_1_to_5.json", "search_seeds/stage1.json"):
    assert expected in names


@pytest.mark.parametrize("source", RECORDS, ids=[str(p.relative_to(RESULTS)) for p in RECORDS])
def test_summarize_reproduces_the_committed_table(source, tmp_path):
  text = seeds.summarise_record(json.loads(source.read_text()), tmp_path, source.stem,
                                plot=False)
  assert text == source.with_suffix(".md").read_text()
  assert (tmp_path / source.name).read_text() == source.read_text()


def test_the_apex_pipeline_table_is_what_its_summaries_regenerate(tmp_path, monkeypatch):
  from rlrag_jax.methods.apex import pipeline
  folder = RESULTS / "apex_pipeline"
  monkeypatch.chdir(ROOT)                      # the table names the summaries by relative path
  files = [str(p.relative_to(ROOT)) for p in sorted(folder.glob("summary.seed_*.json"))]
  monkeypatch.setattr(pipeline, "_plot", lambda runs, path: None)
  agg = pipeline.aggregate(files, tmp_path, notes=(folder / "notes.md").read_text())
  assert agg["text"] == (folder / "pipeline_seeds.md").read_text()
