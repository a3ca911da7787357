"""Every `--config.<key>=<value>` override written in README.md, docs/*.md, docs/results/README.md
and the configs' docstrings parses as the command line would parse it (`python -m
rlrag_jax.train` reads the same flags) and its value passes the config check.

Which config an override goes with: a `--config=configs/x.py[:preset]` in the same command (a
fenced code line, continued by a trailing backslash, or one inline code span); else, in
configs/x.py's own docstring, any preset of x; else any config and preset (it must name a key
of at least one)."""
import pathlib
import re

import pytest
from absl import flags
from ml_collections import config_flags

import config_specs
from rlrag_jax import config_check

ROOT = config_specs.ROOT
DOCS = ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")) + [
    "docs/results/README.md"]
CONFIG_FLAG = re.compile(r"--config=(configs/\w+\.py(?::\w+)?)")
OVERRIDE = re.compile(r"--config\.([A-Za-z_][\w.]*\w)(?:=(\S*))?")


def _logical_lines(text: str) -> list:
  """Lines with their trailing-backslash continuations joined."""
  return re.sub(r"\\\n", " ", text).splitlines()


def _markdown_commands(text: str) -> list:
  """Fenced code lines (continuations joined) and inline code spans."""
  out = []
  parts = re.split(r"^```.*$", text, flags=re.M)
  for i, part in enumerate(parts):
    if i % 2:                                   # inside a fence
      out += _logical_lines(part)
    else:
      out += re.findall(r"`([^`]+)`", part)
      out += [line for line in re.sub(r"`[^`]+`", "", part).splitlines() if "--config." in line]
  return out


def commands() -> list:
  """[(where, owner config or None, command text)] for every command with an override."""
  out = []
  for doc in DOCS:
    for cmd in _markdown_commands((ROOT / doc).read_text()):
      out.append((doc, None, cmd))
  for name in config_specs.CONFIGS:
    for cmd in _logical_lines(config_specs.docstring(name)):
      out.append((f"configs/{name}.py", name, cmd))
  return [(where, owner, cmd) for where, owner, cmd in out if OVERRIDE.search(cmd)]


def _parse(argv):
  fv = flags.FlagValues()
  holder = config_flags.DEFINE_config_file("config", None, flag_values=fv, sys_argv=argv)
  fv(argv)
  return holder.value


def _has_key(config, key: str) -> bool:
  return key in config_check.flat(config)


def _check(where, owner, cmd, all_configs):
  """The problems of one command: overrides naming no key, or values the check rejects."""
  found = CONFIG_FLAG.findall(cmd)
  overrides = OVERRIDE.findall(cmd)
  if found:
    spec = found[0]
    with_value = [f"--config.{k}={v}" for k, v in overrides if v]
    argv = ["train", f"--config={ROOT / spec}"] + with_value
    try:
      c = _parse(argv)
    except Exception as e:              # what the command line would print
      return [f"{where}: `{cmd.strip()}`: {type(e).__name__}: {e}"]
    out = [f"{where}: `{cmd.strip()}`: {spec} has no key {k}" for k, v in overrides
           if not v and not _has_key(c, k)]
    out += [f"{where}: `{cmd.strip()}`: {p}" for p in config_check.problems(c)]
    return out
  candidates = ([c for s, c in all_configs.items() if s.startswith(f"configs/{owner}.py")]
                if owner else list(all_configs.values()))
  return [f"{where}: `{cmd.strip()}`: no config" + (f" of configs/{owner}.py" if owner else "")
          + f" has key {k}" for k, _ in overrides
          if not any(_has_key(c, k) for c in candidates)]


def test_the_documents_hold_overrides_to_check():
  cmds = commands()
  assert {w for w, _, _ in cmds} >= {"README.md", "docs/results/README.md", "configs/arena.py",
                                     "configs/sparkle.py"}
  assert sum(len(OVERRIDE.findall(c)) for _, _, c in cmds) > 40


def test_every_documented_override_names_a_declared_key_with_a_valid_value():
  all_configs = {spec: config_specs.load(spec) for spec in config_specs.specs()}
  problems = [p for where, owner, cmd in commands()
              for p in _check(where, owner, cmd, all_configs)]
  assert not problems, "\n".join(problems)


def test_a_broken_override_is_caught():
  """The check itself: an undeclared key and a bad value are both reported."""
  all_configs = {"configs/arena.py": config_specs.load("configs/arena.py")}
  assert _check("x", None, "--config=configs/arena.py --config.rl.kl_estimatr=k2", all_configs)
  assert _check("x", None, "--config=configs/arena.py --config.rl.kl_estimator=k5", all_configs)
  assert _check("x", "arena", "needs --config.sparkle.agent.ki_mode", all_configs)
  assert not _check("x", "arena", "needs --config.model.path.", all_configs)
