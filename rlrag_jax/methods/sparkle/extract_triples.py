"""Offline knowledge-triple extraction for SPARKLE's Knowledge Integration agent (the paper
decomposes every retrieved document into triples with an LLM, precomputed and cached).

  python -m rlrag_jax.methods.sparkle.extract_triples --config=configs/sparkle.py:paper \\
      --config.data.dir=/path/to/data --out=triples.jsonl \\
      (--url=http://localhost:8000/v1 --model=NAME | --lm=/path/to/run_or_hf_dir) [--limit=N]

Every document of the config's retrieval corpus (the same corpus training retrieves from) is
given to the extractor with an instruction to list `<head; relation; tail>` triples; each line of
`--out` is `{"id": corpus id, "triples": [[head, relation, tail], ...]}`. The file is appended to
and resumable: documents already in it are skipped. A document whose reply holds no triple is
written with an empty list and counted; a failed request is skipped (not written) and counted,
and the command exits 1 so that a rerun fills the gaps. `sparkle.triples_file` points training
at the file.
"""
from __future__ import annotations

import json
import pathlib
import sys
from typing import Callable, Optional, Sequence

from rlrag_jax.methods.sparkle import parsing

INSTRUCTION = (
    "Extract the knowledge triples stated in the document below. Write each as "
    "<head; relation; tail>, separated by commas, and nothing else. Use the entities' full names.")


def prompt(title: str, text: str) -> str:
  return f"{INSTRUCTION}\n\nDocument ({title}): {text}\nTriples:"


def read_done(path) -> dict:
  """{corpus id: triples} already in the output file; a malformed line names file and line."""
  out = {}
  p = pathlib.Path(path)
  if not p.exists():
    return out
  for n, line in enumerate(p.read_text().splitlines(), start=1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
      out[str(row["id"])] = [list(t) for t in row["triples"]]
    except (ValueError, KeyError, TypeError) as e:
      raise ValueError(f"{p}:{n}: expected {{'id': ..., 'triples': [...]}} ({e})") from None
  return out


def extract(records: Sequence, ask: Callable, out_path, *, batch: int = 16, limit: int = 0,
            progress: bool = True) -> dict:
  """Asks `ask([prompt]) -> [reply | None]` for every record not yet in `out_path`, `batch`
  at a time, appending each answered record at once. Counts {'asked', 'written', 'empty',
  'failed', 'already'}."""
  from tqdm.auto import tqdm
  out_path = pathlib.Path(out_path)
  done = read_done(out_path)
  todo = [r for r in records if str(r.id) not in done]
  if limit:
    todo = todo[:limit]
  counts = {"asked": 0, "written": 0, "empty": 0, "failed": 0, "already": len(done)}
  out_path.parent.mkdir(parents=True, exist_ok=True)
  bar = tqdm(total=len(todo), desc="triples", unit="doc", disable=not progress)
  with out_path.open("a") as f:
    for start in range(0, len(todo), batch):
      part = todo[start:start + batch]
      replies = list(ask([prompt(r.title, r.text) for r in part]))
      counts["asked"] += len(part)
      for r, reply in zip(part, replies):
        if reply is None:
          counts["failed"] += 1
          continue
        triples = [list(t) for t in parsing.parse_triples(reply) if all(t)]
        counts["empty"] += not triples
        f.write(json.dumps({"id": str(r.id), "triples": triples}) + "\n")
        counts["written"] += 1
      f.flush()
      bar.update(len(part))
  bar.close()
  return counts


def endpoint_ask(url: str, model: str, max_tokens: int = 512) -> Callable:
  from rlrag_jax.judge import chat_completion
  base = url.rstrip("/")
  full = base if base.endswith("/chat/completions") else base + "/chat/completions"

  def ask(prompts: Sequence[str]) -> list:
    return [chat_completion(full, {"model": model, "temperature": 0.0, "max_tokens": max_tokens,
                                   "messages": [{"role": "user", "content": p}]})
            for p in prompts]
  return ask


def lm_ask(path: str, max_tokens: int = 256) -> Callable:
  """Greedy generation with a local LM (a training run dir or an HF checkpoint dir)."""
  import jax
  from rlrag_jax.rollout.policy import Policy
  from rlrag_jax.rollout.single_turn import decode_keeping_tags
  from rlrag_jax.run_dirs import load_trained
  lm = load_trained(path)
  tok = lm.tokenizer
  pol = Policy(lm.config, lm.params, max_new_tokens=int(max_tokens),
               eos_ids=tuple(lm.config.eos_token_id or ()) or (tok.eos_token_id,),
               pad_id=tok.pad_token_id or 0)
  room = int(lm.config.max_position_embeddings) - int(max_tokens)

  def ask(prompts: Sequence[str]) -> list:
    ids = [tok(p, add_special_tokens=False)["input_ids"][-room:] for p in prompts]
    rows, _ = pol.sample_chunked(ids, jax.random.PRNGKey(0), chunk=len(ids), greedy=True)
    return [decode_keeping_tags(tok, comp) for comp, _ in rows]
  return ask


def main(argv: Optional[list] = None) -> int:
  from absl import flags
  from ml_collections import config_flags
  fl = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "configs/sparkle.py[:preset]", flag_values=fl)
  flags.DEFINE_string("out", None, "the triples JSONL to write (appended; resumable)",
                      flag_values=fl)
  flags.DEFINE_string("url", "", "OpenAI-compatible endpoint base URL", flag_values=fl)
  flags.DEFINE_string("model", "", "the endpoint's model name", flag_values=fl)
  flags.DEFINE_string("lm", "", "a local run dir or HF checkpoint instead of an endpoint",
                      flag_values=fl)
  flags.DEFINE_integer("limit", 0, "at most this many new documents (0: all)", flag_values=fl)
  flags.DEFINE_integer("batch", 16, "documents per call", flag_values=fl)
  args = list(sys.argv if argv is None else argv)
  if any(a in ("-h", "--help", "-help") for a in args[1:]):   # a private FlagValues has none
    print("usage: python -m rlrag_jax.methods.sparkle.extract_triples --config=... --out=FILE "
          f"and --url/--model or --lm\n\n{fl.get_help()}")
    return 0
  fl(args)
  if fl.config is None or not fl.out or not (fl.url or fl.lm):
    print("usage: --config=... --out=FILE and --url/--model or --lm", file=sys.stderr)
    return 2
  from rlrag_jax.data import sources
  from rlrag_jax.retrieval import from_config
  config = fl.config
  records = from_config.corpus_for(config, sources.select(config.data, seed=config.seed))
  ask = endpoint_ask(fl.url, fl.model) if fl.url else lm_ask(fl.lm)
  counts = extract(records, ask, fl.out, batch=fl.batch, limit=fl.limit)
  print(json.dumps(counts))
  return 1 if counts["failed"] else 0


if __name__ == "__main__":
  sys.exit(main())
