"""The Task contract (rlrag_jax/tasks.py): `Task` has two abstract members (its SFT samples, its
evaluation) and `RLTask` one more (its collection); groups are validated when built; the
single-stream kit's defaults run through the engine's hooks; a task missing a required method
cannot be made; the trainer refuses RL for a task that is not an RLTask."""
import dataclasses
import itertools
import sys
import types

import jax
import numpy as np
import pytest

from configs import arena
from rlrag_jax import judge, run_dirs, tasks
from rlrag_jax.evaluation import evaluate
from rlrag_jax.tasks import Episode, EvalRow, Group, RLTask, SingleStreamTask, Task
from rlrag_jax.training import batch as batch_lib
from rlrag_jax.training import collection, stages


class Minimal(SingleStreamTask):
  """The kit's required members only. Examples are strings; group member k's completion is the
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

  def rewards(self, episodes, step=0):
    return [{"total": float(len(e.text) + step)} for e in episodes]

  def eval_metrics(self, episodes):
    return [{"em": float(e.text == "c"), "length": float(len(e.text)), "prediction": e.text[:1]}
            for e in episodes]


def _episode(text):
  return Episode(example=text[0], prompt_ids=[1], completion_ids=[2] * len(text),
                 loss_mask=[1] * len(text), text=text)


def test_the_contract_has_two_abstract_members_and_rl_one_more():
  assert sorted(Task.__abstractmethods__) == ["evaluate", "sft_samples"]
  assert sorted(RLTask.__abstractmethods__) == ["collect", "evaluate", "sft_samples"]
  assert issubclass(SingleStreamTask, RLTask) and issubclass(RLTask, Task)
  fields = {f.name for f in dataclasses.fields(Episode)}
  assert "group" not in fields and "padding" not in fields
  assert [f.name for f in dataclasses.fields(Group)] == ["episodes", "rewards", "metrics",
                                                          "padding"]
  assert [f.name for f in dataclasses.fields(EvalRow)][:3] == ["example", "prediction",
                                                               "metrics"]


def test_a_task_missing_a_required_method_cannot_be_made():
  class NoEvaluation(Task):
    name, tokenizer, train, eval = "no_evaluation", None, [], []

    def sft_samples(self, ex):
      return []

  with pytest.raises(TypeError, match="abstract method.*evaluate"):
    NoEvaluation()

  class SFTOnly(NoEvaluation):
    def evaluate(self, policy, examples, rng):
      return []

  SFTOnly()                                             # a plain Task: two members suffice

  class NoCollect(SFTOnly, RLTask):
    pass

  with pytest.raises(TypeError, match="abstract method.*collect"):
    NoCollect()


def test_groups_are_validated_when_built():
  ep = _episode("x")
  g = Group([ep, ep], [{"total": 1.0, "f": 0.5}, {"total": 0.0, "f": 1.0}], {"leaves": 2.0})
  assert isinstance(g.episodes, tuple) and isinstance(g.rewards, tuple) and not g.padding
  with pytest.raises(dataclasses.FrozenInstanceError):
    g.padding = True
  with pytest.raises(TypeError):
    g.metrics["leaves"] = 3.0                           # read-only
  with pytest.raises(ValueError, match="0 episodes and 0 reward dicts"):
    Group([], [])
  with pytest.raises(ValueError, match="1 episodes and 2 reward dicts"):
    Group([ep], [{"total": 1.0}, {"total": 1.0}])
  with pytest.raises(ValueError, match="reward dict 1 has no 'total'"):
    Group([ep, ep], [{"total": 1.0}, {"f": 1.0}])
  with pytest.raises(ValueError, match=r"reward dict 1 has keys \['f', 'total'\], reward dict 0 "
                                       r"\['total'\]"):
    Group([ep, ep], [{"total": 1.0}, {"total": 1.0, "f": 1.0}])
  with pytest.raises(ValueError, match="reward dict 0: 'total' is 'yes'; expected a number"):
    Group([ep], [{"total": "yes"}])
  with pytest.raises(ValueError, match="Group.metrics: 'leaves' is None"):
    Group([ep], [{"total": 1.0}], {"leaves": None})
  with pytest.raises(ValueError, match=r"\['f'\] are both reward keys and metrics"):
    Group([ep], [{"total": 1.0, "f": 1.0}], {"f": 2.0})
  with pytest.raises(ValueError, match="it is the row's `prediction` field"):
    EvalRow("q", "a", {"prediction": "a"})


def test_the_kit_supplies_the_single_stream_defaults():
  task = Minimal()
  assert task.sft_samples("a") == [([97], [98, 0], None)]
  assert task.sft_loss_mask("a") is None
  got = task.evaluate(None, ["c"], None)
  assert task.rollouts == [(["c"], 1, True)]
  assert got == [EvalRow("c", "c", {"em": 1.0, "length": 1.0}, completion="c")]
  assert task.state_dict() == {} and task.load_state_dict({}) is None
  assert task.monitors() == [] and task.report("/nowhere", None, None) is None
  assert task.eval_report({"all": {}, "rows": []}) == ""
  assert list(task.validation) == [] and task.judge_prompt is judge.DEFAULT_PROMPT
  assert (task.group_size, task.sibling_baselines) == (None, False)
  groups = task.collect(None, ["a", "b"], None, group_size=2, want=2, step=1)
  assert [[e.text for e in g.episodes] for g in groups] == [["a", "aa"], ["b", "bb"]]
  assert [[s["total"] for s in g.rewards] for g in groups] == [[2.0, 3.0], [2.0, 3.0]]
  assert all(dict(g.metrics) == {} and not g.padding for g in groups)
  task.bind_models({})                                  # nothing to bind: accepted
  with pytest.raises(ValueError, match=r"names \['reader'\], but the minimal task takes no"):
    task.bind_models({"reader": object()})


def test_the_engine_runs_a_minimal_task_on_the_defaults():
  task = Minimal()
  c = arena.get_config("")
  c.rl.group_size, c.rl.prompts_per_step = 2, 2
  # RL collection: the kit's rollout path, rewarded by the batch hook.
  batch, fill = collection.collect(task, None, itertools.repeat(["a", "b"]),
                                   jax.random.PRNGKey(0), c, 3)
  eps, rewards = batch.episodes, batch.rewards
  assert [e.text for e in eps] == ["a", "aa", "b", "bb"]
  assert [s["total"] for s in rewards] == [4.0, 5.0, 4.0, 5.0]
  assert task.rollouts == [(["a", "b"], 2, False)] and fill["tries"] == 1.0
  # SFT: the task's samples, flattened over the training examples; a None mask is all ones.
  c.sft.steps = 1
  items = stages.sft_samples(task, c)
  assert items == [([97], [98, 0], None), ([98], [99, 0], None)]
  assert stages.sft_rows(items) == ([[97], [98]], [[98, 0], [99, 0]], [[1, 1], [1, 1]])
  c.sft.steps = 0
  assert stages.sft_samples(task, c) is None
  # Evaluation: the task's rows, their metrics averaged, the prediction and completion kept.
  out = evaluate(task, None, ["c", "cc"], batch_size=1, progress=False)
  assert [r["completion"] for r in out["rows"]] == ["c", "cc"]
  assert [r["prediction"] for r in out["rows"]] == ["c", "c"]
  assert out["all"] == {"em": 0.5, "length": 1.5, "n": 2}
  # Auxiliary models: none configured is fine, any configured is refused.
  run_dirs.bind(task, {})
  with pytest.raises(ValueError, match="takes no auxiliary models"):
    run_dirs.bind(task, {"reader": object()})


def test_group_metrics_reach_the_step_log_as_rewards_do():
  """A group's metrics ride beside its episodes (`Batch.metrics`) and are logged as
  'reward/<key>', each key's mean over the step's episodes, padding included, as a reward
  key is."""
  ep = _episode("x")
  groups = [Group([ep, ep], [{"total": 1.0}, {"total": 0.0}], {"leaf": 0.1}),
            Group([ep], [{"total": 2.0}], {"leaf": 0.4})]
  b = batch_lib.pad(batch_lib.from_groups(groups), 4, group_size=2)
  assert [dict(m) for m in b.metrics] == [{"leaf": 0.1}] * 2 + [{"leaf": 0.4}, {"leaf": 0.1}]
  got = stages.step_rewards(b)
  assert got == {"reward/total": float(np.mean([1.0, 0.0, 2.0, 1.0])),
                 "reward/leaf": float(np.mean([0.1, 0.1, 0.4, 0.1]))}
  assert list(got) == ["reward/total", "reward/leaf"]


def test_get_task_refuses_a_task_outside_the_contract(monkeypatch):
  module = types.ModuleType("rlrag_jax.methods.not_a_task.task")
  module.make_task = lambda config: types.SimpleNamespace(name="not_a_task")
  monkeypatch.setitem(sys.modules, "rlrag_jax.methods.not_a_task.task", module)
  with pytest.raises(TypeError, match="not a subclass of rlrag_jax.tasks.Task"):
    tasks.get_task("not_a_task", None)
  module.make_task = lambda config: Minimal()
  assert isinstance(tasks.get_task("not_a_task", None), Minimal)


class SFTOnly(Task):
  """A plain Task: SFT samples and an evaluation, no collection."""
  name, tokenizer, train, eval = "sft_only", None, ["a"], ["b"]

  def sft_samples(self, ex):
    return [([1], [2], None)]

  def evaluate(self, policy, examples, rng):
    return [EvalRow(ex, "", {}) for ex in examples]


def test_the_trainer_refuses_rl_for_a_task_that_is_not_an_rltask():
  from rlrag_jax import trainer
  c = arena.get_config("")
  c.sft.steps, c.rl.steps = 3, 2
  trainer._check_stages(Minimal(), c)                       # an RLTask trains both
  with pytest.raises(ValueError, match=r"config keys 'rl.steps' / 'rl.epochs' are 2 / 0.0, but "
                                       r"SFTOnly \(arena\) is trained by SFT only \(a tasks.Task, "
                                       r"not a tasks.RLTask\); set both to 0"):
    trainer._check_stages(SFTOnly(), c)
  c.rl.steps = 0
  trainer._check_stages(SFTOnly(), c)
  c.rl.epochs = 1.0
  with pytest.raises(ValueError, match=r"'rl.steps' / 'rl.epochs' are 0 / 1.0, but SFTOnly"):
    trainer._check_stages(SFTOnly(), c)
  c.rl.epochs = 0.0
  empty = SFTOnly()
  empty.train = []
  with pytest.raises(ValueError, match="'sft.steps' / 'sft.epochs' are 3 / .* has no training "
                                       "examples"):
    trainer._check_stages(empty, c)
  c.sft.steps = 0
  trainer._check_stages(empty, c)                           # evaluation only: nothing trains


def test_the_trainer_refuses_rl_settings_the_tasks_groups_do_not_fit():
  """RLTask.group_size and RLTask.sibling_baselines: a task declares what its groups are, and
  the trainer refuses an RL config they do not fit (only when RL trains)."""
  from rlrag_jax import trainer
  c = arena.get_config("")
  c.rl.steps, c.rl.group_size = 2, 4
  task = Minimal()
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


def test_no_engine_module_pads_or_names_groups_but_the_batch():
  """Acceptance of issue 52: padding is made in training/batch.py only."""
  import pathlib
  import rlrag_jax
  root = pathlib.Path(rlrag_jax.__file__).parent
  hits = [str(p.relative_to(root)) for p in root.rglob("*.py")
          if ("_group_keys" in p.read_text() or "padding=True" in p.read_text())]
  assert hits == ["training/batch.py"]
