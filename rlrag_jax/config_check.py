"""One check of a run's config against a table of the values each key may take, run when the
config is read (`trainer.run`, `trainer.task_for_checkpoint`), before any task, index or model
is built: a bad value is one line naming its dotted key, the value and what is allowed,

  rl.kl_estimator='k5': must be one of k1, k2, k3
  rl.lr=-0.001: must be > 0

and every bad value of the config is listed at once.

The table is `key pattern -> rule`: `shared_rules()` below for the trainer's sections, and
`RULES` in `rlrag_jax/methods/<method>/config_rules.py` for a method's own keys (so that this
shared module names no method). A pattern is an `fnmatch` pattern over the dotted key
('data.world.*_frac'); a key the config does not have is skipped (sections differ between
methods and presets). The engine's allowed sets are the constants of `rlrag_jax.settings`,
beside the dataclasses its sections parse into (tests/test_settings.py holds the engine's own
tables, `rl.kl.KL_ESTIMATORS`, `rl.batching.ALGOS`, ..., to them), so that this module imports
no engine layer (tests/test_layering.py) and the table and the code that raises on a bad value
cannot disagree; ranges are what the consuming code needs (a learning rate above 0, a
probability in [0, 1], a count of at least 1, 0 where the code documents 0 as "off").

What the table cannot say is mostly left to the consumers: keys that depend on each other (a
cosine schedule's warmup shorter than the run, the world's dev + test fractions, SPARKLE's
rl.group_size 1), paths that must exist, and keys whose allowed values depend on the task
(rl.dynamic_sampling_key, rl.ppo.whiten_by). A method's `config_rules.py` may also list
`CHECKS`: callables `(config) -> list of problem lines` over several keys, run by `check` with
the table (`NeedsCorpus`: open-domain questions need a retrieval corpus).
"""
from __future__ import annotations

import dataclasses
import fnmatch
import importlib
import math
import pathlib
from typing import Any, Optional, Sequence

from rlrag_jax import settings
from rlrag_jax.settings import ConfigError  # noqa: F401 (a value outside what its key allows)


def _show(v) -> str:
  return repr(v) if v == "" else str(v)


@dataclasses.dataclass(frozen=True)
class OneOf:
  """The value is one of `values`."""
  values: tuple

  def __call__(self, v) -> Optional[str]:
    if isinstance(v, str) and v in self.values:
      return None
    return "must be one of " + ", ".join(_show(x) for x in self.values)


@dataclasses.dataclass(frozen=True)
class Flag:
  """The value is True or False."""

  def __call__(self, v) -> Optional[str]:
    return None if isinstance(v, bool) else "must be True or False"


@dataclasses.dataclass(frozen=True)
class Range:
  """A finite number within [lo, hi] (`lo_open` / `hi_open`: the bound itself excluded; None:
  unbounded), or one of the `also` values (-1 for "all the rest", 0 for "off")."""
  lo: Optional[float] = None
  hi: Optional[float] = None
  lo_open: bool = False
  hi_open: bool = False
  also: tuple = ()

  def __call__(self, v) -> Optional[str]:
    number = isinstance(v, (int, float)) and not isinstance(v, bool)
    if number and v in self.also:
      return None
    if number and math.isfinite(v) and self._inside(v):
      return None
    return "must be " + " or ".join([_show(a) for a in self.also] + [self._text()])

  def _inside(self, v) -> bool:
    if self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo):
      return False
    if self.hi is not None and (v >= self.hi if self.hi_open else v > self.hi):
      return False
    return True

  def _text(self) -> str:
    if self.lo is not None and self.hi is not None:
      return (f"in {'(' if self.lo_open else '['}{_show(self.lo)}, {_show(self.hi)}"
              f"{')' if self.hi_open else ']'}")
    if self.lo is not None:
      return f"{'>' if self.lo_open else '>='} {_show(self.lo)}"
    if self.hi is not None:
      return f"{'<' if self.hi_open else '<='} {_show(self.hi)}"
    return "a finite number"


@dataclasses.dataclass(frozen=True)
class Each:
  """A tuple whose every entry passes `rule` (and, with `length`, that many entries)."""
  rule: Any
  length: Optional[int] = None


def at_least(lo) -> Range:
  return Range(lo=lo)


COUNT = Range(lo=1)                  # a size or number of things: at least one
COUNT_OR_OFF = Range(lo=0)           # 0 documented as "off" / "all" / "none"
POSITIVE = Range(lo=0, lo_open=True)
NON_NEGATIVE = Range(lo=0)
FRACTION = Range(lo=0, hi=1)         # a probability or share
RATIO_BELOW_ONE = Range(lo=0, hi=1, hi_open=True)
BOOL = Flag()
DEVICES = Range(lo=1, also=(-1,))    # a mesh axis: a size, or -1 for the rest of the devices


class DatasetSpec:
  """A `data.mix` / `data.eval_mix` entry: 'name:split[:count]' naming a dataset the loaders
  know (`rlrag_jax.data.sources.parse_spec`, `rlrag_jax.data.loaders`)."""

  def __call__(self, v) -> Optional[str]:
    from rlrag_jax.data import loaders, sources
    try:
      name, _, _ = sources.parse_spec(v)
    except ValueError:
      return "must look like 'name:split' or 'name:split:count' with a positive count"
    try:
      loaders._canonical(name)          # pylint: disable=protected-access
    except ValueError as e:             # the loaders' own message: the names they know
      return str(e)
    return None


class MetricName:
  """A key of an evaluation summary ('em', 'recall', 'judge', ...): a non-empty string without
  spaces; whether the task's summary holds it is known at the first validation, which names
  the keys it holds."""

  def __call__(self, v) -> Optional[str]:
    if isinstance(v, str) and v and not any(ch.isspace() for ch in v):
      return None
    return "must be a metric name of the evaluation summary (a non-empty string, no spaces)"


class Url:
  """'' (off) or an http:// / https:// url (e.g. `retrieval.url`, a retrieval server)."""

  def __call__(self, v) -> Optional[str]:
    if isinstance(v, str) and (v == "" or (v.startswith(("http://", "https://")) and
                                           not any(ch.isspace() for ch in v))):
      return None
    return "must be '' (off) or an http:// or https:// url without spaces"


# The prompt styles every method reads: 'compact' drops the fixed instruction text (a
# from-scratch model gains nothing from it), 'paper' is the paper's prompt.
PROMPT_STYLES = ("paper", "compact")


def methods() -> tuple:
  """The method folders with a task (`rlrag_jax.tasks.get_task` imports `<name>.task`)."""
  root = pathlib.Path(__file__).resolve().parent / "methods"
  return tuple(sorted(p.name for p in root.iterdir() if (p / "task.py").is_file()))


class MethodName:
  """`method`: a name whose `rlrag_jax.methods.<name>.task` imports (what `tasks.get_task`
  needs; a test may register a toy task module under such a name)."""

  def __call__(self, v) -> Optional[str]:
    if not (isinstance(v, str) and v.isidentifier()):
      return "must be one of " + ", ".join(methods())
    name = f"rlrag_jax.methods.{v}.task"
    try:
      importlib.import_module(name)
    except ModuleNotFoundError as e:
      if not (e.name and name.startswith(e.name)):    # a dependency of the task is missing
        raise
      return "must be one of " + ", ".join(methods())
    return None


# The keys of the shared tool loop (`rollout.tool_loop`), for the methods whose config has a
# `tool` section (their config_rules spread these in).
TOOL_RULES = {
    "tool.top_k": COUNT,
    "tool.max_turns": NON_NEGATIVE,                # rollout.tool_loop: >= 0
    "tool.max_obs_tokens": NON_NEGATIVE,
    "tool.max_total_len": COUNT,
    "tool.min_batch": COUNT,
    "tool.context_bucket": COUNT,
}


def shared_rules() -> dict:
  """The table for the trainer's sections (`config_base.trainer_config`) and the retrieval
  section every retrieving method shares."""
  from rlrag_jax.data import sources
  from rlrag_jax.data import world_text
  from rlrag_jax.models import config as model_config
  from rlrag_jax.retrieval import index
  from rlrag_jax.sampling import cache_attention
  s = settings
  return {
      "method": MethodName(),
      "stages": Each(OneOf(s.STAGES)),
      # data (rlrag_jax.data.sources; data.world mirrors the per-field checks of
      # rlrag_jax.data.world.WorldConfig, which keeps the ones between fields)
      "data.source": OneOf(sources.SOURCES),
      "data.prompt_style": OneOf(PROMPT_STYLES),
      "data.mix": Each(DatasetSpec()),
      "data.eval_mix": Each(DatasetSpec()),
      "data.val_mix": Each(DatasetSpec()),
      "data.max_train": COUNT_OR_OFF,
      "data.max_eval": COUNT_OR_OFF,
      "data.max_contexts": COUNT_OR_OFF,
      "data.world.num_countries": COUNT,
      "data.world.num_cities": at_least(2),
      "data.world.num_people": at_least(10),
      "data.world.num_orgs": at_least(len(world_text.ORG_KINDS)),
      "data.world.num_films": COUNT,
      "data.world.num_books": COUNT,
      "data.world.num_questions": COUNT,
      "data.world.distractors_per_question": NON_NEGATIVE,
      "data.world.*_frac": FRACTION,
      "data.world.hop_mix": Each(NON_NEGATIVE, length=3),
      # model (rlrag_jax.training.steps.build_model, rlrag_jax.models.config)
      "model.init": OneOf(s.MODEL_INITS),
      "model.dtype": OneOf(model_config.DTYPES),
      "model.param_dtype": OneOf(model_config.DTYPES),
      "model.thinking": BOOL,                        # models.lm.encode_prompt
      "model.attention_block": COUNT_OR_OFF,
      "model.attention": OneOf(cache_attention.IMPLS),
      "model.decode_attention": OneOf(cache_attention.IMPLS),
      "model.decode_attention_splits": COUNT_OR_OFF,
      "model.vocab_size": COUNT,
      "model.hidden_size": COUNT,
      "model.intermediate_size": COUNT,
      "model.num_layers": COUNT,
      "model.num_heads": COUNT,
      "model.num_kv_heads": COUNT,
      "model.head_dim": COUNT,
      "model.max_position_embeddings": COUNT,
      "mesh.data": DEVICES,
      "mesh.fsdp": DEVICES,
      "mesh.tensor": DEVICES,
      "distributed.num_processes": COUNT_OR_OFF,
      "distributed.process_id": at_least(-1),
      # sft (rlrag_jax.training.stages, rlrag_jax.rl.optim_state.OptimizerConfig)
      "sft.steps": NON_NEGATIVE,
      "sft.epochs": NON_NEGATIVE,     # 0: off (sft.steps); both set: stages.resolve_steps
      "sft.batch_size": COUNT,
      "sft.lr": POSITIVE,
      "sft.lr_schedule": OneOf(s.SCHEDULES),
      "sft.warmup_ratio": RATIO_BELOW_ONE,
      "sft.weight_decay": NON_NEGATIVE,
      "sft.max_len": COUNT,
      "sft.pack_bucket": COUNT,
      "sft.group_by_length": COUNT_OR_OFF,
      "sft.prompt_loss": NON_NEGATIVE,
      "sft.micro_batches": COUNT,
      "sft.tokens_per_micro_batch": COUNT_OR_OFF,
      "sft.logits_chunk": COUNT_OR_OFF,
      "sft.head_backward": OneOf(s.HEAD_BACKWARDS),
      # rl (rlrag_jax.training.learners / steps, rlrag_jax.rl.*, the sampler)
      "rl.algo": OneOf(s.ALGOS),
      "rl.steps": NON_NEGATIVE,
      "rl.epochs": NON_NEGATIVE,      # 0: off (rl.steps)
      "rl.prompts_per_step": COUNT,
      "rl.group_size": COUNT,
      "rl.temperature": POSITIVE,     # the loss divides the logits by it (0 samples greedily,
                                      # but its log-probs would be infinite)
      "rl.top_k": COUNT_OR_OFF,
      "rl.top_p": Range(lo=0, hi=1, lo_open=True),
      "rl.max_new_tokens": COUNT,
      "rl.lr": POSITIVE,
      "rl.lr_schedule": OneOf(s.SCHEDULES),
      "rl.warmup_ratio": RATIO_BELOW_ONE,
      "rl.weight_decay": NON_NEGATIVE,
      "rl.max_grad_norm": POSITIVE,
      "rl.kl_beta": NON_NEGATIVE,
      "rl.kl_estimator": OneOf(s.KL_ESTIMATORS),
      "rl.kl_form": OneOf(s.KL_FORMS),
      "rl.clip_eps_low": NON_NEGATIVE,
      "rl.clip_eps_high": NON_NEGATIVE,
      "rl.dual_clip": Range(lo=1, lo_open=True, also=(0,)),    # losses: c > 1; 0: off
      "rl.entropy_coef": NON_NEGATIVE,
      "rl.aggregation": OneOf(s.AGGREGATIONS),
      "rl.adv_eps": POSITIVE,         # a zero-spread group's std is 0
      "rl.mu": COUNT,
      "rl.micro_batches": COUNT,
      "rl.tokens_per_micro_batch": COUNT_OR_OFF,
      "rl.dynamic_max_tries": COUNT,
      "rl.pack_bucket": COUNT,
      "rl.logits_chunk": COUNT_OR_OFF,
      "rl.head_backward": OneOf(s.HEAD_BACKWARDS),
      "rl.ppo.critic": OneOf(s.CRITICS),
      "rl.ppo.gamma": FRACTION,
      "rl.ppo.lam": FRACTION,
      "rl.ppo.vf_lr": POSITIVE,
      "rl.ppo.vf_clip": NON_NEGATIVE,                          # 0: unclipped value loss
      "rl.ppo.mini_batches": COUNT,
      "rl.ppo.mini_batch_size": COUNT_OR_OFF,                  # 0: mini_batches counts them
      # eval, checkpoints, logging
      "eval.every": COUNT_OR_OFF,
      "eval.val_every": COUNT_OR_OFF,              # 0: no validation
      "eval.val_metric": MetricName(),             # a key of the evaluation summary
      "eval.early_stop_patience": COUNT_OR_OFF,    # 0: never stop early
      "eval.num_examples": NON_NEGATIVE,
      "eval.max_new_tokens": COUNT,
      "eval.batch_size": COUNT,
      "checkpoint.every": COUNT_OR_OFF,
      "checkpoint.keep": COUNT,
      "log_every": COUNT,
      # retrieval (rlrag_jax.retrieval.from_config; the methods that retrieve)
      "retrieval.backend": OneOf(tuple(index.BACKENDS)),
      "retrieval.scann_brute_force_below": NON_NEGATIVE,   # 0: always partitioned
      "retrieval.pooling": OneOf(("", "mean", "cls")),     # '': the encoder folder's
      # retrieval as a service (rlrag_jax.retrieval.client): '' = search in process
      "retrieval.url": Url(),
      "retrieval.url_timeout_s": POSITIVE,
      "retrieval.url_retries": COUNT_OR_OFF,               # 0: no retry
      "retrieval.url_max_failure_rate": FRACTION,          # 1: never stop
      "retrieval.url_failure_window": COUNT,
      # the LLM judge wherever a section names one (eval.*, reward.*; rlrag_jax.judge)
      "*.judge_concurrency": COUNT,
      "*.judge_failure_window": COUNT,
      "*.judge_max_failure_rate": FRACTION,
  }


# The config keys that name a retrieval corpus: a corpus file or name (loaders.CORPORA), a built
# index folder, or a retrieval server. One of them set, a run searches that collection.
CORPUS_KEYS = ("retrieval.corpus", "retrieval.index", "retrieval.url")


@dataclasses.dataclass(frozen=True)
class NeedsCorpus:
  """A cross-key check: a config that reads real datasets (`data.source` 'files') and retrieves
  must name its corpus (one of `CORPUS_KEYS`) when it holds open-domain questions (datasets
  whose records carry no paragraphs: NQ, TriviaQA, PopQA, Bamboogle, MuSiQue's
  dev_no_paragraphs; `loaders.carries_passages`). Without one, `retrieval.from_config.corpus_for`
  pools the selected examples' own paragraphs, and those questions would search the other
  datasets' paragraphs. `always`: every dataset needs the corpus (a protocol whose retrieval is
  open for all of them, as Search-R1's wiki-18), not only the open-domain ones. `protocol`
  names the collection the method's paper searched, for the message.

  A config without a `retrieval` section (a method that does not retrieve) passes."""
  protocol: str = ""
  always: bool = False

  def __call__(self, config) -> list:
    from rlrag_jax.data import loaders, sources
    values = flat(config)
    if values.get("data.source") != "files" or "retrieval.corpus" not in values:
      return []
    if any(values.get(k) for k in CORPUS_KEYS):
      return []
    needs = {}                        # dataset name -> the keys whose entries name it
    for key in ("data.mix", "data.eval_mix", "data.val_mix"):
      for spec in values.get(key) or ():
        try:
          name, split, _ = sources.parse_spec(spec, key)
          open_domain = not loaders.carries_passages(name, split)
        except ValueError:            # the table's DatasetSpec names a malformed entry
          continue
        if self.always or open_domain:
          needs.setdefault(name, [])
          if key not in needs[name]:
            needs[name].append(key)
    if not needs:
      return []
    keys = sorted({k for ks in needs.values() for k in ks})
    why = ("this method's protocol retrieves from a corpus for every dataset"
           if self.always else "their records carry no paragraphs")
    return [f"{' and '.join(keys)} name{'s' if len(keys) == 1 else ''} {', '.join(needs)}, "
            f"which need{'s' if len(needs) == 1 else ''} a retrieval corpus "
            f"({why}), but none of {', '.join(CORPUS_KEYS)} is set: the run would search the "
            "other selected datasets' paragraphs instead"
            + (f". The paper searched {self.protocol}" if self.protocol else "")
            + ". Set one, e.g. --config.retrieval.corpus=wiki18 (the shared sample of wiki-18) "
            "or a JSONL path"]


def method_checks(method: str) -> tuple:
  """`CHECKS` of `rlrag_jax/methods/<method>/config_rules.py` (() without one)."""
  name = f"rlrag_jax.methods.{method}.config_rules"
  if method not in methods():
    return ()
  try:
    mod = importlib.import_module(name)
  except ModuleNotFoundError as e:
    if e.name == name:
      return ()
    raise
  return tuple(getattr(mod, "CHECKS", ()))


def method_rules(method: str) -> dict:
  """`RULES` of `rlrag_jax/methods/<method>/config_rules.py` ({} for a method without one)."""
  name = f"rlrag_jax.methods.{method}.config_rules"
  try:
    mod = importlib.import_module(name)
  except ModuleNotFoundError as e:
    if e.name == name:
      return {}
    raise
  return dict(mod.RULES)


def rules_for(method: str) -> dict:
  """The whole table for a config of `method`: the shared rules, then the method's."""
  table = shared_rules()
  if method in methods():
    table.update(method_rules(method))
  return table


def flat(config, prefix: str = "") -> dict:
  """{dotted key: value} of every leaf of a ConfigDict / dict."""
  out = {}
  for k, v in config.items():
    if hasattr(v, "items"):
      out.update(flat(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def _apply(rule, key: str, value) -> list:
  if isinstance(rule, Each):
    if not isinstance(value, (tuple, list)):
      return [f"{key}={value!r}: must be a tuple"]
    out = []
    if rule.length is not None and len(value) != rule.length:
      out.append(f"{key}={tuple(value)!r}: must have {rule.length} entries")
    for i, v in enumerate(value):
      out += _apply(rule.rule, f"{key}[{i}]", v)
    return out
  why = rule(value)
  return [] if why is None else [f"{key}={value!r}: {why}"]


def problems(config, table: Optional[dict] = None) -> list:
  """One line per value of `config` that its rule rejects, in the config's key order, then the
  lines of the method's cross-key `CHECKS` (run when `table` is not given)."""
  values = flat(config)
  method = str(values.get("method", ""))
  checks = method_checks(method) if table is None else ()
  table = rules_for(method) if table is None else table
  out = []
  for key, value in values.items():
    for pattern, rule in table.items():
      if fnmatch.fnmatchcase(key, pattern):
        out += _apply(rule, key, value)
  for c in checks:
    out += list(c(config))
  return out


def check(config, table: Optional[dict] = None) -> None:
  """Raises `ConfigError` listing every value of `config` its rule rejects."""
  found = problems(config, table)
  if len(found) == 1:
    raise ConfigError(found[0])
  if found:
    raise ConfigError(f"{len(found)} config values are not allowed:\n  " + "\n  ".join(found))


def unmatched(patterns: Sequence[str], keys: Sequence[str]) -> list:
  """The patterns that match none of `keys` (a table entry naming no key is a typo)."""
  return [p for p in patterns if not any(fnmatch.fnmatchcase(k, p) for k in keys)]
