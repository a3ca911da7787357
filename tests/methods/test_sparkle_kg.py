"""SPARKLE's knowledge graph is built without evaluation labels (issue 32, defect 2): built as
ProxyTask builds it (sources.select, CorpusSearch, triples.knowledge_graph), no evaluation
question's gold evidence triple is in it."""
import numpy as np
import pytest

from rlrag_jax import config_base
from rlrag_jax.data import sources
from rlrag_jax.methods.sparkle import triples
from rlrag_jax.retrieval.corpus_search import CorpusSearch


class ConstEncoder:
  """Every text is the same unit vector: the index builds in no time; the KG never reads it."""
  dim = 4
  id = "const-4"

  # queries and passages without prefixes, as the packaged MiniLM
  encode_queries = encode_passages = property(lambda self: self.encode)

  def encode(self, texts, batch_size=64):
    del batch_size
    return np.full((len(texts), self.dim), 0.5, np.float32)


def _row(t):
  return (t.head, t.relation, t.tail)


def _gold(examples) -> set:
  return {_row(t) for ex in examples for t in (ex.triples or ())}


def _world(config, tmp_path):
  config.retrieval.backend = "exact"
  config.retrieval.cache_dir = str(tmp_path)
  sel = sources.select(config.data, seed=config.seed)
  return sel, CorpusSearch(config, sel, ConstEncoder())


def _paper(shared_data_dir, tmp_path, mix, eval_mix):
  c = config_base.load_config_file("configs/sparkle.py:paper")
  c.data.dir = str(shared_data_dir)
  c.data.mix = mix                          # the shared samples have no 2Wiki train
  c.data.eval_mix = eval_mix
  return _world(c, tmp_path)


def test_paper_kg_holds_no_evaluation_gold_triple(shared_data_dir, tmp_path):
  # 2Wiki dev first, so that max_eval keeps evaluation questions with evidence triples.
  sel, env = _paper(shared_data_dir, tmp_path, ("hotpotqa:train:3000",),
                    ("2wiki:dev", "hotpotqa:dev"))
  held_out = _gold(sel.eval)
  assert len(held_out) > 100
  for mode in triples.KG_DEFAULTS:
    kg = triples.knowledge_graph(env, sel.train, "", mode)
    assert set(kg) == {r.id for r in env.records}
    leaked = [t for rows in kg.values() for t in rows if t in held_out]
    assert not leaked, (mode, leaked[:3])
  kg = triples.knowledge_graph(env, sel.train, "", "sentences")
  assert all(kg.values())                   # every document, as the paper's extraction
  r = env.records[0]
  assert kg[r.id][0][:2] == (r.title, "states") and kg[r.id][0][2] in r.text


def test_train_evidence_kg_holds_only_training_questions_triples(shared_data_dir, tmp_path):
  sel, env = _paper(shared_data_dir, tmp_path, ("2wiki:dev",), ("hotpotqa:dev",))
  half = len(sel.train) // 2
  train, held = sel.train[:half], sel.train[half:]
  kg = triples.knowledge_graph(env, train, "", "train_evidence")
  rows = {t for v in kg.values() for t in v}
  assert rows and rows <= _gold(train)
  assert not rows & (_gold(held) - _gold(train))
  assert not any(triples.knowledge_graph(env, train, "", "none").values())


def test_triples_file_rows_come_before_the_default(shared_data_dir, tmp_path):
  sel, env = _paper(shared_data_dir, tmp_path, ("hotpotqa:train:3000",), ("hotpotqa:dev",))
  doc = env.records[3].id
  path = tmp_path / "triples.jsonl"
  path.write_text('{"id": "%s", "triples": [["A", "r", "B"]]}\n' % doc)
  kg = triples.knowledge_graph(env, sel.train, str(path), "none")
  assert kg[doc] == [("A", "r", "B")]
  assert sum(map(bool, kg.values())) == 1


def test_cpu_default_kg_is_the_passages_own_triples(tmp_path):
  """The world's passages state their own facts (a perfect offline extractor): the KG is exactly
  those, whatever the questions. An evaluation question's path triple is in it only because its
  gold passage states it, as the paper's extraction would find it there."""
  sel, env = _world(config_base.load_config_file("configs/sparkle.py"), tmp_path)
  for mode in triples.KG_DEFAULTS:
    kg = triples.knowledge_graph(env, sel.train, "", mode)
    assert kg == {r.id: [_row(t) for t in r.triples] for r in env.records}
  stated = {(r.id, _row(t)) for r in env.records for t in r.triples}
  for ex in sel.eval:
    for t in ex.triples:
      if any(_row(t) in kg[d] for d in kg):
        assert any((d, _row(t)) in stated for d in env.ids(ex, ex.gold_ids)), _row(t)


def test_unknown_kg_default_names_the_key(tmp_path):
  sel, env = _world(config_base.load_config_file("configs/sparkle.py"), tmp_path)
  with pytest.raises(ValueError, match="sparkle.kg_default"):
    triples.knowledge_graph(env, sel.train, "", "gold")
