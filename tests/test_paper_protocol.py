"""Each `paper` preset against its paper's protocol. Configs only: no data, no model.

Three tables a preset, all written from the papers (section in each comment), not read from the
configs:

  PAPER     every value the paper gives that a config key holds: training quotas, batch, group,
            updates, epochs, lr and schedule, KL, clip, lengths, reward coefficients, the model's
            thinking mode, retrieval. The preset must hold it, unless the key is in DEPARTS.
  DEPARTS   a value the paper gives that the preset does not follow: the preset must differ from
            it (a stale entry fails) and the config docstring's "Differences from the paper"
            must say so (the phrase given).
  OURS      a value the paper lost or never gave: no value is pinned, but the docstring's
            "Differences from the paper" must name our choice (the phrase given).

Evaluation counts per dataset are tests/test_eval_protocol.py's; epochs counted over the data
loaded are tests/test_train_protocol.py's.
"""
import importlib
import re

import pytest

from rlrag_jax import config_base
from rlrag_jax.config_base import load_config_file
from rlrag_jax.data import sources
from rlrag_jax.rl import batching
from rlrag_jax.training import learners

PAPER = {
    # Section 4 / appendix F: 10k / 10k / 5k training questions, 500 test questions of each;
    # total batch 256 with 7 rollouts each at temperature 0.9, lr 3e-6; the k2 estimator
    # (section 3.2) as GRPO's loss term; rewards (section 3.3): format, normalised-EM accuracy,
    # relevance, bonus 10 when all three are 1, weights 1. Qwen2.5-7B / Llama-3.1-8B instruct:
    # no thinking switch. The dataset's own paragraphs are the context (section 4.4).
    "arena": {
        "train": {"hotpotqa": 10000, "2wiki": 10000, "musique": 5000},
        "eval": {"hotpotqa:test": 500, "2wiki:test": 500, "musique:test": 500},
        "algo": "grpo", "rl.prompts_per_step": 256, "rl.group_size": 7, "rl.lr": 3e-6,
        "rl.temperature": 0.9, "rl.kl_estimator": "k2", "rl.kl_form": "loss",
        "reward.w_format": 1.0, "reward.w_accuracy": 1.0, "reward.w_relevance": 1.0,
        "reward.bonus_value": 10.0, "reward.accuracy": "em", "model.thinking": False,
        "retrieval": None},
    # Table 5 (verl) and B.3: 2Wiki train split 80/20, batch 32 = PPO mini-batch 32 (one update
    # a step), 32 rollouts, 500 steps, lr 1e-6, KL loss 1e-4, temperature 1.0, top-p 1.0, 5
    # turns, lengths 2048 / 4096 / 8192 / 16384; validation and checkpoints every 30 steps;
    # Eq. 8's r_s; the Qwen3-235B judge (B.2); Qwen3 reasoning models, B.4: "Always begin with
    # <think>"; e5 over the September 2025 Wikipedia (section 4.2).
    "search": {
        "data.mix": ("2wiki:train",), "data.train_frac": 0.8, "algo": "grpo",
        "rl.prompts_per_step": 32, "updates": 1, "rl.group_size": 32, "rl.steps": 500,
        "rl.lr": 1e-6, "rl.kl_beta": 1e-4, "rl.kl_form": "loss", "rl.temperature": 1.0,
        "rl.top_p": 1.0, "tool.max_turns": 5, "tool.max_prompt_len": 2048,
        "tool.max_obs_tokens": 4096, "rl.max_new_tokens": 8192,
        "tool.max_total_len": 2048 + 16384, "eval.every": 30, "checkpoint.every": 30,
        "reward.rs_form": "eq8", "reward.judge_model": "Qwen3-235B-A22B-Instruct",
        "model.thinking": True, "retrieval.corpus": "wikipedia-2025-09"},
    # Tables 5-6 and D.3: 3,000 HotpotQA, 2Wiki and NQ training questions each, 1,500 of the
    # 9,000 for validation; SFT lr 5e-6, batch 64, 1 epoch, max length 2048; PPO policy lr 5e-7
    # cosine, value lr 5e-6, KL 0.002, batch 1,024, max length 2048; alpha 0.3; tree depth 4;
    # top-10 documents, top-20 triples; Qwen2.5-3B-Instruct proxy (no thinking switch); per
    # dataset corpora (D.1).
    "sparkle": {
        "train": {"hotpotqa": 3000, "2wiki": 3000, "nq": 3000},
        "sparkle.valid_fraction": 1500 / 9000, "algo": "ppo", "mini_batch": 1024,
        "rl.lr": 5e-7, "rl.ppo.vf_lr": 5e-6, "rl.lr_schedule": "cosine", "rl.kl_beta": 0.002,
        "sft.lr": 5e-6, "sft.batch_size": 64, "sft.epochs": 1.0, "sft.max_len": 2048,
        "sparkle.max_len": 2048, "sparkle.reward.alpha": 0.3, "sparkle.tree.depth": 4,
        "sparkle.agent.top_docs": 10, "sparkle.agent.top_triples": 20,
        "model.thinking": False, "retrieval.corpus": "per-dataset"},
    # Section 4 / appendix C: 10,473 MuSiQue training questions; appendix D.3 (verl GRPO): 3
    # epochs, 8 trajectories a group, a KL loss and an entropy bonus (their coefficients and
    # the batch sizes are lost in the text); Qwen2.5 instruct models: no thinking switch.
    "apex_planner": {
        "train": {"musique": 10473}, "algo": "grpo", "rl.group_size": 8, "rl.epochs": 3.0,
        "rl.kl_form": "loss", "entropy": True, "model.thinking": False},
    # Appendix D.4: full-parameter SFT with a cosine schedule and warm-up (epochs, lr, batch
    # lost); SFT only.
    # Search-R1's retrieval environment (section 4: e5 over the December 2018 Wikipedia).
    "apex_executor": {"sft.lr_schedule": "cosine", "warmup": True, "rl_runs": False,
                      "model.thinking": False, "retrieval.corpus": "wiki-18"},
    # Appendix B.2: 500 / 3,000 / 1,174 training questions, 150 + 150 for validation, prompt
    # batch 128, group 12, AdamW at 1e-6, clip 0.2 / 0.28, no KL (DAPO, Eq. 6), 4,096 output
    # tokens, 5 iterations, k = 1, t = 4 / 2, alpha 0.2, beta 0.3, gamma 0.2, ell 1.25, format
    # 0.01 a part up to 0.02; appendix C.2: 1,000 dev questions of each; Qwen3-8B writing its
    # own <think>...</think> (the format, B.2); the datasets' own collections.
    "r2ag": {
        "train": {"hotpotqa": 500, "2wiki": 3000, "musique": 1174},
        "val": {"2wiki:train": 150, "musique:train": 150},
        "eval": {"hotpotqa:dev": 1000, "2wiki:dev": 1000, "musique:dev": 1000},
        "algo": "grpo", "rl.prompts_per_step": 128, "rl.group_size": 12, "rl.lr": 1e-6,
        "rl.clip_eps_low": 0.2, "rl.clip_eps_high": 0.28, "rl.kl_beta": 0.0,
        "rl.max_new_tokens": 4096, "r2ag.forest.max_iterations": 5,
        "r2ag.eval.max_iterations": 5, "r2ag.train_top_k": 1, "r2ag.reward.t_base": 4,
        "r2ag.reward.t_pred": 2, "r2ag.reward.alpha": 0.2, "r2ag.reward.beta": 0.3,
        "r2ag.reward.gamma": 0.2, "r2ag.reward.ell": 1.25, "r2ag.reward.format_per_part": 0.01,
        "r2ag.reward.format_max": 0.02, "model.thinking": True,
        "retrieval.corpus": "original collections"},
}

DEPARTS = {
    "arena": {"eval": "draw them from dev"},
    "search": {"retrieval.corpus": "September 2025 Wikipedia"},
    "sparkle": {"train": "no NQ", "retrieval.corpus": "One corpus for all six sets"},
    "r2ag": {"retrieval.corpus": "original document collections"},
    "apex_executor": {"retrieval.corpus": "the preset refuses to start until a corpus is named"},
}

OURS = {
    "arena": {"rl.kl_beta": "KL coefficient 0.04", "rl.mu": "one update per batch (mu = 1)",
              "rl.clip_eps_low": "clip eps 0.2", "rl.lr_schedule": "cosine decay",
              "data.max_contexts": "How many contexts each prompt holds"},
    "search": {"rl.lr_schedule": "Learning-rate schedule: constant",
               "rl.clip_eps_high": "the clip range 0.2 / 0.28", "reward.beta": "reward.beta",
               "tool.top_k": "tool.top_k", "reward.stage2_step": "Stage switch"},
    "sparkle": {"rl.prompts_per_step": "tree rollout of 64 questions",
                "rl.epochs": "one pass is ours", "rl.kl_form": "rl.kl_form='reward'",
                "rl.clip_eps_low": "clip 0.2", "sparkle.max_new": "160 generated tokens"},
    "apex_planner": {"rl.lr": "lr 1e-6", "rl.prompts_per_step": "256 prompts per update",
                     "rl.kl_beta": "KL coefficient 0.001",
                     "rl.entropy_coef": "entropy coefficient 0.001",
                     "rl.clip_eps_low": "clip 0.2", "rl.max_new_tokens": "lengths 1024",
                     "rl.aggregation": "Loss aggregation",
                     "apex.sepr_threshold": "SEPR threshold"},
    "apex_executor": {"sft.epochs": "3 epochs", "sft.lr": "lr 1e-5",
                      "sft.batch_size": "64 samples per", "apex.top_k": "Ours: k=3",
                      "apex.max_hops": "H=5 in ':paper'"},
    "r2ag": {"rl.lr_schedule": "no schedule", "rl.mu": "one optimizer update per prompt batch",
             "eval.val_every": "the interval, the metric"},
}


def _get(c, key):
  node = c
  for part in key.split("."):
    node = node[part]
  return node


def _mix(mix, split=None) -> dict:
  out = {}
  for spec in mix:
    name, sp, count = sources.parse_spec(spec)
    if split is not None:
      assert sp == split, f"{spec}: expected the {split} split"
      out[name] = count
    else:
      out[f"{name}:{sp}"] = count
  return out


def _value(c, key):
  """What the preset holds for a protocol key: a dotted config key or a derived one."""
  if key == "train":
    return _mix(c.data.mix, "train")
  if key == "val":
    return _mix(c.data.val_mix)
  if key == "eval":
    return _mix(c.data.eval_mix)
  if key == "algo":
    return batching.check_algo(c.rl)
  if key == "updates":
    return learners.updates_per_step(c.rl)
  if key == "mini_batch":
    return batching.mini_batch_size(c.rl)
  if key == "entropy":
    return float(c.rl.entropy_coef) > 0
  if key == "warmup":
    return float(c.sft.warmup_ratio) > 0
  if key == "rl_runs":
    return config_base.stage_runs(c.rl)
  if key == "retrieval":
    return c.get("retrieval")
  if key == "retrieval.corpus":
    return c.retrieval.corpus
  return _get(c, key)


def _same(got, want) -> bool:
  if isinstance(want, float) and not isinstance(want, bool):
    return float(got) == pytest.approx(want)
  return got == want


def _differences(preset) -> str:
  """The config docstring's "Differences from the paper" section, whitespace kept."""
  doc = importlib.import_module(f"configs.{preset}").__doc__
  assert "Differences from the paper" in doc, f"configs/{preset}.py: no differences section"
  return doc.split("Differences from the paper", 1)[1]


def _mentions(text, phrase) -> bool:
  squash = lambda s: re.sub(r"\s+", " ", s)
  return squash(phrase) in squash(text)


@pytest.mark.parametrize("preset", sorted(PAPER))
def test_paper_preset_holds_every_value_its_paper_gives(preset):
  c = load_config_file(f"configs/{preset}.py:paper")
  departs = DEPARTS.get(preset, {})
  wrong = {k: (_value(c, k), want) for k, want in PAPER[preset].items()
           if k not in departs and not _same(_value(c, k), want)}
  assert not wrong, f"configs/{preset}.py:paper differs from its paper: {wrong}"


@pytest.mark.parametrize("preset", sorted(PAPER))
def test_paper_preset_departures_are_real_and_documented(preset):
  c = load_config_file(f"configs/{preset}.py:paper")
  doc = _differences(preset)
  for key, phrase in DEPARTS.get(preset, {}).items():
    assert key in PAPER[preset], f"{preset}: departure {key!r} has no paper value"
    assert not _same(_value(c, key), PAPER[preset][key]), (
        f"configs/{preset}.py:paper now follows the paper on {key!r}: drop it from DEPARTS")
    assert _mentions(doc, phrase), f"configs/{preset}.py: the differences do not say {phrase!r}"


@pytest.mark.parametrize("preset", sorted(OURS))
def test_values_the_paper_does_not_give_are_documented_as_ours(preset):
  doc = _differences(preset)
  c = load_config_file(f"configs/{preset}.py:paper")
  for key, phrase in OURS[preset].items():
    assert key not in PAPER[preset], f"{preset}: {key!r} is both the paper's and ours"
    _value(c, key)                   # the key exists
    assert _mentions(doc, phrase), f"configs/{preset}.py: the differences do not say {phrase!r}"


def test_sparkle_mini_batches_follow_the_decisions_of_a_step():
  """Table 6's batch 1,024 read as decisions per update: a step's n decisions are cut into
  max(1, round(n / 1,024)) updates, rl.mu 1 epoch of them."""
  rl = load_config_file("configs/sparkle.py:paper").rl
  for n, updates in ((640, 1), (1536, 2), (2500, 2), (3072, 3), (5000, 5)):
    assert learners.updates_per_step(rl, n) == updates


def test_cpu_defaults_keep_their_settings():
  """The `paper` fixes above leave every method's CPU default as its committed numbers had it."""
  apex = load_config_file("configs/apex_planner.py")
  assert apex.rl.aggregation == "sequence_mean" and apex.data.mix == ("musique:train",)
  for method in ("r2ag", "search", "sparkle", "arena", "apex_planner"):
    assert load_config_file(f"configs/{method}.py").model.thinking is False, method
  sp = load_config_file("configs/sparkle.py")
  assert sp.sparkle.max_len == 0 and dict(sp.sparkle.max_new) == dict(rd=6, qf=72, ki=24,
                                                                        reader=40)
