"""TFDS builders: prepare from a tmp manual_dir of real lines, without TensorFlow, read back."""
import shutil
import sys

import pytest

from _deps import require

tfds = require("tensorflow_datasets")

from rlrag_jax.data import load_dataset  # pylint: disable=g-import-not-at-top
from rlrag_jax.data import tfds_builders
from rlrag_jax.data.schema import Context, Example, Step, Triple


def _head(src, dst, n):
  dst.parent.mkdir(parents=True, exist_ok=True)
  with open(src, encoding="utf-8") as f:
    dst.write_text("".join(next(f) for _ in range(n)), encoding="utf-8")


@pytest.mark.data
def test_build_hotpotqa_without_tensorflow(shared_data_dir, tmp_path):
  tf_before = "tensorflow" in sys.modules
  manual = tmp_path / "manual"
  _head(shared_data_dir / "hotpotqa" / "dev.jsonl", manual / "dev.jsonl", 6)
  _head(shared_data_dir / "hotpotqa" / "train.jsonl", manual / "train.jsonl", 3)
  builder = tfds_builders.build("hotpotqa", manual, tmp_path / "tfds")
  assert {s: builder.info.splits[s].num_examples for s in builder.info.splits} == {
      "dev": 6, "train": 3}
  for split in ("dev", "train"):
    want = load_dataset("hotpotqa", path=manual / f"{split}.jsonl")
    assert tfds_builders.read_examples(builder, split) == want
    assert tfds_builders.read_examples("rlrag_hotpotqa", split,
                                       data_dir=str(tmp_path / "tfds")) == want
  # The raw first record survives intact (hand-read values).
  ex = tfds_builders.read_examples(builder, "dev")[0]
  assert ex.id == "5ae4f3c455429960a22e0221"
  assert ex.gold_ids == ["Dick Biddle", "Colgate University"]
  assert ex.context("Dick Biddle").sentences[0] == ("Dick Biddle (born November 26, 1947) is a "
                                                    "former American football player and coach.")
  if not tf_before:
    assert "tensorflow" not in sys.modules


@pytest.mark.data
def test_build_2wiki_and_musique_from_data_dir_layout(shared_data_dir, tmp_path):
  """manual_dir may have the RLRAG_DATA_DIR layout (<folder>/<split>.jsonl)."""
  manual = tmp_path / "manual"
  src = (shared_data_dir / "2wikimultihopqa" / "dev.jsonl").read_text("utf-8").splitlines(True)
  (manual / "2wikimultihopqa").mkdir(parents=True)
  # Line 19 (a repeated context) and line 350 (a sentence index out of range).
  (manual / "2wikimultihopqa" / "dev.jsonl").write_text(src[0] + src[18] + src[349], "utf-8")
  _head(shared_data_dir / "musique" / "dev.jsonl", manual / "musique" / "dev.jsonl", 2)
  _head(shared_data_dir / "musique" / "dev_no_paragraphs.jsonl",
        manual / "musique" / "dev_no_paragraphs.jsonl", 3)
  out = tmp_path / "tfds"
  wiki = tfds_builders.build("2wiki", manual, out)
  got = tfds_builders.read_examples(wiki, "dev")
  assert got == load_dataset("2wiki", path=manual / "2wikimultihopqa" / "dev.jsonl")
  assert got[0].triples[1] == Triple("Yuen Woo-ping", "father", "Yuen Siu-tien")
  assert got[2].meta["supporting_facts"] == [["The Monocle Laughs", 3]]
  mus = tfds_builders.build("musique", manual, out)
  assert set(mus.info.splits) == {"dev", "dev_no_paragraphs"}
  for split in ("dev", "dev_no_paragraphs"):
    assert tfds_builders.read_examples(mus, split) == load_dataset(
        "musique", split=split, path=manual / "musique")
  assert tfds_builders.read_examples(mus, "dev_no_paragraphs")[0].decomposition[1] == Step(
      "#1 >> spouse", "Miquette Giraudy", ["5"])


def test_features_round_trip_with_nested_lists():
  ex = Example(
      id="q", question="Who?", answers=["a", "b"], gold_ids=["c2", "c1"], hops=3, kind="k",
      source="world", meta={"x": [1, 2], "y": "é"},
      contexts=[Context("c1", "T1", "s1 s2", ["s1", "s2"], [Triple("h", "r", "t")]),
                Context("c2", "T2", "", [], []),
                Context("c3", "T3", "u", ["u"], [Triple("a", "b", "c"), Triple("d", "e", "f")])],
      decomposition=[Step("q1", "a1", ["c1"]), Step("#1 q2", "a2", []),
                     Step("q3", "a3", ["c2", "c3"])],
      triples=[Triple("x", "y", "z")])
  assert _serialize_and_parse(ex) == ex
  empty = Example(id="e", question="?", answers=["x"])
  assert _serialize_and_parse(empty) == empty


def _serialize_and_parse(ex):
  """Example -> features -> serialized proto bytes -> numpy features -> Example (no TF)."""
  features = tfds_builders.example_features()
  serializer = tfds.core.example_serializer.ExampleSerializer(features.get_serialized_info())
  data = serializer.serialize_example(
      features.encode_example(tfds_builders.example_to_features(ex)))
  return tfds_builders.features_to_example(features.deserialize_example_np(data))


def test_missing_manual_files(tmp_path):
  (tmp_path / "manual").mkdir()
  (tmp_path / "manual" / "dev.jsonl").write_text("{}\n")   # not a bamboogle split
  with pytest.raises(FileNotFoundError, match=r"bamboogle.*test\.jsonl"):
    tfds_builders.build("bamboogle", tmp_path / "manual", tmp_path / "tfds")
  assert "Nothing is downloaded" in tfds_builders.Bamboogle.MANUAL_DOWNLOAD_INSTRUCTIONS
