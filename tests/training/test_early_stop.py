"""Validation every eval.val_every RL steps, the best state kept, early stop after
eval.early_stop_patience validations without a new best: the RL stage's loop over stubs (no
model, no rollouts), against a hand-computed metric sequence."""
import types

import jax
import pytest

from rlrag_jax import config_base
from rlrag_jax.tasks import Episode, Group
from stub_task import StubTask
from rlrag_jax.training import batch as batch_lib
from rlrag_jax.training import collection, early_stop, stages


def test_early_stopping_bookkeeping_by_hand():
  es = early_stop.EarlyStopping(patience=2)
  # steps 10..50: 0.1 best, 0.3 best, 0.2 (1 without), 0.3 equal is not better (2): stop
  seen = [(s, es.update(s, v), es.should_stop) for s, v in
          [(10, 0.1), (20, 0.3), (30, 0.2), (40, 0.3)]]
  assert seen == [(10, True, False), (20, True, False), (30, False, False), (40, False, True)]
  assert (es.best, es.best_step, es.since_best) == (0.3, 20, 2)
  again = early_stop.EarlyStopping(patience=2)
  again.load_state_dict(es.state_dict())
  assert again == es
  never = early_stop.EarlyStopping(patience=0)
  for s, v in enumerate([0.5, 0.4, 0.3, 0.2, 0.1]):
    never.update(s, v)
  assert not never.should_stop and never.best_step == 0


class _Log:
  def __init__(self):
    self.rows = []

  def write(self, step, stage, metrics):
    self.rows.append((step, stage, dict(metrics)))


def _run(metric_values, *, val_every, patience, rl_steps, val_metric="recall"):
  """A Run over stubs whose validation at its k-th call returns metric_values[k]."""
  config = config_base.trainer_config("stub", "unused")
  config.sft.steps, config.rl.steps, config.log_every, config.checkpoint.every = 0, rl_steps, 1, 0
  config.eval.update(dict(every=0, val_every=val_every, val_metric=val_metric,
                          early_stop_patience=patience))
  values = iter(metric_values)
  asked = []

  def evaluate_fn(task, policy, examples, cfg, desc):
    asked.append((desc, list(examples)))
    return {"all": {"recall": next(values), "n": len(examples)}, "rows": []}

  learner = types.SimpleNamespace(update=lambda state, critic, batch, ref, key: (
      state, critic, {"loss": 0.0}))
  policy = types.SimpleNamespace(with_params=lambda p: policy)
  run = stages.Run(
      config=config, task=StubTask(), workdir=None, model_cfg=None, mesh=None,
      steps=None, learner=learner, ckpt=None, rlog=_Log(), policy=policy, eval_policy=policy,
      eval_examples=["e1"], iterators={"rl": None}, evaluate_fn=evaluate_fn,
      base_key=jax.random.PRNGKey(0), pad=0, state=types.SimpleNamespace(params=None),
      stage="rl", compiles=types.SimpleNamespace(take=lambda: {}),
      val_examples=["v1", "v2"], early=early_stop.EarlyStopping(patience=patience))
  saved = []
  run.save_best = lambda value: saved.append((run.step, value))
  return run, asked, saved


@pytest.fixture
def stub_collect(monkeypatch):
  ep = Episode(example=None, prompt_ids=[1], completion_ids=[2], loss_mask=[1], text="")
  batch = batch_lib.from_groups([Group([ep], [{"total": 0.0}])])
  monkeypatch.setattr(collection, "collect", lambda *a, **k: (batch, {}))


def test_rl_stage_validates_keeps_the_best_and_stops_early(stub_collect):
  # validations at RL steps 2, 4, 6, 8: 0.2, 0.5 (best), 0.4, 0.5 (not better): patience 2
  # stops after step 8 of 20; the best is step 4, saved once per new best (steps 2 and 4).
  run, asked, saved = _run([0.2, 0.5, 0.4, 0.5], val_every=2, patience=2, rl_steps=20)
  stages.RLStage().loop(run, end=20)
  assert run.step == 8
  assert (run.early.best_step, run.early.best) == (4, 0.5)
  assert saved == [(2, 0.2), (4, 0.5)]
  assert asked == [("validation", ["v1", "v2"])] * 4          # the validation set, not eval
  assert [(s, m["recall"]) for s, stage, m in run.rlog.rows if stage == "validation"] == [
      (2, 0.2), (4, 0.5), (6, 0.4), (8, 0.5)]
  logged = [m for s, stage, m in run.rlog.rows if stage == "rl"]
  assert len(logged) == 8 and logged[3]["validation/recall"] == 0.5     # RL step 4
  assert "validation/recall" not in logged[2]


def test_rl_stage_without_patience_runs_to_the_end_and_keeps_the_best(stub_collect):
  run, _, saved = _run([0.3, 0.1, 0.2], val_every=3, patience=0, rl_steps=9)
  stages.RLStage().loop(run, end=9)
  assert run.step == 9 and run.early.best_step == 3 and saved == [(3, 0.3)]


def test_a_missing_validation_metric_names_the_config_key(stub_collect):
  run, _, _ = _run([0.3], val_every=1, patience=0, rl_steps=2, val_metric="full_recal")
  with pytest.raises(ValueError, match=r"'eval.val_metric' is 'full_recal'.*\['n', 'recall'\]"):
    stages.RLStage().loop(run, end=2)
