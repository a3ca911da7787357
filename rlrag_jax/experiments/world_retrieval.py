"""How well the shared encoder finds the embedded world's gold passages.

  python -m rlrag_jax.experiments.world_retrieval [--split dev] [--k 5] [--max_questions 400]

Queries are the single-hop sub-questions of the gold decompositions ('#k' replaced by the earlier
sub-answers); each step's gold passages are its `gold_ids`. Reports exact-search Recall@k and
Full-Recall@k per hop position, over the packaged MiniLM encoder.
"""
from __future__ import annotations

import argparse
import collections
import re

import numpy as np

from rlrag_jax import metrics, runlog

_REF = re.compile(r"#(\d+)")


def single_hop_queries(examples) -> list:
  """(query, gold_ids, step index) for every decomposition step that has gold passages."""
  out = []
  for ex in examples:
    answers = []
    for i, step in enumerate(ex.decomposition):
      q = _REF.sub(lambda m: answers[int(m.group(1)) - 1]
                   if 0 < int(m.group(1)) <= len(answers) else m.group(0), step.question)
      answers.append(step.answer)
      if step.gold_ids:
        out.append((q, list(step.gold_ids), i))
  return out


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--split", default="dev")
  ap.add_argument("--k", type=int, default=5)
  ap.add_argument("--max_questions", type=int, default=400)
  ap.add_argument("--seed", type=int, default=0)
  args = ap.parse_args(argv)
  from rlrag_jax.data import world as world_lib
  from rlrag_jax.retrieval import Encoder, Retriever
  w = world_lib.build(seed=args.seed)
  examples = w.split(args.split)[: args.max_questions]
  queries = single_hop_queries(examples)
  retriever = Retriever.build(w.corpus, Encoder.from_pretrained(), backend="exact")
  hits = retriever.search([q for q, _, _ in queries], k=args.k)
  by_step = collections.defaultdict(list)
  for (q, gold, i), h in zip(queries, hits):
    ids = [x.id for x in h]
    by_step[i + 1].append((metrics.recall_at_k(ids, gold, args.k),
                           metrics.full_recall_at_k(ids, gold, args.k)))
  rows = []
  for step in sorted(by_step):
    r = np.array(by_step[step])
    rows.append({"step": step, f"recall@{args.k}": r[:, 0].mean(),
                 f"full_recall@{args.k}": r[:, 1].mean(), "n": len(r)})
  allr = np.array([x for v in by_step.values() for x in v])
  rows.append({"step": "all", f"recall@{args.k}": allr[:, 0].mean(),
               f"full_recall@{args.k}": allr[:, 1].mean(), "n": len(allr)})
  print(runlog.format_table(rows, ["step", f"recall@{args.k}", f"full_recall@{args.k}", "n"],
                            title=f"world {args.split}: exact search over {len(w.corpus)} passages"))
  return rows


if __name__ == "__main__":
  main()
