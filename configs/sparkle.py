"""SPARKLE: one proxy model plays three agents (Retrieval Decision, Query Formulation through a
KG-triple reasoning chain, Knowledge Integration by selecting one candidate triple) around a
frozen reader; PPO with a value model on binary tree rollouts with pruning and Monte-Carlo credit.

  python -m rlrag_jax.train --config=configs/sparkle.py            # CPU default, embedded world
  python -m rlrag_jax.train --config=configs/sparkle.py --config.sparkle.rollout=standard
  python -m rlrag_jax.train --config=configs/sparkle.py:paper \\
      --config.model.path=/path/to/Qwen2.5-3B-Instruct \\
      --config.models.reader.path=/path/to/Qwen2.5-7B-Instruct --config.data.dir=/path/to/data

The reader thinks one step per call (`<think>…</think>`, then `<answer>…</answer>`); after each
thought the proxy decides whether to retrieve, writes the chain, the need and a query, and picks
one of the top-20 triples of the top-10 retrieved documents, whose document joins the context
(rlrag_jax/methods/sparkle/). Training: SFT on the oracle's correct trajectories, then PPO where
each question grows a binary tree (both decisions at each of the first `sparkle.tree.depth`
steps, a "Yes" that adds nothing pruned, then linear completion), every decision trained with
the mean leaf reward below it; R = α·Recall(final context) + (1 − α)·F1. The CPU default's
reader is trained once by configs/sparkle_reader.py (`models.reader.train_config`) and reused.
`sparkle_report.txt` holds F1, EM, recall and cumulative Recall@5 per step for the reader
alone, naive RAG, SPARKLE after SFT and after PPO.

Presets (`get_config(arg)`):
  ''       small models from scratch on the embedded world's 2-hop questions: a partial SFT
           warm-up on oracle trajectories, then tree-rollout PPO.
  'paper'  Tables 5-6 and the authors' training script: Qwen2.5-3B proxy, a 7B reader, SFT lr
           5e-6, batch 64, 1 epoch; PPO policy lr 5e-7, value lr 5e-6, KL 0.002, batch 1024
           decisions, 64 questions per rollout, cosine schedule, max length 2048, tree depth 4;
           3,000 each of HotpotQA, 2Wiki and NQ train (NQ is not among the shared samples: the
           preset mixes HotpotQA and 2Wiki).

Differences from the paper, with the reason:
  - The SFT data on the world is the oracle's trajectories (prompts.py). On real data,
    `python -m rlrag_jax.methods.sparkle.trajectories` collects a stronger proxy's through an
    OpenAI-compatible endpoint (the paper: Qwen2.5-72B-Instruct) and keeps the correct ones;
    `sparkle.sft_trajectories` points the warm-up at them. Without either, set sft.steps=0.
  - Values from the authors' released OpenRLHF-based code (training_script.sh and its PPO CLI
    defaults), not in the paper: clip 0.2, value clip 0.2, GAE λ 0.95, γ 1, the k1 KL estimator,
    temperature 1.0, 160 generated tokens per call. Their code adds the KL to the per-token
    reward with a coefficient scaled by each action's length and normalises advantages per
    action type; here the KL is the trainer's loss term (rl.kl_beta, rl.kl_estimator). The
    ':paper' preset whitens the advantages per action type as their code does
    (rl.ppo.whiten_by='role'); the CPU default whitens over the whole batch (per role, seed 0:
    F1 0.188 -> 0.162 after PPO, against 0.168 with one whitening; not adopted).
  - The reward: α·Recall + (1 − α)·F1 with α = 0.3 as the paper writes it
    (sparkle.reward.weighting='paper'); the released code weights them the other way round
    ('code').
  - A malformed output: a decision reads as "No" (sparkle.agent.rd_default), a formulation
    without a query searches the latest thought, a selection naming no candidate takes the
    best-scored one (sparkle.agent.ki_fallback 'top'; 'none' selects nothing). The paper does
    not say.
  - Not given by the paper, ours: at most sparkle.agent.max_steps reasoning steps and
    max_retrievals retrievals per question; cumulative Recall@5 counts each query's top 5.
  - CPU default only: 2-hop world questions (the paper's in-domain sets are 2-hop HotpotQA and
    2Wiki plus single-hop NQ), small models, and a shallower tree (sparkle.tree.depth) and
    fewer RL steps so that it fits 15 minutes on 2 cores. The proxy starts from the reader's
    weights (model.path follows models.reader.path): the only LM of the world's text there is,
    standing in for the paper's pretrained Qwen2.5-3B (from scratch, seed 0: SFT-only F1 0.132
    against 0.188). PPO's update is split into rl.micro_batches (memory and speed only).
"""
import ml_collections

from rlrag_jax import config_base


def base_config() -> ml_collections.ConfigDict:
  c = config_base.trainer_config("sparkle", "runs/sparkle")
  c.sparkle = ml_collections.ConfigDict(dict(
      role="proxy",
      rollout="tree",                     # 'tree' | 'standard' (the paper's comparison)
      tree=ml_collections.ConfigDict(dict(depth=4)),
      agent=ml_collections.ConfigDict(dict(
          top_docs=10, top_triples=20, max_steps=10, max_retrievals=5, recall_k=5,
          rd_default=False, ki_fallback="top", ki_output="triple", reasoning_reader=False,
          passage_words=0)),
      max_new=ml_collections.ConfigDict(dict(rd=8, qf=160, ki=48, reader=160)),
      reward=ml_collections.ConfigDict(dict(alpha=0.3, weighting="paper")),
      # An OpenAI-compatible reader instead of models.reader (plug-and-play: any reader).
      reader=ml_collections.ConfigDict(dict(url="", model="", max_tokens=256)),
      triples_file="",                    # extract_triples' JSONL for a corpus without triples
      sft_trajectories="",                # trajectories.py's JSONL: SFT on a stronger proxy's
      eval=ml_collections.ConfigDict(dict(naive_k=5, baselines=True, recall_steps=4)),
      reader_sft=ml_collections.ConfigDict(dict(retrieve_prob=0.75, distractor_prob=0.3))))
  c.models.reader = ml_collections.ConfigDict(dict(
      path="runs/sparkle_reader", train_config="configs/sparkle_reader.py",
      step=-1))                           # the reader run's checkpoint (-1: latest)
  c.retrieval = ml_collections.ConfigDict(dict(
      backend="exact", corpus="", encoder_path="", cache_dir=""))
  # PPO with a value model; values from the authors' released training script.
  c.rl.algo = "ppo"
  c.rl.group_size = 1
  c.rl.kl_beta = 0.002
  c.rl.kl_estimator = "k1"
  c.rl.clip_eps_low = 0.2
  c.rl.clip_eps_high = 0.2
  c.rl.temperature = 1.0
  c.rl.lr_schedule = "cosine"
  c.rl.ppo.update(dict(critic="separate", gamma=1.0, lam=0.95, vf_clip=0.2, whiten=True,
                       mini_batches=1))
  return c


def get_config(arg: str = ""):
  c = base_config()
  if arg in ("", "default", "cpu"):
    c.data.world = config_base.world_config(**config_base.SMALL_WORLD, hop_mix=(1.0, 0.0, 0.0))
    c.data.prompt_style = "compact"
    # The proxy starts from the reader's weights (a small LM of the world's text: the stand-in
    # for the paper's pretrained proxy); the reference keeps the two paths one setting.
    c.model.init = "hf"
    c.model.path = c.models.reader.get_ref("path")
    c.model.train_config = c.models.reader.get_ref("train_config")
    c.sparkle.agent.max_steps = 8
    c.sparkle.agent.max_retrievals = 4
    c.sparkle.max_new.update(dict(rd=6, qf=72, ki=24, reader=40))
    c.sparkle.tree.depth = 2
    c.sft.steps = 250                   # partial: RL has room (SFT loss ~0.6 at the end)
    c.sft.group_by_length = 8           # length-sorted batches: half the padding
    c.sft.batch_size = 32
    c.sft.lr = 3e-3
    c.sft.max_len = 512
    c.sft.pack_bucket = 64
    c.sft.prompt_loss = 0.3             # LM loss on the prompts too: its only pretraining
    c.sft.micro_batches = 4             # smaller live buffers: fewer page faults on CPU
    c.rl.steps = 12                     # ~24 s a step on 2 cores (tree of depth 2, 4 questions)
    c.rl.prompts_per_step = 4
    c.rl.lr = 1e-4
    c.rl.ppo.vf_lr = 5e-4
    c.rl.max_new_tokens = 72
    c.rl.pack_bucket = 64
    c.rl.micro_batches = 16             # the update's buffers 16x smaller: 2.3x faster on CPU
    c.eval.num_examples = 100
    c.eval.batch_size = 64
    c.eval.max_new_tokens = 72
    c.checkpoint.every = 10
    c.export_hf = False
  elif arg == "paper":
    config_base.use_hf_model(c)
    c.models.reader = ml_collections.ConfigDict(dict(path=""))
    c.data.prompt_style = "paper"
    c.data.mix = ("hotpotqa:train:3000", "2wiki:train:3000")
    c.data.eval_mix = ("hotpotqa:dev", "2wiki:dev", "musique:dev", "bamboogle:test")
    c.data.allow_short = True
    c.data.max_eval = 1000
    c.retrieval.backend = "scann"
    c.sft.steps = 118                   # 1 epoch of ~7,500 trajectories at batch 64
    c.sft.batch_size = 64
    c.sft.lr = 5e-6
    c.sft.max_len = 2048
    c.rl.steps = 117                    # one pass over 7,500 questions, 64 per rollout
    c.rl.prompts_per_step = 64
    c.rl.lr = 5e-7
    c.rl.ppo.vf_lr = 5e-6
    c.rl.ppo.whiten_by = "role"         # the authors' code normalises per action type
    c.rl.max_new_tokens = 160
    c.rl.micro_batches = 1
    c.eval.max_new_tokens = 160
    c.eval.num_examples = 1000
    c.checkpoint.every = 10
  else:
    raise ValueError(f"configs/sparkle.py: unknown preset {arg!r}; expected '' or 'paper'")
  return c
