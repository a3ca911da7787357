"""config_base.section: a config section parsed into a frozen dataclass, every key declared."""
from __future__ import annotations

import dataclasses

import ml_collections
import pytest

from rlrag_jax import config_base
from rlrag_jax.config_check import ConfigError


@dataclasses.dataclass(frozen=True)
class Inner:
  top_k: int
  other: tuple


@dataclasses.dataclass(frozen=True)
class Outer:
  role: str
  lr: float
  flag: bool
  eval: Inner


def _cfg(**over):
  c = ml_collections.ConfigDict(dict(
      role="proxy", lr=1e-4, flag=False,
      eval=ml_collections.ConfigDict(dict(top_k=3, other=(2, 5)))))
  c.update(over)
  return c


def test_values_are_passed_through_exactly_and_nested_sections_become_dataclasses():
  s = config_base.section(Outer, _cfg(), "m")
  assert s == Outer(role="proxy", lr=1e-4, flag=False, eval=Inner(top_k=3, other=(2, 5)))
  assert type(s.eval.other) is tuple and type(s.eval.top_k) is int and s.flag is False
  with pytest.raises(dataclasses.FrozenInstanceError):
    s.role = "x"
  # a plain dict section reads the same
  d = dict(role="proxy", lr=1e-4, flag=False, eval=dict(top_k=3, other=(2, 5)))
  assert config_base.section(Outer, d, "m") == s


def test_a_missing_key_names_its_dotted_key():
  c = _cfg()
  del c.eval["top_k"]
  with pytest.raises(ConfigError, match=r"^config key 'm\.eval\.top_k' is missing"):
    config_base.section(Outer, c, "m")
  c = _cfg()
  del c["lr"]
  del c["flag"]
  with pytest.raises(ConfigError, match=r"config keys 'm\.lr', 'm\.flag' are missing"):
    config_base.section(Outer, c, "m")


def test_an_unknown_key_is_named_with_the_allowed_ones():
  c = _cfg()
  c.eval.topk = 4               # a misspelt key: named before the one it misses
  del c.eval["top_k"]
  with pytest.raises(ConfigError,
                     match=r"config key 'm\.eval\.topk' unknown; section 'm\.eval' takes "
                           r"other, top_k"):
    config_base.section(Outer, c, "m")


def test_a_missing_nested_section_is_named():
  c = dict(role="proxy", lr=1e-4, flag=False, eval=3)
  with pytest.raises(ConfigError, match=r"config section 'm\.eval' is missing"):
    config_base.section(Outer, c, "m")


def test_fill_added_later_sets_only_missing_keys_of_existing_sections():
  c = ml_collections.ConfigDict(dict(model=dict(dtype="float32"), sft=dict(epochs=2.0)))
  filled = config_base.fill_added_later(
      c, {"model.thinking": False, "sft.epochs": 0.0, "apex.max_passage_words": 0})
  assert filled == ["model.thinking"]
  assert c.model.thinking is False and c.sft.epochs == 2.0 and "apex" not in c
