"""rlrag_jax.config_check: every config and preset validates clean; bad values fail when the
config is read, before anything is built, naming the dotted key, the value and what is allowed;
the table's sets agree with the code that consumes each key."""
import fnmatch

import pytest
from absl import flags
from ml_collections import config_flags

import config_specs
from rlrag_jax import config_check, trainer


@pytest.fixture(scope="module")
def loaded():
  return {spec: config_specs.load(spec) for spec in config_specs.specs()}


# The presets that evaluate open-domain questions (or, Search-R1, retrieve for every dataset):
# they name no corpus of their own, so they refuse to start until one of retrieval.corpus /
# index / url is set (config_check.NeedsCorpus; tests/methods/test_search_r1.py checks each).
NEEDS_CORPUS = ("configs/apex_executor.py:paper", "configs/search_r1.py:paper",
                "configs/search_r1.py:paper_grpo", "configs/sparkle.py:paper")


@pytest.mark.parametrize("spec", config_specs.specs())
def test_every_config_and_preset_validates_clean(spec, loaded):
  """Clean as they are, or, for a preset that needs a corpus, once one is named (the sample of
  wiki-18), the corpus line being its only problem before."""
  c = loaded[spec]
  if spec in NEEDS_CORPUS:
    found = config_check.problems(c)
    assert len(found) == 1 and "need" in found[0] and "retrieval.corpus" in found[0]
    c = config_specs.load(spec)
    c.retrieval.corpus = "wiki18"
  assert config_check.problems(c) == []


def test_every_table_pattern_names_a_key_of_some_config(loaded):
  """A pattern that matches nothing is a typo: its key would go unchecked."""
  keys = {k for c in loaded.values() for k in config_check.flat(c)}
  table = dict(config_check.shared_rules())
  for method in config_check.methods():
    table.update(config_check.method_rules(method))
  assert config_check.unmatched(sorted(table), sorted(keys)) == []


def test_every_enum_like_string_and_every_number_has_a_rule(loaded):
  """Each string key that holds one of a few names, and each number, has a rule. Free: paths,
  URLs, model names, keys whose values the task decides, seeds, models.<name>.step (-1: the
  latest checkpoint) and reward.stage2_step (<= 0: never)."""
  free = ("workdir", "compile_cache", "data.dir", "model.path", "model.train_config",
          "models.*", "distributed.coordinator_address", "*.judge_url", "*.judge_model",
          "retrieval.corpus", "retrieval.encoder_path", "retrieval.cache_dir", "retrieval.index",
          "retrieval.query_prefix", "retrieval.passage_prefix", "arena.sft.teacher_traces",
          "apex.encoder_path", "apex.gold_plans", "apex.trajectories", "sparkle.reader.url",
          "sparkle.reader.model", "sparkle.triples_file", "sparkle.sft_trajectories",
          "rl.dynamic_sampling_key", "rl.ppo.whiten_by", "seed", "data.world.seed",
          "reward.stage2_step")
  missing = set()
  for c in loaded.values():
    table = config_check.rules_for(c.method)
    for key, value in config_check.flat(c).items():
      checked = isinstance(value, (str, int, float)) and not isinstance(value, bool)
      if (checked and not any(fnmatch.fnmatchcase(key, p) for p in free)
          and not any(fnmatch.fnmatchcase(key, p) for p in table)):
        missing.add(key)
  assert not missing


def _parse(argv):
  """What `python -m rlrag_jax.train` reads from these arguments."""
  fv = flags.FlagValues()
  holder = config_flags.DEFINE_config_file("config", None, flag_values=fv, sys_argv=argv)
  fv(argv)
  return holder.value


BAD = [
    # (config, override, the message line)
    ("arena.py", "rl.kl_estimator=k5", "rl.kl_estimator='k5': must be one of k1, k2, k3"),
    ("arena.py", "rl.aggregation=mean",
     "rl.aggregation='mean': must be one of sequence_mean, token_mean, constant"),
    ("arena.py", "rl.algo=ppo2", "rl.algo='ppo2': must be one of grpo, dr_grpo, rloo, ppo"),
    ("arena.py", "rl.lr_schedule=cosin",
     "rl.lr_schedule='cosin': must be one of cosine, linear, constant"),
    ("arena.py", "model.dtype=fp8", "model.dtype='fp8': must be one of float32, bfloat16, float16"),
    ("arena.py", "reward.accuracy=bleu", "reward.accuracy='bleu': must be one of em, f1, judge"),
    ("arena.py", "data.source=web", "data.source='web': must be one of world, files"),
    ("arena.py", "method=nonsense",
     "method='nonsense': must be one of apex, arena, r2ag, search, search_r1, sparkle"),
    ("search.py", "retrieval.backend=faiss", "retrieval.backend='faiss': must be one of exact, scann"),
    ("sparkle.py", "sparkle.agent.ki_mode=some",
     "sparkle.agent.ki_mode='some': must be one of triple, document, all"),
    ("sparkle.py", "sparkle.agent.ki_fallback=first",
     "sparkle.agent.ki_fallback='first': must be one of top, none"),
    ("sparkle.py", "rl.ppo.critic=big", "rl.ppo.critic='big': must be one of separate, head, tree_mc"),
    ("r2ag.py", "r2ag.forest.carry=all", "r2ag.forest.carry='all': must be one of gold, branch"),
    ("arena.py", "rl.lr=-0.001", "rl.lr=-0.001: must be > 0"),
    ("sparkle.py", "rl.ppo.vf_lr=0", "rl.ppo.vf_lr=0.0: must be > 0"),
    ("arena.py", "rl.clip_eps_low=-0.2", "rl.clip_eps_low=-0.2: must be >= 0"),
    ("arena.py", "rl.top_p=1.5", "rl.top_p=1.5: must be in (0, 1]"),
    ("arena.py", "rl.warmup_ratio=1.0", "rl.warmup_ratio=1.0: must be in [0, 1)"),
    ("sparkle.py", "sparkle.reader_sft.retrieve_prob=1.2",
     "sparkle.reader_sft.retrieve_prob=1.2: must be in [0, 1]"),
    ("arena.py", "rl.group_size=0", "rl.group_size=0: must be >= 1"),
    ("arena.py", "mesh.fsdp=0", "mesh.fsdp=0: must be -1 or >= 1"),
    ("arena.py", "rl.dual_clip=0.5", "rl.dual_clip=0.5: must be 0 or > 1"),
    ("arena.py", "data.world.num_people=5", "data.world.num_people=5: must be >= 10"),
    ("r2ag.py", "r2ag.eval.other_top_k=(2,0)", "r2ag.eval.other_top_k[1]=0: must be >= 1"),
    ("arena.py", "data.mix=('hotpotqa:train:ten',)",
     "data.mix[0]='hotpotqa:train:ten': must look like 'name:split' or 'name:split:count'"),
]


@pytest.mark.parametrize("config,override,message", BAD, ids=[b[1] for b in BAD])
def test_a_bad_value_fails_when_the_config_is_read(config, override, message, tmp_path):
  c = _parse(["train", f"--config={config_specs.ROOT / 'configs' / config}",
              f"--config.{override}", f"--config.workdir={tmp_path / 'run'}"])
  with pytest.raises(config_check.ConfigError) as e:
    trainer.run(c, progress=False)
  assert str(e.value).startswith(message)
  assert not (tmp_path / "run").exists()          # nothing built: not even the workdir


def test_several_bad_values_are_listed_together():
  c = config_specs.load("configs/arena.py")
  c.rl.kl_estimator, c.rl.lr = "k5", -1e-3
  with pytest.raises(config_check.ConfigError) as e:
    config_check.check(c)
  assert str(e.value) == ("2 config values are not allowed:\n"
                          "  rl.kl_estimator='k5': must be one of k1, k2, k3\n"
                          "  rl.lr=-0.001: must be > 0")


def test_a_bad_value_fails_before_an_evaluation_loads_its_checkpoint(tmp_path):
  c = config_specs.load("configs/arena.py")
  c.rl.kl_estimator = "k5"
  with pytest.raises(config_check.ConfigError, match="rl.kl_estimator='k5'"):
    trainer.task_for_checkpoint(c, tmp_path / "no_such_run")


@pytest.mark.parametrize("rule,good,bad", [
    (config_check.Range(lo=0, lo_open=True), [1e-9, 3.0], [0, -1, float("nan"), float("inf"),
                                                           "1", None, True]),
    (config_check.Range(lo=0, hi=1), [0, 0.5, 1], [-0.1, 1.01]),
    (config_check.Range(lo=1, also=(-1,)), [-1, 1, 8], [0, -2]),
    (config_check.OneOf(("a", "")), ["a", ""], ["b", None, 1]),
    (config_check.Url(), ["", "http://127.0.0.1:8000", "https://h/x"],
     ["127.0.0.1:8000", "ftp://h", "http://a b", None, 1]),
])
def test_rules_accept_and_reject(rule, good, bad):
  assert [rule(v) for v in good] == [None] * len(good)
  assert all(rule(v) for v in bad)


def test_enum_rules_agree_with_their_consumers():
  """Each allowed value passes the consuming code and a value the table rejects fails it."""
  from rlrag_jax.methods.sparkle import agent, prompts as sparkle_prompts
  from rlrag_jax.rl import optim_state, step_factories
  from rlrag_jax.training import learners
  import ml_collections
  table = config_check.rules_for("sparkle")

  def consumer_accepts(make, v):
    try:
      make(v)
    except ValueError:
      return False
    return True

  consumers = {
      "rl.kl_estimator": lambda v: step_factories.LossConfig(kl_estimator=v),
      "rl.aggregation": lambda v: step_factories.LossConfig(aggregation=v, max_completion_len=8),
      "rl.lr_schedule": lambda v: optim_state.make_schedule(optim_state.OptimizerConfig(schedule=v)),
      "rl.algo": lambda v: learners.check_algo(ml_collections.ConfigDict(dict(algo=v))),
      "sparkle.agent.rd_mode": lambda v: agent.AgentConfig(rd_mode=v),
      "sparkle.agent.qf_mode": lambda v: agent.AgentConfig(qf_mode=v),
      "sparkle.agent.ki_mode": lambda v: agent.AgentConfig(ki_mode=v),
      "sparkle.agent.ki_output": lambda v: agent.AgentConfig(ki_output=v),
  }
  for key, make in consumers.items():
    for v in table[key].values:
      assert consumer_accepts(make, v), (key, v)
    assert not consumer_accepts(make, "nonsense"), key
  assert table["data.prompt_style"].values == sparkle_prompts.STYLES


@pytest.mark.parametrize("key,bad,good", [("num_people", 9, 10), ("num_cities", 1, 2),
                                          ("num_orgs", 5, 6), ("*_frac", 1.1, 1.0),
                                          ("distractors_per_question", -1, 0)])
def test_world_rules_agree_with_world_config(key, bad, good):
  """data.world's rules mirror WorldConfig's per-field checks at their boundaries."""
  from rlrag_jax.data import world
  rule = config_check.shared_rules()[f"data.world.{key}"]
  field = "hard_distractor_frac" if key == "*_frac" else key
  rest = dict(num_countries=1) if field == "num_cities" else {}    # cities >= countries too
  with pytest.raises(ValueError, match=field):
    world.WorldConfig(**rest, **{field: bad})
  world.WorldConfig(**rest, **{field: good})
  assert rule(bad) and rule(good) is None
