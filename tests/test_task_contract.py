"""The Task contract (rlrag_jax/tasks.py): a task that implements only the required members runs
through the engine's hooks on `Task`'s defaults, and a task missing a required method cannot be
made."""
import itertools
import sys
import types

import jax
import pytest

from configs import arena
from rlrag_jax import judge, run_dirs, tasks
from rlrag_jax.evaluation import evaluate
from rlrag_jax.tasks import Episode, Task
from rlrag_jax.training import collection, stages


class Minimal(Task):
  """The required members only. Examples are strings; group member k's completion is the
  example k + 1 times."""
  name = "minimal"
  tokenizer = None
  train = ["a", "b"]
  eval = ["c"]

  def __init__(self):
    self.rollouts = []

  def prompt_ids(self, ex):
    return [ord(ex)]

  def sft_target_ids(self, ex):
    return [ord(ex) + 1, 0]

  def rollout(self, policy, examples, rng, *, group_size=1, greedy=False):
    self.rollouts.append((list(examples), group_size, greedy))
    return [Episode(example=ex, prompt_ids=[ord(ex[0])], completion_ids=[ord(ex[0])] * (k + 1),
                    loss_mask=[1] * (k + 1), text=ex * (k + 1))
            for ex in examples for k in range(group_size)]

  def reward(self, episode, step=0):
    return {"total": float(len(episode.text) + step)}

  def eval_metrics(self, episode):
    return {"em": float(episode.text == "c"), "length": float(len(episode.text))}


def _episode(text):
  return Episode(example=text[0], prompt_ids=[1], completion_ids=[2] * len(text),
                 loss_mask=[1] * len(text), text=text)


def test_the_defaults_are_the_single_stream_behaviour():
  task = Minimal()
  eps = [_episode("x"), _episode("xyz")]
  assert task.rewards(eps, 2) == [{"total": 3.0}, {"total": 5.0}]        # reward + step each
  assert task.eval_metrics_batch(eps) == [{"em": 0.0, "length": 1.0},
                                          {"em": 0.0, "length": 3.0}]
  got = task.eval_rollout(None, ["c"], None)
  assert task.rollouts == [(["c"], 1, True)] and [e.text for e in got] == ["c"]
  assert task.sft_loss_mask("a") is None
  assert task.state_dict() == {} and task.load_state_dict({}) is None
  assert task.monitors() == [] and task.report("/nowhere", None, None) is None
  assert task.eval_report({"all": {}, "rows": []}) == ""
  assert list(task.validation) == [] and task.judge_prompt is judge.DEFAULT_PROMPT
  assert task.sft_samples is None
  groups = task.collect(None, ["a", "b"], None, group_size=2, want=2, step=1)
  assert [[e.text for e in g.episodes] for g in groups] == [["a", "aa"], ["b", "bb"]]
  assert [[s["total"] for s in g.scores] for g in groups] == [[2.0, 3.0], [2.0, 3.0]]
  task.bind_models({})                                  # nothing to bind: accepted
  with pytest.raises(ValueError, match=r"names \['reader'\], but the minimal task takes no"):
    task.bind_models({"reader": object()})


def test_the_engine_runs_a_minimal_task_on_the_defaults():
  task = Minimal()
  c = arena.get_config("")
  c.rl.group_size, c.rl.prompts_per_step = 2, 2
  # RL collection: the engine's own rollout path, rewards by the per-episode default.
  batch, fill = collection.collect(task, None, itertools.repeat(["a", "b"]),
                                   jax.random.PRNGKey(0), c, 3)
  eps, scores = batch.episodes, batch.scores
  assert [e.text for e in eps] == ["a", "aa", "b", "bb"]
  assert [s["total"] for s in scores] == [4.0, 5.0, 4.0, 5.0]
  assert task.rollouts == [(["a", "b"], 2, False)] and fill["tries"] == 1.0
  # SFT: one sample per example, no loss mask; no samples list for the stage to batch.
  assert stages.sft_rows(task, ["a", "b"]) == ([[97], [98]], [[98, 0], [99, 0]], None)
  c.sft.steps = 1
  assert stages.sft_samples(task, c) is None
  # Evaluation: greedy rollouts, per-episode metrics, no endpoint monitors.
  out = evaluate(task, None, ["c", "cc"], batch_size=1, progress=False)
  assert [r["completion"] for r in out["rows"]] == ["c", "cc"]
  assert out["all"] == {"em": 0.5, "length": 1.5, "n": 2}
  # Auxiliary models: none configured is fine, any configured is refused.
  run_dirs.bind(task, {})
  with pytest.raises(ValueError, match="takes no auxiliary models"):
    run_dirs.bind(task, {"reader": object()})


def test_a_task_missing_a_required_method_cannot_be_made():
  class NoReward(Task):
    name, tokenizer, train, eval = "no_reward", None, [], []

    def prompt_ids(self, ex):
      return []

    def sft_target_ids(self, ex):
      return []

    def rollout(self, policy, examples, rng, *, group_size=1, greedy=False):
      return []

    def eval_metrics(self, episode):
      return {}

  with pytest.raises(TypeError, match="abstract method.*reward"):
    NoReward()
  assert sorted(Task.__abstractmethods__) == ["eval_metrics", "prompt_ids", "reward", "rollout",
                                              "sft_target_ids"]


def test_get_task_refuses_a_task_outside_the_contract(monkeypatch):
  module = types.ModuleType("rlrag_jax.methods.not_a_task.task")
  module.make_task = lambda config: types.SimpleNamespace(name="not_a_task")
  monkeypatch.setitem(sys.modules, "rlrag_jax.methods.not_a_task.task", module)
  with pytest.raises(TypeError, match="not a subclass of rlrag_jax.tasks.Task"):
    tasks.get_task("not_a_task", None)
  module.make_task = lambda config: Minimal()
  assert isinstance(tasks.get_task("not_a_task", None), Minimal)


def test_the_trainer_refuses_a_stage_the_task_does_not_train():
  from rlrag_jax import trainer
  c = arena.get_config("")
  c.sft.steps, c.rl.steps = 3, 2
  trainer._check_stages(Minimal(), c)                       # both stages by default

  class SFTOnly(Minimal):
    stages = ("sft",)

  with pytest.raises(ValueError, match=r"'rl.steps' / 'rl.epochs' are 2 / 0.0, but SFTOnly "
                                       r"\(arena\) trains by sft only; set both to 0"):
    trainer._check_stages(SFTOnly(), c)
  c.rl.steps = 0
  trainer._check_stages(SFTOnly(), c)
  empty = SFTOnly()
  empty.train = []
  with pytest.raises(ValueError, match="'sft.steps' / 'sft.epochs' are 3 / .* has no training "
                                       "examples"):
    trainer._check_stages(empty, c)
  c.sft.steps = 0
  trainer._check_stages(empty, c)                           # evaluation only: nothing trains


def test_the_trainer_refuses_rl_settings_the_tasks_groups_do_not_fit():
  """Task.group_size and Task.sibling_baselines: a task declares what its groups are, and the
  trainer refuses an RL config they do not fit (only when RL trains)."""
  from rlrag_jax import trainer
  c = arena.get_config("")
  c.rl.steps, c.rl.group_size = 2, 4
  task = Minimal()
  assert (task.group_size, task.sibling_baselines) == (None, False)
  trainer._check_stages(task, c)                            # any group size by default
  task.group_size = 1
  with pytest.raises(ValueError, match=r"'rl.group_size' is 4, but Minimal \(arena\) collects "
                                       r"groups of 1 \(set rl.group_size=1\)"):
    trainer._check_stages(task, c)
  c.rl.group_size = 1
  trainer._check_stages(task, c)
  c.rl.algo, c.rl.ppo.critic = "ppo", "tree_mc"
  with pytest.raises(ValueError, match=r"'tree_mc', whose values come from sibling branches, "
                                       r"but Minimal \(arena\) collects none"):
    trainer._check_stages(task, c)
  task.sibling_baselines = True
  trainer._check_stages(task, c)
  task.sibling_baselines, c.rl.steps = False, 0
  trainer._check_stages(task, c)                            # no RL: nothing to fit
