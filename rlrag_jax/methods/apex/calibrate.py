"""Calibrates the SEPR match threshold on paraphrases of the embedded world's sub-questions.

  python -m rlrag_jax.methods.apex.calibrate --out docs/results/apex_sepr_threshold

The paper tuned its threshold "to filter low-confidence matches without penalizing valid
paraphrases" and its text lost the value. We measure the same trade-off. Every relation of the
world that has two question templates gives paraphrase pairs (the same sub-question, both
wordings, e.g. "Who directed X?" / "Who was the director of X?"). Two kinds of non-matches
are sampled against them:
  - other relation, same subject ("When was X born?" / "Where was X born?"): a wrong step;
  - same relation, other subject of the same type ("Who directed X?" / "Who directed Y?"):
    the right step about the wrong entity.
Subjects are the named subjects of real gold decomposition steps. The threshold reported is
the one that maximises balanced accuracy ((TPR + TNR) / 2) over a 0.01 grid. Writes
threshold.md, threshold.json and threshold.png (the three similarity histograms) under --out.
"""
from __future__ import annotations

import argparse
import collections
import json
import pathlib
import random
import re

import numpy as np

from rlrag_jax.data import world as world_lib
from rlrag_jax.data import world_text

KINDS = ("paraphrase", "other relation, same subject", "same relation, other subject")


def _template_regexes() -> list:
  """(relation, template index, compiled regex with one subject group), for Q's templates."""
  out = []
  for rel, templates in world_text.Q.items():
    for i, t in enumerate(templates):
      pat = re.escape(t).replace(re.escape("{x}"), "(?P<x>.+)")
      out.append((rel, i, re.compile(f"^{pat}$")))
  return out


def step_subjects(examples) -> list:
  """(relation, template index, subject) of every decomposition step phrased by a Q template
  about a named subject (steps about '#k' are left out: their subject is not a name)."""
  regexes = _template_regexes()
  out = []
  for ex in examples:
    for step in ex.decomposition:
      for rel, i, rx in regexes:
        m = rx.match(step.question)
        if m and "#" not in m.group("x"):
          out.append((rel, i, m.group("x")))
          break
  return out


def build_pairs(world, max_per_kind: int, seed: int = 0) -> dict:
  """{kind: [(text_a, text_b), ...]} with at most max_per_kind pairs each."""
  rng = random.Random(seed)
  type_of = {e.name: e.type for e in world.entities}
  subjects = step_subjects(world.train)
  rels_of_type = collections.defaultdict(set)
  names_of_rel = collections.defaultdict(set)
  for rel, _, x in subjects:
    rels_of_type[type_of.get(x, "?")].add(rel)
    names_of_rel[rel].add(x)
  names_of_rel = {r: sorted(v) for r, v in names_of_rel.items()}
  pairs = {k: [] for k in KINDS}
  seen = set()
  rng.shuffle(subjects)
  q = world_text.Q
  for rel, i, x in subjects:
    text = q[rel][i].format(x=x)
    if len(q[rel]) > 1:
      pairs[KINDS[0]].append((text, q[rel][1 - i].format(x=x)))
    others = sorted(rels_of_type[type_of.get(x, "?")] - {rel})
    if others:
      r2 = rng.choice(others)
      pairs[KINDS[1]].append((text, rng.choice(q[r2]).format(x=x)))
    same_type = [y for y in names_of_rel[rel] if y != x and type_of.get(y) == type_of.get(x)]
    if same_type:
      y = rng.choice(same_type)
      pairs[KINDS[2]].append((text, rng.choice(q[rel]).format(x=y)))
  for k in KINDS:
    uniq = []
    for p in pairs[k]:
      if p not in seen and p[0] != p[1]:
        seen.add(p)
        uniq.append(p)
    pairs[k] = uniq[:max_per_kind]
  return pairs


def pair_similarities(encoder, pairs: dict) -> dict:
  """{kind: cosine similarities [n]} with one encode call over every distinct text."""
  texts = sorted({t for ps in pairs.values() for p in ps for t in p})
  emb = np.asarray(encoder.encode(texts, batch_size=256), np.float64)
  emb /= np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
  row = {t: i for i, t in enumerate(texts)}
  return {k: np.array([float(emb[row[a]] @ emb[row[b]]) for a, b in ps])
          for k, ps in pairs.items()}


def choose_threshold(pos: np.ndarray, neg: np.ndarray, grid=None) -> dict:
  """The grid threshold with the best balanced accuracy (ties: the lowest), with its rates."""
  grid = np.round(np.arange(0.5, 1.0001, 0.01), 2) if grid is None else np.asarray(grid)
  best = None
  for t in grid:
    tpr = float(np.mean(pos >= t)) if len(pos) else 0.0
    tnr = float(np.mean(neg < t)) if len(neg) else 0.0
    bal = (tpr + tnr) / 2
    if best is None or bal > best["balanced_accuracy"] + 1e-12:
      best = {"threshold": float(t), "tpr": tpr, "tnr": tnr, "balanced_accuracy": bal}
  return best


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default="docs/results/apex_sepr_threshold")
  ap.add_argument("--max_per_kind", type=int, default=600)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--encoder", default="", help="HF encoder folder ('' = packaged MiniLM)")
  args = ap.parse_args(argv)
  from rlrag_jax import runlog
  from rlrag_jax.retrieval.encoder import Encoder
  from rlrag_jax.config_base import SMALL_WORLD      # the CPU defaults' world
  world = world_lib.build(seed=args.seed, **SMALL_WORLD)
  encoder = Encoder.from_pretrained(args.encoder or None)
  pairs = build_pairs(world, args.max_per_kind, args.seed)
  sims = pair_similarities(encoder, pairs)
  neg = np.concatenate([sims[k] for k in KINDS[1:]])
  best = choose_threshold(sims[KINDS[0]], neg)
  per_kind = {}
  for k in KINDS:
    s = sims[k]
    per_kind[k] = {"n": int(len(s)), "mean": float(s.mean()), "min": float(s.min()),
                   "p5": float(np.percentile(s, 5)), "p50": float(np.percentile(s, 50)),
                   "p95": float(np.percentile(s, 95)), "max": float(s.max()),
                   "above_threshold": float(np.mean(s >= best["threshold"]))}
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  examples = {k: [list(p) for p in pairs[k][:3]] for k in KINDS}
  (out / "threshold.json").write_text(json.dumps(
      {"encoder": encoder.id, "world_seed": args.seed, "chosen": best, "per_kind": per_kind,
       "examples": examples}, indent=2))
  rows = [{"pairs": k, **{c: per_kind[k][c] for c in
                          ("n", "mean", "min", "p5", "p50", "p95", "max", "above_threshold")}}
          for k in KINDS]
  table = runlog.format_table(rows, ["pairs", "n", "mean", "min", "p5", "p50", "p95", "max",
                                     "above_threshold"])
  md = ["# SEPR threshold calibration (`python -m rlrag_jax.methods.apex.calibrate`)", "",
        f"Encoder `{encoder.id}`; pairs of sub-questions from the embedded world (seed "
        f"{args.seed}, the CPU default sizes); cosine similarity per pair.", "",
        "```", table, "```", "",
        f"Chosen threshold **{best['threshold']:.2f}** (best balanced accuracy over a 0.01 grid): "
        f"{best['tpr']:.3f} of paraphrase pairs match, {best['tnr']:.3f} of non-matching pairs "
        f"are rejected (balanced accuracy {best['balanced_accuracy']:.3f}).", "",
        "Examples:"]
  for k in KINDS:
    for a, b in pairs[k][:2]:
      md.append(f"- {k}: \"{a}\" / \"{b}\"")
  (out / "threshold.md").write_text("\n".join(md) + "\n")
  fig, axes = runlog.subplots(1, 1, figsize=(6.5, 3.6), squeeze=False)
  ax = axes[0][0]
  bins = np.linspace(min(float(s.min()) for s in sims.values()), 1.0, 40)
  for k in KINDS:
    ax.hist(sims[k], bins=bins, alpha=0.5, label=f"{k} (n={len(sims[k])})")
  ax.axvline(best["threshold"], color="k", ls="--", lw=1, label=f"threshold {best['threshold']:.2f}")
  ax.set_xlabel("cosine similarity (MiniLM)")
  ax.set_ylabel("pairs")
  ax.legend(fontsize=7)
  runlog.save_figure(fig, out / "threshold.png", title="SEPR threshold calibration")
  print("\n".join(md))


if __name__ == "__main__":
  main()
