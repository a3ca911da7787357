"""ARENA: structured relevance / analysis / answer generation trained with GRPO (k2 KL).

  python -m rlrag_jax.train --config=configs/arena.py            # CPU default on the embedded world
  python -m rlrag_jax.train --config=configs/arena.py:paper \\
      --config.model.path=/path/to/Qwen2.5-7B-Instruct --config.data.dir=/path/to/data

Presets (`get_config(arg)`):
  ''      a small model trained from scratch on the embedded world, SFT warm-up then GRPO;
          finishes in minutes on a 2-core CPU.
  'paper' the paper's setting: Qwen2.5-7B-Instruct, 7 generations, temperature 0.9, lr 3e-6
          cosine with 10% warmup, beta 0.04 with the k2 estimator, eps 0.2, 25k mixed
          HotpotQA / 2Wiki / MuSiQue training examples, completions up to 256 tokens.
"""
import ml_collections

from rlrag_jax import config_base


def base_config() -> ml_collections.ConfigDict:
  """The trainer's shared sections (`rlrag_jax.config_base`) plus ARENA's own keys."""
  c = config_base.trainer_config("arena", "runs/arena")
  c.data.mix = ("hotpotqa:train", "2wiki:dev", "musique:train")   # name:split for 'files'
  c.data.eval_mix = ("hotpotqa:dev", "2wiki:dev", "musique:dev")
  c.data.max_contexts = 4               # gold passages + distractors shown as references
  c.data.max_passage_chars = 0          # 0 = whole passages
  c.data.analysis_style = "full"        # SFT targets' analysis: 'full' sentences | 'chain' (terse)
  c.rl.warmup_ratio = 0.1
  c.rl.kl_estimator = "k2"              # ARENA's estimator: 1/2 (log r)^2
  c.reward = ml_collections.ConfigDict(dict(w_format=1.0, w_accuracy=1.0, w_relevance=1.0,
                                            bonus_value=10.0))
  return c


def get_config(arg: str = ""):
  c = base_config()
  if arg in ("", "default", "cpu"):
    c.data.world = ml_collections.ConfigDict(dict(seed=0))
    c.data.max_contexts = 3
    c.data.prompt_style = "compact"     # a from-scratch model gains nothing from a fixed preamble
    c.data.analysis_style = "chain"     # short gold analyses: completions fit 64 new tokens
    c.data.max_eval = 200
    c.sft.steps = 300
    c.sft.batch_size = 16
    c.sft.lr = 3e-3
    c.sft.pack_bucket = 32
    c.rl.steps = 50
    c.rl.prompts_per_step = 8
    c.rl.group_size = 8
    c.rl.lr = 1e-4
    c.rl.max_new_tokens = 72
    c.rl.kl_beta = 0.04
    c.eval.max_new_tokens = 72
    c.eval.num_examples = 200
    c.checkpoint.every = 50
  elif arg == "paper":
    config_base.use_hf_model(c)         # set --config.model.path=/path/to/Qwen2.5-7B-Instruct
    c.data.max_train = 25000
    c.data.max_contexts = 0             # all contexts of each example
    c.rl.steps = 1000
    c.rl.prompts_per_step = 16
    c.rl.group_size = 7
    c.rl.temperature = 0.9
    c.rl.max_new_tokens = 256
    c.rl.lr = 3e-6
    c.rl.warmup_ratio = 0.1
    c.rl.kl_beta = 0.04
    c.rl.kl_estimator = "k2"
    c.rl.clip_eps_low = 0.2
    c.rl.clip_eps_high = 0.2
    c.rl.micro_batches = 4
    c.eval.max_new_tokens = 256
    c.eval.every = 100
    c.checkpoint.every = 100
  else:
    raise ValueError(f"configs/arena.py: unknown preset {arg!r}; expected '' or 'paper'")
  return c
