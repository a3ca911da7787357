"""Teacher reasoning traces for ARENA's SFT-reasoning baseline (the paper's appendix E, Table 7).

  python -m rlrag_jax.methods.arena.teacher_traces --config=configs/arena.py:sft_reasoning \\
      --url=http://localhost:8000/v1 --model=NAME --out=traces.jsonl [--limit=N]

For every training example of the config's data selection, the teacher (any OpenAI-compatible
chat endpoint) is asked with the paper's Table 7 prompt, filled with the question, the numbered
references, the gold relevance ids and the gold answer; its reply is the trace. Each line of
`--out` is `{"id", "question", "trace"}`. The file is appended to and resumable: examples whose id
is already in it are not asked again. A request that fails (after the endpoint client's retries)
or returns no text is skipped and counted; the command exits 1 when any was skipped, so a rerun
fills the gaps. The `sft_reasoning` preset reads the file (`arena.sft.teacher_traces`) and trains
on `<relevance>gold ids</relevance><analysis>trace</analysis><answer>gold answer</answer>`.
"""
from __future__ import annotations

import json
import pathlib
import sys
from typing import Iterable, Optional

TABLE7 = ("Generate a thinking process showing how to derive the given answer using ONLY the "
          "specified relevance IDs from provided references.\n"
          "Question: {question}\nReferences: {references}\nRelevance IDs: {relevance_ids}\n"
          "Answer: {answer}")


def teacher_prompt(example, max_chars: Optional[int] = None) -> str:
  """Table 7 filled for one example (references numbered from 1, gold ids as a JSON list)."""
  from rlrag_jax.methods.arena import prompts
  refs = prompts.format_references(prompts.passages_of(example), max_chars)
  gold = list(prompts.reference_numbers(example).gold)
  return TABLE7.format(question=example.question, references="\n" + refs,
                       relevance_ids=json.dumps(gold), answer=example.answers[0])


def read_traces(path) -> dict:
  """{example id: trace} from a traces file; a malformed line is an error naming file and line."""
  out = {}
  p = pathlib.Path(path)
  for n, line in enumerate(p.read_text().splitlines(), start=1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
      out[str(row["id"])] = str(row["trace"])
    except (ValueError, KeyError, TypeError) as e:
      raise ValueError(f"{p}:{n}: expected a JSON object with 'id' and 'trace' ({e})") from None
  return out


def build(examples: Iterable, ask, out_path, *, max_chars: Optional[int] = None,
          limit: int = 0, progress: bool = True) -> dict:
  """Asks `ask(prompt) -> str | None` for each example not yet in `out_path`; appends the replies.
  Returns counts {'asked', 'written', 'skipped', 'already'}."""
  from tqdm.auto import tqdm
  out_path = pathlib.Path(out_path)
  done = read_traces(out_path) if out_path.exists() else {}
  todo = [ex for ex in examples if str(ex.id) not in done]
  if limit:
    todo = todo[:limit]
  counts = {"asked": 0, "written": 0, "skipped": 0, "already": len(done)}
  out_path.parent.mkdir(parents=True, exist_ok=True)
  with out_path.open("a") as f:
    for ex in tqdm(todo, desc="teacher traces", disable=not progress):
      counts["asked"] += 1
      trace = ask(teacher_prompt(ex, max_chars))
      if not trace or not trace.strip():
        counts["skipped"] += 1
        continue
      f.write(json.dumps({"id": str(ex.id), "question": ex.question,
                          "trace": trace.strip()}) + "\n")
      f.flush()
      counts["written"] += 1
  return counts


def main(argv=None) -> int:
  import argparse
  from rlrag_jax import judge
  from rlrag_jax.data import sources
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", required=True, help="configs/arena.py[:preset]")
  parser.add_argument("--url", required=True, help="OpenAI-compatible base url, e.g. .../v1")
  parser.add_argument("--model", required=True)
  parser.add_argument("--out", required=True)
  parser.add_argument("--limit", type=int, default=0, help="ask at most this many (0 = all)")
  parser.add_argument("--max_tokens", type=int, default=512)
  parser.add_argument("--timeout", type=float, default=60.0)
  args = parser.parse_args(argv)
  config = _load_config(args.config)
  examples = sources.select(config.data, seed=config.seed).train
  url = args.url.rstrip("/") + "/chat/completions"
  ask = lambda prompt: judge.chat_completion(
      url, {"model": args.model, "temperature": 0.0, "max_tokens": args.max_tokens,
            "messages": [{"role": "user", "content": prompt}]}, timeout=args.timeout)
  counts = build(examples, ask, args.out, max_chars=config.data.max_passage_chars or None,
                 limit=args.limit)
  print(f"teacher traces: {counts['written']} written, {counts['skipped']} skipped (no reply), "
        f"{counts['already']} already in {args.out}")
  return 1 if counts["skipped"] else 0


def _load_config(spec: str):
  from rlrag_jax import config_base
  return config_base.load_config_file(spec)


if __name__ == "__main__":
  sys.exit(main())
