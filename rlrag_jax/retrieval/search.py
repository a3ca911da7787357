"""Search an index folder from the command line (as pyserini's and FlashRAG's tools do).

  python -m rlrag_jax.retrieval.search --index DIR [--topk 3] [--json] [QUERY ...]

Queries come from the arguments, else one a line on standard input. Plain output prints each
query and its hits (rank, score, id, title, the text's first words); `--json` prints one line a
query: {"query": ..., "hits": [{"id": ..., "score": ..., "contents": "\"Title\"\\ntext"}, ...]}.
The query encoder is the index's own (its manifest names it: `--encoder` is needed only when it
is not the packaged MiniLM), with the index's pooling and prefixes; another one is refused.
"""
from __future__ import annotations

import argparse
import json
import sys


def contents(title: str, text: str) -> str:
  """FlashRAG's / Search-R1's passage text: '"Title"\\ntext'."""
  return f'"{title}"\n{text}'


def open_searcher(index: str, encoder_path: str = ""):
  """(Retriever over the index folder, its manifest), with a query encoder of the index's
  conventions."""
  from rlrag_jax.retrieval.encoder import Encoder  # pylint: disable=g-import-not-at-top
  from rlrag_jax.retrieval.retriever import Retriever  # pylint: disable=g-import-not-at-top
  m = Retriever.read_manifest(index)
  conv = m.get("conventions") or {}
  kw = {k: conv[k] for k in ("pooling", "normalize", "query_prefix", "passage_prefix")
        if k in conv}
  encoder = Encoder.from_pretrained(encoder_path or None, **kw)
  return Retriever.load(index, encoder), m


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m rlrag_jax.retrieval.search",
                              description="Top-k passages of an index folder for text queries.")
  p.add_argument("--index", required=True, help="an index folder (retrieval.build's --out)")
  p.add_argument("--topk", type=int, default=3)
  p.add_argument("--json", action="store_true", help="one JSON line a query")
  p.add_argument("--encoder", default="",
                 help="the query encoder's folder ('' = packaged MiniLM); must be the index's")
  p.add_argument("--batch-size", type=int, default=64)
  p.add_argument("queries", nargs="*", help="queries (default: one a line on stdin)")
  args = p.parse_args(argv)
  if args.topk < 1:
    print(f"search: --topk must be >= 1, got {args.topk}", file=sys.stderr)
    return 2
  queries = args.queries or [line.rstrip("\n") for line in sys.stdin if line.strip()]
  from rlrag_jax.retrieval.retriever import RetrieverFormatError  # pylint: disable=g-import-not-at-top
  try:
    retriever, _ = open_searcher(args.index, args.encoder)
  except (RetrieverFormatError, FileNotFoundError, ValueError) as e:
    print(f"search: {e}", file=sys.stderr)
    return 2
  for start in range(0, len(queries), 1024):
    batch = queries[start:start + 1024]
    for q, hits in zip(batch, retriever.search(batch, k=args.topk, batch_size=args.batch_size)):
      if args.json:
        print(json.dumps({"query": q, "hits": [
            {"id": h.id, "score": round(float(h.score), 6), "contents": contents(h.title, h.text)}
            for h in hits]}, ensure_ascii=False))
      else:
        print(f"query: {q}")
        for rank, h in enumerate(hits, 1):
          words = h.text.split()
          print(f"  {rank}. {h.score:.4f}  {h.id}  {h.title}: {' '.join(words[:20])}"
                f"{' ...' if len(words) > 20 else ''}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
