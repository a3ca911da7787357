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


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.method = "arena"
  c.seed = 0
  c.workdir = "runs/arena"

  c.data = ml_collections.ConfigDict()
  c.data.source = "world"               # 'world' | 'files'
  c.data.world = ml_collections.ConfigDict(dict(seed=0))   # world.build keyword sizes
  c.data.dir = ""                       # RLRAG_DATA_DIR override for 'files'
  c.data.mix = ("hotpotqa:train", "2wiki:dev", "musique:train")   # name:split for 'files'
  c.data.eval_mix = ("hotpotqa:dev", "2wiki:dev", "musique:dev")
  c.data.max_train = 0                  # 0 = all
  c.data.max_eval = 200
  c.data.max_contexts = 4               # gold passages + distractors shown as references
  c.data.max_passage_chars = 0          # 0 = whole passages
  c.data.prompt_style = "paper"         # 'paper' (the structured-reply instruction) | 'compact'
  c.data.analysis_style = "full"        # SFT targets' analysis: 'full' sentences | 'chain' (terse)
  c.data.skip_invalid = False

  c.model = ml_collections.ConfigDict()
  c.model.init = "scratch"              # 'scratch' | 'hf'
  c.model.path = ""                     # HF checkpoint dir when init == 'hf'
  c.model.chat_template = True          # use the tokenizer's chat template when it has one
  c.model.dtype = "float32"
  c.model.remat = False
  c.model.vocab_size = 2048             # tokenizer trained on the world's text ('scratch')
  c.model.hidden_size = 128
  c.model.intermediate_size = 384
  c.model.num_layers = 4
  c.model.num_heads = 4
  c.model.num_kv_heads = 2
  c.model.head_dim = 32
  c.model.max_position_embeddings = 1024

  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
  c.distributed = ml_collections.ConfigDict(dict(initialize=False, coordinator_address="",
                                                 num_processes=0, process_id=-1))

  c.sft = ml_collections.ConfigDict()
  c.sft.steps = 0
  c.sft.batch_size = 32
  c.sft.lr = 3e-3
  c.sft.warmup_ratio = 0.05
  c.sft.weight_decay = 0.0
  c.sft.max_len = 512
  c.sft.pack_bucket = 64                # batch widths round up to this (fewer recompiles)

  c.rl = ml_collections.ConfigDict()
  c.rl.algo = "grpo"                    # 'grpo' (group advantages; DAPO via its knobs)
  c.rl.steps = 0
  c.rl.prompts_per_step = 8
  c.rl.group_size = 8
  c.rl.temperature = 1.0
  c.rl.top_k = 0
  c.rl.top_p = 1.0
  c.rl.max_new_tokens = 128
  c.rl.lr = 1e-4
  c.rl.warmup_ratio = 0.1
  c.rl.weight_decay = 0.0
  c.rl.max_grad_norm = 1.0
  c.rl.kl_beta = 0.04
  c.rl.kl_estimator = "k2"              # k1 | k2 | k3
  c.rl.clip_eps_low = 0.2
  c.rl.clip_eps_high = 0.2
  c.rl.dual_clip = 0.0                  # 0 = off
  c.rl.aggregation = "sequence_mean"    # sequence_mean | token_mean | constant
  c.rl.scale_std = True
  c.rl.adv_eps = 1e-4
  c.rl.mu = 1                           # inner iterations per rollout batch
  c.rl.micro_batches = 1                # gradient accumulation
  c.rl.dynamic_sampling = False
  c.rl.dynamic_max_tries = 3
  c.rl.pack_bucket = 64                 # batch widths round up to this (fewer recompiles)

  c.reward = ml_collections.ConfigDict(dict(w_format=1.0, w_accuracy=1.0, w_relevance=1.0,
                                            bonus_value=10.0))

  c.eval = ml_collections.ConfigDict(dict(every=0, num_examples=200, max_new_tokens=128,
                                          batch_size=64, judge_url="", judge_model=""))
  c.checkpoint = ml_collections.ConfigDict(dict(every=50, keep=2))
  c.log_every = 5
  c.export_hf = True                    # write an HF checkpoint of the final policy
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
    c.data.source = "files"
    c.data.max_train = 25000
    c.data.max_contexts = 0             # all contexts of each example
    c.model.init = "hf"
    c.model.path = ""                   # set --config.model.path=/path/to/Qwen2.5-7B-Instruct
    c.model.dtype = "bfloat16"
    c.model.remat = True
    c.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, tensor=1))
    c.sft.steps = 0
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
