"""SPARKLE through the shared trainer: the CPU default shrunk (the reader trained once from its
own config, the proxy's oracle SFT, tree-rollout PPO with a critic, the report, kill and
resume), the standard-rollout switch, and the ':paper' preset shrunk onto tiny HF checkpoints
and the real data samples."""
import atexit
import json
import pathlib
import shutil
import tempfile

import pytest

from _deps import require
from rlrag_jax import config_base, trainer
from rlrag_jax.methods.sparkle import parsing
from rlrag_jax.methods.sparkle import task as sparkle_task

pytestmark = pytest.mark.slow

_SHARED_CACHE = pathlib.Path(tempfile.mkdtemp(prefix="sparkle_retriever_"))
atexit.register(shutil.rmtree, _SHARED_CACHE, True)
WORLD = dict(num_countries=6, num_cities=24, num_people=80, num_orgs=20, num_films=40,
             num_books=40, num_questions=300, hop_mix=(1.0, 0.0, 0.0))


def _small(c, workdir):
  c.workdir = str(workdir)
  # Every run of this module searches the same world: one retrieval index and one set of
  # triple embeddings (cached by a fingerprint of the corpus and encoder) instead of a MiniLM
  # pass per run. The module's runs share a worker (one xdist group), so none writes it at once.
  c.retrieval.cache_dir = str(_SHARED_CACHE)
  c.data.world = config_base.world_config(**WORLD)
  c.data.max_eval = 6
  c.model.update(dict(hidden_size=64, intermediate_size=128, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=32, vocab_size=1024))
  c.sft.update(dict(steps=4, batch_size=8))
  c.eval.update(dict(num_examples=6, batch_size=6))
  c.sparkle.max_new.update(dict(rd=4, qf=24, ki=12, reader=16))
  c.sparkle.agent.update(dict(max_steps=5))
  c.checkpoint.every = 1
  return c


def _proxy_cfg(workdir, reader):
  c = _small(config_base.load_config_file("configs/sparkle.py"), workdir)
  # The proxy starts from the reader (model.path and model.train_config follow these keys).
  c.models.reader.path, c.models.reader.train_config = str(reader), ""
  c.rl.update(dict(steps=2, prompts_per_step=2, max_new_tokens=24))
  c.sparkle.tree.depth = 2
  return c


def _reader_cfg_file(folder) -> str:
  """A config file for the reader: `configs/sparkle_reader.py` shrunk like the proxy runs here."""
  f = folder / "reader_cfg.py"
  f.write_text(
      "from rlrag_jax import config_base\n"
      "def get_config(arg=''):\n"
      "  c = config_base.load_config_file('configs/sparkle_reader.py')\n"
      f"  c.retrieval.cache_dir = {str(_SHARED_CACHE)!r}\n"
      f"  c.data.world = config_base.world_config(**{WORLD!r})\n"
      "  c.data.max_eval = 4\n"
      "  c.model.update(dict(hidden_size=64, intermediate_size=128, num_layers=1, num_heads=2,"
      " num_kv_heads=1, head_dim=32, vocab_size=1024))\n"
      "  c.sft.update(dict(steps=3, batch_size=8))\n"
      "  c.eval.update(dict(num_examples=4, batch_size=4))\n"
      "  c.sparkle.max_new.update(dict(rd=4, qf=24, ki=12, reader=16))\n"
      "  c.sparkle.agent.max_steps = 5\n"
      "  return c\n")
  return str(f)


@pytest.fixture(scope="module")
def reader(tmp_path_factory):
  """The reader every proxy run here reads with, made the way a user gets it: the first proxy
  run's dependency step (`trainer.train_dependencies`, which `python -m rlrag_jax.train` takes
  before the run) finds no trained run at `models.reader.path` and trains one from
  `models.reader.train_config`; the run then loads it (and stops after its first step)."""
  root = tmp_path_factory.mktemp("reader")
  path = root / "run"
  c = _proxy_cfg(root / "first_proxy", path)
  c.models.reader.train_config = _reader_cfg_file(root)
  c.rl.steps, c.sft.steps = 1, 1
  trainer.train_dependencies(c)
  assert trainer.run(c, progress=False, stop_after=1) is None
  summary = json.loads((path / "eval_summary.json").read_text())
  assert {"em", "f1", "thought_match"} <= set(summary["after"])
  assert json.loads((path / "config.json").read_text())["sft"]["steps"] == 3   # its own config
  assert (root / "first_proxy" / "metrics.jsonl").is_file()      # then the proxy run started
  return path


def test_tree_ppo_trains_reports_and_resumes(tmp_path, reader):
  whole = trainer.run(_proxy_cfg(tmp_path / "whole", reader), progress=False)
  after, before = whole.after["all"], whole.before["all"]
  for p in ("", "llm_", "naive_"):
    for key in ("f1", "em", "recall", "reward"):
      assert 0.0 <= after[f"{p}{key}"] <= 1.0 and 0.0 <= before[f"{p}{key}"] <= 1.0
    assert after[f"{p}steps"] <= 5
  assert after["naive_retrievals"] == 1 and after["llm_retrievals"] == 0
  # cumulative recall never falls from one step to the next
  for p in ("", "naive_"):
    r = [after[f"{p}recall@5_step{t}"] for t in range(1, 5)]
    assert r == sorted(r)
  report = (tmp_path / "whole" / "sparkle_report.txt").read_text()
  for name in ("SFT only", "tree-rollout PPO", "reader alone", "naive RAG", "SPARKLE", "R@5 s1",
               "SFT warm-up", "Truncated proxy calls"):
    assert name in report
  # the proxy's calls cut at their token cap, counted per question (greedy, held out)
  assert 0 <= after["truncated_decisions"] <= after["decisions"]
  assert 0 <= after["truncated_selections"] <= after["selections"]
  rows = [json.loads(l) for l in (tmp_path / "whole" / "metrics.jsonl").open()]
  rl = [r for r in rows if r.get("stage") == "rl"]
  assert len(rl) == 2
  for r in rl:
    assert "vf/loss" in r and "reward/leaf_reward" in r and "reward/is_rd" in r
    assert r["reward/is_rd"] > 0              # every tree decides at least once
    for name in ("decision", "formulation", "selection"):
      assert 0.0 <= r[f"reward/truncated_{name}_rate"] <= 1.0
  # killed after the first RL step, then resumed: the same final evaluation. The baselines
  # (reader alone, naive RAG) do not depend on the proxy and were checked above: off here.
  sft = 4

  def cut_cfg():
    c = _proxy_cfg(tmp_path / "cut", reader)
    c.sparkle.eval.baselines = False
    return c

  assert trainer.run(cut_cfg(), progress=False, stop_after=sft + 1) is None
  resumed = trainer.run(cut_cfg(), progress=False, resume=True)
  got = {k: v for k, v in resumed.after["all"].items() if "latency" not in k}
  assert "f1" in got and not any(k.startswith(("llm_", "naive_")) for k in got)
  assert got == pytest.approx({k: whole.after["all"][k] for k in got})


def test_tree_values_instead_of_a_critic_train_and_resume(tmp_path, reader):
  """rl.ppo.critic='tree_mc': every decision carries its parent's return, no value model is
  trained or saved, and a killed run resumes to the same result."""
  def cfg(name):
    c = _proxy_cfg(tmp_path / name, reader)
    c.rl.ppo.critic = "tree_mc"
    c.sparkle.eval.baselines = False      # reader alone and naive RAG: checked once, above
    return c

  whole = trainer.run(cfg("whole"), progress=False)
  rows = [json.loads(l) for l in (tmp_path / "whole" / "metrics.jsonl").open()]
  rl = [r for r in rows if r.get("stage") == "rl"]
  assert len(rl) == 2
  for r in rl:
    assert not any(k.startswith("vf/") for k in r)
    assert 0.0 <= r["tree/adv_tokens_frac"] <= 1.0
  assert trainer.run(cfg("cut"), progress=False, stop_after=4 + 1) is None
  resumed = trainer.run(cfg("cut"), progress=False, resume=True)
  strip = lambda d: {k: v for k, v in d.items() if "latency" not in k}
  assert strip(resumed.after["all"]) == pytest.approx(strip(whole.after["all"]))


def test_standard_rollout_switch_and_sft_samples(tmp_path, reader):
  c = _proxy_cfg(tmp_path / "std", reader)
  c.sparkle.rollout = "standard"
  c.sparkle.eval.baselines = False        # reader alone and naive RAG: checked once, above
  c.rl.steps = 1
  # Several PPO epochs of mini-batches: the episode count is padded to what both splits need
  # (2 mini-batches of a multiple of 3 micro-batches), which no fixed bucket of 8 gives.
  c.rl.update(dict(mu=2, micro_batches=3))
  c.rl.ppo.mini_batches = 2
  res = trainer.run(c, progress=False)
  rl = [json.loads(l) for l in (tmp_path / "std" / "metrics.jsonl").open()]
  assert [r for r in rl if r.get("stage") == "rl"][0]["vf/loss"] >= 0
  assert "standard-rollout PPO" in (tmp_path / "std" / "sparkle_report.txt").read_text()
  assert res.after["all"]["n"] == 6
  t = sparkle_task.make_task(c)
  ex = next(ex for ex in t.train if t.sft_samples(ex))
  targets = [t.tokenizer.decode(tgt, skip_special_tokens=True) for _, tgt, _ in
             t.sft_samples(ex)]
  assert parsing.YES in targets[0] and parsing.QUERY in targets[1]
  assert t.sft_counts["kept"] <= t.sft_counts["oracle"] <= len(t.train)
  # The task declares what its groups are; the trainer refuses RL settings they do not fit.
  assert (t.group_size, t.sibling_baselines) == (1, False)
  trainer._check_stages(t, c)
  c.rl.ppo.critic = "tree_mc"          # no sibling branches to take values from
  with pytest.raises(ValueError, match="'tree_mc', whose values come from sibling branches, "
                     "but ProxyTask \\(sparkle\\) collects none"):
    trainer._check_stages(t, c)
  c.rl.ppo.critic, c.rl.group_size = "separate", 4
  with pytest.raises(ValueError, match="'rl.group_size' is 4, but ProxyTask \\(sparkle\\) "
                     "collects groups of 1"):
    trainer._check_stages(t, c)
  c.rl.group_size = 1
  c.sparkle.rollout = "sideways"
  with pytest.raises(ValueError, match="sparkle.rollout"):
    sparkle_task.make_task(c)


def test_reader_is_trained_once_from_its_config(tmp_path, reader):
  """The `reader` fixture's first proxy run trained the reader from its config; a second run
  naming the same path and config finds it trained and does not train it again."""
  stamp = (reader / "eval_summary.json").stat().st_mtime_ns
  c = _proxy_cfg(tmp_path / "b", reader)
  c.models.reader.train_config = _reader_cfg_file(tmp_path)
  c.rl.steps, c.sft.steps = 1, 1
  trainer.train_dependencies(c)
  assert trainer.run(c, progress=False, stop_after=1) is None
  assert (reader / "eval_summary.json").stat().st_mtime_ns == stamp
  assert (tmp_path / "b" / "metrics.jsonl").is_file()      # the second proxy run did start


def test_paper_preset_runs_on_real_data(tmp_path, shared_data_dir):
  require("torch")
  from hf_tiny import E2E_HF, make_tiny_checkpoint
  policy = make_tiny_checkpoint(tmp_path, "qwen2", **E2E_HF, name="policy")
  reader = make_tiny_checkpoint(tmp_path, "llama", seed=1, **E2E_HF,
                                name="reader")
  c = config_base.load_config_file("configs/sparkle.py:paper")
  c.workdir, c.model.path, c.data.dir = str(tmp_path / "run"), str(policy), ""
  c.models.reader.path = str(reader)
  c.data.mix = ("hotpotqa:train",)          # the samples hold no 2Wiki or NQ train split
  c.data.eval_mix = ("2wiki:dev:2", "hotpotqa:dev:2")    # per dataset: a cut of both refuses
  c.data.max_train, c.data.max_eval = 4, 0
  c.retrieval.backend = "exact"
  c.sft.steps = c.sft.epochs = 0            # real data: SFT needs collected trajectories
  c.rl.update(dict(steps=1, epochs=0.0, prompts_per_step=2, max_new_tokens=6))
  c.sparkle.tree.depth = 1
  # Few, short passages and triples: byte-level tokens make whole passages thousands of
  # tokens, whose prefills were most of this test's time; the plumbing does not need them.
  c.sparkle.agent.update(dict(max_steps=2, top_docs=2, top_triples=4, passage_words=12))
  c.sparkle.max_new.update(dict(rd=3, qf=6, ki=6, reader=6))
  c.eval.update(dict(num_examples=4, max_new_tokens=6, batch_size=4))
  c.checkpoint.every = 1
  c.model.attention_block = 64
  res = trainer.run(c, progress=False)
  assert res.after["all"]["n"] == 4 and "recall@5_step1" in res.after["all"]
  t = sparkle_task.make_task(c)
  assert all(t.gold(ex) for ex in t.train + t.eval)       # gold paragraphs found in the corpus
  # 2Wiki's evidences became triples of the documents that state them
  two = [ex for ex in t.eval if ex.source == "2wiki" and ex.triples]
  assert two
  heads = {tr.head for tr in two[0].triples}
  docs = [d for d in t.env.records if d.title in heads]
  assert any(t.store.doc_triples(d.id) for d in docs)


def test_reader_paper_preset_runs_on_real_data(tmp_path, shared_data_dir):
  require("torch")
  from hf_tiny import E2E_HF, make_tiny_checkpoint
  ckpt = make_tiny_checkpoint(tmp_path, "qwen2", **E2E_HF, name="reader")
  c = config_base.load_config_file("configs/sparkle_reader.py:paper")
  c.workdir, c.model.path, c.data.dir = str(tmp_path / "run"), str(ckpt), ""
  c.data.mix = ("musique:train",)          # MuSiQue gives decompositions with gold ids
  c.data.eval_mix = ("musique:dev",)
  c.data.max_train, c.data.max_eval = 4, 4
  c.retrieval.backend = "exact"
  c.sft.update(dict(steps=2, batch_size=2, max_len=1024))
  c.sparkle.agent.max_steps = 2
  c.sparkle.max_new.reader = 6
  c.eval.update(dict(num_examples=4, max_new_tokens=6, batch_size=4))
  c.model.attention_block = 64
  res = trainer.run(c, progress=False)
  assert {"em", "f1", "thought_match"} <= set(res.after["all"])
  assert 0 < res.after["all"]["n"] <= 4
