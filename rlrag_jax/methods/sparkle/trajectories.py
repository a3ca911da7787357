"""SFT trajectories for SPARKLE's proxy from any stronger proxy behind an OpenAI-compatible
endpoint (the paper distils Qwen2.5-72B-Instruct and keeps the trajectories that answer
correctly).

  python -m rlrag_jax.methods.sparkle.trajectories --config=configs/sparkle.py:paper \\
      --config.models.reader.path=/path/to/reader --url=http://localhost:8000/v1 --model=NAME \\
      --out=trajectories.jsonl [--limit=N] [--min_f1=1.0]

Every training question of the config's data selection runs the linear inference loop with the
endpoint model in the proxy's three roles (the config's prompts) and the config's reader,
retriever and triples. Each line of `--out` is `{"id", "question", "prediction", "f1",
"correct", "samples": [{"role", "prompt", "target"}, ...]}`; `correct` is F1 >= --min_f1 (1.0:
the exact answer, as the paper keeps correct trajectories). The file is appended to and
resumable: questions already in it are skipped. `sparkle.sft_trajectories=FILE` trains the
proxy on the correct ones instead of the world oracle's (`trajectory_io.read_trajectories` reads them).
"""
from __future__ import annotations

import json
import pathlib
import sys
from typing import Callable, Optional, Sequence

from rlrag_jax.methods.sparkle.trajectory_io import read_trajectories  # noqa: F401 (re-exported)


def endpoint_proposer(url: str, model: str, max_tokens: dict, *, temperature: float = 0.0,
                      timeout: float = 60.0) -> Callable:
  """propose(role, prompts, greedy) for agent.Agent from a chat endpoint; a failed request is
  an empty (malformed) output."""
  from rlrag_jax.judge import chat_completion
  base = url.rstrip("/")
  full = base if base.endswith("/chat/completions") else base + "/chat/completions"

  def propose(role: str, prompts: Sequence[str], greedy: bool) -> list:
    out = []
    for p in prompts:
      reply = chat_completion(full, {
          "model": model, "temperature": 0.0 if greedy else temperature,
          "max_tokens": int(max_tokens[role]),
          "messages": [{"role": "user", "content": p}]}, timeout=timeout)
      out.append((reply or "", (), False))
    return out
  return propose


def _done(path) -> set:
  p = pathlib.Path(path)
  if not p.exists():
    return set()
  return {str(json.loads(l)["id"]) for l in p.read_text().splitlines() if l.strip()}


def collect(task, examples: Sequence, propose: Callable, out_path, *, min_f1: float = 1.0,
            batch: int = 8, limit: int = 0, progress: bool = True,
            reader_rows: int = 64) -> dict:
  """Runs the linear loop for every example not yet in `out_path` with `propose` as the proxy
  and the task's reader (an in-process one `reader_rows` prompts a call), retriever and
  triples; appends one line per question. Counts {'asked', 'correct', 'already'}."""
  from tqdm.auto import tqdm
  from rlrag_jax.methods.sparkle import agent as agent_lib
  out_path = pathlib.Path(out_path)
  done = _done(out_path)
  todo = [ex for ex in examples if str(ex.id) not in done]
  if limit:
    todo = todo[:limit]
  counts = {"asked": 0, "correct": 0, "already": len(done)}
  ag = agent_lib.Agent(task.agent_cfg, propose=propose,
                       read=lambda requests: task._read(requests, reader_rows),
                       search=task.env.search,
                       embed=task.env.embed, store=task.store, docs=task.env.pairs,
                       encode_forced=task.target_ids)
  out_path.parent.mkdir(parents=True, exist_ok=True)
  bar = tqdm(total=len(todo), desc="trajectories", unit="q", disable=not progress)
  with out_path.open("a") as f:
    for start in range(0, len(todo), batch):
      part = todo[start:start + batch]
      made = []
      states = ag.run([ex.question for ex in part], greedy=True, samples=made)
      for ex, st, smp in zip(part, states, made):
        f1 = task.score_state(ex, st)["f1"]
        ok = f1 >= min_f1
        counts["asked"] += 1
        counts["correct"] += ok
        f.write(json.dumps({"id": str(ex.id), "question": ex.question,
                            "prediction": st.prediction, "f1": f1, "correct": bool(ok),
                            "samples": [{"role": s.role, "prompt": s.prompt, "target": s.text}
                                        for s in smp]}) + "\n")
      f.flush()
      bar.update(len(part))
  bar.close()
  return counts


def main(argv: Optional[list] = None) -> int:
  from absl import flags
  from ml_collections import config_flags
  fl = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "configs/sparkle.py[:preset]", flag_values=fl)
  flags.DEFINE_string("out", None, "the trajectories JSONL (appended; resumable)",
                      flag_values=fl)
  flags.DEFINE_string("url", "", "the proxy's OpenAI-compatible endpoint", flag_values=fl)
  flags.DEFINE_string("model", "", "the endpoint's model name", flag_values=fl)
  flags.DEFINE_float("min_f1", 1.0, "a trajectory is kept when its answer F1 reaches this",
                     flag_values=fl)
  flags.DEFINE_integer("limit", 0, "at most this many new questions (0: all)", flag_values=fl)
  args = list(sys.argv if argv is None else argv)
  if any(a in ("-h", "--help", "-help") for a in args[1:]):   # a private FlagValues has none
    print("usage: python -m rlrag_jax.methods.sparkle.trajectories --config=... --url=... "
          f"--model=... --out=FILE\n\n{fl.get_help()}")
    return 0
  fl(args)
  if fl.config is None or not fl.out or not fl.url:
    print("usage: --config=... --url=... --model=... --out=FILE", file=sys.stderr)
    return 2
  from rlrag_jax import settings
  from rlrag_jax.methods.sparkle import task as task_lib
  config = fl.config
  task = task_lib.ProxyTask(config)
  if task.reader is None:
    from rlrag_jax.models.sharding import make_mesh
    from rlrag_jax import run_dirs
    run_dirs.bind(task, run_dirs.load_models(config.models, make_mesh()))
  engine = settings.Settings.from_config(config)
  propose = endpoint_proposer(fl.url, fl.model, task.max_new,
                              temperature=engine.rl.temperature)
  counts = collect(task, task.train, propose, fl.out, min_f1=fl.min_f1, limit=fl.limit,
                   reader_rows=engine.eval.batch_size)
  print(json.dumps(counts))
  return 0


if __name__ == "__main__":
  sys.exit(main())
