"""Loaders for the raw QA files (HotpotQA, 2Wiki, MuSiQue, Bamboogle, FlashRAG) and the corpora.

Every loader reads its JSONL file line by line and turns each record into one `schema.Example`:

  hotpotqa   context ids = titles; gold_ids = supporting-fact titles in order of first mention.
  2wiki      as hotpotqa, plus `evidences` -> Example.triples; hops = #gold titles (min 2).
  musique    context ids = str(paragraph idx); gold_ids from `is_supporting`; decomposition steps
             keep their '#k' references; hops from the id prefix ('3hop1' -> 3).
  bamboogle  `Question`, `Answer`; no contexts; hops = 2.
  flashrag   `id`, `question`, `golden_answers` (nq, triviaqa, popqa, ...); no contexts;
             hops = 1. PopQA's own release (`id`, `question`, `possible_answers` as a JSON
             string or list) reads the same way.
  FlashRAG's releases of hotpotqa / 2wiki / musique / bamboogle (`id`, `question`,
             `golden_answers`: no paragraphs) are read too: a record with `golden_answers` is
             parsed as FlashRAG's layout under the dataset's own name (source, hops: 2, or
             MuSiQue's id prefix), whichever layout the file's other records have.
  world      the embedded synthetic world (`rlrag_jax.data.world.build(seed=0)`).

Sentences are stripped; `Context.text` joins the non-empty ones with a space.

A malformed record raises `DataError`, whose message names the file, the 1-based line and the
field. With `skip_invalid=True` the record is skipped instead and counted in a `LoadReport`
(`load_dataset(..., return_report=True)` returns `(examples, report)`).

Two quirks of the real releases are repaired, not rejected, and noted in the report:
  * 2Wiki repeats a few distractor paragraphs verbatim under the same title: the copy is dropped
    (a repeated title with *different* sentences is an error: ids would be ambiguous).
  * 2Wiki has supporting facts whose sentence index is past the end of their paragraph (2 of
    the 462 dev records): the title still counts as gold; the pair is left out of
    `meta['supporting_facts']`. In HotpotQA the same defect is an error.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import logging
import os
import pathlib
import re
from typing import Any, Callable, Iterator, Literal, Optional, Sequence, Union, overload

from rlrag_jax.data import paths
from rlrag_jax.data.schema import Context, CorpusRecord, Example, Step, Triple

log = logging.getLogger(__name__)

PathLike = Union[str, os.PathLike]

DATASETS = ("hotpotqa", "2wiki", "musique", "bamboogle", "flashrag", "world")
# Folder under `paths.data_dir()`, the splits the shared samples hold, and the default split.
FOLDERS = {"hotpotqa": "hotpotqa", "2wiki": "2wikimultihopqa", "musique": "musique",
           "bamboogle": "bamboogle"}
SPLITS = {
    "hotpotqa": ("dev", "train"),
    "2wiki": ("dev",),
    "musique": ("dev", "train", "dev_no_paragraphs"),
    "bamboogle": ("test",),
    "flashrag": ("test",),
    "world": ("train", "dev", "test"),
}
_DEFAULT_SPLIT = {"hotpotqa": "dev", "2wiki": "dev", "musique": "dev", "bamboogle": "test",
                  "flashrag": "test", "world": "dev"}
# Other spellings accepted for `name`; nq/triviaqa are FlashRAG subsets under data_dir().
_ALIASES = {"2wikimultihopqa": "2wiki", "hotpot": "hotpotqa", "hotpot_qa": "hotpotqa"}
FLASHRAG_SUBSETS = ("nq", "triviaqa", "popqa")
CORPORA = {
    "2wiki": "corpus/2wikimultihopqa_hipporag_corpus.jsonl",
    "2wikimultihopqa_hipporag": "corpus/2wikimultihopqa_hipporag_corpus.jsonl",
    "wiki18": "corpus/wiki18_flashrag_sample.jsonl",
    "wiki18_flashrag": "corpus/wiki18_flashrag_sample.jsonl",
}
_PROGRESS_BYTES = 64 << 20   # show a tqdm bar for files larger than this


class DataError(ValueError):
  """A malformed record: the message names the file, the 1-based line and the field."""

  def __init__(self, path: PathLike, line: int, field: Optional[str], message: str):
    self.path, self.line, self.field = str(path), line, field
    where = f"{self.path}:{line}"
    super().__init__(f"{where}: field '{field}': {message}" if field else f"{where}: {message}")


@dataclasses.dataclass
class LoadReport:
  """What one load did: records read, loaded and skipped, and the quirks that were repaired."""
  path: str = ""
  num_records: int = 0                 # non-blank lines read
  num_loaded: int = 0
  num_skipped: int = 0
  errors: list = dataclasses.field(default_factory=list)   # str(DataError) of skipped records
  notes: list = dataclasses.field(default_factory=list)    # "path:line: what was repaired"


# ----------------------------------------------------------------------------- field access


class _Where:
  """Location of the record being parsed; builds `DataError`s and notes for it."""

  def __init__(self, path: pathlib.Path, line: int, row: int, report: LoadReport):
    self.path, self.line, self.row, self.report = path, line, row, report   # row: 0-based record

  def error(self, field: Optional[str], message: str) -> DataError:
    return DataError(self.path, self.line, field, message)

  def note(self, message: str) -> None:
    self.report.notes.append(f"{self.path}:{self.line}: {message}")


def _type_name(types) -> str:
  types = types if isinstance(types, tuple) else (types,)
  names = {str: "str", int: "int", bool: "bool", list: "list", dict: "object", type(None): "null",
           float: "float"}
  return " or ".join(names.get(t, t.__name__) for t in types)


def _check(value: Any, types, where: _Where, field: str) -> Any:
  """`value` if it has one of `types` (bool is not accepted as int), else DataError."""
  types = types if isinstance(types, tuple) else (types,)
  ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
  if not ok:
    raise where.error(field, f"expected {_type_name(types)}, found {type(value).__name__} "
                             f"{_short(value)}")
  return value


def _get(obj: dict, key: str, types, where: _Where, prefix: str = "", optional: bool = False):
  field = f"{prefix}.{key}" if prefix else key
  if key not in obj:
    if optional:
      return None
    raise where.error(field, f"missing (record has keys {sorted(obj)})")
  return _check(obj[key], types, where, field)


def _str_list(value: Any, where: _Where, field: str) -> list:
  _check(value, list, where, field)
  for i, v in enumerate(value):
    _check(v, str, where, f"{field}[{i}]")
  return value


def _short(value: Any, n: int = 60) -> str:
  s = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
  return s if len(s) <= n else s[:n - 3] + "..."


def _dedupe(items) -> list:
  return list(dict.fromkeys(items))


# ----------------------------------------------------------------------------- record parsers


def _parse_title_contexts(raw: Any, where: _Where, field: str = "context") -> list:
  """HotpotQA/2Wiki `[[title, [sentences]]]` -> list[Context] with id = title."""
  _check(raw, list, where, field)
  contexts, seen = [], {}
  for i, item in enumerate(raw):
    f = f"{field}[{i}]"
    _check(item, list, where, f)
    if len(item) != 2:
      raise where.error(f, f"expected [title, [sentences]], found a list of {len(item)} items")
    title = _check(item[0], str, where, f"{f}[0]")
    sentences = [s.strip() for s in _str_list(item[1], where, f"{f}[1]")]
    if title in seen:
      if contexts[seen[title]].sentences == sentences:
        where.note(f"{f}: dropped a verbatim repeat of context {title!r}")
        continue
      raise where.error(f, f"title {title!r} repeats context[{seen[title]}] with different "
                           "sentences; context ids (titles) must be unique")
    seen[title] = len(contexts)
    contexts.append(Context(id=title, title=title, text=" ".join(s for s in sentences if s),
                            sentences=sentences))
  return contexts


def _parse_supporting_facts(raw: Any, contexts: list, where: _Where, lenient_sentences: bool):
  """-> (gold titles in order of first mention, the valid [title, sent_id] pairs)."""
  _check(raw, list, where, "supporting_facts")
  by_title = {c.id: c for c in contexts}
  gold, pairs = [], []
  for i, sf in enumerate(raw):
    f = f"supporting_facts[{i}]"
    _check(sf, list, where, f)
    if len(sf) != 2:
      raise where.error(f, f"expected [title, sent_id], found a list of {len(sf)} items")
    title = _check(sf[0], str, where, f"{f}[0]")
    sent = _check(sf[1], int, where, f"{f}[1]")
    if title not in by_title:
      raise where.error(f"{f}[0]", f"title {title!r} is not in context "
                                   f"(titles: {_short(list(by_title), 200)})")
    n = len(by_title[title].sentences)
    if not 0 <= sent < n:
      msg = f"sentence index {sent} out of range for {title!r}, which has {n} sentences"
      if not lenient_sentences:
        raise where.error(f"{f}[1]", msg)
      where.note(f"{f}[1]: {msg}; kept the title as gold, dropped the pair")
    else:
      pairs.append([title, sent])
    gold.append(title)
  if not gold:
    raise where.error("supporting_facts", "expected at least one supporting fact, found none")
  return _dedupe(gold), pairs


def _parse_hotpotqa(rec: dict, where: _Where) -> Example:
  qid = _get(rec, "_id", str, where)
  question = _get(rec, "question", str, where)
  answer = _get(rec, "answer", str, where)
  kind = _get(rec, "type", str, where)
  level = _get(rec, "level", str, where, optional=True)
  contexts = _parse_title_contexts(_get(rec, "context", list, where), where)
  gold, pairs = _parse_supporting_facts(_get(rec, "supporting_facts", list, where), contexts,
                                        where, lenient_sentences=False)
  meta = {"supporting_facts": pairs}
  if level is not None:
    meta["level"] = level
  return Example(id=qid, question=question, answers=[answer], contexts=contexts, gold_ids=gold,
                 hops=2, kind=kind, source="hotpotqa", meta=meta)


def _parse_2wiki(rec: dict, where: _Where) -> Example:
  qid = _get(rec, "_id", str, where)
  question = _get(rec, "question", str, where)
  answer = _get(rec, "answer", str, where)
  kind = _get(rec, "type", str, where)
  contexts = _parse_title_contexts(_get(rec, "context", list, where), where)
  gold, pairs = _parse_supporting_facts(_get(rec, "supporting_facts", list, where), contexts,
                                        where, lenient_sentences=True)
  evidences = _get(rec, "evidences", list, where)
  triples = []
  for i, t in enumerate(evidences):
    f = f"evidences[{i}]"
    _str_list(t, where, f)
    if len(t) != 3:
      raise where.error(f, f"expected [subject, relation, object], found {len(t)} items")
    triples.append(Triple(*t))
  meta = {"supporting_facts": pairs}
  for key, types in (("entity_ids", str), ("answer_id", (str, type(None))),
                     ("evidences_id", list)):
    value = _get(rec, key, types, where, optional=True)
    if key in rec:
      meta[key] = value
  return Example(id=qid, question=question, answers=[answer], contexts=contexts, gold_ids=gold,
                 hops=max(2, len(gold)), kind=kind, source="2wiki", triples=triples, meta=meta)


_HOPS = re.compile(r"^(\d+)hop")


def _parse_musique(rec: dict, where: _Where) -> Example:
  qid = _get(rec, "id", str, where)
  question = _get(rec, "question", str, where)
  answer = _get(rec, "answer", str, where)
  aliases = _str_list(_get(rec, "answer_aliases", list, where), where, "answer_aliases")
  answerable = _get(rec, "answerable", bool, where, optional=True)

  contexts, gold = [], []
  paragraphs = _get(rec, "paragraphs", list, where, optional=True)
  for i, p in enumerate(paragraphs or []):
    f = f"paragraphs[{i}]"
    _check(p, dict, where, f)
    idx = _get(p, "idx", int, where, f)
    title = _get(p, "title", str, where, f)
    text = _get(p, "paragraph_text", str, where, f).strip()
    supporting = _get(p, "is_supporting", bool, where, f)
    if any(c.id == str(idx) for c in contexts):
      raise where.error(f"{f}.idx", f"idx {idx} repeats an earlier paragraph's idx")
    contexts.append(Context(id=str(idx), title=title, text=text, sentences=[text]))
    if supporting:
      gold.append(str(idx))

  steps, step_ids = [], []
  decomposition = _get(rec, "question_decomposition", list, where)
  ids = {c.id for c in contexts}
  for i, s in enumerate(decomposition):
    f = f"question_decomposition[{i}]"
    _check(s, dict, where, f)
    step_id = _get(s, "id", (int, str), where, f)
    support = _get(s, "paragraph_support_idx", (int, type(None)), where, f)
    step = Step(question=_get(s, "question", str, where, f),
                answer=_get(s, "answer", str, where, f),
                gold_ids=[] if support is None else [str(support)])
    if support is not None and paragraphs is not None and str(support) not in ids:
      raise where.error(f"{f}.paragraph_support_idx",
                        f"paragraph {support} is not among the paragraph idx values "
                        f"{sorted(int(c) for c in ids)}")
    steps.append(step)
    step_ids.append(step_id)
  if paragraphs is None:     # dev_no_paragraphs: the steps still name the original paragraphs
    gold = _dedupe(g for s in steps for g in s.gold_ids)

  m = _HOPS.match(qid)
  hops = int(m.group(1)) if m else max(1, len(steps))
  meta = {"decomposition_ids": step_ids, "has_paragraphs": paragraphs is not None}
  if answerable is not None:
    meta["answerable"] = answerable
  return Example(id=qid, question=question, answers=_dedupe([answer, *aliases]),
                 contexts=contexts, gold_ids=gold, decomposition=steps, hops=hops,
                 kind=qid.split("__")[0] if "__" in qid else "", source="musique", meta=meta)


def _parse_bamboogle(rec: dict, where: _Where) -> Example:
  question = _get(rec, "Question", str, where)
  answer = _get(rec, "Answer", str, where)
  return Example(id=f"bamboogle_{where.row}", question=question,
                 answers=[answer], hops=2, kind="compositional", source="bamboogle")


def _flashrag_parser(source: str) -> Callable[[dict, _Where], Example]:
  def parse(rec: dict, where: _Where) -> Example:
    qid = str(_get(rec, "id", (str, int), where))
    question = _get(rec, "question", str, where)
    field = "golden_answers"
    if field not in rec and "possible_answers" in rec:     # PopQA's own release
      field = "possible_answers"
      raw = _get(rec, field, (str, list), where)
      if isinstance(raw, str):
        try:
          raw = json.loads(raw)
        except ValueError:
          raise where.error(field, f"expected a JSON list of strings, found {raw[:60]!r}") \
              from None
        if not isinstance(raw, list):
          raise where.error(field, f"expected a JSON list of strings, found {type(raw).__name__}")
      answers = _str_list(raw, where, field)
    else:
      answers = _str_list(_get(rec, field, list, where), where, field)
    if not answers:
      raise where.error(field, "expected at least one answer, found an empty list")
    meta = {"metadata": rec["metadata"]} if isinstance(rec.get("metadata"), dict) else {}
    return Example(id=qid, question=question, answers=_dedupe(answers), hops=1, source=source,
                   meta=meta)
  return parse


_PARSERS = {"hotpotqa": _parse_hotpotqa, "2wiki": _parse_2wiki, "musique": _parse_musique,
            "bamboogle": _parse_bamboogle}


def _or_flashrag(dataset: str, native: Callable) -> Callable[[dict, _Where], Example]:
  """`native`, or FlashRAG's layout for a record that has `golden_answers` (FlashRAG ships
  every QA set that way: question + answers, no paragraphs), with the dataset's name as source
  and its usual hop count."""
  flash = _flashrag_parser(dataset)

  def parse(rec: dict, where: _Where) -> Example:
    if "golden_answers" not in rec:
      return native(rec, where)
    ex = flash(rec, where)
    m = _HOPS.match(ex.id) if dataset == "musique" else None
    ex.hops = int(m.group(1)) if m else 2
    return ex
  return parse


# The datasets whose records never carry passages: their questions are open-domain, answerable
# only from a corpus (`retrieval.corpus`), never from the pooled paragraphs of other datasets.
# (hotpotqa / 2wiki / musique carry their paragraphs in the layouts the shared samples hold, not
# in FlashRAG's; a config check cannot see a file's layout.)
OPEN_DOMAIN = ("flashrag", "bamboogle") + FLASHRAG_SUBSETS


def carries_passages(name: str, split: Optional[str] = None) -> bool:
  """Whether dataset `name` (split `split`) comes with its own paragraphs in the layouts the
  shared samples hold: False for the FlashRAG subsets, Bamboogle and MuSiQue's
  dev_no_paragraphs."""
  dataset, subset = _canonical(name)
  if dataset == "world":
    return True
  if (subset or dataset) in OPEN_DOMAIN:
    return False
  return not (dataset == "musique" and split == "dev_no_paragraphs")


# ----------------------------------------------------------------------------- file reading


def _read_jsonl(path: pathlib.Path, report: LoadReport) -> Iterator[tuple]:
  """Yields (1-based line, record dict or DataError) for every non-blank line, streaming."""
  size = path.stat().st_size
  bar = None
  if size > _PROGRESS_BYTES:
    from tqdm.auto import tqdm
    bar = tqdm(total=size, unit="B", unit_scale=True, desc=path.name, leave=False)
  try:
    with open(path, "rb") as f:
      for line_no, raw in enumerate(f, start=1):
        if bar is not None:
          bar.update(len(raw))
        if not raw.strip():
          continue
        report.num_records += 1
        try:
          rec = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
          yield line_no, DataError(path, line_no, None, f"not UTF-8 ({e.reason} at byte {e.start})")
          continue
        except json.JSONDecodeError as e:
          yield line_no, DataError(path, line_no, None,
                                   f"invalid JSON: {e.msg} at column {e.colno}")
          continue
        if not isinstance(rec, dict):
          rec = DataError(path, line_no, "<record>",
                          f"expected a JSON object, found {type(rec).__name__}")
        yield line_no, rec
  finally:
    if bar is not None:
      bar.close()


def _iter_parsed(path: pathlib.Path, parse: Callable, skip_invalid: bool,
                 report: LoadReport, with_lines: bool = False,
                 read: Callable = None) -> Iterator[Any]:
  """Parsed records of `path` (read by `read`, default JSONL), a malformed one raised or (with
  `skip_invalid`) counted in `report`; `with_lines`: (1-based line, record) pairs."""
  report.path = str(path)
  for line_no, rec in (read or _read_jsonl)(path, report):
    try:
      if isinstance(rec, DataError):
        raise rec
      out = parse(rec, _Where(path, line_no, report.num_records - 1, report))
    except DataError as e:
      if not skip_invalid:
        raise
      report.num_skipped += 1
      report.errors.append(str(e))
      continue
    report.num_loaded += 1
    yield (line_no, out) if with_lines else out
  if report.num_skipped:
    log.warning("%s: skipped %d malformed of %d records (first: %s)", path, report.num_skipped,
                report.num_records, report.errors[0])
  if report.notes:
    log.info("%s: repaired %d quirks (first: %s)", path, len(report.notes), report.notes[0])


# ----------------------------------------------------------------------------- public API


def _canonical(name: str) -> tuple:
  """name -> (dataset, flashrag subset or None)."""
  key = name.lower()
  key = _ALIASES.get(key, key)
  if key in FLASHRAG_SUBSETS:
    return "flashrag", key
  if key not in DATASETS:
    raise ValueError(f"unknown dataset {name!r}; expected one of {list(DATASETS)} "
                     f"(or a FlashRAG subset {list(FLASHRAG_SUBSETS)})")
  return key, None


def _missing_file(desc: str, path: pathlib.Path, given: bool = False) -> FileNotFoundError:
  """`given`: `path` came from the caller (a file or folder argument, config key data.dir),
  not from the data dir, which the message then does not name."""
  found = sorted(p.name for p in path.parent.glob("*.json*")) if path.parent.is_dir() else []
  origin = "path given by the caller" if given else paths.data_dir_origin()
  return FileNotFoundError(f"{desc}: expected file {path}, which does not exist ({origin}; "
                           f"files there: {found or 'none'})")


def dataset_path(name: str, split: Optional[str] = None,
                 path: Optional[PathLike] = None) -> pathlib.Path:
  """The JSONL file `load_dataset(name, path, split)` reads.

  `path` may be a file, a folder holding `<split>.jsonl`, or (flashrag) a subset name such as
  'nq' meaning `data_dir()/nq/<split>.jsonl`. Without `path`: `data_dir()/<folder>/<split>.jsonl`.
  """
  dataset, subset = _canonical(name)
  if dataset == "world":
    raise ValueError("dataset 'world' is generated in memory (rlrag_jax.data.world), not read "
                     "from a file")
  split = split or _DEFAULT_SPLIT[dataset]
  desc = f"dataset {name!r} split {split!r}"
  if path is not None:
    p = pathlib.Path(path).expanduser()
    if p.is_file():
      return p
    given = True
    if p.is_dir():
      p = p / f"{split}.jsonl"
    elif dataset == "flashrag" and p.suffix == "" and len(p.parts) == 1:
      p, given = paths.data_dir() / p.name / f"{split}.jsonl", False
    elif p.suffix == "":              # a folder that does not exist: name the file it would hold
      p = p / f"{split}.jsonl"
    if not p.is_file():
      raise _missing_file(desc, p, given)
    return p
  if dataset == "flashrag":
    if subset is None:
      raise ValueError("dataset 'flashrag' needs path=<jsonl file> or a subset name under the "
                       f"data dir such as {list(FLASHRAG_SUBSETS)}")
    p = paths.data_dir() / subset / f"{split}.jsonl"
  else:
    p = paths.data_dir() / FOLDERS[dataset] / f"{split}.jsonl"
  if not p.is_file():
    raise _missing_file(desc, p)
  return p


def _flashrag_source(subset: Optional[str], path: Optional[PathLike]) -> str:
  if subset:
    return subset
  if path is not None and len(pathlib.Path(path).parts) == 1 and not pathlib.Path(path).suffix:
    return str(path)
  return "flashrag"


def iter_dataset(name: str, path: Optional[PathLike] = None, split: Optional[str] = None,
                 skip_invalid: bool = False,
                 report: Optional[LoadReport] = None) -> Iterator[Example]:
  """Streams the examples of one file; fills `report` (if given) as it goes.

  The name, split and file are checked at the call; records are parsed as they are consumed.
  """
  report = LoadReport() if report is None else report
  dataset, subset = _canonical(name)
  if dataset == "world":
    return iter(_world_split(split or _DEFAULT_SPLIT["world"], path, report))
  file = dataset_path(name, split, path)
  parse = _flashrag_parser(_flashrag_source(subset, path)) if dataset == "flashrag" \
      else _or_flashrag(dataset, _PARSERS[dataset])
  return _iter_parsed(file, parse, skip_invalid, report)


def _world_split(split: str, path: Optional[PathLike], report: LoadReport) -> list:
  if path is not None:
    raise ValueError(f"dataset 'world' takes no path (got {path!r}); it is built in memory")
  if split not in SPLITS["world"]:
    raise ValueError(f"dataset 'world': unknown split {split!r}; expected one of "
                     f"{list(SPLITS['world'])}")
  from rlrag_jax.data import world  # pylint: disable=g-import-not-at-top
  examples = list(getattr(world.build(seed=0), split))
  report.path = f"world:{split}"
  report.num_records = report.num_loaded = len(examples)
  return examples


@overload
def load_dataset(name: str, path: Optional[PathLike] = ..., split: Optional[str] = ...,
                 skip_invalid: bool = ..., return_report: Literal[False] = ...) -> list: ...


@overload
def load_dataset(name: str, path: Optional[PathLike] = ..., split: Optional[str] = ...,
                 skip_invalid: bool = ..., *, return_report: Literal[True]) -> tuple: ...


def load_dataset(name: str, path: Optional[PathLike] = None, split: Optional[str] = None,
                 skip_invalid: bool = False, return_report: bool = False):
  """Loads one split of a dataset as `list[Example]`.

  Args:
    name: one of `DATASETS` ('hotpotqa', '2wiki', 'musique', 'bamboogle', 'flashrag', 'world'),
      or a FlashRAG subset name ('nq', 'triviaqa').
    path: a JSONL file, or a folder holding `<split>.jsonl`; for flashrag also a subset name
      under the data dir. None: the shared sample under `paths.data_dir()`.
    split: 'dev', 'train', 'test', 'dev_no_paragraphs' (musique); any `<split>.jsonl` present
      works. None: the dataset's default (dev; test for bamboogle and flashrag).
    skip_invalid: skip malformed records (counted in the report, warned about) instead of
      raising `DataError`.
    return_report: also return the `LoadReport`.

  Returns:
    The examples, or `(examples, report)` when `return_report`.
  """
  report = LoadReport()
  examples = list(iter_dataset(name, path, split, skip_invalid, report))
  return (examples, report) if return_report else examples


# ----------------------------------------------------------------------------- corpora


def _parse_corpus_record(rec: dict, where: _Where) -> CorpusRecord:
  if "contents" in rec:        # FlashRAG / DPR wiki-18: '"Title"\ntext'
    rid = _get(rec, "id", (str, int), where)
    contents = _get(rec, "contents", str, where)
    head, sep, text = contents.partition("\n")
    if not sep:
      head, text = "", contents
    title = head.strip()
    if len(title) >= 2 and title[0] == title[-1] == '"':
      title = title[1:-1]
    return CorpusRecord(id=str(rid), title=title, text=text.strip())
  title = _get(rec, "title", str, where)
  text = _get(rec, "text", str, where)
  rid = _get(rec, "id", (str, int), where, optional=True)
  rid = where.row if rid is None else rid
  return CorpusRecord(id=str(rid), title=title, text=text.strip())


def corpus_path(name_or_path: PathLike) -> pathlib.Path:
  """A corpus name in `CORPORA` -> its file under the data dir; anything else is a path."""
  if isinstance(name_or_path, str) and name_or_path.lower() in CORPORA:
    p = paths.data_dir() / CORPORA[name_or_path.lower()]
  else:
    p = pathlib.Path(name_or_path).expanduser()
  if not p.is_file():
    raise _missing_file(f"corpus {str(name_or_path)!r}", p)
  return p


def _read_dpr_tsv(path: pathlib.Path, report: LoadReport) -> Iterator[tuple]:
  """DPR's passage TSV (`id<TAB>text<TAB>title`, a header line first) -> (1-based line, dict
  or DataError), streaming. Quoted fields (DPR's psgs_w100.tsv quotes texts) are unquoted."""
  with open(path, "r", encoding="utf-8", errors="strict", newline="") as f:
    header = f.readline().rstrip("\r\n").split("\t")
    if [h.strip().lower() for h in header[:3]] != ["id", "text", "title"]:
      raise DataError(path, 1, None, f"expected the DPR header 'id<TAB>text<TAB>title', found "
                      f"{header[:3]!r}")
    csv.field_size_limit(1 << 30)
    rows = csv.reader(f, delimiter="\t", quotechar='"')
    for row in rows:
      line_no = rows.line_num + 1     # the header was read before the reader
      if not row or not "".join(row).strip():
        continue
      report.num_records += 1
      if len(row) != 3:
        yield line_no, DataError(path, line_no, "<record>",
                                 f"expected 3 tab-separated fields (id, text, title), found "
                                 f"{len(row)}")
        continue
      yield line_no, {"id": row[0], "text": row[1], "title": row[2]}


def corpus_format(path: PathLike) -> str:
  """'dpr_tsv' for a .tsv file, else 'jsonl' (FlashRAG {id, contents} or {title, text})."""
  return "dpr_tsv" if str(path).lower().endswith(".tsv") else "jsonl"


def iter_corpus(name_or_path: PathLike, skip_invalid: bool = False,
                report: Optional[LoadReport] = None,
                with_lines: bool = False) -> Iterator[CorpusRecord]:
  """Streams a passage corpus one `CorpusRecord` at a time (nothing is held per passage).

  Three layouts: `{title, text}` JSONL (HippoRAG; id = the record's 0-based row, like FlashRAG's
  row ids, unless it has an `id`), `{id, contents}` JSONL with contents '"Title"\\ntext'
  (FlashRAG / Search-R1's wiki-18), and DPR's TSV (`id<TAB>text<TAB>title`, with a header). A
  malformed row raises a `DataError` naming file, line and field; with `skip_invalid` it is
  skipped and counted in `report`. `with_lines`: yields (1-based file line, record).
  """
  report = LoadReport() if report is None else report
  path = corpus_path(name_or_path)
  read = _read_dpr_tsv if corpus_format(path) == "dpr_tsv" else _read_jsonl
  yield from _iter_parsed(path, _parse_corpus_record, skip_invalid, report, with_lines, read)


def load_corpus(name_or_path: PathLike, skip_invalid: bool = False,
                return_report: bool = False):
  """Loads a passage corpus as `list[CorpusRecord]` (or `(records, report)`); the layouts are
  `iter_corpus`'s. At Wikipedia scale build a passage store instead (`retrieval.store`)."""
  report = LoadReport()
  records = list(iter_corpus(name_or_path, skip_invalid, report))
  return (records, report) if return_report else records


def available_splits(name: str) -> Sequence[str]:
  """The splits the shared samples hold for `name`."""
  return SPLITS[_canonical(name)[0]]
