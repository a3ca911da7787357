"""End-to-end: the ARENA pipeline on a tiny world and model; resume after a kill; export."""
import json

import jax
import numpy as np
import pytest

from _deps import require
from configs import arena
from rlrag_jax import fingerprint, run_dirs, trainer
from rlrag_jax.rollout.policy import checkpoint_policy
from rlrag_jax.training import collection

pytestmark = pytest.mark.slow


def tiny_config(workdir):
  c = arena.get_config("")
  c.workdir = str(workdir)
  c.data.world = dict(seed=0, num_questions=400)
  c.data.max_eval = 8
  c.model.vocab_size = 512
  c.model.hidden_size = 32
  c.model.intermediate_size = 64
  c.model.num_layers = 1
  c.model.num_heads = 2
  c.model.num_kv_heads = 1
  c.model.head_dim = 16
  c.sft.steps = 3
  c.sft.batch_size = 4
  c.rl.steps = 4
  c.rl.prompts_per_step = 2
  c.rl.group_size = 2
  c.rl.max_new_tokens = 12
  c.eval.num_examples = 4
  c.eval.max_new_tokens = 12
  c.eval.batch_size = 4
  c.checkpoint.every = 2
  c.checkpoint.keep = 3
  c.export_hf = True
  return c


def _leaves(params):
  return [np.asarray(x) for x in jax.tree_util.tree_leaves(params)]


def _rows(workdir):
  return [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_resume_after_kill_repeats_the_uninterrupted_run(tmp_path, caplog):
  full = trainer.run(tiny_config(tmp_path / "full"), progress=False)
  # Killed after step 5 (SFT 1-3, RL 4-5): the last checkpoint is step 4, so step 5 is redone.
  assert trainer.run(tiny_config(tmp_path / "killed"), progress=False, stop_after=5) is None
  killed = tmp_path / "killed"
  assert fingerprint.read(killed)["fingerprint"] == fingerprint.fingerprint(
      tiny_config(killed))
  # A run directory made before fingerprints (none recorded) resumes with a warning; so do a
  # killed process's half-written last metrics line (dropped) and a corrupt latest checkpoint
  # (step 4: set aside, the run resumes from step 2 and still repeats the uninterrupted one).
  from test_checkpoint import _truncate_largest_state_file
  (killed / "fingerprint.json").unlink()
  with (killed / "metrics.jsonl").open("a") as f:
    f.write('{"step": 6, "stage": "rl", "lo')
  _truncate_largest_state_file(killed / "checkpoints" / "4")
  with caplog.at_level("WARNING"):
    resumed = trainer.run(tiny_config(killed), progress=False, resume=True)
  assert "no fingerprint.json" in caplog.text and "cannot be checked" in caplog.text
  assert "dropped a torn last line" in caplog.text
  assert "checkpoint step 4 under" in caplog.text and "restored step 2 instead" in caplog.text
  assert (killed / "checkpoints" / "4.corrupt").is_dir()
  assert fingerprint.read(killed)["starts"][-1]["status"] == "unchecked"
  for a, b in zip(_leaves(full.params), _leaves(resumed.params)):
    np.testing.assert_array_equal(a, b)
  # Timings and compile counts differ between processes; everything else must not.
  strip = lambda rows: [{k: v for k, v in r.items()
                         if not k.endswith("_s") and not k.startswith("compile/")} for r in rows]
  assert strip(_rows(tmp_path / "full")) == strip(_rows(tmp_path / "killed"))
  assert full.after == resumed.after


def test_run_writes_report_and_exports_a_transformers_checkpoint(tmp_path):
  torch = require("torch")
  transformers = require("transformers")
  work = tmp_path / "run"
  config = tiny_config(work)
  config.eval.every = 2                 # a mid-run evaluation after RL step 2 of 4
  res = trainer.run(config, progress=False)
  for name in ("metrics.jsonl", "eval_table.txt", "eval_summary.json", "rl_curves.png",
               "sft_curves.png", "eval_rows.json", "eval_rows_rl2.json"):
    assert (work / name).exists(), name
  per_example = json.loads((work / "eval_rows.json").read_text())
  assert len(per_example["before"]) == len(per_example["after"]) == res.after["all"]["n"]
  assert {r["id"] for r in per_example["before"]} == {r["id"] for r in per_example["after"]}
  assert all("em" in r and "completion" not in r for r in per_example["after"])
  mid = json.loads((work / "eval_rows_rl2.json").read_text())
  assert len(mid["rows"]) == res.after["all"]["n"] and "em" in mid["all"]
  assert list((work / "tb").iterdir()), "no TensorBoard event file"
  stages = {r["stage"] for r in _rows(work)}
  assert {"sft", "rl", "eval_before", "eval_after"} <= stages
  # The exported HF checkpoint loads in transformers with the same logits as our params.
  model = transformers.AutoModelForCausalLM.from_pretrained(str(work / "hf")).eval()
  ids = np.array([[5, 9, 17, 33, 2, 7]])
  with torch.no_grad():
    ref = model(input_ids=torch.tensor(ids)).logits.numpy()
  from rlrag_jax.models import LM
  ours = np.asarray(LM(res.model_config, res.params).logits(ids))
  np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=1e-4)
  # And `export` from the run directory gives the same files' logits.
  lm = run_dirs.load_trained(work)
  np.testing.assert_allclose(np.asarray(lm.logits(ids)), ours, atol=1e-6)


def test_judge_counts_are_logged_per_step_and_a_dead_judge_stops_the_run(tmp_path,
                                                                          monkeypatch):
  """A judge that answers 8 requests and then only 500s: eval_before (4 questions) and RL
  steps 4-5 (2 each) are judged, step 6 fails twice, step 7 passes the limit (more than 2 of the
  last 4 failed): the run stops with EndpointFailing, its step-6 checkpoint on disk."""
  import itertools
  from chat_server import serve
  from rlrag_jax import judge
  from rlrag_jax.checkpoint import CheckpointManager
  from rlrag_jax.methods.arena.task import ArenaTask
  monkeypatch.setattr(ArenaTask, "decode", lambda self, ids: (
      "<relevance>[1]</relevance><analysis>a</analysis><answer>Paris</answer>"))
  work = tmp_path / "run"
  c = tiny_config(work)
  c.export_hf = False
  c.reward.accuracy = "judge"
  c.reward.judge_model, c.reward.judge_failure_window = "m", 4
  count = itertools.count()
  with serve(lambda body: "yes" if next(count) < 8 else None) as chat:
    c.reward.judge_url = chat.url
    with pytest.raises(judge.EndpointFailing, match="reward.judge_max_failure_rate=0.5"):
      trainer.run(c, progress=False)
  rows = {(r["stage"], r["step"]): r for r in _rows(work)}
  assert rows[("eval_before", 3)]["judge/calls"] == 4.0
  for step, failures in ((4, 0.0), (5, 0.0), (6, 2.0)):
    r = rows[("rl", step)]
    assert (r["judge/calls"], r["judge/failures"], r["judge/failure_rate"]) == (
        2.0, failures, failures / 2), step
  assert rows[("rl", 6)]["judge/failures_http"] == 2.0 and ("rl", 7) not in rows
  assert rows[("rl", 4)]["reward/accuracy"] == 1.0 and rows[("rl", 6)]["reward/accuracy"] == 0.0
  assert CheckpointManager(work / "checkpoints", max_to_keep=None).latest_step() == 6


def test_a_step_the_micro_batches_do_not_divide_pads_with_whole_groups_and_trains(tmp_path):
  """Group size 3, 4 prompts, 8 micro-batches: the 12 episodes of a step pad to 16 with a
  silenced group of 3 and one of 1 under fresh ids, and the RL steps train (the positional
  advantages raised here before: 16 episodes do not split into groups of 3)."""
  c = tiny_config(tmp_path / "run")
  c.rl.group_size, c.rl.prompts_per_step, c.rl.micro_batches = 3, 4, 8
  c.sft.steps, c.rl.steps, c.export_hf = 1, 2, False
  trainer.run(c, progress=False)
  rl_rows = [r for r in _rows(tmp_path / "run") if r["stage"] == "rl"]
  assert [r["step"] for r in rl_rows] == [2, 3]
  for r in rl_rows:
    assert r["dynamic/padded_episodes"] == 4.0 and np.isfinite(r["loss"])


def test_build_model_carries_the_attention_block_and_remat(tmp_path):
  from rlrag_jax.generate import byte_level_tokenizer
  c = tiny_config(tmp_path)
  c.model.attention_block, c.model.remat = 16, True
  cfg, params = trainer.build_model(c, byte_level_tokenizer())
  assert cfg.attention_block == 16 and cfg.remat
  assert jax.tree_util.tree_leaves(params)


def test_stage_iterators_build_only_the_stages_that_run():
  config = arena.get_config("")
  items = list(range(5))
  config.sft.steps, config.sft.batch_size = 0, 32          # no SFT: its batch size is irrelevant
  config.rl.steps, config.rl.prompts_per_step = 2, 4
  sft_it, rl_it = trainer.stage_iterators(items, config)
  assert sft_it is None and len(next(rl_it)) == 4
  config.rl.steps = 0
  assert trainer.stage_iterators(items, config) == (None, None)
  config.sft.steps = 3                                     # now SFT runs and needs 32 examples
  with pytest.raises(ValueError, match=r"sft stage: 5 training examples.*'sft.batch_size' = 32"):
    trainer.stage_iterators(items, config)
  config.sft.steps, config.rl.steps, config.rl.prompts_per_step = 0, 1, 6
  with pytest.raises(ValueError, match=r"rl stage: 5 .*'rl.prompts_per_step' = 6"):
    trainer.stage_iterators(items, config)


def test_dynamic_sampling_keeps_groups_by_the_configured_key():
  """Groups with no spread in `rl.dynamic_sampling_key` are dropped and refilled."""
  import types
  config = arena.get_config("")
  config.rl.group_size, config.rl.prompts_per_step = 2, 2
  config.rl.dynamic_sampling, config.rl.dynamic_max_tries = True, 3
  # Draw 1: group A has a spread in 'total' but not in 'correct'; group B in both.
  from stub_task import StubTask
  task = StubTask(rewards=lambda eps, step: [{"total": ep[1], "correct": ep[2]} for ep in eps])
  import itertools
  rl_iter = itertools.repeat(["x", "y"])
  for key_name, want in (("total", ["A", "A", "B", "B"]), ("correct", ["B", "B", "C", "C"])):
    draws = iter([[("A", 1.0, 0.0), ("A", 2.0, 0.0), ("B", 1.0, 1.0), ("B", 0.0, 0.0)],
                  [("C", 1.0, 1.0), ("C", 1.0, 0.0), ("D", 0.0, 0.0), ("D", 0.0, 0.0)]])
    task.rollout = lambda policy, exs, key, group_size, d=draws: next(d)
    config.rl.dynamic_sampling_key = key_name
    batch, fill = collection.collect(task, None, rl_iter, jax.random.PRNGKey(0), config, 1)
    assert [e[0] for e in batch.episodes] == want, key_name
  config.rl.dynamic_sampling_key = "accuracy"
  task.rollout = lambda policy, exs, key, group_size: [("A", 1.0, 0.0)] * 4
  with pytest.raises(ValueError, match="'rl.dynamic_sampling_key' is 'accuracy'"):
    collection.collect(task, None, rl_iter, jax.random.PRNGKey(0), config, 1)


def test_a_run_starts_from_another_runs_weights_trained_once_by_its_config(tmp_path):
  """model.init 'hf' with model.path a training run directory: the new run's initial params
  and tokenizer are that run's; model.train_config trains it first when it is missing (the
  dependency step, `trainer.train_dependencies`; the run's own setup refuses it missing)."""
  base_cfg = tmp_path / "base_config.py"
  tiny = tiny_config("unused")
  tiny.rl.steps, tiny.export_hf = 0, False
  base_cfg.write_text(
      "import ml_collections\n"
      "def get_config(arg=''):\n"
      f"  return ml_collections.ConfigDict({tiny.to_dict()!r})\n")
  base = tmp_path / "base"
  c = tiny_config(tmp_path / "run")
  c.model.init, c.model.path = "hf", str(base)
  c.model.train_config = str(base_cfg)
  with pytest.raises(FileNotFoundError, match="'model.path'.*no finished run"):
    trainer._setup(c, None)
  trainer.train_dependencies(c)
  r = trainer._setup(c, None)
  assert (base / "eval_summary.json").exists()          # trained once, by its own config
  lm = run_dirs.load_trained(base)
  for a, b in zip(_leaves(r.params), _leaves(lm.params)):
    np.testing.assert_array_equal(a, b)
  assert r.task.tokenizer.get_vocab() == lm.tokenizer.get_vocab()
  r.ckpt.close()
  r.rlog.close()


def test_a_run_directory_serves_the_checkpoint_tools(tmp_path):
  """`trainer.task_for_checkpoint` (evaluate, experiments.headroom) rebuilds the task with the
  run's own tokenizer and weights: greedy evaluation repeats the run's final table, and the
  headroom tool's greedy reward is that evaluation's."""
  from rlrag_jax import evaluation
  from rlrag_jax.experiments import headroom
  work = tmp_path / "run"
  config = tiny_config(work)
  config.export_hf = False
  res = trainer.run(config, progress=False)
  task, lm = trainer.task_for_checkpoint(tiny_config(work), work)
  policy = checkpoint_policy(lm, task.tokenizer, config.eval.max_new_tokens)
  examples = list(task.eval)[: config.eval.num_examples]
  again = evaluation.evaluate(task, policy, examples, batch_size=config.eval.batch_size,
                              seed=config.seed, progress=False)
  assert again["all"] == res.after["all"]
  room = headroom.headroom(task, policy, examples, k=2, temperatures=(1.0,),
                           rng=jax.random.PRNGKey(0), progress=False)
  assert room["total"]["greedy"] == pytest.approx(res.after["all"]["reward"])
  with pytest.raises(FileNotFoundError, match="neither a training run directory"):
    trainer.task_for_checkpoint(tiny_config(work), tmp_path)
