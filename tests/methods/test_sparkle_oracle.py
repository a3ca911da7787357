"""SPARKLE's world oracle (reader thoughts and the three roles' targets) on real world questions,
and the triple store's candidates against a brute-force ranking."""
import hashlib

import numpy as np
import pytest

from rlrag_jax.data import world
from rlrag_jax.methods.sparkle import parsing, prompts
from rlrag_jax.methods.sparkle.triples import Candidate, TripleStore, triple_sentence


@pytest.fixture(scope="module")
def w():
  return world.build(seed=0)


def plan_of(ex):
  return prompts.Plan.of(ex.decomposition, ex.triples, ex.answers[0])


def walk(plan, retrieve=lambda step: True, limit=30):
  """The oracle reader's thoughts when each need is met (its gold documents join the context)
  exactly when `retrieve(step)` says so."""
  ctx, thoughts = [], []
  for _ in range(limit):
    t = plan.thought(ctx, thoughts)
    if t.kind == "answer":
      return thoughts, ctx, t.text
    thoughts.append(t.text)
    i = plan.needed(thoughts)
    if i is not None and retrieve(i):
      ctx += [g for g in plan.gold[i] if g not in ctx]
  return thoughts, ctx, None


def test_oracle_reader_alternates_needs_and_facts_then_answers(w):
  kinds = set()
  for ex in w.split("train")[:40]:
    plan = plan_of(ex)
    thoughts, ctx, answer = walk(plan)
    steps = [i for i, g in enumerate(plan.gold) if g]
    assert answer == ex.answers[0]
    assert thoughts == [x for i in steps for x in (plan.need(i), plan.fact(i))]
    assert set(ctx) == set(ex.gold_ids)
    kinds.add(ex.kind)
    # The second step's need names the first step's answer (its '#1' filled in).
    if len(steps) > 1 and plan.refs[steps[1]] == (steps[0],):
      assert plan.answers[steps[0]] in plan.need(steps[1])
  assert {"composition", "comparison"} <= kinds


def test_an_unmet_need_is_stated_again_and_blocks_the_answer(w):
  ex = w.split("train")[0]
  plan = plan_of(ex)
  thoughts, ctx, answer = walk(plan, retrieve=lambda step: False, limit=5)
  assert answer is None and thoughts == [plan.need(0)] * 5 and ctx == []
  # Met on the second try: the reasoning resumes.
  tries = {"n": 0}

  def second(step):
    tries["n"] += 1
    return tries["n"] % 2 == 0
  thoughts, _, answer = walk(plan, retrieve=second)
  assert answer == ex.answers[0] and thoughts[:3] == [plan.need(0), plan.need(0), plan.fact(0)]


def test_role_targets_follow_the_latest_thought(w):
  ex = w.split("train")[0]        # a 4-hop composition
  plan = plan_of(ex)
  th = [plan.need(0)]
  assert plan.decision(th) and plan.needed(th) == 0
  f = parsing.parse_formulation(plan.formulation(th), "x")
  t0 = ex.triples[0]
  assert f.well_formed and f.query == f"{t0.head} {t0.relation.replace('_', ' ')}"
  # A need names its fact by the path triple, whatever wording the step's question has.
  assert th[0] == f"{prompts.NEED_PREFIX} <{t0.head}; {t0.relation}; ?>"
  assert f.chain == ((ex.triples[0].head, ex.triples[0].relation, parsing.UNKNOWN),)
  th = [plan.need(0), plan.fact(0), plan.need(1)]
  f = parsing.parse_formulation(plan.formulation(th), "x")
  t1 = ex.triples[1]
  assert f.chain == ((t0.head, t0.relation, t0.tail), (t1.head, t1.relation, parsing.UNKNOWN))
  assert not plan.decision(th[:2]) and plan.formulation(th[:2]) is None
  assert plan.selection(th[:2], [Candidate("a", "b", "c", "d")]) is None
  # KI: the path triple wins over another triple of the same gold document; else that document.
  gold_doc = plan.gold[1][0]
  other = Candidate("x", "y", "z", gold_doc)
  path = Candidate(t1.head, t1.relation, t1.tail, gold_doc)
  noise = Candidate("n", "o", "p", "elsewhere")
  assert plan.selection(th, [noise, other, path]) == 2
  assert plan.selection(th, [noise, other]) == 1
  assert plan.selection(th, [noise]) is None


# ------------------------------------------------------------------------------ triple store
class HashEncoder:
  """A deterministic stand-in encoder: unit vectors from hashed words."""
  id = "hash-encoder"
  dim = 32

  def __init__(self):
    self.calls = 0

  # queries and passages without prefixes, as the packaged MiniLM
  encode_queries = encode_passages = property(lambda self: self.encode)

  def encode(self, texts, batch_size=64):
    self.calls += 1
    out = np.zeros((len(texts), self.dim), np.float32)
    for i, t in enumerate(texts):
      for word in t.lower().split():
        out[i, int(hashlib.md5(word.encode()).hexdigest(), 16) % self.dim] += 1
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


def test_candidates_match_a_brute_force_ranking_and_cache(tmp_path, w):
  enc = HashEncoder()
  records = w.corpus[:300]
  store = TripleStore.from_records(records, enc, cache_dir=str(tmp_path))
  assert len(store) == sum(len(r.triples) for r in records) and enc.calls == 1
  docs = [r.id for r in records[10:20]] + [records[10].id]
  q = enc.encode(["where was the director born"])[0]
  got = store.candidates(q, docs, top_triples=7)
  pool = [(t, r.id) for r in records[10:20] for t in r.triples]
  ref = sorted(((float(enc.encode([triple_sentence(t.head, t.relation, t.tail)])[0] @ q), k)
                for k, (t, _) in enumerate(pool)), key=lambda x: (-x[0], x[1]))[:7]
  assert [(c.head, c.relation, c.tail, c.doc_id) for c in got] == [
      (pool[k][0].head, pool[k][0].relation, pool[k][0].tail, pool[k][1]) for _, k in ref]
  assert [c.score for c in got] == pytest.approx([s for s, _ in ref], abs=1e-5)
  assert store.candidates(q, ["no-such-doc"], 5) == []
  again = TripleStore.from_records(records, enc, cache_dir=str(tmp_path))
  assert enc.calls == 1 + 1 + len(pool)       # the cached embeddings were reused
  np.testing.assert_array_equal(again.embeddings, store.embeddings)


def test_question_path_triples_never_enter_unless_a_retrieved_document_states_them(w):
  ex = w.split("train")[0]
  enc = HashEncoder()
  store = TripleStore.from_records(w.corpus, enc)
  path = {(t.head, t.relation, t.tail) for t in ex.triples}
  q = enc.encode([ex.question])[0]
  far = [r.id for r in w.corpus if r.id not in ex.gold_ids][:10]
  got = {(c.head, c.relation, c.tail) for c in store.candidates(q, far, 20)}
  assert not got & path
  near = store.candidates(q, [ex.gold_ids[0]], 20)
  assert {(c.head, c.relation, c.tail) for c in near} & path
  assert all(c.doc_id == ex.gold_ids[0] for c in near)
