"""Executor SFT trajectories self-instructed by any model behind an OpenAI-compatible endpoint,
kept only when correct (the paper: 14,604 filtered multi-round trajectories).

  python -m rlrag_jax.methods.apex.self_instruct --config=configs/apex_executor.py:paper \\
      --url=http://localhost:8000/v1 --model=NAME --out=trajectories.jsonl [--workers=8] \\
      [--max_examples=N] [--config.data.dir=...]

Every training question's gold plan (the decomposition, MuSiQue's symbolic steps rewritten) runs
through Algorithm 2 (executor.py) with the endpoint in the model's seat: each execution call is
one chat request (the role's instruction as the system message, its sections as the user
message, greedy), the run's retriever answers the searches. A trajectory is kept when its final
answer matches a gold answer exactly (normalised EM); a failed request counts and makes that
call's output empty (the parsers' fallbacks take over). Written per kept question: {"id",
"question", "answers", "calls": [{"ask": {...}, "output": "..."}]}; set `apex.trajectories` to
the file to train the executor on it instead of the oracle trajectories.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import pathlib
import sys

from absl import app, flags
from ml_collections import config_flags

from rlrag_jax.methods.apex.prompts import ask_to_dict

def define_flags() -> None:
  """The command's flags (defined only when run as a command: importing defines none)."""
  global _CONFIG, _URL, _MODEL, _OUT, _WORKERS, _MAX, _BATCH
  _CONFIG = config_flags.DEFINE_config_file("config", "configs/apex_executor.py",
                                            "configs/apex_executor.py[:preset]")
  _URL = flags.DEFINE_string("url", None, "OpenAI-compatible endpoint base URL (…/v1)")
  _MODEL = flags.DEFINE_string("model", "", "the endpoint's model name")
  _OUT = flags.DEFINE_string("out", None, "output JSONL")
  _WORKERS = flags.DEFINE_integer("workers", 8, "concurrent requests")
  _MAX = flags.DEFINE_integer("max_examples", 0, "training questions to try (0: all)")
  _BATCH = flags.DEFINE_integer("batch", 64, "questions executed side by side")


class EndpointModel:
  """`generate(asks) -> texts` over an OpenAI-compatible chat endpoint; never raises."""

  def __init__(self, url: str, model: str, *, workers: int = 8, max_tokens: int = 64,
               timeout: float = 60.0):
    self.url = url.rstrip("/") + "/chat/completions"
    self.model, self.workers, self.max_tokens, self.timeout = model, workers, max_tokens, timeout
    self.requests = self.failures = 0

  def one(self, ask) -> str:
    from rlrag_jax.judge import chat_completion
    reply = chat_completion(self.url, {"model": self.model, "temperature": 0.0,
                                       "max_tokens": self.max_tokens,
                                       "messages": ask.chat_messages()}, timeout=self.timeout)
    self.requests += 1
    if reply is None:
      self.failures += 1
      return ""
    return reply

  def __call__(self, asks) -> list:
    with concurrent.futures.ThreadPoolExecutor(max(1, self.workers)) as pool:
      return list(pool.map(self.one, asks))


def generate_trajectories(task, model, out, *, max_examples: int = 0, batch: int = 64) -> dict:
  """Runs the gold plans of `task.train` with `model`; writes the correct trajectories."""
  from tqdm.auto import tqdm
  from rlrag_jax import metrics
  from rlrag_jax.methods.apex import executor
  from rlrag_jax.methods.apex.task import gold_plan
  examples = list(task.train)[:max_examples] if max_examples else list(task.train)
  out = pathlib.Path(out)
  out.parent.mkdir(parents=True, exist_ok=True)
  kept = 0
  with out.open("w") as f, tqdm(total=len(examples), desc="self-instruct", unit="question") as bar:
    for start in range(0, len(examples), batch):
      chunk = examples[start:start + batch]
      procs = [executor.solve(ex.question, gold_plan(ex), max_hops=task.max_hops)
               for ex in chunk]
      for ex, t in zip(chunk, executor.run(procs, model, task.search)):
        if metrics.exact_match(t.answer, ex.answers) > 0:
          kept += 1
          f.write(json.dumps({"id": str(ex.id), "question": ex.question,
                              "answers": list(ex.answers),
                              "calls": [{"ask": ask_to_dict(a), "output": o}
                                        for a, o in t.calls]}) + "\n")
      bar.update(len(chunk))
  return {"tried": len(examples), "kept": kept, "requests": model.requests,
          "failed_requests": model.failures, "out": str(out)}


def main(argv) -> int:
  del argv
  if not (_URL.value and _OUT.value):
    print("self_instruct: --url and --out are required", file=sys.stderr)
    return 2
  from rlrag_jax.methods.apex.task import ExecutorTask
  c = _CONFIG.value
  c.apex.trajectories = ""
  task = ExecutorTask(c)
  model = EndpointModel(_URL.value, _MODEL.value, workers=_WORKERS.value,
                        max_tokens=max(int(c.apex.max_query_tokens),
                                       int(c.apex.max_answer_tokens)))
  res = generate_trajectories(task, model, _OUT.value, max_examples=_MAX.value,
                              batch=_BATCH.value)
  print(f"{res['kept']} of {res['tried']} trajectories correct and kept -> {res['out']}; "
        f"{res['requests']} requests, {res['failed_requests']} failed")
  return 0


if __name__ == "__main__":
  define_flags()
  app.run(lambda argv: sys.exit(main(argv)))
