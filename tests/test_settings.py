"""The engine's settings (`rlrag_jax.settings`): every config and preset parses, each value as
the config holds it (the same number, the same type: what the readers used to cast it to); the
allowed values agree with the engine's own tables; the derived counts agree with the functions
the learners still call on the raw section (`rl.batching`, `training.learners`)."""
import dataclasses

import pytest

from config_specs import load, specs
from rlrag_jax import config_base, settings
from rlrag_jax.rl import advantages, batching, logprobs, losses, optim_state
from rlrag_jax.rl.kl import KL_ESTIMATORS
from rlrag_jax.training import learners, stages, steps


def test_allowed_values_are_the_engines_tables():
  assert settings.OUTCOME_ALGOS == tuple(advantages.ADVANTAGE_ESTIMATORS)
  assert settings.ALGOS == batching.ALGOS == learners.ALGOS
  assert settings.CRITICS == learners.CRITICS
  assert settings.KL_FORMS == learners.KL_FORMS
  assert settings.KL_ESTIMATORS == tuple(KL_ESTIMATORS)
  assert settings.AGGREGATIONS == tuple(losses.AGGREGATIONS)
  assert settings.SCHEDULES == optim_state.SCHEDULES
  assert settings.HEAD_BACKWARDS == logprobs.HEAD_BACKWARDS
  assert settings.MODEL_INITS == steps.MODEL_INITS
  assert settings.STAGES == tuple(stages.STAGES)


def _leaves(section, prefix):
  for k, v in section.items():
    if hasattr(v, "items"):
      yield from _leaves(v, f"{prefix}{k}.")
    else:
      yield f"{prefix}{k}", v


def _get(obj, dotted):
  for part in dotted.split("."):
    obj = getattr(obj, part)
  return obj


@pytest.mark.parametrize("spec", specs())
def test_every_preset_parses_to_its_own_values_and_types(spec):
  c = load(spec)
  s = settings.Settings.from_config(c)
  for name in ("sft", "rl", "eval", "checkpoint"):
    for key, raw in _leaves(c[name], ""):
      got = _get(getattr(s, name), key)
      assert got == raw and type(got) is type(raw), (spec, f"{name}.{key}", raw, got)
  assert (s.seed, s.stages, s.log_every, s.export_hf) == (
      c.seed, tuple(c.stages), c.log_every, c.export_hf)


@pytest.mark.parametrize("spec", specs())
def test_derived_counts_agree_with_the_raw_readers(spec):
  c = load(spec)
  rl, sft = settings.Settings.from_config(c).rl, settings.Settings.from_config(c).sft
  assert rl.runs == config_base.stage_runs(c.rl) and sft.runs == config_base.stage_runs(c.sft)
  assert rl.token_budget == batching.token_budget(c.rl)
  assert sft.equal_micro_batches == batching.equal_micro_batches(c.sft)
  assert rl.equal_micro_batches == batching.equal_micro_batches(c.rl)
  assert rl.mini_batch_size == batching.mini_batch_size(c.rl)
  assert rl.schedule_by_rl_step == learners.schedule_by_rl_step(c.rl)
  assert rl.checked_kl_form == learners.kl_form(c.rl)
  for n in (0, 1, 7, 300):
    assert rl.schedule_length(n) == learners.schedule_length(c.rl, n)


def test_ppo_counts_agree_with_the_raw_readers():
  c = config_base.trainer_config("x", "w")
  c.rl.algo, c.rl.mu, c.rl.ppo.mini_batches = "ppo", 3, 4
  for size in (0, 16):
    c.rl.ppo.mini_batch_size = size
    rl = settings.Settings.from_config(c).rl
    assert rl.schedule_length(50) == learners.schedule_length(c.rl, 50) == (
        50 if size else 600)


def test_a_section_is_parsed_strictly_and_cast_once():
  c = config_base.trainer_config("x", "w")
  c.rl.lr = 1                                  # an int where the key is a float
  assert type(settings.Settings.from_config(c).rl.lr) is float
  c.eval.judge_urll = "http://x"
  with pytest.raises(settings.ConfigError, match="'eval.judge_urll' unknown"):
    settings.Settings.from_config(c)
  c = config_base.trainer_config("x", "w")
  del c.rl.ppo["vf_clip"]
  with pytest.raises(settings.ConfigError, match="'rl.ppo.vf_clip' is missing"):
    settings.Settings.from_config(c)


def test_settings_are_frozen_and_steps_resolve_by_copy():
  s = settings.Settings.from_config(config_base.trainer_config("x", "w"))
  with pytest.raises(dataclasses.FrozenInstanceError):
    s.rl.steps = 3
  t = s.with_steps({"sft": 8, "rl": 3})
  assert (t.sft.steps, t.rl.steps, s.sft.steps, s.rl.steps) == (8, 3, 0, 0)
  assert settings.of(t) is t


def test_kl_form_reward_needs_ppo():
  c = config_base.trainer_config("x", "w")
  c.rl.kl_form = "reward"
  with pytest.raises(ValueError, match="'rl.kl_form' is 'reward'.*rl.algo is 'grpo'"):
    settings.Settings.from_config(c).rl.checked_kl_form
