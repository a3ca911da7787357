"""The knowledge-triple corpus behind SPARKLE's Knowledge Integration agent.

Every document's triples are known offline (the paper extracts them with an LLM and caches
them; the embedded world ships the triples its passages state; a real corpus loads the file
written by `python -m rlrag_jax.methods.sparkle.extract_triples`, else `sparkle.kg_default`
decides: `knowledge_graph` below, which never sees an evaluation question). At a retrieval,
the triples of the retrieved documents (the paper: top-10) are ranked by the encoder's
similarity to the query and the best `top_triples` (the paper: 20) become the candidates, each
remembering its source document (which joins the context when the agent selects it).

Candidates only ever come from retrieved documents' own triples: a question's reasoning path
(`Example.triples`, 2Wiki's `evidences`) is never offered, so the answer cannot leak through it.
Triple embeddings are computed once per (corpus, encoder) and cached as a .npy file.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import pathlib
import re
from typing import Mapping, Optional, Sequence

import numpy as np

log = logging.getLogger("rlrag_jax.sparkle")

# sparkle.kg_default: the triples of a document that has neither its own nor a triples_file row.
KG_DEFAULTS = ("sentences", "train_evidence", "none")


@dataclasses.dataclass(frozen=True)
class Candidate:
  head: str
  relation: str
  tail: str
  doc_id: str
  score: float = 0.0


def triple_sentence(head: str, relation: str, tail: str) -> str:
  """What the encoder reads for a triple ("The Silent Coast directed by Tamnal Quilothsyl")."""
  return f"{head} {relation.replace('_', ' ')} {tail}"


class TripleStore:
  """Per-document triples and their unit embeddings [N, d]."""

  def __init__(self, triples_by_doc: Mapping[str, Sequence], encoder,
               cache_dir: Optional[str] = None, batch_size: int = 256):
    self.doc_ids, self.rows = [], []
    self.by_doc = {}
    for doc in triples_by_doc:
      start = len(self.rows)
      for t in triples_by_doc[doc]:
        h, r, tl = (t.head, t.relation, t.tail) if hasattr(t, "head") else tuple(t)
        self.rows.append((str(h), str(r), str(tl)))
        self.doc_ids.append(str(doc))
      self.by_doc[str(doc)] = (start, len(self.rows))
    self.encoder = encoder
    self.embeddings = self._embed(cache_dir, batch_size)

  @classmethod
  def from_records(cls, records: Sequence, encoder, cache_dir: Optional[str] = None,
                   extracted: Optional[Mapping[str, Sequence]] = None) -> "TripleStore":
    """Triples of corpus records (their own `triples`, else `extracted[record id]`)."""
    extracted = extracted or {}
    by_doc = {r.id: (list(r.triples) if getattr(r, "triples", None) else
                     list(extracted.get(r.id, ()))) for r in records}
    return cls(by_doc, encoder, cache_dir)

  def __len__(self) -> int:
    return len(self.rows)

  def _embed(self, cache_dir, batch_size) -> np.ndarray:
    dim = int(self.encoder.dim)
    if not self.rows:
      return np.zeros((0, dim), np.float32)
    texts = [triple_sentence(*r) for r in self.rows]
    h = hashlib.sha1(str(self.encoder.id).encode())
    for d, t in zip(self.doc_ids, texts):
      h.update(f"{d}\x00{t}\x01".encode())
    path = (pathlib.Path(cache_dir).expanduser() / f"triples-{h.hexdigest()[:16]}.npy"
            if cache_dir else None)
    if path is not None and path.exists():
      emb = np.load(path)
      if emb.shape == (len(texts), dim):
        return emb
    log.info("sparkle: encoding %d triples%s", len(texts),
             f" (cached in {path})" if path else "")
    emb = np.asarray(self.encoder.encode(texts, batch_size=batch_size), np.float32)
    if path is not None:
      path.parent.mkdir(parents=True, exist_ok=True)
      tmp = path.with_suffix(".tmp.npy")
      np.save(tmp, emb)
      tmp.replace(path)
    return emb

  def doc_triples(self, doc_id: str) -> list:
    a, b = self.by_doc.get(str(doc_id), (0, 0))
    return [Candidate(*self.rows[k], doc_id=self.doc_ids[k]) for k in range(a, b)]

  def candidates(self, query_vec: np.ndarray, doc_ids: Sequence[str],
                 top_triples: int) -> list:
    """The `top_triples` triples of `doc_ids` most similar to the query, best first (ties keep
    document then triple order); a document repeated in `doc_ids` counts once."""
    rows, seen = [], set()
    for d in doc_ids:
      d = str(d)
      if d in seen:
        continue
      seen.add(d)
      a, b = self.by_doc.get(d, (0, 0))
      rows.extend(range(a, b))
    if not rows:
      return []
    scores = self.embeddings[rows] @ np.asarray(query_vec, np.float32)
    order = sorted(range(len(rows)), key=lambda k: (-float(scores[k]), k))[:int(top_triples)]
    return [Candidate(*self.rows[rows[k]], doc_id=self.doc_ids[rows[k]],
                      score=float(scores[k])) for k in order]


# ------------------------------------------------------------------ the knowledge graph
def _load_triples(path: str) -> dict:
  """{doc id: [(head, relation, tail)]} from extract_triples' JSONL file ('' = none)."""
  if not path:
    return {}
  out = {}
  p = pathlib.Path(path).expanduser()
  if not p.exists():
    raise FileNotFoundError(f"config key 'sparkle.triples_file': {p} does not exist (write it "
                            "with python -m rlrag_jax.methods.sparkle.extract_triples)")
  for n, line in enumerate(p.read_text().splitlines(), 1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
      out[str(row["id"])] = [tuple(map(str, t))[:3] for t in row["triples"]]
    except (ValueError, KeyError, TypeError) as e:
      raise ValueError(f"{p}:{n}: expected {{'id': ..., 'triples': [[h, r, t], ...]}} ({e})") \
          from None
  return out


def _evidence_triples(env, examples) -> dict:
  """2Wiki's evidence triples as the triples of the document that states them (the gold
  context titled by the triple's head): offered only when that document is retrieved, never as
  a question's own path. Label-derived: called with training questions only."""
  from rlrag_jax import metrics
  out = {}
  for ex in examples:
    for t in getattr(ex, "triples", None) or ():
      for c in getattr(ex, "contexts", ()):
        if metrics.normalize_answer(c.title) == metrics.normalize_answer(t.head):
          for cid in env.ids(ex, [c.id]):
            row = (t.head, t.relation, t.tail)
            if row not in out.setdefault(cid, []):
              out[cid].append(row)
          break
  return out


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def _sentence_triples(record) -> list:
  """A rule's triples of one document, no LLM and no question: one (title, 'states',
  sentence) per sentence of its text."""
  text = " ".join(str(record.text).split())
  return [(str(record.title), "states", s) for s in _SENTENCE_END.split(text) if s]


def knowledge_graph(env, train, triples_file: str = "",
                    default: str = "sentences") -> dict:
  """{corpus id: [(head, relation, tail)]}, the KG the agent's candidates come from, built
  without the evaluation questions (it is never handed them): a document's own triples (the
  world's), else its rows of `triples_file` (extract_triples' JSONL, the paper's offline
  extraction), else `default` (config key 'sparkle.kg_default'):
    'sentences'       one (title, 'states', sentence) per sentence of the document: every
                      document, no labels (the paper's coverage, not its extractor);
    'train_evidence'  the 2Wiki evidence triples of the training questions on the documents
                      that state them: label-derived, and only training questions' gold
                      documents get any;
    'none'            no triples."""
  if default not in KG_DEFAULTS:
    raise ValueError(f"config key 'sparkle.kg_default' is {default!r}; expected one of "
                     f"{KG_DEFAULTS}")
  from_file = _load_triples(triples_file)
  evidence = _evidence_triples(env, train) if default == "train_evidence" else {}
  out = {}
  for r in env.records:
    own = [(t.head, t.relation, t.tail) if hasattr(t, "head") else tuple(t)[:3]
           for t in (getattr(r, "triples", None) or ())]
    if own:
      out[r.id] = own
    elif r.id in from_file:
      out[r.id] = list(from_file[r.id])
    elif default == "sentences":
      out[r.id] = _sentence_triples(r)
    else:
      out[r.id] = list(evidence.get(r.id, ()))
  return out
