"""`CorpusSearch`: a run's corpus, its cached retriever and query embeddings, and the mapping of
an example's gold context ids to corpus ids: what a method that retrieves by query text and
scores against gold documents needs (R2AG, SPARKLE). Knows no method.

With `retrieval.url` set the passage searches go to that server (`client.RemoteRetriever`) and
their ids are the server's; the query embeddings (`embed`) and the mapping of gold contexts to
corpus ids stay local, on `retrieval.corpus`. So the server must serve that same corpus with the
same ids for gold ids and retrieved ids to meet; a retrieved passage the local corpus lacks is
still readable (`pairs`) from what the server sent, and a retrieved id whose title or text
differs from the local passage of that id is warned about once."""
from __future__ import annotations

import logging
from typing import Sequence

from rlrag_jax.retrieval import from_config
from rlrag_jax.retrieval.query_cache import QueryEmbeddings

log = logging.getLogger("rlrag_jax.retrieval")


class _StoreById:
  """`by_id` over a PassageStore: `id in`, `[id]`, `get` and (for passages a server returns that
  the store lacks) `[id] = record`, without a dict of every passage."""

  def __init__(self, store):
    self.store = store
    self.extra = {}

  def get(self, rid, default=None):
    rid = str(rid)
    if rid in self.extra:
      return self.extra[rid]
    row = self.store.row_of(rid)
    return default if row is None else self.store[row]

  def __contains__(self, rid) -> bool:
    return self.get(rid) is not None

  def __getitem__(self, rid):
    rec = self.get(rid)
    if rec is None:
      raise KeyError(rid)
    return rec

  def __setitem__(self, rid, record) -> None:
    self.extra[str(rid)] = record


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
    self.remote = bool(config.retrieval.url)    # retrieval as a service
    self._mismatch_warned = False

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
    if self.remote:
      hits = self.retriever.search(list(queries), k)
      self._note_remote(hits)
    else:
      hits = self.retriever.search_embeddings(self.embed(list(queries)), k)
    return [[h.id for h in hs] for hs in hits]

  # ------------------------------------------------ retrieval as a service (retrieval.url)
  def _note_remote(self, hits) -> None:
    """Keeps the server's passages the local corpus lacks (for `pairs`); warns once when an id
    names another passage on the server than here."""
    from rlrag_jax.data.schema import CorpusRecord
    for h in (h for hs in hits for h in hs):
      mine = self.by_id.get(h.id)
      if mine is None:
        self.by_id[h.id] = CorpusRecord(id=h.id, title=h.title, text=h.text)
      elif (mine.title, mine.text) != (h.title, h.text) and not self._mismatch_warned:
        self._mismatch_warned = True
        log.warning("retrieval.url: the server's passage %r (title %r) differs from the local "
                    "corpus's (title %r): the server serves another corpus than "
                    "retrieval.corpus, so gold and retrieved ids do not name the same passages",
                    h.id, h.title, mine.title)
