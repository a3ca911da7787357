"""The accelerator `paper` presets end to end on the real data samples, shrunk by overrides only.

Each preset keeps its algorithm, optimiser, KL, clipping, aggregation, prompt style and model path
plumbing (an HF checkpoint computed in bfloat16 over float32 master params, FSDP mesh, remat,
blocked attention); the overrides only make it small: a tiny random HF checkpoint
(`tests/hf_tiny.py`), a few examples from splits that exist in `../shared/data` with train and
eval disjoint, 2 RL steps, short completions. Each run is killed after step 1, resumed, evaluated
and exported, and the export is reloaded in `transformers` with matching logits.

A random tiny model earns zero reward, so each preset's first RL step runs on the same real
prompts with a stub reward that varies: its advantages are non-zero and the parameters move at the
preset's own learning rate (3e-6 / 1e-6: these would round away in bfloat16 params).
"""
import json

import jax
import numpy as np
import pytest

from _deps import require
from configs import apex_planner, arena, search
from rlrag_jax import trainer
from rlrag_jax.models import LM, load_hf
from hf_tiny import E2E_HF, load_reference, make_tiny_checkpoint

pytestmark = pytest.mark.slow


def _shrink(c, ckpt, workdir):
  c.workdir = str(workdir)
  c.model.path = str(ckpt)
  c.data.dir = ""                    # RLRAG_DATA_DIR (the shared samples)
  c.rl.steps = 2
  c.rl.epochs = 0                    # fixed steps (APEX planner's preset counts epochs)
  c.rl.prompts_per_step = 2
  c.rl.group_size = 2
  c.rl.micro_batches = 2
  c.rl.dynamic_max_tries = 1
  c.eval.num_examples = 2
  c.eval.batch_size = 2
  c.eval.every = 0
  c.checkpoint.every = 1
  c.checkpoint.keep = 3
  c.model.attention_block = 64       # blocked attention stays on, at the tiny model's scale
  return c


def arena_paper(ckpt, workdir):
  c = _shrink(arena.get_config("paper"), ckpt, workdir)
  c.data.mix = ("hotpotqa:train", "musique:train")      # the shared samples have no 2Wiki train
  c.data.eval_mix = ("hotpotqa:dev",)
  c.data.max_train = 6
  c.data.max_eval = 2
  c.data.max_contexts = 2
  c.data.max_passage_chars = 120
  c.rl.max_new_tokens = 8
  c.eval.max_new_tokens = 8
  return c


def search_paper(ckpt, workdir):
  c = _shrink(search.get_config("paper"), ckpt, workdir)
  c.data.mix = ("2wiki:dev",)                            # 80/20 split of it (train_frac 0.8)
  c.data.max_train = 10
  c.data.max_eval = 2
  c.retrieval.corpus = ""                                # the examples' own contexts
  c.retrieval.backend = "exact"
  c.tool.top_k, c.tool.max_turns, c.tool.max_obs_tokens = 1, 2, 48
  c.tool.max_total_len, c.tool.min_batch, c.tool.context_bucket = 2200, 2, 64  # B.4 prompt: ~1.9k bytes
  c.rl.max_new_tokens = 8
  c.eval.max_new_tokens = 8
  c.search.eval.baselines = False
  c.reward.match = "em"                                  # no judge endpoint in tests
  return c


def apex_planner_paper(ckpt, workdir):
  c = _shrink(apex_planner.get_config("paper"), ckpt, workdir)
  c.data.max_train = 6                                   # MuSiQue train / dev samples
  c.data.max_eval = 2
  c.rl.max_new_tokens = 8
  c.eval.max_new_tokens = 8
  return c


PRESETS = {"arena": (arena_paper, "qwen2"), "search": (search_paper, "llama"),
           "apex_planner": (apex_planner_paper, "qwen2")}


def _questions(examples):
  return {ex.question for ex in examples}


def _varying_reward(monkeypatch, seen):
  """Every task `trainer.run` builds gets a stub reward that varies within every group of
  distinct completions (a deterministic hash of the tokens), and every advantage array the
  update computes is appended to `seen`."""
  real_get_task = trainer.get_task

  def stub_task(method, config):
    task = real_get_task(method, config)
    def reward(ep, step):
      total = float(hash(tuple(ep.completion_ids)) % 997)
      return {"total": total, "correct": total % 2}     # 'correct': search's sampling key
    # the kit's batch hook (the judge's questions asked concurrently) is what collect calls
    task.rewards = lambda episodes, step=0: [reward(ep, step) for ep in episodes]
    task.report = lambda *a, **k: None          # the method's report reads real reward keys
    return task

  from rlrag_jax.training import learners
  real_adv = learners.adv_lib.group_advantages

  def recording_adv(*a, **kw):
    out = real_adv(*a, **kw)
    seen.append(np.asarray(out))
    return out

  monkeypatch.setattr(trainer, "get_task", stub_task)
  monkeypatch.setattr(learners.adv_lib, "group_advantages", recording_adv)


def _assert_moved(params, ckpt, lr):
  """The params moved from the checkpoint's by more than a tenth of one step at `lr`, and the
  master copy stayed float32."""
  start = load_hf(ckpt, param_dtype="float32").params
  moved = [float(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32)).max())
           for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(start))]
  assert max(moved) > 0.1 * lr, (max(moved), lr)
  assert all(np.asarray(x).dtype == np.float32 for x in jax.tree_util.tree_leaves(params))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_paper_preset_trains_resumes_evaluates_and_exports(name, tmp_path, monkeypatch):
  """Step 1 under the varying stub reward (a random tiny model earns zero real reward): its
  advantages are non-zero and the parameters move at the preset's own learning rate. The run is
  killed after it, resumed (step 2 under the task's own reward), evaluated and exported."""
  torch = require("torch")
  make, arch = PRESETS[name]
  ckpt = make_tiny_checkpoint(tmp_path, arch, **E2E_HF)
  c = make(ckpt, tmp_path / "run")
  from rlrag_jax.tasks import get_task
  task = get_task(c.method, c)
  assert task.train and task.eval
  assert not _questions(task.train) & _questions(task.eval), "train and eval overlap"

  seen = []
  with monkeypatch.context() as m:
    _varying_reward(m, seen)
    assert trainer.run(c, progress=False, stop_after=1) is None        # killed after step 1
  assert len(seen) == 1 and np.abs(seen[0]).max() > 0, seen
  res = trainer.run(make(ckpt, tmp_path / "run"), progress=False, resume=True)
  rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if r["stage"] == "rl"] == [1, 2]
  assert {"eval_before", "eval_after"} <= {r["stage"] for r in rows}
  assert res.after["all"]["n"] == 2
  # The master params moved at the preset's learning rate (step 1 had non-zero advantages).
  _assert_moved(res.params, ckpt, c.rl.lr)

  # The export loads in transformers with our trained params' logits (float32 compute).
  ref = load_reference(tmp_path / "run" / "hf")
  ids = np.array([[1, 40, 41, 77, 90, 33, 2]])
  with torch.no_grad():
    want = ref(input_ids=torch.tensor(ids)).logits.numpy()
  ours = LM(res.model_config.replace(dtype="float32"), res.params).logits(ids)
  np.testing.assert_allclose(np.asarray(ours), want, atol=1e-4, rtol=1e-4)


def test_qwen3_paper_preset_rl_step_moves_params_under_a_varying_reward(tmp_path, monkeypatch):
  """Qwen3 (q/k norms) trains under the ARENA preset: one RL step, non-zero advantages, params
  moved."""
  ckpt = make_tiny_checkpoint(tmp_path, "qwen3", **E2E_HF)
  c = arena_paper(ckpt, tmp_path / "run")
  c.rl.steps, c.checkpoint.every, c.export_hf = 1, 0, False
  seen = []
  _varying_reward(monkeypatch, seen)
  monkeypatch.setattr(trainer, "_evaluate", lambda *a, **k: {"all": {"n": 0}, "rows": []})
  res = trainer.run(c, progress=False)
  assert len(seen) == 1 and np.abs(seen[0]).max() > 0, seen
  _assert_moved(res.params, ckpt, c.rl.lr)
