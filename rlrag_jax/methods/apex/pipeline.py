"""APEX-Searcher's plan -> execute pipeline over two separately trained runs, and the paper's
Table 2 cells.

  python -m rlrag_jax.methods.apex.pipeline --planner=runs/apex_planner \\
      --executor=runs/apex_executor --out=runs/apex_pipeline
  python -m rlrag_jax.methods.apex.pipeline ... --data=musique:dev,2wiki:dev   # the real samples
  python -m rlrag_jax.methods.apex.pipeline --aggregate=DIR0,DIR1,DIR2 --out=DIR  # over seeds

Greedy decoding throughout (appendix D.2). Cells, each with its held-out EM / F1, mean
retrievals and plan statistics:

  naive_rag     the question's top-k passages, one answer (the executor's sub-answer role)
  no_planning   the question as a one-step plan through the executor (Algorithm 2)
  plan_sft      plans of the planner at the end of its SFT warm-up ("planning without RL"; a
                ":paper" run without SFT: its untrained HF checkpoint)
  plan_rl       plans of the planner after GRPO on SEPR (the full system)
  gold_plan     the gold decompositions (an upper bound on planning; not a paper cell)

each with the trained executor ("exec SFT on") and, with --executor_base (an untrained instruct
checkpoint), again with that one ("exec SFT off"); without it those cells are n/a: a
from-scratch executor without SFT cannot follow any prompt. The planner's cells also report
their plans' SEPR against the gold plans.

EM and F1 are given per dataset and as their unweighted mean (the paper's Tables 1-2 and their
"Avg."), each question counted under its example's `source` (hotpotqa, 2wiki, musique,
bamboogle; the CPU default's generated questions: 'world', one row): a mean over every question
pooled would weight the datasets by their sizes (2Wiki is 56% of the four full dev sets). The
cells' table gives that average.

Writes OUT/apex_report.txt (the tables), OUT/summary.json (per cell means overall and per
dataset, and the per-question EM and F1 with each question's id and dataset, which the seed
aggregation pairs on) and OUT/traces/<cell>.jsonl (per question: dataset, plan, every
sub-question's resolution, decision, queries, retrieved ids and answer, the prediction, EM).
"""
from __future__ import annotations

import json
import logging
import os
import pathlib
import sys
from typing import Optional, Sequence

import numpy as np
from absl import app, flags

log = logging.getLogger("rlrag_jax.apex")

CELLS = ("naive_rag", "no_planning", "plan_sft", "plan_rl", "gold_plan")
LABELS = {"naive_rag": "naive RAG", "no_planning": "no planning", "plan_sft": "plan w/o RL",
          "plan_rl": "plan with RL", "gold_plan": "gold plan (bound)"}

# The paper's datasets in its tables' order, by Example.source, with their column names; other
# sources (the generated world's 'world') follow them, sorted.
DATASETS = {"hotpotqa": "HotpotQA", "2wiki": "2Wiki", "musique": "MuSiQue",
            "bamboogle": "Bamboogle"}
AVG = "Avg."
UNLABELLED = "unlabelled"

# Command-line flags are defined in define_flags(), only when this module runs as a command,
# so that importing it (tests, other commands) defines no absl flag twice.


def define_flags() -> None:
  global _PLANNER, _EXECUTOR, _EXEC_BASE, _SFT_STEP, _CONFIG, _DATA, _N, _OUT, _CELLS, _AGG, _NOTES
  _PLANNER = flags.DEFINE_string("planner", None, "planner training run directory")
  _EXECUTOR = flags.DEFINE_string("executor", None, "executor run directory or HF checkpoint")
  _EXEC_BASE = flags.DEFINE_string("executor_base", "", "an untrained (instruct) checkpoint for "
                                   "the 'exec SFT off' cells; '' = n/a")
  _SFT_STEP = flags.DEFINE_integer("planner_sft_step", None, "the planner's SFT-end checkpoint "
                                   "step (default: its config's sft.steps)")
  _CONFIG = flags.DEFINE_string("config", "", "configs/apex_executor.py[:preset] when --executor "
                                "is not a training run (default: the run's own config)")
  _DATA = flags.DEFINE_string("data", "", "evaluation data instead of the executor run's: "
                              "comma-separated 'name:split' specs read from RLRAG_DATA_DIR")
  _N = flags.DEFINE_integer("num_examples", 0, "held-out questions per cell (0: the whole "
                           "evaluation selection, e.g. ':paper''s full dev sets; a cut of "
                           "several datasets is refused)")
  _OUT = flags.DEFINE_string("out", None, "output folder")
  _CELLS = flags.DEFINE_list("cells", list(CELLS), "the Table 2 cells to evaluate (the paper's "
                             "switches: planning on/off = plan_* / no_planning, planner RL on/off "
                             "= plan_rl / plan_sft; exec SFT off with --executor_base)")
  _AGG = flags.DEFINE_string("aggregate", "", "comma-separated pipeline output folders (one per "
                             "seed) or their summary .json files to summarise instead of running")
  _NOTES = flags.DEFINE_string("notes", "", "with --aggregate: a markdown file placed under the "
                               "title (how the table came about)")


# ------------------------------------------------------------------------------ loading
def _run_config(path: str, fallback: str = ""):
  """The training config a run directory saved, else `fallback` (a config file[:preset])."""
  import ml_collections
  p = pathlib.Path(path)
  if (p / "model").is_dir() and (p / "config.json").exists():
    from rlrag_jax import config_base
    from rlrag_jax.methods.apex import settings
    c = ml_collections.ConfigDict(json.loads((p / "config.json").read_text()))
    role = c.apex.role if "apex" in c and "role" in c.apex else ""
    filled = config_base.fill_added_later(c, config_base.ADDED_LATER,
                                          settings.ADDED_LATER.get(role, {}))
    if filled:
      log.info("%s: its saved config predates %s; those keys take the values that reproduce "
               "it (config_base.ADDED_LATER, apex settings.ADDED_LATER)", path, ", ".join(filled))
    return c
  if not fallback:
    raise FileNotFoundError(f"{path}: no config.json (not a training run); pass "
                            "--config=configs/apex_executor.py[:preset]")
  from rlrag_jax import config_base
  return config_base.load_config_file(fallback)


def _sft_steps(planner: str, pc) -> int:
  """The planner run's SFT length: its config's sft.steps, or where it counted sft.epochs the
  steps its start computed from them (metrics.jsonl's 'schedule' row, trainer.run)."""
  if float(pc.sft.epochs) <= 0:
    return int(pc.sft.steps)
  from rlrag_jax import runlog
  rows = [r for r in runlog.read_rows(pathlib.Path(planner) / "metrics.jsonl")
          if r["stage"] == "schedule" and "sft/steps" in r]
  if not rows:
    raise ValueError(f"{planner}: its config counts sft.epochs but metrics.jsonl has no "
                     "'schedule' row with the SFT steps; pass --planner_sft_step")
  return int(rows[-1]["sft/steps"])


def _policy(lm, max_new_tokens: int, rows_per_call: int):
  from rlrag_jax.rollout.policy import Policy
  tok = lm.tokenizer
  eos = tuple(lm.config.eos_token_id or ()) or (tok.eos_token_id,)
  return Policy(lm.config, lm.params, max_new_tokens=max_new_tokens, eos_ids=eos,
                pad_id=tok.pad_token_id or 0, rows_per_call=int(rows_per_call))


def use_eval_data(c, data: str, num_examples: int = 0) -> None:
  """Points config `c`'s data at `data` (--data: comma-separated 'name:split[:count]' specs read
  from RLRAG_DATA_DIR) for evaluation only; its examples keep their dataset (Example.source)."""
  from rlrag_jax.data import paths
  c.data.source = "files"
  c.data.dir = str(paths.data_dir())
  c.data.mix = ()
  c.data.eval_mix = tuple(s.strip() for s in data.split(",") if s.strip())
  c.data.max_eval = int(num_examples)


def executor_task(executor: str, out: pathlib.Path, config_file: str = "", data: str = "",
                  like=None, num_examples: int = 0):
  """The ExecutorTask for `executor`'s config (its tokenizer, prompts, retrieval), evaluating
  `data` when given. `like`: take every setting from this config instead (the untrained
  'exec SFT off' checkpoint runs with the trained executor's prompts and data)."""
  import copy
  from rlrag_jax.methods.apex.task import ExecutorTask
  c = copy.deepcopy(like.config) if like is not None else _run_config(executor, config_file)
  c.sft.steps = c.sft.epochs = 0
  c.rl.steps = c.rl.epochs = 0
  if (pathlib.Path(executor) / "model").is_dir():
    c.workdir = str(executor)                       # the run's own tokenizer and index cache
  else:
    c.model.init, c.model.path = "hf", str(executor)
    c.workdir = str(out)
    c.retrieval.cache_dir = str(out / "retriever")
  if data and like is None:
    use_eval_data(c, data, num_examples)
    c.retrieval.corpus = ""                         # the corpus: these examples' contexts
    c.retrieval.cache_dir = str(out / "retriever")
  if like is None:
    return ExecutorTask(c)
  # the same corpus and encoder: reuse the index `like` built instead of encoding it again
  lc = like.config.retrieval
  c.retrieval.cache_dir = str(lc.cache_dir or pathlib.Path(like.config.workdir) / "retriever")
  return ExecutorTask(c, encoder=like.encoder)


# ------------------------------------------------------------------------------ planning
def make_plans(planner: str, step: Optional[int], questions, max_new_tokens: int = 0) -> dict:
  """Greedy plans of the planner run's checkpoint `step` (None: latest) for `questions`:
  {'plans': [[sub-question, ...]], 'fallback': [bool], 'text': [raw output]}. Step 0 of a run
  that started from an HF checkpoint without SFT (the ':paper' preset) is that checkpoint: the
  paper's untrained planner."""
  import jax
  from rlrag_jax.methods.apex import plans
  from rlrag_jax.methods.apex.task import planner_prompt_ids
  from rlrag_jax.rollout.single_turn import completion_ids, decode_keeping_tags
  from rlrag_jax.run_dirs import load_trained
  pc = _run_config(planner)
  if step == 0 and pc.model.init == "hf" and int(pc.sft.steps) == 0:
    lm = load_trained(pc.model.path)
  else:
    lm = load_trained(planner, step=step)
  tok = lm.tokenizer
  use_chat = bool(pc.model.chat_template and getattr(tok, "chat_template", None))
  max_steps = int(pc.apex.max_steps)
  policy = _policy(lm, max_new_tokens or int(pc.eval.max_new_tokens), pc.eval.batch_size)
  out = {"plans": [], "fallback": [], "text": []}
  batch = int(pc.eval.batch_size)
  for i in range(0, len(questions), batch):
    chunk = questions[i:i + batch]
    ids = [planner_prompt_ids(tok, q, max_steps, pc.data.prompt_style, use_chat,
                              thinking=pc.model.thinking)
           for q in chunk]
    gen = policy.sample(ids, jax.random.PRNGKey(0), greedy=True, batch_multiple=8)
    for r, q in enumerate(chunk):
      text = decode_keeping_tags(tok, completion_ids(gen, r))
      p = plans.parse(text, q, max_steps)
      out["plans"].append(list(p.steps))
      out["fallback"].append(bool(p.fallback))
      out["text"].append(text)
  return out


# ------------------------------------------------------------------------------ evaluation
def score_cell(task, examples, traces, plan_info=None, scorer=None) -> tuple:
  """(cell summary, per-question rows)."""
  from rlrag_jax import metrics
  from rlrag_jax.methods.apex.task import gold_plan
  rows = []
  for i, (ex, t) in enumerate(zip(examples, traces)):
    row = {"id": ex.id, "dataset": ex.source or UNLABELLED, "question": ex.question,
           "answers": list(ex.answers),
           "prediction": t.answer, "em": metrics.exact_match(t.answer, ex.answers),
           "f1": metrics.f1(t.answer, ex.answers), "plan": list(t.plan),
           "gold_plan": gold_plan(ex), **t.counts(), "steps": t.steps}
    if plan_info is not None:
      row["plan_fallback"] = plan_info["fallback"][i]
      row["planner_output"] = plan_info["text"][i]
    rows.append(row)
  summary = {k: float(np.mean([r[k] for r in rows])) if rows else float("nan")
             for k in ("em", "f1", "retrievals", "skipped_retrieval", "repeated_queries",
                       "parse_fallbacks")}
  summary["plan_steps"] = float(np.mean([len(r["plan"]) for r in rows])) if rows else 0.0
  summary["n"] = len(rows)
  table = per_dataset([r["dataset"] for r in rows], [r["em"] for r in rows],
                      [r["f1"] for r in rows])
  summary["by_dataset"] = table["datasets"]
  summary["avg_em"], summary["avg_f1"] = table["avg"]["em"], table["avg"]["f1"]
  if plan_info is not None:
    summary["plan_fallback"] = float(np.mean(plan_info["fallback"]))
    if scorer is not None:
      gold = [r["gold_plan"] for r in rows]
      pred = [[] if f else p for p, f in zip(plan_info["plans"], plan_info["fallback"])]
      sepr = scorer(pred, gold)
      summary["sepr"] = float(np.mean(sepr))
      for r, v in zip(rows, sepr):
        r["sepr"] = float(v)
  return summary, rows


def dataset_order(names) -> list:
  """`names` (Example.source values) in the paper's order, the others after them, sorted."""
  names = set(names)
  return [k for k in DATASETS if k in names] + sorted(names - set(DATASETS))


def per_dataset(datasets: Sequence[str], em: Sequence[float], f1: Sequence[float]) -> dict:
  """Per-question EM and F1 with each question's dataset -> {'datasets': {name: {'em', 'f1',
  'n'}} in the paper's order, 'avg': {'em', 'f1', 'datasets'}}: 'avg' is the unweighted mean
  over the datasets (the paper's Avg.), not over the questions."""
  if not len(datasets) == len(em) == len(f1):
    raise ValueError(f"per_dataset: {len(datasets)} dataset labels, {len(em)} EM and {len(f1)} "
                     "F1 values; expected one of each per question")
  out = {}
  for name in dataset_order(datasets):
    idx = [i for i, d in enumerate(datasets) if d == name]
    out[name] = {"em": float(np.mean([em[i] for i in idx])),
                 "f1": float(np.mean([f1[i] for i in idx])), "n": len(idx)}
  avg = {k: float(np.mean([v[k] for v in out.values()])) if out else float("nan")
         for k in ("em", "f1")}
  return {"datasets": out, "avg": {**avg, "datasets": len(out)}}


def dataset_name(name: str) -> str:
  return DATASETS.get(name, name)


def run_pipeline(planner: str, executor: str, out, *, executor_base: str = "",
                 planner_sft_step: Optional[int] = None, config_file: str = "", data: str = "",
                 num_examples: int = 0, cells: Sequence[str] = CELLS) -> dict:
  """The `cells` (default all) for the held-out questions (the first `num_examples` of one
  dataset; 0: all); writes the report."""
  wanted = tuple(cells)
  unknown = set(wanted) - set(CELLS)
  if unknown:
    raise ValueError(f"--cells: unknown {sorted(unknown)}; expected some of {list(CELLS)}")
  from rlrag_jax.methods.apex import sepr
  from rlrag_jax.methods.apex.task import gold_plan
  from rlrag_jax.run_dirs import load_trained
  out = pathlib.Path(out)
  (out / "traces").mkdir(parents=True, exist_ok=True)
  task = executor_task(executor, out, config_file, data, num_examples=num_examples)
  from rlrag_jax.data import sources
  examples = (sources.cut_eval(list(task.eval), num_examples, "--num_examples") if num_examples
              else list(task.eval))
  if not examples:
    raise ValueError(f"apex pipeline: no held-out examples ({data or 'the executor run data'})")
  questions = [ex.question for ex in examples]
  pc = _run_config(planner)
  sft_step = _sft_steps(planner, pc) if planner_sft_step is None else int(planner_sft_step)
  scorer = sepr.SEPRScorer(task.encoder, float(pc.apex.sepr_threshold))
  plan_sets = {"no_planning": {"plans": [[q] for q in questions]},
               "gold_plan": {"plans": [gold_plan(ex) for ex in examples]}}
  if "plan_sft" in wanted:
    try:
      plan_sets["plan_sft"] = make_plans(planner, sft_step, questions)
    except (FileNotFoundError, ValueError, KeyError) as e:
      log.warning("plan_sft: no planner checkpoint at step %d (%s); the cell is n/a", sft_step,
                  e)
  if "plan_rl" in wanted:
    plan_sets["plan_rl"] = make_plans(planner, None, questions)

  executors = {"on": executor}
  if executor_base:
    executors["off"] = executor_base
  results, per_question, per_question_f1 = {}, {}, {}
  for sft, path in executors.items():
    ecfg = task.config
    lm = load_trained(path)
    policy = _policy(lm, int(ecfg.eval.max_new_tokens), ecfg.eval.batch_size)
    if sft == "off":
      base_task = executor_task(path, out, like=task)
    else:
      base_task = task
    for cell in [c for c in CELLS if c in wanted]:
      name = f"{cell}/exec_sft_{sft}"
      if cell == "naive_rag":
        traces = base_task.naive_rag(policy, examples)
        info = None
      elif cell in plan_sets:
        info = plan_sets[cell]
        traces = base_task.execute(policy, examples, info["plans"])
        if "fallback" not in info:
          info = None
      else:
        continue
      summary, rows = score_cell(base_task, examples, traces, info,
                                 scorer if info is not None else None)
      results[name] = summary
      per_question[name] = [r["em"] for r in rows]
      per_question_f1[name] = [r["f1"] for r in rows]
      with open(out / "traces" / f"{cell}.exec_sft_{sft}.jsonl", "w") as f:
        for r in rows:
          f.write(json.dumps(r) + "\n")
      log.info("%s: EM %.3f F1 %.3f (the mean over %d datasets; %d questions)", name,
               summary["avg_em"], summary["avg_f1"], len(summary["by_dataset"]), summary["n"])
  result = {"planner": str(planner), "executor": str(executor), "executor_base": executor_base,
            "planner_sft_step": sft_step, "data": data or "executor run's held-out split",
            "cells": results, "per_question_em": per_question,
            "per_question_f1": per_question_f1, "ids": [ex.id for ex in examples],
            "datasets": [ex.source or UNLABELLED for ex in examples]}
  (out / "summary.json").write_text(json.dumps(result, indent=2))
  (out / "apex_report.txt").write_text(format_report(result))
  return result


def legacy_dataset(result: dict) -> str:
  """The one dataset of a summary written before the pipeline labelled its questions: the
  generated world's (its ids are 'world-NNNNN', Example.source 'world'), or the dataset of a
  one-dataset --data spec; else UNLABELLED (questions of several datasets, pooled)."""
  ids = result.get("ids") or []
  if ids and all(str(i).startswith("world-") for i in ids):
    return "world"
  specs = [x for x in str(result.get("data", "")).split(",") if x.strip()]
  if len(specs) == 1 and ":" in specs[0]:
    return specs[0].split(":")[0].strip().lower()
  return UNLABELLED


def cell_datasets(result: dict, cell: str) -> dict:
  """`cell`'s per-dataset table (`per_dataset`'s form) from a pipeline summary. A summary written
  before the pipeline kept datasets: from its per-question EM and F1 and dataset labels where it
  has them, else its pooled EM and F1 as the one dataset it holds (`legacy_dataset`)."""
  s = result["cells"][cell]
  if "by_dataset" in s:
    return {"datasets": s["by_dataset"],
            "avg": {"em": s["avg_em"], "f1": s["avg_f1"], "datasets": len(s["by_dataset"])}}
  labels = result.get("datasets")
  em = result.get("per_question_em", {}).get(cell)
  f1 = result.get("per_question_f1", {}).get(cell)
  if labels and em is not None and f1 is not None:
    return per_dataset(labels, em, f1)
  one = {"em": float(s["em"]), "f1": float(s["f1"]), "n": s.get("n", len(em or ()))}
  return {"datasets": {legacy_dataset(result): one},
          "avg": {"em": one["em"], "f1": one["f1"], "datasets": 1}}


def _cell_keys(cells) -> list:
  """The summary's cells in the report's order (CELLS, exec SFT on before off)."""
  return [f"{c}/exec_sft_{sft}" for c in CELLS for sft in ("on", "off")
          if f"{c}/exec_sft_{sft}" in cells]


def _short(cell: str) -> str:
  """'plan_rl/exec_sft_on' -> 'plan_rl', '.../exec_sft_off' -> 'plan_rl/off'."""
  name, sft = cell.split("/exec_sft_")
  return name if sft == "on" else f"{name}/off"


def dataset_rows(tables: dict, fmt=lambda v: v) -> tuple:
  """(rows, columns) of the per-dataset table: a row per dataset in the paper's order, then
  'Avg.' (the unweighted mean over the datasets) when there are several; per cell an EM and an
  F1 column. `tables`: {cell: per_dataset-form table}; `fmt` renders a value."""
  cells = _cell_keys(tables)
  names = dataset_order({d for t in tables.values() for d in t["datasets"]})
  rows = []
  for name in names:
    row = {"dataset": dataset_name(name),
           "n": next((t["datasets"][name]["n"] for t in tables.values()
                      if name in t["datasets"]), "")}
    for c in cells:
      d = tables[c]["datasets"].get(name)
      row[f"{_short(c)} EM"] = fmt(d["em"]) if d else ""
      row[f"{_short(c)} F1"] = fmt(d["f1"]) if d else ""
    rows.append(row)
  if len(names) > 1:
    row = {"dataset": AVG, "n": ""}
    for c in cells:
      row[f"{_short(c)} EM"] = fmt(tables[c]["avg"]["em"])
      row[f"{_short(c)} F1"] = fmt(tables[c]["avg"]["f1"])
    rows.append(row)
  cols = ["dataset", "n"] + [f"{_short(c)} {k}" for c in cells for k in ("EM", "F1")]
  return rows, cols


def format_report(result: dict) -> str:
  from rlrag_jax import runlog
  tables = {c: cell_datasets(result, c) for c in _cell_keys(result["cells"])}
  rows = []
  for cell in CELLS:
    for sft in ("on", "off"):
      s = result["cells"].get(f"{cell}/exec_sft_{sft}")
      row = {"cell": LABELS[cell], "exec SFT": sft}
      if s is None:
        row.update(em="n/a", f1="n/a")
      else:
        row.update({k: s.get(k, "") for k in ("retrievals", "plan_steps", "plan_fallback",
                                              "sepr", "n")})
        avg = tables[f"{cell}/exec_sft_{sft}"]["avg"]
        row.update(em=avg["em"], f1=avg["f1"])
      rows.append(row)
  cols = ["cell", "exec SFT", "em", "f1", "retrievals", "plan_steps", "plan_fallback", "sepr",
          "n"]
  names = {d for t in tables.values() for d in t["datasets"]}
  head = (f"APEX-Searcher pipeline (greedy): planner {result['planner']} (SFT end: step "
          f"{result['planner_sft_step']}), executor {result['executor']}\n"
          f"data: {result['data']}\n"
          "exec SFT off: n/a unless --executor_base names an untrained checkpoint (a "
          "from-scratch executor without SFT follows no prompt).\n"
          f"em, f1: the unweighted mean over the {len(names)} dataset"
          f"{'s' if len(names) != 1 else ''} below (the paper's Avg.; one dataset: its own).\n")
  drows, dcols = dataset_rows(tables)
  return (head + runlog.format_table(rows, cols, title="Table 2 cells") + "\n\n"
          + runlog.format_table(drows, dcols, title="EM and F1 per dataset (the paper's Tables "
                                "1-2; '/off': exec SFT off; Avg.: the unweighted mean over the "
                                "datasets)") + "\n")


# ------------------------------------------------------------------------------ over seeds
def aggregate(dirs, out, resamples: int = 2000, notes: str = "") -> dict:
  """Mean ± std over seeds per cell (EM and F1: each seed's unweighted mean over its datasets),
  the same per dataset and for that average (the paper's Tables 1-2 and Avg.; 'datasets' in the
  result and pipeline_seeds.json), and intervals of the EM differences plan_rl - naive_rag,
  plan_rl - no_planning, plan_rl - plan_sft and gold_plan - plan_rl, paired on (seed, question):
  pooled, hierarchical, crossed (when the summaries carry the question ids) and t over seeds
  (`rlrag_jax.metrics.seed_intervals`), with the t test's p-value and Holm's correction over the
  four. A dir is a pipeline output folder or its summary .json (a committed copy). `notes`
  (markdown: how the table came about, e.g. seeds added after a first result) follows the
  title."""
  from rlrag_jax.metrics import holm, seed_intervals
  paths = [pathlib.Path(d) if str(d).endswith(".json") else pathlib.Path(d) / "summary.json"
           for d in dirs]
  runs = [json.loads(p.read_text()) for p in paths]
  cells = sorted({c for r in runs for c in r["cells"]})
  stat = lambda v: (float(np.mean(v)), float(np.std(v)), len(v))
  table, by_dataset = {}, {}
  for c in cells:
    have = [r for r in runs if c in r["cells"]]
    per_seed = [cell_datasets(r, c) for r in have]
    # EM and F1: each seed's unweighted mean over its datasets (the paper's Avg.)
    vals = {k: [t["avg"][k] for t in per_seed] for k in ("em", "f1")}
    vals.update({k: [r["cells"][c][k] for r in have if k in r["cells"][c]]
                 for k in ("retrievals", "sepr")})
    table[c] = {k: stat(v) for k, v in vals.items() if v}
    names = dataset_order({d for t in per_seed for d in t["datasets"]})
    # per dataset: EM and F1 as (mean, std, seeds), n its questions (a seed's)
    by_dataset[c] = {dataset_name(d): {
        **{k: stat([t["datasets"][d][k] for t in per_seed if d in t["datasets"]])
           for k in ("em", "f1")},
        "n": next(t["datasets"][d]["n"] for t in per_seed if d in t["datasets"])}
        for d in names}
    if len(names) > 1:
      by_dataset[c][AVG] = {k: stat([t["avg"][k] for t in per_seed]) for k in ("em", "f1")}
  diffs = {}
  for a, b in (("plan_rl", "naive_rag"), ("plan_rl", "no_planning"), ("plan_rl", "plan_sft"),
               ("gold_plan", "plan_rl")):
    ca, cb = f"{a}/exec_sft_on", f"{b}/exec_sft_on"
    both = [r for r in runs if ca in r["per_question_em"] and cb in r["per_question_em"]]
    if both:
      # paired by question id where the summary names them (a dict per seed), else by position
      groups = [dict(zip(r["ids"], (x - y for x, y in zip(r["per_question_em"][ca],
                                                            r["per_question_em"][cb]))))
                if "ids" in r else [x - y for x, y in zip(r["per_question_em"][ca],
                                                          r["per_question_em"][cb])]
                for r in both]
      iv = seed_intervals(groups, resamples)
      diffs[f"{a} - {b}"] = {"ci": iv["pooled"], "ci_hier": iv["hierarchical"],
                             "ci_crossed": iv["crossed"], "ci_t": iv["t"], "p": iv["p"],
                             "claim": iv["claim"], "per_seed": iv["per_seed"]}
  for v, mark in zip(diffs.values(), holm([v["p"] for v in diffs.values()])):
    v["holm"] = bool(mark)
  lines = [f"APEX pipeline over {len(runs)} seeds ({', '.join(map(str, dirs))})", ""]
  if notes.strip():
    lines += [notes.strip(), ""]
  sets = dataset_order({d for r in runs for c in cells
                        for d in cell_datasets(r, c)["datasets"]})
  lines += [f"EM and F1: mean ± std over seeds of each seed's unweighted mean over its "
            f"{len(sets)} dataset{'s' if len(sets) != 1 else ''} (the paper's Avg.; one "
            "dataset: its own); per dataset in the second table.", "",
            "| cell | EM | F1 | retrievals | plan SEPR |", "|---|---|---|---|---|"]
  fmt = lambda t: f"{t[0]:.3f} ± {t[1]:.3f}" if t else ""
  for c in cells:
    t = table[c]
    lines.append(f"| {c} | {fmt(t.get('em'))} | {fmt(t.get('f1'))} | "
                 f"{fmt(t.get('retrievals'))} | {fmt(t.get('sepr'))} |")
  lines += ["", "EM and F1 per dataset, mean ± std over seeds (the paper's Tables 1-2, cells as "
            "columns; '/off': exec SFT off; Avg.: each seed's unweighted mean over the "
            "datasets, then over seeds):", ""]
  order = _cell_keys(cells)
  head = ["dataset", "n"] + [f"{_short(c)} {k}" for c in order for k in ("EM", "F1")]
  lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for d in [dataset_name(x) for x in sets] + ([AVG] if len(sets) > 1 else []):
    n = next((by_dataset[c][d].get("n", "") for c in order if d in by_dataset[c]), "")
    vals = [fmt(by_dataset[c].get(d, {}).get(k)) for c in order for k in ("em", "f1")]
    lines.append("| " + " | ".join([d, str(n)] + vals) + " |")
  pooled = (f" (questions pooled over the {len(sets)} datasets: each weighted by its size, "
            "unlike Avg.)" if len(sets) > 1 else "")
  lines += ["", "EM differences, paired on (seed, question), 95% intervals: pooled (a bootstrap "
            "with every (seed, question) pair one unit: no seed-to-seed variance), hierarchical "
            "(seeds, then questions within a seed), crossed (seeds, and one question draw shared "
            "by the drawn seeds, paired by question id), t over the per-seed differences; 'vs 0' "
            "reads '> 0' or '< 0' only when every seed-aware interval excludes 0; p is the t "
            f"test's, and 'Holm' says whether it survives Holm's correction at 0.05 over the "
            f"{sum(np.isfinite(v['p']) for v in diffs.values())} differences tested here"
            f"{pooled}:", ""]
  ci = lambda t: f"[{t[1]:+.3f}, {t[2]:+.3f}]" if np.isfinite(t[1]) else "–"
  for k, v in diffs.items():
    lines.append(f"- {k}: {v['ci'][0]:+.3f}; pooled {ci(v['ci'])}, hierarchical "
                 f"{ci(v['ci_hier'])}, crossed {ci(v['ci_crossed'])}, t {ci(v['ci_t'])} "
                 f"(vs 0: {v['claim']}; p {v['p']:.4f}, Holm: "
                 f"{'holds' if v['holm'] else 'no'}); per seed "
                 + ", ".join(f"{x:+.3f}" for x in v["per_seed"]))
  text = "\n".join(lines) + "\n"
  out = pathlib.Path(out)
  out.mkdir(parents=True, exist_ok=True)
  (out / "pipeline_seeds.md").write_text(text)
  (out / "pipeline_seeds.json").write_text(json.dumps({"cells": table, "datasets": by_dataset,
                                                       "diffs": diffs}, indent=2))
  _plot(runs, out / "pipeline_seeds.png")
  return {"cells": table, "datasets": by_dataset, "diffs": diffs, "text": text}


def _plot(runs, path) -> None:
  """Held-out EM per cell (exec SFT on; a seed's unweighted mean over its datasets): one dot
  per seed, the mean as a bar with its std."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  cells = [c for c in CELLS if any(f"{c}/exec_sft_on" in r["cells"] for r in runs)]
  fig, ax = plt.subplots(figsize=(1.4 * len(cells) + 1.5, 3.2))
  for x, c in enumerate(cells):
    v = [cell_datasets(r, f"{c}/exec_sft_on")["avg"]["em"] for r in runs
         if f"{c}/exec_sft_on" in r["cells"]]
    ax.bar(x, np.mean(v), yerr=np.std(v), color="#9ecae1", capsize=4)
    ax.scatter([x] * len(v), v, color="#08519c", s=12, zorder=3)
  ax.set_xticks(range(len(cells)), [LABELS[c] for c in cells], rotation=20, ha="right")
  ax.set_ylabel("held-out EM")
  ax.set_title(f"APEX pipeline, {len(runs)} seeds (dots), mean ± std")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv) -> int:
  del argv
  from rlrag_jax import runlog
  runlog.cli_logging()
  if not _OUT.value:
    print("pipeline: --out is required", file=sys.stderr)
    return 2
  if _AGG.value:
    notes = pathlib.Path(_NOTES.value).read_text() if _NOTES.value else ""
    print(aggregate([d for d in _AGG.value.split(",") if d], _OUT.value, notes=notes)["text"])
    return 0
  if not (_PLANNER.value and _EXECUTOR.value):
    print("pipeline: --planner and --executor are required (or --aggregate)", file=sys.stderr)
    return 2
  try:
    result = run_pipeline(_PLANNER.value, _EXECUTOR.value, _OUT.value,
                          executor_base=_EXEC_BASE.value, planner_sft_step=_SFT_STEP.value,
                          config_file=_CONFIG.value, data=_DATA.value,
                          num_examples=_N.value, cells=_CELLS.value)
  except FileNotFoundError as e:
    print(f"pipeline: {e}", file=sys.stderr)
    return 2
  print(format_report(result))
  return 0


if __name__ == "__main__":
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  define_flags()
  app.run(lambda argv: sys.exit(main(argv)))
