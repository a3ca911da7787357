"""MuSiQue's symbolic decomposition steps ("Akinoshu Kenji >> place of birth", "#1 >> spouse")
rewritten as natural-language sub-questions, for gold plans.

  python -m rlrag_jax.methods.apex.rewrite --dataset musique --split train --out plans.jsonl

  python -m rlrag_jax.methods.apex.rewrite ... --llm_url=http://localhost:8000/v1 \
      --llm_model=NAME [--llm_cache=FILE]

The paper rewrote them with DeepSeek-V3. Ours by default are template rules: a question
template per common Wikidata relation, and a generic "What is the <relation> of <subject>?" for
the rest. With --llm_url every symbolic step goes to that OpenAI-compatible endpoint instead
(LLM_PROMPT, ours), each reply cached in a JSON file by step text so a rerun asks nothing twice;
a reply that is not one question keeping the step's #k references, or a failed request, falls
back to the template rules and is counted as 'llm_failed'. A step is counted as 'natural'
(already a question, kept), 'llm', 'template', 'generic' or 'failed' (a '>>' form without a
subject or a relation, or with several '>>': kept as written). The command writes one JSON line
per example ({"id", "question", "steps"}) and prints the counts; point `apex.gold_plans` at the
file to train on it.
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
KINDS = ("natural", "llm", "template", "generic", "failed", "llm_failed")
LLM_PROMPT = ("Rewrite one step of a multi-hop question decomposition as a single, natural "
              "English question. The step is written as 'subject >> relation'; #1, #2 stand "
              "for answers of earlier steps and must appear unchanged in your question. Reply "
              "with the question only.\n\nStep: {step}")
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


def rewrite_plan(steps, rewrite=None) -> tuple:
  """([sub-question, ...], Counter of kinds) for a list of step texts; `rewrite` (default
  `rewrite_step`) maps one step to (text, kind)."""
  rewrite = rewrite or rewrite_step
  out, counts = [], collections.Counter()
  for s in steps:
    text, kind = rewrite(s)
    out.append(text)
    counts[kind] += 1
  return out, counts


class LLMRewriter:
  """Symbolic steps rewritten by an LLM behind an OpenAI-compatible endpoint (`url` is its
  base, e.g. http://localhost:8000/v1), replies cached in `cache` (a JSON file). Anything else
  goes to `rewrite_step`. Never raises on a bad reply or a failed request: the template rules
  answer and `.failures` counts it."""

  def __init__(self, url: str, model: str, cache=None, *, timeout: float = 60.0):
    self.url = url.rstrip("/") + "/chat/completions"
    self.model, self.timeout = model, timeout
    self.cache_path = pathlib.Path(cache) if cache else None
    self.cache = {}
    if self.cache_path is not None and self.cache_path.exists():
      try:
        self.cache = json.loads(self.cache_path.read_text())
      except ValueError as e:
        raise ValueError(f"{self.cache_path}: not a JSON cache of rewrites ({e})") from None
    self.failures = self.requests = 0

  def __call__(self, step) -> tuple:
    if not isinstance(step, str) or ">>" not in step:
      return rewrite_step(step)
    reply = self.cache.get(step)
    if reply is None:
      from rlrag_jax.judge import chat_completion
      self.requests += 1
      reply = chat_completion(self.url, {
          "model": self.model, "temperature": 0.0, "max_tokens": 64,
          "messages": [{"role": "user", "content": LLM_PROMPT.format(step=step)}]},
          timeout=self.timeout)
      if reply is not None:
        self.cache[step] = reply
    question = _llm_question(reply, step)
    if question is None:
      self.failures += 1
      return rewrite_step(step)[0], "llm_failed"
    return question, "llm"

  def save(self) -> None:
    if self.cache_path is not None:
      self.cache_path.parent.mkdir(parents=True, exist_ok=True)
      self.cache_path.write_text(json.dumps(self.cache, indent=1, sort_keys=True))


def _llm_question(reply, step: str):
  """The reply's question when it is one line ending in '?' that keeps the step's #k
  references and has no '>>'; else None."""
  if not isinstance(reply, str):
    return None
  lines = [l.strip().strip("\"'`") for l in reply.strip().splitlines() if l.strip()]
  if len(lines) != 1 or not lines[0].endswith("?") or ">>" in lines[0]:
    return None
  refs = set(re.findall(r"#\d+", step))
  if refs != set(re.findall(r"#\d+", lines[0])):
    return None
  return lines[0]


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
  ap.add_argument("--llm_url", default="", help="OpenAI-compatible endpoint base URL ('' = the "
                  "template rules)")
  ap.add_argument("--llm_model", default="", help="the endpoint's model name")
  ap.add_argument("--llm_cache", default="", help="JSON cache of LLM rewrites (default: "
                  "OUT.llm_cache.json)")
  args = ap.parse_args(argv)
  llm = None
  if args.llm_url:
    llm = LLMRewriter(args.llm_url, args.llm_model,
                      args.llm_cache or str(args.out) + ".llm_cache.json")
  from tqdm.auto import tqdm
  from rlrag_jax.data import loaders
  examples = loaders.load_dataset(args.dataset, args.path or None, split=args.split)
  total = collections.Counter()
  out = pathlib.Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  with out.open("w") as f:
    for ex in tqdm(examples, desc="rewrite", unit="question"):
      steps, counts = rewrite_plan([s.question for s in ex.decomposition], llm)
      total.update(counts)
      f.write(json.dumps({"id": str(ex.id), "question": ex.question, "steps": steps}) + "\n")
  if llm is not None:
    llm.save()
    print(f"LLM: {llm.requests} requests, {llm.failures} steps fell back to the template rules "
          f"(cache: {llm.cache_path})")
  n = sum(total.values())
  print(f"{len(examples)} questions, {n} steps -> {out}")
  for k in KINDS:
    print(f"  {k:9s} {total[k]:6d} ({total[k] / max(n, 1):.1%})")
  return total


if __name__ == "__main__":
  main()
