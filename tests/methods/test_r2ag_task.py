"""R2AG through the shared trainer: the CPU default shrunk (SFT warm-up, DAPO over the forest,
kill-and-resume continuing the forest exactly, the frozen generator trained once from its own
config), and the ':paper' preset shrunk onto tiny HF checkpoints and the real data samples."""
import json

import ml_collections
import pytest

from _deps import require
from configs import r2ag
from rlrag_jax import config_base, trainer
from rlrag_jax.methods.r2ag import parsing
from rlrag_jax.methods.r2ag import task as r2ag_task

pytestmark = pytest.mark.slow

WORLD = dict(num_countries=6, num_cities=24, num_people=80, num_orgs=20, num_films=40,
             num_books=40, num_questions=300)


def test_flat_groups_are_dropped_by_the_engine_s_dynamic_sampling():
  """Algorithm 1 drops zero-spread groups: every preset hands that to the engine (one draw in
  ':paper', replacements drawn in the CPU default)."""
  for arg, tries in (("", 3), ("paper", 1), ("long_warmup", 3)):
    rl = r2ag.get_config(arg).rl
    assert (rl.dynamic_sampling, rl.dynamic_sampling_key, rl.dynamic_max_tries) == (
        True, "total", tries), arg


def _small(c, workdir):
  c.workdir = str(workdir)
  c.data.world = config_base.world_config(**WORLD)
  c.data.max_eval = 6
  c.model.update(dict(hidden_size=64, intermediate_size=128, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=32, vocab_size=1024))
  c.sft.update(dict(steps=6, batch_size=8))
  c.eval.update(dict(num_examples=6, batch_size=6, max_new_tokens=40))
  c.checkpoint.every = 1
  return c


def _steering_cfg(workdir, generator):
  c = _small(r2ag.get_config(""), workdir)
  c.models.generator = ml_collections.ConfigDict(dict(path=str(generator)))
  c.rl.update(dict(steps=3, prompts_per_step=3, group_size=4, max_new_tokens=40))
  c.r2ag.forest.update(dict(size=4, max_iterations=3, max_children=2, max_size=4))
  return c


def _generator_cfg_file(folder) -> str:
  """A config file for the generator: `configs/r2ag_generator.py` shrunk like the runs here."""
  f = folder / "gen_cfg.py"
  f.write_text(
      "from configs import r2ag_generator\n"
      "from rlrag_jax import config_base\n"
      "def get_config(arg=''):\n"
      "  c = r2ag_generator.get_config('')\n"
      f"  c.data.world = config_base.world_config(**{WORLD!r})\n"
      "  c.data.max_eval = 6\n"
      "  c.model.update(dict(hidden_size=64, intermediate_size=128, num_layers=1, num_heads=2,"
      " num_kv_heads=1, head_dim=32, vocab_size=1024))\n"
      "  c.sft.update(dict(steps=3, batch_size=8))\n"
      "  c.eval.update(dict(num_examples=6, batch_size=6, max_new_tokens=40))\n"
      "  return c\n")
  return str(f)


@pytest.fixture(scope="module")
def generator(tmp_path_factory):
  """The frozen generator of every steering run here, made the way a user gets it: the first
  steering run's dependency step (`trainer.train_dependencies`, which `python -m
  rlrag_jax.train` takes before the run) finds no trained run at `models.generator.path` and
  trains one from `models.generator.train_config`; the run itself, refused before that, then
  loads it (and stops after its first step)."""
  root = tmp_path_factory.mktemp("gen")
  path = root / "run"
  c = _steering_cfg(root / "first_steering", path)
  c.models.generator.train_config = _generator_cfg_file(root)
  c.rl.steps, c.sft.steps = 1, 1
  with pytest.raises(FileNotFoundError, match="'models.generator.path'.*train_dependencies"):
    trainer.run(c, progress=False, stop_after=1)
  trainer.train_dependencies(c)
  assert trainer.run(c, progress=False, stop_after=1) is None
  assert json.loads((path / "config.json").read_text())["sft"]["steps"] == 3   # its own config
  assert "em" in json.loads((path / "eval_summary.json").read_text())["after"]
  assert (root / "first_steering" / "metrics.jsonl").is_file()   # then the steering run started
  return path


def test_trains_reports_and_resumes_the_forest_exactly(tmp_path, generator):
  whole = trainer.run(_steering_cfg(tmp_path / "whole", generator), progress=False)
  after = whole.after["all"]
  for prefix in ("", "base_", "top2_", "sr_"):
    # shares of questions or of gold documents (task.retrieval_metrics, tested by hand in
    # test_r2ag_rewards); a question's AP is at most its recall (each precision is <= 1), and
    # full recall means recall 1
    for key in ("recall", "full_recall", "map", "em", "f1"):
      assert 0 <= after[f"{prefix}{key}"] <= 1, (prefix, key, after)
    assert after[f"{prefix}map"] <= after[f"{prefix}recall"] + 1e-9
    assert after[f"{prefix}full_recall"] <= after[f"{prefix}recall"] + 1e-9
    assert after[f"{prefix}at_k"] >= 0
  assert after["sr_at_k"] == 5            # single-step retrieval: r2ag.eval.sr_k documents
  assert 0 <= after["later_noisy_premature_stops"] <= after["later_premature_stops"] <= \
      after["later_steps"]
  report = (tmp_path / "whole" / "r2ag_report.txt").read_text()
  for name in ("SFT only", "after RL", "R2AG top-1", "base-only", "top-2", "SR@k", "mAP",
               "RR-Forest"):
    assert name in report
  rows = [json.loads(l) for l in (tmp_path / "whole" / "metrics.jsonl").open()]
  rl = [r for r in rows if r.get("stage") == "rl"]
  assert len(rl) == 3 and all("reward/mh" in r and "dynamic/dropped_groups" in r for r in rl)

  # killed after the second RL step, then resumed: the same forest, the same evaluation
  sft = 6
  assert trainer.run(_steering_cfg(tmp_path / "cut", generator), progress=False,
                     stop_after=sft + 2) is None
  resumed = trainer.run(_steering_cfg(tmp_path / "cut", generator), progress=False,
                        resume=True)
  forest = [json.loads((tmp_path / d / "r2ag_forest.json").read_text()) for d in ("whole",
                                                                                   "cut")]
  assert forest[0] == forest[1]
  strip = lambda d: {k: v for k, v in d.items() if "latency" not in k}
  assert strip(resumed.after["all"]) == pytest.approx(strip(whole.after["all"]))


def test_generator_is_trained_once_from_its_config(tmp_path, generator):
  """`models.generator.train_config`: the `generator` fixture's first run trained the missing
  generator; a second run naming the same path and config reuses it."""
  stamp = (generator / "eval_summary.json").stat().st_mtime_ns
  c = _steering_cfg(tmp_path / "b", generator)
  c.models.generator.train_config = _generator_cfg_file(tmp_path)
  c.rl.steps, c.sft.steps = 1, 1
  trainer.train_dependencies(c)
  assert trainer.run(c, progress=False, stop_after=1) is None
  assert (generator / "eval_summary.json").stat().st_mtime_ns == stamp
  assert (tmp_path / "b" / "metrics.jsonl").is_file()      # the second run did start


def test_paper_preset_runs_on_real_data(tmp_path, shared_data_dir):
  require("torch")
  from hf_tiny import E2E_HF, make_tiny_checkpoint
  policy = make_tiny_checkpoint(tmp_path, "qwen2", **E2E_HF, name="policy")
  reader = make_tiny_checkpoint(tmp_path, "llama", seed=1, **E2E_HF,
                                name="generator")
  c = r2ag.get_config("paper")
  c.workdir, c.model.path, c.data.dir = str(tmp_path / "run"), str(policy), ""
  c.models.generator.path = str(reader)
  c.data.mix = ("hotpotqa:train", "musique:train")      # the samples hold no 2Wiki train split
  c.data.val_mix = ("hotpotqa:dev:2",)    # what train and eval leave (train took both splits)
  c.data.eval_mix = ("hotpotqa:dev:3",)   # per-dataset counts: a cut of several is refused
  c.data.max_train, c.data.max_eval = 6, 0
  c.retrieval.backend = "exact"
  c.rl.update(dict(steps=2, prompts_per_step=2, group_size=2, micro_batches=1,
                   max_new_tokens=8))
  c.r2ag.forest.update(dict(size=3, max_size=4))
  c.r2ag.eval.update(dict(answer_tokens=4, max_iterations=2))
  c.r2ag.passage_words = 12               # byte-level tokens: whole passages make long prefills
  c.eval.update(dict(num_examples=3, max_new_tokens=8, batch_size=3))
  c.checkpoint.every = 1
  c.eval.val_every = 1                    # validations at both RL steps
  c.model.attention_block = 64
  res = trainer.run(c, progress=False)
  assert res.after["all"]["n"] == 3 and "map" in res.after["all"]
  assert (tmp_path / "run" / "best").is_dir()
  t = r2ag_task.make_task(c)
  assert all(t.gold(ex) for ex in t.train + t.eval)     # gold paragraphs found in the corpus
  assert {ex.source for ex in t.train} == {"hotpotqa", "musique"}


@pytest.mark.parametrize("carry", ["gold", "branch"])
def test_forest_carries_gold_or_every_retrieved_document(tmp_path, carry):
  """An expansion whose rollout asks the first hop's question (base) and a query that retrieves
  a non-gold document (predicted): with carry='gold' the continuation's context is the gold
  documents retrieved (the paper's d^{j+1} = g~), with 'branch' every document retrieved, as
  inference's branches hold them."""
  import jax
  from rlrag_jax.tasks import Episode
  c = _small(r2ag.get_config(""), tmp_path)
  c.r2ag.forest.update(dict(size=1, carry=carry))
  t = r2ag_task.make_task(c)
  (item,) = t.forest.take(1)
  ex = t.train[t.forest.example_of(item)]
  gold = set(t.gold(ex))
  first = t.decomposition(ex)[0].question
  off = next(q for q in ("zebra violin harbour", "quartz meadow lantern", "copper fog")
             if t.corpus.search([q], 1)[0][0] not in gold)
  text = parsing.render("nothing known yet", [first], [off])
  hits = {d for h in t.corpus.search([first, off], 1) for d in h}
  assert hits - gold and hits & gold                  # the query pair does what it is meant to

  def fake_sample(policy, examples, items, rng, g, greedy=False):
    return [Episode(example=examples[0], prompt_ids=[1], completion_ids=[2], loss_mask=[1],
                    text=text, info={"context": tuple(items[0].context), "item": 0,
                                     "truncated": False})] * g
  t._sample = fake_sample
  t._expand(None, [item], jax.random.PRNGKey(0), 2)
  (nxt,) = t.forest.next.values()
  assert set(nxt.context) == (hits & gold if carry == "gold" else hits)
