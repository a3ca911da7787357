"""TFDS builders for the raw QA files, prepared from a local `manual_dir` (no download).

One `GeneratorBasedBuilder` per dataset: `Hotpotqa` ('rlrag_hotpotqa'), `TwoWiki`
('rlrag_2wiki'), `Musique` ('rlrag_musique'), `Bamboogle` ('rlrag_bamboogle'). Each reuses
`loaders.iter_dataset`, so a built split holds exactly what `load_dataset` returns, in file order.

TensorFlow is not needed: build with `file_format='array_record'` and read with
`tfds.data_source` / `builder.as_data_source` (TFDS' tf-less path). Only one level of
`Sequence` is used, because nested (ragged) sequences need TensorFlow to serialise, so an
`Example` is flattened:

  contexts            Sequence({id, title, text, num_sentences, num_triples})
  context_sentences   all contexts' sentences, concatenated       # [sum num_sentences]
  context_triples     all contexts' triples, concatenated          # [sum num_triples]
  decomposition       Sequence({question, answer, num_gold_ids})
  decomposition_gold_ids                                           # [sum num_gold_ids]
  triples, answers, gold_ids, id, question, hops, kind, source; meta as a JSON string.

`example_to_features` / `features_to_example` convert both ways.

Build and read:
  b = Hotpotqa(data_dir=out_dir, file_format="array_record")
  b.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=raw_dir))
  examples = read_examples(b, "dev")
"""
from __future__ import annotations

import inspect
import json
import pathlib
from typing import Any, Iterator, Optional

import numpy as np
import tensorflow_datasets as tfds
from etils import epath

from rlrag_jax.data import loaders
from rlrag_jax.data.schema import Context, Example, Step, Triple

_Text = tfds.features.Text


def _triple_features() -> tfds.features.Sequence:
  return tfds.features.Sequence({"head": _Text(), "relation": _Text(), "tail": _Text()})


def example_features() -> tfds.features.FeaturesDict:
  """The flattened `schema.Example` (see module doc)."""
  return tfds.features.FeaturesDict({
      "id": _Text(),
      "question": _Text(),
      "answers": tfds.features.Sequence(_Text()),
      "gold_ids": tfds.features.Sequence(_Text()),
      "hops": np.int32,
      "kind": _Text(),
      "source": _Text(),
      "contexts": tfds.features.Sequence({
          "id": _Text(), "title": _Text(), "text": _Text(),
          "num_sentences": np.int32, "num_triples": np.int32}),
      "context_sentences": tfds.features.Sequence(_Text()),
      "context_triples": _triple_features(),
      "decomposition": tfds.features.Sequence({
          "question": _Text(), "answer": _Text(), "num_gold_ids": np.int32}),
      "decomposition_gold_ids": tfds.features.Sequence(_Text()),
      "triples": _triple_features(),
      "meta": _Text(),
  })


def _triples_dict(triples: list) -> dict:
  return {"head": [t.head for t in triples], "relation": [t.relation for t in triples],
          "tail": [t.tail for t in triples]}


def example_to_features(ex: Example) -> dict:
  """`Example` -> the nested dict of `example_features()`."""
  ctx_triples = [t for c in ex.contexts for t in c.triples]
  return {
      "id": ex.id, "question": ex.question, "answers": list(ex.answers),
      "gold_ids": list(ex.gold_ids), "hops": ex.hops, "kind": ex.kind, "source": ex.source,
      "contexts": {"id": [c.id for c in ex.contexts], "title": [c.title for c in ex.contexts],
                   "text": [c.text for c in ex.contexts],
                   "num_sentences": [len(c.sentences) for c in ex.contexts],
                   "num_triples": [len(c.triples) for c in ex.contexts]},
      "context_sentences": [s for c in ex.contexts for s in c.sentences],
      "context_triples": _triples_dict(ctx_triples),
      "decomposition": {"question": [s.question for s in ex.decomposition],
                        "answer": [s.answer for s in ex.decomposition],
                        "num_gold_ids": [len(s.gold_ids) for s in ex.decomposition]},
      "decomposition_gold_ids": [g for s in ex.decomposition for g in s.gold_ids],
      "triples": _triples_dict(ex.triples),
      "meta": json.dumps(ex.meta, ensure_ascii=False),
  }


def _s(x: Any) -> str:
  return x.decode("utf-8") if isinstance(x, bytes) else str(x)


def _strs(xs) -> list:
  return [_s(x) for x in xs]


def _triples(d: dict) -> list:
  return [Triple(_s(h), _s(r), _s(t)) for h, r, t in zip(d["head"], d["relation"], d["tail"])]


def _split_by(flat: list, counts) -> Iterator[list]:
  start = 0
  for n in counts:
    yield flat[start:start + int(n)]
    start += int(n)


def features_to_example(d: dict) -> Example:
  """A record read back from TFDS (bytes or str leaves) -> `Example`."""
  c = d["contexts"]
  sentences = _split_by(_strs(d["context_sentences"]), c["num_sentences"])
  ctx_triples = _split_by(_triples(d["context_triples"]), c["num_triples"])
  contexts = [Context(id=_s(i), title=_s(t), text=_s(x), sentences=next(sentences),
                      triples=next(ctx_triples))
              for i, t, x in zip(c["id"], c["title"], c["text"])]
  dec = d["decomposition"]
  step_gold = _split_by(_strs(d["decomposition_gold_ids"]), dec["num_gold_ids"])
  steps = [Step(question=_s(q), answer=_s(a), gold_ids=next(step_gold))
           for q, a in zip(dec["question"], dec["answer"])]
  return Example(id=_s(d["id"]), question=_s(d["question"]), answers=_strs(d["answers"]),
                 contexts=contexts, gold_ids=_strs(d["gold_ids"]), decomposition=steps,
                 hops=int(d["hops"]), kind=_s(d["kind"]), source=_s(d["source"]),
                 triples=_triples(d["triples"]), meta=json.loads(_s(d["meta"])))


class _RawQABuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Shared body: one split per `<split>.jsonl` found in the manual dir."""

  DATASET = ""          # loaders name
  FOLDER = ""           # folder under the shared data dir, also accepted inside manual_dir
  HOMEPAGE = ""
  CITATION = ""
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Raw JSONL through rlrag_jax.data.loaders."}

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    splits = ", ".join(f"{s}.jsonl" for s in loaders.SPLITS.get(cls.DATASET, ()))
    cls.MANUAL_DOWNLOAD_INSTRUCTIONS = (
        f"Place the raw {cls.DATASET} JSONL files ({splits}; at least one) in the manual dir, "
        f"either directly or in a '{cls.FOLDER}/' subfolder (the layout of RLRAG_DATA_DIR, so "
        "the shared data folder itself works as manual_dir). Nothing is downloaded.")

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    # TFDS 4.9.10's own `code_path` reaches for the `importlib_resources` backport (declared only
    # for Python < 3.9) whenever the builder lives in a package; its fallback is this file.
    return epath.Path(inspect.getfile(cls))

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self, description=f"{self.DATASET} as rlrag_jax.data.schema.Example records.",
        features=example_features(), homepage=self.HOMEPAGE, citation=self.CITATION,
        disable_shuffling=True)

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    manual = pathlib.Path(str(dl_manager.manual_dir))
    splits = {}
    for split in loaders.SPLITS[self.DATASET]:
      for f in (manual / f"{split}.jsonl", manual / self.FOLDER / f"{split}.jsonl"):
        if f.is_file():
          splits[split] = self._generate_examples(f)
          break
    if not splits:
      raise FileNotFoundError(f"{self.name}: no split file in manual dir {manual}. "
                              f"{self.MANUAL_DOWNLOAD_INSTRUCTIONS}")
    return splits

  def _generate_examples(self, path: pathlib.Path):
    for i, ex in enumerate(loaders.iter_dataset(self.DATASET, path=path)):
      yield i, example_to_features(ex)


class Hotpotqa(_RawQABuilder):
  """HotpotQA, distractor setting."""
  name = "rlrag_hotpotqa"
  DATASET, FOLDER = "hotpotqa", "hotpotqa"
  HOMEPAGE = "https://hotpotqa.github.io/"
  CITATION = "Yang et al., HotpotQA, EMNLP 2018."


class TwoWiki(_RawQABuilder):
  """2WikiMultihopQA."""
  name = "rlrag_2wiki"
  DATASET, FOLDER = "2wiki", "2wikimultihopqa"
  HOMEPAGE = "https://github.com/Alab-NII/2wikimultihop"
  CITATION = "Ho et al., Constructing A Multi-hop QA Dataset ..., COLING 2020."


class Musique(_RawQABuilder):
  """MuSiQue-Ans (dev_no_paragraphs: decompositions only)."""
  name = "rlrag_musique"
  DATASET, FOLDER = "musique", "musique"
  HOMEPAGE = "https://github.com/StonyBrookNLP/musique"
  CITATION = "Trivedi et al., MuSiQue, TACL 2022."


class Bamboogle(_RawQABuilder):
  """Bamboogle (Press et al., self-ask)."""
  name = "rlrag_bamboogle"
  DATASET, FOLDER = "bamboogle", "bamboogle"
  HOMEPAGE = "https://github.com/ofirpress/self-ask"
  CITATION = "Press et al., Measuring and Narrowing the Compositionality Gap, 2022."


BUILDERS = {"hotpotqa": Hotpotqa, "2wiki": TwoWiki, "musique": Musique, "bamboogle": Bamboogle}


def build(dataset: str, manual_dir, data_dir, file_format: str = "array_record"):
  """Prepares `dataset` from the raw files in `manual_dir` into `data_dir`; returns the builder."""
  builder = BUILDERS[dataset](data_dir=str(data_dir), file_format=file_format)
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=str(manual_dir)))
  return builder


def read_examples(builder_or_name, split: str, data_dir: Optional[str] = None) -> list:
  """A built split as `list[Example]`, read through `tfds.data_source` (no TensorFlow)."""
  if isinstance(builder_or_name, str):
    source = tfds.data_source(builder_or_name, split=split, data_dir=data_dir)
  else:
    source = builder_or_name.as_data_source(split=split)
  return [features_to_example(source[i]) for i in range(len(source))]
