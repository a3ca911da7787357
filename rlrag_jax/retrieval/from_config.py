"""The retrieval corpus, the query encoder and a cached Retriever for a run, from its config's
`retrieval` section (keys and their meaning: `config_base.retrieval_config`):

  retrieval.index      a prebuilt index folder: its passage store is the corpus, its vectors are
                       searched, nothing is encoded but queries (with the index's conventions:
                       an encoder or pooling / prefix that differs is refused, naming both)
  retrieval.corpus     else '' = the data selection's own corpus (the embedded world), else the
                       deduplicated contexts of its examples; or a name in loaders.CORPORA / a
                       corpus file: indexed on first use into the same layout as the build CLI
                       writes, cached under `retrieval.cache_dir` (default <workdir>/retriever)
  retrieval.encoder_path, pooling, query_prefix, passage_prefix   the encoder and its conventions
  retrieval.backend, scann_brute_force_below                      the index built on first use
  retrieval.url        '' = search in process; else a retrieval server (Search-R1's protocol):
                       `retriever_for` returns a `client.RemoteRetriever` and builds no index
                       (url_timeout_s, url_retries, url_max_failure_rate, url_failure_window:
                       its client settings)

Shared by every method that retrieves (the search agent, APEX's executor, SPARKLE, R2AG); knows
no method.
"""
from __future__ import annotations

import hashlib
import json
import logging
import pathlib

log = logging.getLogger("rlrag_jax.retrieval")


def encoder_for(config):
  """The query / passage encoder of `retrieval.encoder_path` with the section's conventions."""
  from rlrag_jax.retrieval import Encoder
  rc = config.retrieval
  kw = {}
  if rc.pooling:
    kw["pooling"] = rc.pooling
  for key in ("query_prefix", "passage_prefix"):
    if rc[key] != "auto":
      kw[key] = rc[key]
  return Encoder.from_pretrained(rc.encoder_path or None, **kw)


def corpus_for(config, selection):
  """The corpus: the `retrieval.index` folder's passage store, else `retrieval.corpus` (a name in
  loaders.CORPORA or a file), else the selection's own corpus (the world), else the deduplicated
  contexts of every example (train, eval, then validation: a run without validation pools
  exactly what it did before). A list of CorpusRecords, or a PassageStore (index by row)."""
  from rlrag_jax.data.schema import CorpusRecord
  if config.retrieval.index:
    from rlrag_jax.retrieval.store import PassageStore
    return PassageStore(pathlib.Path(config.retrieval.index).expanduser() / "store")
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
  if not out and not config.retrieval.url:   # with a server, its corpus is searched remotely
    raise ValueError(f"{config.method}: no retrieval corpus: set config key 'retrieval.corpus', "
                     "'retrieval.index' or 'retrieval.url' (the examples carry no contexts to "
                     "build one from)")
  return out


def retriever_for(config, corpus, encoder=None):
  """(encoder, Retriever, index folder): the `retrieval.index` folder, else an index of `corpus`
  cached under `retrieval.cache_dir` (default <workdir>/retriever) by a fingerprint of the
  corpus, the encoder, its conventions and the index settings. With `retrieval.url` set:
  (encoder, RemoteRetriever, a local cache folder), no index built; the encoder is still loaded
  for what a method embeds itself."""
  from rlrag_jax.retrieval import Retriever
  from rlrag_jax.retrieval.retriever import RetrieverFormatError
  rc = config.retrieval
  if encoder is None:
    encoder = encoder_for(config)
  if rc.url:                   # retrieval as a service: see remote_retriever below
    return encoder, *remote_retriever(config)
  if rc.index:
    folder = pathlib.Path(rc.index).expanduser()
    try:
      retriever = Retriever.load(folder, encoder)
    except RetrieverFormatError as e:
      raise RetrieverFormatError(f"config key retrieval.index={rc.index!r}: {e} (the query "
                                 f"encoder is retrieval.encoder_path={rc.encoder_path!r})") from None
    log.info("%s: prebuilt index %s: %d passages, %s", config.method, folder, len(retriever),
             retriever.index.describe())
    return encoder, retriever, folder
  index_params = {}
  if rc.backend == "scann":
    index_params["brute_force_below"] = int(rc.scann_brute_force_below)
  h = hashlib.sha1(encoder.id.encode())
  h.update(rc.backend.encode())
  h.update(f"\x03format={Retriever.FORMAT_VERSION}".encode())
  conventions = encoder.conventions() if hasattr(encoder, "conventions") else {}
  for k, v in sorted(list(index_params.items()) + list(conventions.items())):
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
  retriever.save(folder, extra={"built_by": {"corpus": rc.corpus or "selection",
                                             "n": len(corpus)}})
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
