"""The retrieval corpus and a cached Retriever for a run, from its config's `retrieval` section:

  retrieval.corpus     '' = the data selection's own corpus (the embedded world), else the
                       deduplicated contexts of its examples; or a name in loaders.CORPORA / a
                       JSONL path
  retrieval.backend    'exact' | 'scann'
  retrieval.scann_brute_force_below  corpora smaller than this get ScaNN's float brute force
                       (exact search; default 16384); lower it to run the partitioned tree + AH
                       + reorder on a small corpus (the index logs which of the two runs)
  retrieval.encoder_path  '' = the packaged MiniLM
  retrieval.cache_dir  where built indexes are kept ('' = <workdir>/retriever)
  retrieval.url        '' = search in process; else a retrieval server (Search-R1's protocol):
                       `retriever_for` returns a `client.RemoteRetriever` and builds no index
                       (url_timeout_s, url_retries, url_max_failure_rate, url_failure_window:
                       its client settings)

Shared by every method that retrieves (the search agent, APEX's executor); knows no method.
"""
from __future__ import annotations

import hashlib
import json
import logging
import pathlib

log = logging.getLogger("rlrag_jax.retrieval")


def corpus_for(config, selection) -> list:
  """The corpus: `retrieval.corpus` (a name in loaders.CORPORA or a JSONL path), else the
  selection's own corpus (the world), else the deduplicated contexts of every example (train,
  eval, then validation: a run without validation pools exactly what it did before)."""
  from rlrag_jax.data.schema import CorpusRecord
  name = config.retrieval.corpus
  if name:
    from rlrag_jax.data import loaders
    return loaders.load_corpus(name)
  if selection.corpus:
    return list(selection.corpus)
  seen, out = set(), []
  for ex in list(selection.train) + list(selection.eval) + list(selection.val):
    for c in ex.contexts:
      key = (c.title, c.text)
      if key not in seen:
        seen.add(key)
        out.append(CorpusRecord(id=f"p{len(out)}", title=c.title, text=c.text))
  if not out:
    raise ValueError(f"{config.method}: no retrieval corpus: set config key 'retrieval.corpus' "
                     "(the examples carry no contexts to build one from)")
  return out


def retriever_for(config, corpus, encoder=None):
  """(encoder, Retriever, index folder), the index cached under `retrieval.cache_dir` (default
  <workdir>/retriever) by a fingerprint of the corpus, the encoder and the index settings.
  With `retrieval.url` set: (encoder, RemoteRetriever, a local cache folder), no index built;
  the encoder is still loaded for what a method embeds itself."""
  from rlrag_jax.retrieval import Encoder, Retriever
  rc = config.retrieval
  if encoder is None:
    encoder = Encoder.from_pretrained(rc.encoder_path or None)
  if rc.url:                   # retrieval as a service: see remote_retriever below
    return encoder, *remote_retriever(config)
  index_params = {}
  if rc.backend == "scann":
    index_params["brute_force_below"] = int(rc.scann_brute_force_below)
  h = hashlib.sha1(encoder.id.encode())
  h.update(rc.backend.encode())
  for k, v in sorted(index_params.items()):
    h.update(f"\x02{k}={v}".encode())
  for r in corpus:
    h.update(f"{r.id}\x00{r.title}\x00{r.text}\x01".encode())
  cache = pathlib.Path(rc.cache_dir or pathlib.Path(config.workdir) / "retriever").expanduser()
  folder = cache / f"index-{h.hexdigest()[:16]}"
  if (folder / "manifest.json").exists():
    return encoder, Retriever.load(folder, encoder), folder
  log.info("%s: encoding %d passages for the %s index (cached in %s)", config.method,
           len(corpus), rc.backend, folder)
  retriever = Retriever.build(corpus, encoder, backend=rc.backend, batch_size=128,
                              **index_params)
  retriever.save(folder)
  (folder / "built_by.json").write_text(json.dumps({"corpus": rc.corpus or "selection",
                                                    "n": len(corpus),
                                                    "index_mode": retriever.index.mode}))
  return encoder, retriever, folder


# ---------------------------------------------------------------- retrieval as a service
def remote_retriever(config) -> tuple:
  """(RemoteRetriever of `retrieval.url`, a folder for the run's local caches keyed by the url:
  <cache_dir>/remote-<hash>). What the server says of itself (/health, where it has one) is
  logged once."""
  from rlrag_jax.retrieval import client
  rc = config.retrieval
  remote = client.from_config(rc)
  cache = pathlib.Path(rc.cache_dir or pathlib.Path(config.workdir) / "retriever").expanduser()
  folder = cache / f"remote-{hashlib.sha1(rc.url.encode()).hexdigest()[:16]}"
  folder.mkdir(parents=True, exist_ok=True)
  health = remote.health()
  if health is None:
    log.info("%s: passages from %s (no /health: a server of the protocol other than ours, or "
             "not up yet)", config.method, rc.url)
  else:
    log.info("%s: passages from %s: %s passages, %s backend, encoder %s", config.method, rc.url,
             health.get("n"), health.get("backend"), health.get("encoder"))
  return remote, folder
