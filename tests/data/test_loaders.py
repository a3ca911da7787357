"""Loaders: record counts and hand-read records of the real samples, malformed-line handling."""
import json
import logging
import sys
import types

import pytest

import rlrag_jax.data
from rlrag_jax.data import DataError, load_corpus, load_dataset
from rlrag_jax.data.schema import Step, Triple

# ----------------------------------------------------------------------------- real data

COUNTS = [
    ("hotpotqa", "dev", "hotpotqa/dev.jsonl", 1000),
    ("hotpotqa", "train", "hotpotqa/train.jsonl", 110),
    ("2wiki", "dev", "2wikimultihopqa/dev.jsonl", 462),
    ("musique", "dev", "musique/dev.jsonl", 93),
    ("musique", "train", "musique/train.jsonl", 100),
    ("musique", "dev_no_paragraphs", "musique/dev_no_paragraphs.jsonl", 2217),
    ("bamboogle", "test", "bamboogle/test.jsonl", 100),
    ("nq", "test", "nq/test.jsonl", 800),
    ("triviaqa", "test", "triviaqa/test.jsonl", 800),
]


@pytest.mark.data
@pytest.mark.parametrize("name,split,rel,count", COUNTS)
def test_counts_and_invariants(shared_data_dir, name, split, rel, count):
  examples, report = load_dataset(name, split=split, return_report=True)
  assert len(examples) == count
  assert report.num_records == report.num_loaded == count and report.num_skipped == 0
  assert report.path == str(shared_data_dir / rel)
  # The same file through an explicit path gives the same examples.
  assert load_dataset(name, path=shared_data_dir / rel) == examples
  assert len({ex.id for ex in examples}) == count
  for ex in examples:
    assert ex.question and ex.answers and all(isinstance(a, str) for a in ex.answers)
    ids = [c.id for c in ex.contexts]
    assert len(set(ids)) == len(ids)
    if ex.contexts:
      assert set(ex.gold_ids) <= set(ids)
      assert all(set(s.gold_ids) <= set(ids) for s in ex.decomposition)
    for c in ex.contexts:
      assert c.text == " ".join(s for s in c.sentences if s)
      assert all(s == s.strip() for s in c.sentences)


@pytest.mark.data
def test_flashrag_name_or_path(shared_data_dir):
  by_alias = load_dataset("nq")
  by_subset = load_dataset("flashrag", path="nq")
  by_file = load_dataset("flashrag", path=shared_data_dir / "nq" / "test.jsonl")
  assert by_alias == by_subset
  assert [e.id for e in by_file] == [e.id for e in by_alias]
  assert {e.source for e in by_alias} == {"nq"} and {e.source for e in by_file} == {"flashrag"}
  with pytest.raises(ValueError, match="flashrag"):
    load_dataset("flashrag")


@pytest.mark.data
def test_hotpotqa_dev_first_record(shared_data_dir):
  # Line 1 of hotpotqa/dev.jsonl, read by hand.
  ex = load_dataset("hotpotqa", split="dev")[0]
  assert ex.id == "5ae4f3c455429960a22e0221"
  assert ex.question == ("What is the are of the university at which Dick Biddle served as head "
                         "football coach?")
  assert ex.answers == ["575 acres (2.08 km²)"]
  assert ex.gold_ids == ["Dick Biddle", "Colgate University"]
  assert (ex.hops, ex.kind, ex.source) == (2, "bridge", "hotpotqa")
  assert ex.meta == {"supporting_facts": [["Dick Biddle", 1], ["Colgate University", 0]],
                     "level": "hard"}
  assert [c.id for c in ex.contexts] == [
      "Dan Hunt (American football)", "2013 Colgate Raiders football team",
      "2012 Colgate Raiders football team", "Ernest T. Jones", "Willie Fritz", "Ted Karras Jr.",
      "Colgate University", "Tom Keele", "Dick Biddle", "2011 Colgate Raiders football team"]
  colgate = ex.context("Colgate University")
  assert colgate.title == "Colgate University"
  assert colgate.text == ("Colgate University is a private liberal arts college located on 575 "
                          "acres (2.08 km²) in Hamilton Village, Hamilton Township, Madison "
                          "County, New York, United States.")
  biddle = ex.context("Dick Biddle")
  assert len(biddle.sentences) == 6
  assert biddle.sentences[1] == ("he served as head football coach at Colgate University from "
                                 "1996 through 2013, compiling a record of 137–73.")
  assert biddle.text.startswith("Dick Biddle (born November 26, 1947) is a former American "
                                "football player and coach. he served as head")


@pytest.mark.data
def test_hotpotqa_comparison_and_empty_sentence(shared_data_dir):
  examples = load_dataset("hotpotqa", split="dev")
  ex = examples[8]   # line 9
  assert ex.id == "5a8f64e0554299458435d60b" and ex.kind == "comparison"
  assert ex.answers == ["Chicken Ranch"]
  assert ex.gold_ids == ["Chicken Ranch (film)", "The End of Suburbia"]
  # Line 54: 'The Nurtured Heart Approach' ends with an empty sentence; it keeps its index.
  nha = examples[53].context("The Nurtured Heart Approach")
  assert len(nha.sentences) == 10 and nha.sentences[-1] == ""
  assert nha.text.endswith("(Hektner, J, Brennan, A, & Brotherson, S., 2013).")


@pytest.mark.data
def test_2wiki_records(shared_data_dir):
  examples, report = load_dataset("2wiki", return_report=True)
  ex = examples[0]
  assert ex.id == "f2ff844c0bda11eba7f7acde48001122"
  assert ex.question == "Who is the father of the director of film Legend Of A Fighter?"
  assert ex.answers == ["Yuen Siu-tien"]
  assert ex.gold_ids == ["Legend of a Fighter", "Yuen Woo-ping"]
  assert ex.triples == [Triple("Legend of a Fighter", "director", "Yuen Woo-ping"),
                        Triple("Yuen Woo-ping", "father", "Yuen Siu-tien")]
  assert (ex.hops, ex.kind, ex.source) == (2, "compositional", "2wiki")
  assert ex.meta["entity_ids"] == "Q4256920_Q460297" and ex.meta["answer_id"] == "Q947267"
  assert ex.context("Legend of a Fighter").text == (
      "Legend of a Fighter is a 1982 Hong Kong martial arts film based on the story of Chinese "
      "martial artist Huo Yuanjia (Cantonese: Fok Yuen-kap). Directed by Yuen Woo-ping, the film "
      "starred Bryan Leung as the lead character.")
  # Line 2: bridge_comparison with four gold paragraphs -> 4 hops, order of first mention.
  ex = examples[1]
  assert ex.kind == "bridge_comparison" and ex.answers == ["Girls In White"]
  assert ex.gold_ids == ["Three Violent People", "Girls in White", "Rudolph Maté",
                         "Victor Janson"]
  assert ex.hops == 4
  # Line 19 repeats 'Dayton International Peace Museum' verbatim: the copy is dropped.
  ex = examples[18]
  assert len(ex.contexts) == 9
  assert [c.id for c in ex.contexts].count("Dayton International Peace Museum") == 1
  assert ex.gold_ids == ["Balzekas Museum of Lithuanian Culture", "Peace Museum, Bradford"]
  # Line 350: ['Georges Lautner', 3] points past its 3 sentences (an upstream defect).
  ex = examples[349]
  assert ex.id == "2a84a2920bdd11eba7f7acde48001122"
  assert ex.gold_ids == ["The Monocle Laughs", "Georges Lautner"]
  assert ex.meta["supporting_facts"] == [["The Monocle Laughs", 3]]
  assert sum("dev.jsonl:350: supporting_facts[1][1]" in n for n in report.notes) == 1
  assert sum("out of range" in n for n in report.notes) == 2     # lines 350 and 409
  assert sum("verbatim repeat" in n for n in report.notes) == 25


@pytest.mark.data
def test_musique_records(shared_data_dir):
  examples = load_dataset("musique", split="dev")
  ex = examples[0]
  assert ex.id == "4hop1__668178_378185_282674_759393"
  assert ex.question == ("What is the capital of the county that shares a border with the "
                         "county where Don Werner was born?")
  assert ex.answers == ["Green Bay"]
  assert ex.gold_ids == ["0", "7", "14", "17"]
  assert ex.decomposition == [
      Step("Don Werner >> place of birth", "Appleton", ["0"]),
      Step("#1 >> located in the administrative territorial entity", "Outagamie County", ["7"]),
      Step("#2 >> shares border with", "Brown County", ["14"]),
      Step("#3 >> capital", "Green Bay", ["17"]),
  ]
  assert (ex.hops, ex.kind, ex.source) == (4, "4hop1", "musique")
  assert [c.id for c in ex.contexts] == [str(i) for i in range(20)]
  assert ex.context("0").title == "Don Werner"
  assert ex.context("0").text.startswith("Donald Paul Werner (born March 8, 1953 in Appleton")
  assert ex.context("0").sentences == [ex.context("0").text]
  assert ex.context("7").title == "John C. Petersen"
  # Line 4: aliases appended; gold ids in paragraph order, steps in hop order.
  ex = examples[3]
  assert ex.id == "3hop1__518381_709625_84283" and ex.hops == 3
  assert ex.answers == ["Warner Music Group", "Warner Music"]
  assert ex.gold_ids == ["2", "6", "14"]
  assert ex.decomposition == [
      Step("Lovin' All Night >> performer", "Rodney Crowell", ["14"]),
      Step("#1 >> record label", "Warner Bros. Records", ["6"]),
      Step("who is the owner of #2", "Warner Music Group", ["2"]),
  ]


@pytest.mark.data
def test_musique_without_paragraphs(shared_data_dir):
  ex = load_dataset("musique", split="dev_no_paragraphs")[0]
  assert ex.id == "2hop__460946_294723"
  assert ex.question == "Who is the spouse of the Green performer?"
  assert ex.answers == ["Miquette Giraudy"]
  assert ex.contexts == []
  assert ex.decomposition == [Step("Green >> performer", "Steve Hillage", ["10"]),
                              Step("#1 >> spouse", "Miquette Giraudy", ["5"])]
  assert ex.gold_ids == ["10", "5"] and ex.hops == 2
  assert ex.meta["has_paragraphs"] is False


@pytest.mark.data
def test_bamboogle_and_flashrag_records(shared_data_dir):
  ex = load_dataset("bamboogle")[0]
  assert ex.id == "bamboogle_0"
  assert ex.question == ("Who was president of the United States in the year that Citibank was "
                         "founded?")
  assert ex.answers == ["james madison"] and ex.contexts == [] and ex.hops == 2
  ex = load_dataset("nq")[0]
  assert (ex.id, ex.question, ex.answers) == (
      "test_3283", "who told the story of the prodigal son", ["Jesus Christ"])
  ex = load_dataset("triviaqa")[1]
  assert ex.id == "test_6654"
  assert ex.question == "Cleeve Hill is the highest point in which range of English hills?"
  assert ex.answers == ["Cotteswold Hills", "Cotswold Hills, England", "Cotswold Hills (England)",
                        "Cotswolds AONB", "Cotswolds", "Cotswold stone", "Cotswold",
                        "The Cotswolds", "Cotswold Edge", "Costwold", "Cotswold Hills"]


@pytest.mark.data
@pytest.mark.parametrize("name,count", [("2wiki", 6119), ("wiki18", 1000)])
def test_corpus_counts(shared_data_dir, name, count):
  records = load_corpus(name)
  assert len(records) == count
  assert [r.id for r in records] == [str(i) for i in range(count)]
  assert all(r.title and r.text for r in records)


@pytest.mark.data
def test_corpus_records(shared_data_dir):
  hippo = load_corpus(shared_data_dir / "corpus" / "2wikimultihopqa_hipporag_corpus.jsonl")
  assert (hippo[1].id, hippo[1].title) == ("1", "Theodred II (Bishop of Elmham)")
  assert hippo[1].text == ("Theodred II was a medieval Bishop of Elmham. The date of Theodred's "
                           "consecration unknown, but the date of his death was sometime between "
                           "995 and 997.")
  wiki = load_corpus("wiki18")
  assert (wiki[0].id, wiki[0].title) == ("0", "Evan Morris")
  assert wiki[0].text.startswith("Evan Morris Evan L. Morris (January 26, 1977 – July 9, 2015) "
                                 "was a lobbyist for Genentech")
  assert (wiki[1].id, wiki[1].title) == ("1", "Horatio Hale")


def test_unknown_names_and_missing_files(tmp_path, monkeypatch):
  monkeypatch.setenv("RLRAG_DATA_DIR", str(tmp_path))
  with pytest.raises(ValueError, match="unknown dataset 'squad'"):
    load_dataset("squad")
  with pytest.raises(FileNotFoundError, match=r"hotpotqa/test\.jsonl"):
    load_dataset("hotpotqa", split="test")
  with pytest.raises(FileNotFoundError, match="RLRAG_DATA_DIR"):
    load_corpus("wiki18")


def test_world_delegates_lazily(monkeypatch):
  calls = []
  splits = {"train": ["t0", "t1"], "dev": ["d0"], "test": ["x0", "x1", "x2"]}

  def build(seed):
    calls.append(seed)
    return types.SimpleNamespace(**splits)

  fake = types.ModuleType("rlrag_jax.data.world")
  fake.build = build
  monkeypatch.setitem(sys.modules, "rlrag_jax.data.world", fake)
  monkeypatch.setattr(rlrag_jax.data, "world", fake, raising=False)
  assert load_dataset("world", split="test") == ["x0", "x1", "x2"]
  examples, report = load_dataset("world", split="train", return_report=True)
  assert examples == ["t0", "t1"] and report.num_loaded == 2
  assert calls == [0, 0]
  with pytest.raises(ValueError, match="split"):
    load_dataset("world", split="validation")
  with pytest.raises(ValueError, match="path"):
    load_dataset("world", path="x.jsonl")


def test_world_matches_the_generator():
  from rlrag_jax.data import world
  built = world.build(seed=0)
  assert load_dataset("world") == built.dev      # the default split is dev


# ----------------------------------------------------------------------------- malformed lines


def _hotpot(**kw):
  rec = {"_id": "q1", "question": "Who?", "answer": "Ann", "type": "bridge", "level": "hard",
         "supporting_facts": [["A", 0], ["B", 1]],
         "context": [["A", ["Ann was born.", " She lives."]], ["B", ["B0.", " B1."]],
                     ["C", ["C0."]]]}
  rec.update(kw)
  return rec


def _2wiki(**kw):
  rec = _hotpot(type="compositional", evidences=[["A", "father", "B"]],
                entity_ids="Q1_Q2", answer_id="Q3", evidences_id=[])
  rec.pop("level")
  rec.update(kw)
  return rec


def _musique(**kw):
  rec = {"id": "2hop__1_2", "question": "Who?", "answer": "Ann", "answer_aliases": ["Annie"],
         "answerable": True,
         "paragraphs": [
             {"idx": 0, "title": "A", "paragraph_text": "A text.", "is_supporting": True},
             {"idx": 1, "title": "B", "paragraph_text": " B text. ", "is_supporting": False},
             {"idx": 2, "title": "C", "paragraph_text": "C text.", "is_supporting": True}],
         "question_decomposition": [
             {"id": 1, "question": "x >> y", "answer": "B", "paragraph_support_idx": 2},
             {"id": 2, "question": "#1 >> z", "answer": "Ann", "paragraph_support_idx": 0}]}
  rec.update(kw)
  return rec


def _drop(rec, key):
  rec = dict(rec)
  del rec[key]
  return rec


BAD_JSON = '{"_id": "q1", "question": '
# (dataset, bad line, expected field); field None: no field (invalid JSON).
MALFORMED = {
    "hotpotqa": [
        (BAD_JSON, None),
        (json.dumps([1, 2]), "<record>"),
        (json.dumps(_drop(_hotpot(), "question")), "question"),
        (json.dumps(_drop(_hotpot(), "context")), "context"),
        (json.dumps(_hotpot(answer=5)), "answer"),
        (json.dumps(_hotpot(context=[["A", "Ann was born."]])), "context[0][1]"),
        (json.dumps(_hotpot(supporting_facts=[["A", "0"]])), "supporting_facts[0][1]"),
        (json.dumps(_hotpot(supporting_facts=[["A", 0], ["Z", 0]])), "supporting_facts[1][0]"),
        (json.dumps(_hotpot(supporting_facts=[["B", 2]])), "supporting_facts[0][1]"),
        (json.dumps(_hotpot(context=[["A", ["x"]], ["A", ["y"]]])), "context[1]"),
    ],
    "2wiki": [
        (BAD_JSON, None),
        (json.dumps(_drop(_2wiki(), "evidences")), "evidences"),
        (json.dumps(_2wiki(evidences=[["A", "father"]])), "evidences[0]"),
        (json.dumps(_2wiki(answer_id=7)), "answer_id"),
        (json.dumps(_2wiki(supporting_facts=[["Z", 0]])), "supporting_facts[0][0]"),
        (json.dumps(_2wiki(supporting_facts=[])), "supporting_facts"),
    ],
    "musique": [
        (BAD_JSON, None),
        (json.dumps(_drop(_musique(), "question_decomposition")), "question_decomposition"),
        (json.dumps(_musique(answer_aliases=[1])), "answer_aliases[0]"),
        (json.dumps(_musique(paragraphs=[{"idx": 0, "title": "A", "paragraph_text": "t",
                                          "is_supporting": "yes"}])),
         "paragraphs[0].is_supporting"),
        (json.dumps(_musique(question_decomposition=[
            {"id": 1, "question": "q", "answer": "a", "paragraph_support_idx": 7}])),
         "question_decomposition[0].paragraph_support_idx"),
        (json.dumps(_musique(question_decomposition=[{"id": 1, "question": "q", "answer": "a"}])),
         "question_decomposition[0].paragraph_support_idx"),
    ],
    "bamboogle": [
        (BAD_JSON, None),
        (json.dumps({"Question": "Who?"}), "Answer"),
        (json.dumps({"Question": 3, "Answer": "x"}), "Question"),
    ],
    "flashrag": [
        (BAD_JSON, None),
        (json.dumps({"question": "Who?", "golden_answers": ["x"]}), "id"),
        (json.dumps({"id": "t1", "question": "Who?", "golden_answers": "x"}), "golden_answers"),
        (json.dumps({"id": "t1", "question": "Who?", "golden_answers": []}), "golden_answers"),
        (json.dumps({"id": "t1", "question": "Who?", "golden_answers": ["x", None]}),
         "golden_answers[1]"),
    ],
}
GOOD = {
    "hotpotqa": json.dumps(_hotpot()),
    "2wiki": json.dumps(_2wiki()),
    "musique": json.dumps(_musique()),
    "bamboogle": json.dumps({"Question": "Who?", "Answer": "Ann"}),
    "flashrag": json.dumps({"id": "t0", "question": "Who?", "golden_answers": ["Ann", "Ann"]}),
}
CASES = [(name, line, field) for name, cases in MALFORMED.items() for line, field in cases]


@pytest.mark.parametrize("name,line,field", CASES,
                         ids=[f"{n}-{f}" for n, _, f in CASES])
def test_malformed_line_names_file_line_field(tmp_path, name, line, field):
  path = tmp_path / f"{name}.jsonl"
  path.write_text(GOOD[name] + "\n\n" + line + "\n" + GOOD[name] + "\n", encoding="utf-8")
  with pytest.raises(DataError) as info:
    load_dataset(name, path=path)
  err = info.value
  assert isinstance(err, ValueError)
  assert (err.path, err.line, err.field) == (str(path), 3, field)
  msg = str(err)
  assert msg.startswith(f"{path}:3: ")
  if field is None:
    assert "invalid JSON" in msg or "JSON object" in msg
  else:
    assert f"field '{field}'" in msg
  examples, report = load_dataset(name, path=path, skip_invalid=True, return_report=True)
  assert len(examples) == 2
  assert (report.num_records, report.num_loaded, report.num_skipped) == (3, 2, 1)
  assert report.errors == [msg]


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_skip_invalid_counts_and_warns(tmp_path, caplog, name):
  bad = [line for line, _ in MALFORMED[name]]
  path = tmp_path / "mixed.jsonl"
  path.write_text("\n".join([GOOD[name], *bad, GOOD[name]]) + "\n", encoding="utf-8")
  with caplog.at_level(logging.WARNING, logger="rlrag_jax.data.loaders"):
    examples, report = load_dataset(name, path=path, skip_invalid=True, return_report=True)
  assert len(examples) == 2 and report.num_skipped == len(bad)
  assert [int(e.split(":")[1]) for e in report.errors] == list(range(2, 2 + len(bad)))
  warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  assert len(warned) == 1 and f"skipped {len(bad)} malformed of {len(bad) + 2}" in warned[0]


def test_synthetic_records_parse(tmp_path):
  """The good synthetic records, field by field (independent of the real files)."""
  out = {}
  for name, line in GOOD.items():
    p = tmp_path / f"{name}.jsonl"
    p.write_text(line + "\n", encoding="utf-8")
    out[name] = load_dataset(name, path=p)[0]
  hp = out["hotpotqa"]
  assert hp.gold_ids == ["A", "B"] and [c.id for c in hp.contexts] == ["A", "B", "C"]
  assert hp.context("A").text == "Ann was born. She lives."
  assert hp.context("A").sentences == ["Ann was born.", "She lives."]
  assert out["2wiki"].triples == [Triple("A", "father", "B")] and out["2wiki"].hops == 2
  mu = out["musique"]
  assert mu.gold_ids == ["0", "2"] and mu.answers == ["Ann", "Annie"] and mu.hops == 2
  assert mu.decomposition == [Step("x >> y", "B", ["2"]), Step("#1 >> z", "Ann", ["0"])]
  assert mu.context("1").text == "B text." and mu.context("1").sentences == ["B text."]
  assert out["flashrag"].answers == ["Ann"] and out["flashrag"].source == "flashrag"
  assert out["bamboogle"].id == "bamboogle_0"


def test_2wiki_out_of_range_sentence_is_a_note(tmp_path):
  path = tmp_path / "dev.jsonl"
  path.write_text(json.dumps(_2wiki(supporting_facts=[["A", 0], ["B", 9]])) + "\n")
  examples, report = load_dataset("2wiki", path=path, return_report=True)
  assert examples[0].gold_ids == ["A", "B"]
  assert examples[0].meta["supporting_facts"] == [["A", 0]]
  assert report.num_skipped == 0 and len(report.notes) == 1
  assert report.notes[0].startswith(f"{path}:1: supporting_facts[1][1]: sentence index 9")


def test_corpus_malformed(tmp_path):
  path = tmp_path / "corpus.jsonl"
  path.write_text("\n".join([json.dumps({"title": "A", "text": "a"}),
                             json.dumps({"title": "B"}),
                             json.dumps({"id": "7", "contents": 3}),
                             json.dumps({"title": "C", "text": "c"})]) + "\n")
  with pytest.raises(DataError, match=rf"{path}:2: field 'text'"):
    load_corpus(path)
  records, report = load_corpus(path, skip_invalid=True, return_report=True)
  assert [(r.id, r.title) for r in records] == [("0", "A"), ("3", "C")]
  assert report.num_skipped == 2 and f"{path}:3: field 'contents'" in report.errors[1]


def test_popqa_both_layouts(tmp_path):
  """PopQA as FlashRAG ships it (golden_answers) and as its own release (possible_answers, a
  JSON string); a malformed answer list names the file, line and field."""
  import json as _json
  d = tmp_path / "popqa"
  d.mkdir()
  (d / "test.jsonl").write_text(
      _json.dumps({"id": "p1", "question": "Who wrote X?", "golden_answers": ["Ann", "A. B."]})
      + "\n" + _json.dumps({"id": 7, "question": "What is Y's capital?",
                            "possible_answers": "[\"Oslo\", \"Christiania\"]"}) + "\n")
  exs = load_dataset("flashrag", path=d / "test.jsonl")
  assert [(e.id, e.answers, e.hops) for e in exs] == [("p1", ["Ann", "A. B."], 1),
                                                      ("7", ["Oslo", "Christiania"], 1)]
  assert [e.question for e in load_dataset("popqa", path=d)] == [e.question for e in exs]
  (d / "bad.jsonl").write_text(_json.dumps({"id": "p", "question": "q",
                                            "possible_answers": "Oslo"}) + "\n")
  with pytest.raises(Exception, match=r"bad.jsonl.*1.*possible_answers"):
    load_dataset("flashrag", path=d / "bad.jsonl")
