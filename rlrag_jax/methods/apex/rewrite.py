"""MuSiQue's symbolic decomposition steps ("Akinoshu Kenji >> place of birth", "#1 >> spouse")
rewritten as natural-language sub-questions, for gold plans.

  python -m rlrag_jax.methods.apex.rewrite --dataset musique --split train --out plans.jsonl

The paper rewrote them with DeepSeek-V3; ours are template rules: a question template per
common Wikidata relation, and a generic "What is the <relation> of <subject>?" for the rest. A
step is counted as 'natural' (already a question, kept), 'template', 'generic' or 'failed' (a
'>>' form without a subject or a relation, or with several '>>': kept as written). The command
writes one JSON line per example ({"id", "question", "steps"}) and prints the counts; point
`apex.gold_plans` at the file to train on it.
"""
from __future__ import annotations

import argparse
import collections
import json
import pathlib
import re

# {relation: template with {x} for the subject}; they cover 178 of the 183 symbolic steps in the
# MuSiQue train and dev samples of ../shared/data (the other 5 take the generic form).
RELATION_TEMPLATES = {
    "located in the administrative territorial entity":
        "In which administrative territorial entity is {x} located?",
    "place of birth": "Where was {x} born?",
    "place of death": "Where did {x} die?",
    "country": "Which country is {x} in?",
    "country of citizenship": "What is the country of citizenship of {x}?",
    "performer": "Who performed {x}?",
    "shares border with": "What shares a border with {x}?",
    "spouse": "Who is the spouse of {x}?",
    "part of": "What is {x} part of?",
    "author": "Who is the author of {x}?",
    "member of sports team": "Which sports team is {x} a member of?",
    "sibling": "Who is the sibling of {x}?",
    "educated at": "Where was {x} educated?",
    "continent": "On which continent is {x}?",
    "father": "Who is the father of {x}?",
    "mother": "Who is the mother of {x}?",
    "child": "Who is the child of {x}?",
    "instance of": "What is {x} an instance of?",
    "composer": "Who composed {x}?",
    "member of political party": "Which political party is {x} a member of?",
    "location": "Where is {x} located?",
    "producer": "Who produced {x}?",
    "cast member": "Who is a cast member of {x}?",
    "member of": "What is {x} a member of?",
    "owned by": "Who owns {x}?",
    "operator": "Who operates {x}?",
    "native language": "What is the native language of {x}?",
    "director": "Who directed {x}?",
    "screenwriter": "Who wrote the screenplay of {x}?",
    "manufacturer": "Who manufactured {x}?",
    "creator": "Who created {x}?",
    "record label": "What is the record label of {x}?",
    "headquarters location": "Where is the headquarters of {x}?",
    "capital": "What is the capital of {x}?",
    "capital of": "What is {x} the capital of?",
    "publisher": "Who published {x}?",
    "employer": "Who is the employer of {x}?",
    "founded by": "Who founded {x}?",
    "developer": "Who developed {x}?",
    "genre": "What is the genre of {x}?",
    "award received": "What award did {x} receive?",
    "work location": "Where did {x} work?",
    "follows": "What does {x} follow?",
    "followed by": "What follows {x}?",
    "sport": "Which sport does {x} play?",
    "instrument": "What instrument does {x} play?",
    "has part": "What is a part of {x}?",
    "conflict": "Which conflict was {x} part of?",
}
KINDS = ("natural", "template", "generic", "failed")
_SPACES = re.compile(r"\s+")


def rewrite_step(text: str) -> tuple:
  """(sub-question, kind): a symbolic 'subject >> relation' step as a question; anything else
  kept as written ('natural' when it has no '>>')."""
  if not isinstance(text, str):
    return str(text), "failed"
  if ">>" not in text:
    return text.strip(), "natural"
  parts = [p.strip() for p in text.split(">>")]
  if len(parts) != 2 or not parts[0] or not parts[1]:
    return text.strip(), "failed"
  subject = _SPACES.sub(" ", parts[0].replace("( ", "(").replace(" )", ")"))
  relation = _SPACES.sub(" ", parts[1].lower())
  template = RELATION_TEMPLATES.get(relation)
  if template is not None:
    return template.format(x=subject), "template"
  return f"What is the {relation} of {subject}?", "generic"


def rewrite_plan(steps) -> tuple:
  """([sub-question, ...], Counter of kinds) for a list of step texts."""
  out, counts = [], collections.Counter()
  for s in steps:
    text, kind = rewrite_step(s)
    out.append(text)
    counts[kind] += 1
  return out, counts


def read_plans(path) -> dict:
  """{example id: [sub-question, ...]} from a file this command wrote."""
  out = {}
  p = pathlib.Path(path)
  for n, line in enumerate(p.read_text().splitlines(), 1):
    if not line.strip():
      continue
    try:
      rec = json.loads(line)
      steps = rec["steps"]
      if not isinstance(steps, list) or not all(isinstance(s, str) and s for s in steps):
        raise ValueError("'steps' must be a list of non-empty strings")
      out[str(rec["id"])] = steps
    except (ValueError, KeyError, TypeError) as e:
      raise ValueError(f"{p}:{n}: {e}") from None
  return out


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--dataset", default="musique")
  ap.add_argument("--split", default="train")
  ap.add_argument("--path", default="",
                  help="the dataset's folder or JSONL file ('' = <RLRAG_DATA_DIR>/<dataset>/)")
  ap.add_argument("--out", required=True)
  args = ap.parse_args(argv)
  from tqdm.auto import tqdm
  from rlrag_jax.data import loaders
  examples = loaders.load_dataset(args.dataset, args.path or None, split=args.split)
  total = collections.Counter()
  out = pathlib.Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  with out.open("w") as f:
    for ex in tqdm(examples, desc="rewrite", unit="question"):
      steps, counts = rewrite_plan([s.question for s in ex.decomposition])
      total.update(counts)
      f.write(json.dumps({"id": str(ex.id), "question": ex.question, "steps": steps}) + "\n")
  n = sum(total.values())
  print(f"{len(examples)} questions, {n} steps -> {out}")
  for k in KINDS:
    print(f"  {k:9s} {total[k]:6d} ({total[k] / max(n, 1):.1%})")
  return total


if __name__ == "__main__":
  main()
