"""`CorpusSearch`: a run's corpus, its cached retriever and query embeddings, and the mapping of
an example's gold context ids to corpus ids: what a method that retrieves by query text and
scores against gold documents needs (R2AG, SPARKLE). Knows no method."""
from __future__ import annotations

from typing import Sequence

from rlrag_jax.retrieval import from_config
from rlrag_jax.retrieval.query_cache import QueryEmbeddings


class _StoreById:
  """`by_id` over a PassageStore: `id in`, `[id]` and `get` without a dict of every passage."""

  def __init__(self, store):
    self.store = store

  def __contains__(self, rid) -> bool:
    return self.store.row_of(str(rid)) is not None

  def __getitem__(self, rid):
    row = self.store.row_of(str(rid))
    if row is None:
      raise KeyError(rid)
    return self.store[row]

  def get(self, rid, default=None):
    row = self.store.row_of(str(rid))
    return default if row is None else self.store[row]


class CorpusSearch:

  def __init__(self, config, selection, encoder=None):
    self.records = from_config.corpus_for(config, selection)
    self.encoder, self.retriever, self.index_dir = from_config.retriever_for(
        config, self.records, encoder)
    self.embed = QueryEmbeddings(self.encoder)
    if isinstance(self.records, list):
      self.by_id = {r.id: r for r in self.records}
      self._by_text = {(r.title, r.text): r.id for r in self.records}
    else:      # a prebuilt index's store (any size): ids are looked up, texts are not matched
      self.by_id = _StoreById(self.records)
      self._by_text = {}

  def ids(self, ex, ids) -> tuple:
    """Corpus ids of an example's context ids (the world's are corpus ids already; a real
    dataset's are matched by title and text, except over a prebuilt index, where only ids
    match); unmatched ids are left out."""
    out = []
    for i in ids:
      i = str(i)
      if i in self.by_id:
        out.append(i)
        continue
      c = ex.context(i) if hasattr(ex, "context") else None
      cid = self._by_text.get((c.title, c.text)) if c is not None else None
      if cid is not None and cid not in out:
        out.append(cid)
    return tuple(out)

  def pairs(self, ids) -> list:
    """(title, text) of each corpus id."""
    return [(self.by_id[i].title, self.by_id[i].text) for i in ids]

  def search(self, queries: Sequence[str], k: int) -> list:
    """Per query the ids of its top-k documents (one batched encoder call and search)."""
    if not queries:
      return []
    hits = self.retriever.search_embeddings(self.embed(list(queries)), k)
    return [[h.id for h in hs] for hs in hits]
