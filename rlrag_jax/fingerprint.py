"""A run directory's identity: the fingerprint of the config its results depend on.

  <workdir>/config.json       the resolved config of the run's first start; never overwritten
                              (a directory made before fingerprints holds its last start's)
  <workdir>/fingerprint.json  {"fingerprint": SHA-256 hex, "excluded": {key: why},
                              "config": the resolved config the fingerprint was made from,
                              "starts": one entry per start: time, resume, status
                              ('new' | 'same' | 'unchecked' | 'forced'), fingerprint, the host
                              (`host()`: CPU and its vector instructions, cores, jax, XLA_FLAGS,
                              device), the code (`code_version()`: git commit and whether
                              the tree had uncommitted changes), and for a forced start the
                              differing keys with old and new values},
                              "code": the code version of the latest start}

The fingerprint is a SHA-256 over the resolved config's items (dotted keys and their JSON
values, sorted) except those under EXCLUDED: keys that say where a run is stored, placed or
shown, or how often it saves, and not what it computes. Every other key counts, memory knobs
(micro-batches, logits chunks, remat) included: they change floating-point rounding. A key that
only one side has (declared since the run started, by a newer rlrag_jax, or removed since) is not
a mismatch: a new key's default is the behaviour the run had, so such a start is accepted with a
warning naming the keys, and recorded as 'upgraded'.

`trainer.run` checks a start into a directory that already holds a run (`verify`): a differing
fingerprint is a `ConfigMismatch` naming the differing keys, unless `force`, which records the
forced start and makes the new config the directory's. A directory made before fingerprints is
accepted with a warning that it cannot be checked, and its fingerprint is recorded from then on.
`experiments.seeds` compares a finished run's fingerprint with the one its flags give now.

The code version is part of a run's identity but kept beside the config hash, not in it: a
commit that does not touch what a run computes (a docs change, a new method) would otherwise
make every finished run stale. `check` compares it (`Check.code_differs`); a resume into a run
made by other code is let through with a warning, and `experiments.seeds` warns before reusing
a finished run made by other code (or by a dirty tree, or before code versions were recorded).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import pathlib
import time
from typing import Any, Optional

from rlrag_jax import runlog

log = logging.getLogger("rlrag_jax.fingerprint")

FILE = "fingerprint.json"
CONFIG_FILE = "config.json"

# Top-level keys (and everything under them) that do not change a run's results.
EXCLUDED = {
    "workdir": "where the run is stored",
    "compile_cache": "where compiled XLA programs are cached",
    "log_every": "how often the progress bar shows metrics",
    "checkpoint": "how often a run saves and how many saves it keeps: a resumed run repeats "
                  "the uninterrupted one whatever they are",
    "export_hf": "whether a Hugging Face copy of the final policy is written",
    "mesh": "the device layout: checkpoints restore onto another mesh, and -1 means all "
            "devices of whichever machine runs it",
    "distributed": "how the processes of a multi-host run find each other",
}

_ABSENT = "(absent)"


class ConfigMismatch(ValueError):
  """A start into a run directory whose recorded config differs from this one."""


@dataclasses.dataclass
class Check:
  """What a run directory holds against a config."""
  status: str                  # 'new' (no run yet) | 'unchecked' (a run made before
                               # fingerprints) | 'same' | 'upgraded' (keys added or removed,
                               # none changed) | 'differs'
  fingerprint: str             # this config's
  config: dict                 # this config, resolved
  recorded: Optional[dict] = None       # the directory's fingerprint.json
  differs: dict = dataclasses.field(default_factory=dict)   # key -> (recorded, this)
  code: Optional[dict] = None           # this code's version (`code_version`)

  @property
  def recorded_code(self) -> Optional[dict]:
    """The code version of the run's latest start; None when not recorded (older runs)."""
    return (self.recorded or {}).get("code")

  @property
  def code_differs(self) -> bool:
    """Whether a recorded run may have been made by other code than this: another commit, a
    dirty tree on either side, or no code version recorded."""
    return code_differs(self.recorded_code, self.code)


def code_differs(recorded: Optional[dict], now: Optional[dict]) -> bool:
  """Whether two code versions may differ: unknown or dirty on either side, or other commits."""
  if not recorded or not now or not recorded.get("commit") or not now.get("commit"):
    return True
  return (recorded["commit"] != now["commit"] or bool(recorded.get("dirty"))
          or bool(now.get("dirty")))


def describe_code(code: Optional[dict]) -> str:
  """'abc1234' or 'abc1234 (dirty)' or 'unrecorded'."""
  if not code or not code.get("commit"):
    return "unrecorded"
  return code["commit"][:12] + (" (dirty)" if code.get("dirty") else "")


_CODE_VERSION: Optional[dict] = None


def code_version(refresh: bool = False) -> Optional[dict]:
  """{'commit': the git HEAD of the checkout rlrag_jax is imported from, 'dirty': whether its
  tracked files differ from it}, or None outside a git checkout (an installed copy). Read once
  per process unless `refresh`."""
  global _CODE_VERSION
  if _CODE_VERSION is None or refresh:
    import subprocess
    root = pathlib.Path(__file__).resolve().parent.parent
    try:
      git = lambda *a: subprocess.run(["git", "-C", str(root), *a], capture_output=True,
                                      text=True, timeout=30, check=True).stdout
      commit = git("rev-parse", "HEAD").strip()
      dirty = bool(git("status", "--porcelain", "--untracked-files=no").strip())
      _CODE_VERSION = {"commit": commit, "dirty": dirty}
    except (OSError, subprocess.SubprocessError):
      _CODE_VERSION = {}
  return dict(_CODE_VERSION) or None


def resolved(config) -> dict:
  """A ConfigDict (or a dict) as the plain JSON dict it resolves to."""
  if hasattr(config, "to_json_best_effort"):
    return json.loads(config.to_json_best_effort())
  return json.loads(json.dumps(dict(config), default=str))


def items(config) -> dict:
  """{dotted key: value} of the keys that count (all but EXCLUDED)."""
  out = {}

  def walk(node, prefix):
    for k, v in node.items():
      key = f"{prefix}{k}"
      if not prefix and k in EXCLUDED:
        continue
      if isinstance(v, dict) and v:
        walk(v, key + ".")
      else:
        out[key] = v
  walk(resolved(config), "")
  return out


def fingerprint(config) -> str:
  """SHA-256 hex of `items(config)`."""
  text = json.dumps(items(config), sort_keys=True, separators=(",", ":"))
  return hashlib.sha256(text.encode()).hexdigest()


def differences(old, new) -> dict:
  """{key: (old value, new value)} over the keys that count, '(absent)' for a missing key."""
  a, b = items(old), items(new)
  return {k: (a.get(k, _ABSENT), b.get(k, _ABSENT)) for k in sorted(set(a) | set(b))
          if a.get(k, _ABSENT) != b.get(k, _ABSENT)}


def format_differences(differs: dict, limit: int = 0) -> str:
  """One '  key: old -> new' line per key (the first `limit` when > 0)."""
  show = lambda v: v if v == _ABSENT else json.dumps(v)
  keys = list(differs)
  lines = [f"  {k}: {show(differs[k][0])} -> {show(differs[k][1])}"
           for k in (keys[:limit] if limit else keys)]
  if limit and len(keys) > limit:
    lines.append(f"  ... and {len(keys) - limit} more")
  return "\n".join(lines)


def read(workdir) -> Optional[dict]:
  """The directory's fingerprint.json, or None."""
  p = pathlib.Path(workdir) / FILE
  return json.loads(p.read_text()) if p.exists() else None


def has_run(workdir) -> bool:
  """Whether a training run has started in `workdir` (a log such as experiments.seeds'
  train.log alone does not count)."""
  p = pathlib.Path(workdir)
  return any((p / name).exists()
             for name in (FILE, CONFIG_FILE, "checkpoints", "metrics.jsonl"))


def check(workdir, config) -> Check:
  """How `workdir` stands against `config`; reads only."""
  cfg = resolved(config)
  fp = fingerprint(cfg)
  recorded = read(workdir)
  code = code_version()
  if recorded is None:
    return Check("unchecked" if has_run(workdir) else "new", fp, cfg, code=code)
  if recorded["fingerprint"] == fp:
    return Check("same", fp, cfg, recorded, code=code)
  diff = differences(recorded["config"], cfg)
  changed = {k: v for k, v in diff.items() if _ABSENT not in v}
  return Check("differs" if changed else "upgraded", fp, cfg, recorded, diff, code=code)


def mismatch_message(workdir, c: Check) -> str:
  return (f"{workdir}: this run directory holds a run of another config (its fingerprint "
          f"{c.recorded['fingerprint'][:12]}, this config's {c.fingerprint[:12]}); "
          f"{len(c.differs)} differing key(s), recorded -> now:\n"
          f"{format_differences(c.differs)}\n"
          f"Use another workdir, or pass --force (trainer.run(force=True)) to start anyway; a "
          f"forced start is recorded in {pathlib.Path(workdir) / FILE}.")


def verify(workdir, config, *, force: bool = False) -> Check:
  """`check`, raising ConfigMismatch on a differing fingerprint unless `force`; warns about a
  directory that cannot be checked (made before fingerprints) or a forced start."""
  c = check(workdir, config)
  if c.recorded is not None and c.code_differs:
    log.warning("%s: the run there was made by code %s, this is %s: its results so far may "
                "not be what this code computes", workdir, describe_code(c.recorded_code),
                describe_code(c.code))
  if c.status == "differs":
    if not force:
      raise ConfigMismatch(mismatch_message(workdir, c))
    log.warning("%s: --force: starting with another config than the run directory's; "
                "recorded in %s. Differing keys, recorded -> now:\n%s", workdir, FILE,
                format_differences(c.differs))
  elif c.status == "upgraded":
    log.warning("%s: the config now has key(s) the run directory's has not, or lacks some it "
                "had (another rlrag_jax version); no shared key differs, so the run goes on. "
                "recorded -> now:\n%s", workdir, format_differences(c.differs))
  elif c.status == "unchecked":
    legacy = pathlib.Path(workdir) / CONFIG_FILE
    note = ""
    if legacy.exists():
      last = differences(json.loads(legacy.read_text()), c.config)
      note = (f"; its {CONFIG_FILE} (written at its last start) differs from this config in "
              f"{len(last)} key(s)" + (":\n" + format_differences(last, 10) if last else ""))
    log.warning("%s: no %s (a run directory made before run fingerprints), so its config "
                "cannot be checked against this one; recording this config's fingerprint %s "
                "from now on%s", workdir, FILE, c.fingerprint[:12], note)
  return c


VECTOR_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_tile")


def host() -> dict:
  """What a run's floating-point results can depend on besides its config: the CPU (XLA:CPU
  compiles for the host's vector instructions; capping them at SSE4.2 changes the sampler's
  float32 log-probs in their last bits, at AVX2 not on an AVX-512 host: docs/reliability.md),
  the core count, jax / jaxlib, XLA_FLAGS and the first device."""
  import os
  import platform
  import jax
  import jaxlib
  cpu, flags = platform.processor() or platform.machine(), set()
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      key, _, value = line.partition(":")
      if key.strip() == "model name" and cpu in ("", platform.machine()):
        cpu = value.strip()
      elif key.strip() == "flags":
        flags = set(value.split())
        break
  except OSError:
    pass
  dev = jax.devices()[0]
  return {"cpu": cpu, "vector": [f for f in VECTOR_FLAGS if f in flags], "cores": os.cpu_count(),
          "jax": jax.__version__, "jaxlib": jaxlib.__version__,
          "xla_flags": os.environ.get("XLA_FLAGS", ""),
          "device": f"{dev.platform}:{getattr(dev, 'device_kind', '')}"}


def record(workdir, c: Check, *, resume: bool) -> None:
  """Writes fingerprint.json for a start that `verify` let through (and config.json when the
  directory has none); a differing fingerprint here was forced."""
  p = pathlib.Path(workdir)
  p.mkdir(parents=True, exist_ok=True)
  status = "forced" if c.status == "differs" else c.status     # 'upgraded' keeps its name
  start: dict[str, Any] = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "resume": bool(resume),
                           "status": status, "fingerprint": c.fingerprint, "host": host(),
                           "code": c.code}
  if c.differs:
    start["differs"] = {k: list(v) for k, v in c.differs.items()}
  starts = (c.recorded or {}).get("starts", []) + [start]
  if not (p / CONFIG_FILE).exists():
    runlog.write_atomic(p / CONFIG_FILE, json.dumps(c.config, indent=2))
  runlog.write_atomic(p / FILE, json.dumps(
      {"fingerprint": c.fingerprint, "excluded": EXCLUDED, "config": c.config,
       "starts": starts, "code": c.code}, indent=1))
