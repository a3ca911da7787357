"""The embedded world: facts replay over the triples, gold passages state them, splits, mix."""
import collections
import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys

import pytest

from rlrag_jax.data import world as world_lib
from rlrag_jax.data.schema import Example

SMALL = dict(num_countries=6, num_cities=30, num_people=160, num_orgs=36, num_films=80,
             num_books=80, num_questions=300)


@pytest.fixture(scope="module")
def w():
  return world_lib.build(seed=0)


def _examples(w):
  return w.train + w.dev + w.test


def _dump(w) -> bytes:
  rows = {"corpus": [r.to_dict() for r in w.corpus],
          "entities": [dataclasses.asdict(e) for e in w.entities],
          **{s: [e.to_dict() for e in w.split(s)] for s in ("train", "dev", "test")}}
  return json.dumps(rows, sort_keys=True, ensure_ascii=False).encode()


# ----------------------------------------------------------------------------- sizes, determinism


def test_sizes_match_config(w):
  cfg = w.config
  types = collections.Counter(e.type for e in w.entities)
  assert types == {"country": cfg.num_countries, "city": cfg.num_cities,
                   "person": cfg.num_people, "org": cfg.num_orgs, "film": cfg.num_films,
                   "book": cfg.num_books}
  assert len(w.corpus) == len(w.entities) == sum(types.values())
  assert [r.id for r in w.corpus] == [e.id for e in w.entities]
  n = cfg.num_questions
  assert len(_examples(w)) == n
  assert len(w.dev) == round(n * cfg.dev_frac) and len(w.test) == round(n * cfg.test_frac)
  assert w.triples == [t for r in w.corpus for t in r.triples]


def test_sizes_are_keyword_args():
  small = world_lib.build(seed=1, **SMALL)
  assert sum(e.type == "person" for e in small.entities) == 160
  assert len(_examples(small)) == 300
  assert all(len(e.contexts) == len(e.gold_ids) + 4 for e in _examples(small))
  fewer = world_lib.build(seed=1, **{**SMALL, "distractors_per_question": 2})
  assert all(len(e.contexts) == len(e.gold_ids) + 2 for e in _examples(fewer))


def test_same_seed_identical_different_seed_differs():
  a, b = world_lib.build(seed=5, **SMALL), world_lib.build(seed=5, **SMALL)
  assert _dump(a) == _dump(b)
  c = world_lib.build(seed=6, **SMALL)
  assert _dump(a) != _dump(c)
  assert [r.text for r in a.corpus] != [r.text for r in c.corpus]
  assert [e.question for e in a.train] != [e.question for e in c.train]


def test_identical_in_another_process_with_other_hash_seed():
  """No output may depend on set/dict order of str hashes (PYTHONHASHSEED)."""
  code = ("import hashlib,json,sys,dataclasses;from rlrag_jax.data import world as W;"
          "sys.path.insert(0, sys.argv[1]);import test_world as t;"
          f"print(hashlib.sha256(t._dump(W.build(seed=5, **{SMALL!r}))).hexdigest())")
  env = {**os.environ, "PYTHONHASHSEED": "12345"}
  here = os.path.dirname(os.path.abspath(__file__))
  out = subprocess.run([sys.executable, "-c", code, here], env=env, capture_output=True,
                       text=True, check=True).stdout.strip()
  assert out == hashlib.sha256(_dump(world_lib.build(seed=5, **SMALL))).hexdigest()


def test_questions_do_not_change_the_corpus():
  a = world_lib.build(seed=2, **SMALL)
  b = world_lib.build(seed=2, **{**SMALL, "num_questions": 200})
  assert [r.to_dict() for r in a.corpus] == [r.to_dict() for r in b.corpus]


def test_bad_sizes_raise():
  with pytest.raises(TypeError, match="num_peeple"):
    world_lib.build(num_peeple=3)
  with pytest.raises(ValueError, match="num_cities"):
    world_lib.build(num_countries=10, num_cities=5)
  with pytest.raises(ValueError, match="distinct questions"):
    world_lib.build(num_countries=2, num_cities=3, num_people=10, num_orgs=6, num_films=2,
                    num_books=2, num_questions=2000)


# ----------------------------------------------------------------------------- facts and passages


def test_every_fact_stated_once_in_its_head_passage(w):
  where = collections.defaultdict(list)
  for r, ent in zip(w.corpus, w.entities):
    assert r.title == ent.name and r.id == ent.id
    for t in r.triples:
      assert t.head == r.title, (r.id, t)
      assert t.tail in r.text, (r.id, t)
      where[(t.head, t.relation)].append(r.id)
  assert all(len(v) == 1 for v in where.values())
  names = [e.name for e in w.entities]
  assert len(set(names)) == len(names)


def test_passages_are_short_paragraphs(w):
  for r in w.corpus:
    n = len(r.text.split())
    assert n <= 60, (r.id, n)
  for e in _examples(w)[:300]:
    for c in e.contexts:
      assert c.text == " ".join(c.sentences) == w.passage(c.id).text
      assert 2 <= len(c.sentences) <= 4
      assert c.triples == w.passage(c.id).triples


def test_names_are_generated_not_real(w):
  real = {"france", "germany", "spain", "italy", "china", "india", "japan", "brazil", "egypt",
          "london", "paris", "rome", "berlin", "madrid", "tokyo", "cairo", "lima", "oslo",
          "vienna", "prague", "dublin", "athens", "moscow", "delhi", "canada", "mexico", "chile",
          "peru", "cuba", "kenya", "ghana", "mali", "chad", "iran", "iraq", "oman", "malta"}
  for e in w.entities:
    if e.type in ("country", "city", "person"):
      assert not {p.lower() for p in e.name.split()} & real, e.name


# ----------------------------------------------------------------------------- questions


def _value(x, vals):
  """'#k' -> the k-th step's value; anything else is a name."""
  return vals[int(x[1:]) - 1] if re.fullmatch(r"#\d+", x) else x


def _replay(program, facts):
  """Runs a question's program over the world's triples; returns every step's value."""
  vals = []

  def val(x):
    return _value(x, vals)

  for op in program:
    if op["op"] == "hop":
      vals.append(facts[(val(op["head"]), op["relation"])])
    elif op["op"] == "earlier":
      ya, yb = (int(val(a)) for a in op["args"])
      assert ya != yb
      vals.append(op["options"][0] if ya < yb else op["options"][1])
    elif op["op"] == "same":
      a, b = (val(a) for a in op["args"])
      vals.append("yes" if a == b else "no")
    else:
      raise AssertionError(op)
  return vals


def test_decomposition_replays_over_triples(w):
  facts = {(t.head, t.relation): t.tail for t in w.triples}
  for e in _examples(w):
    program = e.meta["program"]
    assert len(program) == len(e.decomposition)
    vals = _replay(program, facts)
    assert [s.answer for s in e.decomposition] == vals, e.id
    assert e.answers[0] == vals[-1], e.id
    hops = [(op, s) for op, s in zip(program, e.decomposition) if op["op"] == "hop"]
    assert e.hops == len(hops) == len(e.gold_ids) and 2 <= e.hops <= 4
    path = [(_value(op["head"], vals), op["relation"], vals[k])
            for k, op in enumerate(program) if op["op"] == "hop"]
    assert [(t.head, t.relation, t.tail) for t in e.triples] == path
    # Sub-questions refer only to earlier answers.
    for k, s in enumerate(e.decomposition):
      assert all(int(r) <= k for r in re.findall(r"#(\d+)", s.question)), (e.id, s.question)


def test_gold_passages_state_their_step(w):
  for e in _examples(w):
    ctx = {c.id: c for c in e.contexts}
    hop_golds = []
    for op, s in zip(e.meta["program"], e.decomposition):
      if op["op"] != "hop":
        assert s.gold_ids == []
        continue
      (pid,) = s.gold_ids
      hop_golds.append(pid)
      passage = w.passage(pid)
      assert s.answer in passage.text, (e.id, s)
      assert any(t.relation == op["relation"] and t.tail == s.answer for t in passage.triples)
      assert pid in ctx and ctx[pid].text == passage.text
    assert hop_golds == e.gold_ids and len(set(e.gold_ids)) == len(e.gold_ids)


def test_no_question_answerable_without_its_gold_passages(w):
  """Each step's fact is in no other passage, so dropping any gold passage loses a fact."""
  stated = collections.defaultdict(set)
  for r in w.corpus:
    for t in r.triples:
      stated[(t.head, t.relation)].add(r.id)
  for e in _examples(w):
    for t, gid in zip(e.triples, e.gold_ids):
      assert stated[(t.head, t.relation)] == {gid}
      others = [c for c in e.contexts if c.id != gid]
      assert not any(u.head == t.head and u.relation == t.relation
                     for c in others for u in c.triples)


def test_splits_disjoint_and_questions_unique(w):
  ids = [set(e.id for e in w.split(s)) for s in ("train", "dev", "test")]
  assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
  texts = [e.question for e in _examples(w)]
  assert len(set(texts)) == len(texts)


def test_hop_and_kind_mix(w):
  ex = _examples(w)
  mix = collections.Counter((e.kind, e.hops) for e in ex)
  for key in [("bridge", 2), ("composition", 3), ("composition", 4), ("comparison", 2),
              ("comparison", 3), ("comparison", 4)]:
    assert mix[key] >= 0.02 * len(ex), (key, mix)
  assert set(mix) <= {("bridge", 2), ("composition", 3), ("composition", 4), ("comparison", 2),
                      ("comparison", 3), ("comparison", 4)}
  assert all(e.source == "world" for e in ex)
  hops = collections.Counter(e.hops for e in ex)
  cfg = w.config
  for h, p in zip((2, 3, 4), cfg.hop_mix):
    assert abs(hops[h] / len(ex) - p / sum(cfg.hop_mix)) < 0.05, hops
  yes_no = collections.Counter(e.answers[0] for e in ex if e.answers[0] in ("yes", "no"))
  assert 0.35 < yes_no["yes"] / sum(yes_no.values()) < 0.65, yes_no


def test_answers_and_aliases(w):
  ents = {e.name: e for e in w.entities}
  saw_surname = False
  for e in _examples(w):
    a = e.answers[0]
    assert len(set(e.answers)) == len(e.answers)
    if e.kind != "comparison":
      assert a not in e.question, e.id
    if a in ents:
      assert set(e.answers) <= set(ents[a].aliases)
      if ents[a].type == "person" and len(e.answers) == 2:
        assert e.answers[1] == a.split(" ", 1)[1]
        saw_surname = True
    # No alias other than the answer is copied from the question.
    rest = e.question.replace(a, "")
    assert not any(x in rest for x in e.answers[1:]), e.id
    last = e.meta["program"][-1]
    if last.get("relation") in world_lib.YEAR_RELATIONS:
      assert re.fullmatch(r"\d{4}", a) and e.answers == [a]
    if last["op"] == "same":
      assert e.answers in (["yes"], ["no"])
    if last["op"] == "earlier":
      assert a in last["options"]
  assert saw_surname


def test_contexts_mix_gold_and_related_distractors(w):
  ex = _examples(w)
  first_is_gold, related = 0, 0
  for e in ex:
    ids = [c.id for c in e.contexts]
    assert len(set(ids)) == len(ids)
    assert set(e.gold_ids) <= set(ids)
    first_is_gold += ids[0] in e.gold_ids
    gold_names = {w.passage(g).title for g in e.gold_ids}
    gold_tails = {(t.relation, t.tail) for g in e.gold_ids for t in w.passage(g).triples}
    for c in e.contexts:
      if c.id in e.gold_ids:
        continue
      if any(t.tail in gold_names or (t.relation, t.tail) in gold_tails
             for t in c.triples if t.relation in world_lib.ENTITY_RELATIONS):
        related += 1
        break
  # Shuffled: gold is first about as often as its share of the contexts.
  share = sum(len(e.gold_ids) / len(e.contexts) for e in ex) / len(ex)
  assert abs(first_is_gold / len(ex) - share) < 0.05
  assert related > 0.8 * len(ex)


def test_save_round_trip(tmp_path):
  small = world_lib.build(seed=3, **SMALL)
  out = small.save(tmp_path / "world")
  rows = [json.loads(l) for l in (out / "dev.jsonl").read_text().splitlines()]
  assert [Example.from_dict(r).to_dict() for r in rows] == [e.to_dict() for e in small.dev]
  corpus = [json.loads(l) for l in (out / "corpus.jsonl").read_text().splitlines()]
  assert corpus == [r.to_dict() for r in small.corpus]
  info = json.loads((out / "world.json").read_text())
  assert info["seed"] == 3 and info["counts"]["passages"] == len(small.corpus)
