"""R2AG: a retrieval-steering model expands a reasoning-augmented retrieval tree; Top-Survivor
rewards; DAPO; progressive training over the RR-Forest (Algorithm 1).

  python -m rlrag_jax.train --config=configs/r2ag.py             # CPU default, embedded world
  python -m rlrag_jax.train --config=configs/r2ag.py:paper \\
      --config.model.path=/path/to/Qwen3-8B --config.models.generator.path=/path/to/Qwen3-8B \\
      --config.data.dir=/path/to/data

Per expansion step the steering model writes <think>…</think>, base queries <base-Q>…</base-Q>
and anticipatory predicted queries <predicted-Q>…</predicted-Q>, or "stop retrieval"; each query
retrieves its top-1 document in training (rlrag_jax/methods/r2ag/). The reward of a step is
R = α·R_MH + β·R_JH + γ·R_AP + R_f (rewards.py). Training walks the RR-Forest level by level
(forest.py); the forest is checkpointed with the run. Evaluation expands a tree per held-out
question (inference.py) and answers with the frozen generator `models.generator`; the CPU
default trains that generator once with configs/r2ag_generator.py (`train_config`) and reuses it.
`r2ag_report.txt` holds Recall, Full-Recall, @K, mAP, EM, F1, iterations and latency for
single-step retrieval, R2AG top-1, base-only and top-2, before RL (the SFT warm-up, our stand-in
for the paper's prompted R2AG-p) and after.

Presets (`get_config(arg)`):
  ''       a small model trained from scratch on the embedded world: a partial SFT warm-up on
           oracle expansion steps, then DAPO over small forests.
  'long_warmup'  the default with a warm-up that copies the question's names (sft.steps 1200)
           and RL over forests that carry every retrieved document on
           (r2ag.forest.carry 'branch'); 20 min on 2 cores. Chosen on seed 0; on fresh seeds
           3-5 its RL raises held-out top-1 Recall, Full-Recall and mAP on every seed, but
           not beyond the seed-to-seed spread (t intervals include 0); top-2 Full-Recall and
           mAP rise with intervals that exclude 0, and premature stops beside non-gold
           documents vanish (docs/results/README.md, "Fresh seeds 3, 4, 5"). Over the five
           seeds that did not choose it (1-5), the top-1 Recall gain is shown (+0.037,
           t [+0.001, +0.073]); Full-Recall and mAP rise on all five, not shown.
  'gpu'    the CPU default sized for one NVIDIA H100: three seeds in about 8 minutes (2.6 min
           a seed, compile included, plus the frozen generator trained once), an estimate
           until measured on a GPU (see "GPU budget" below). The same world, generator (the
           CPU default's, runs/r2ag_generator), rewards, evaluation and partial-SFT-then-DAPO
           pipeline over gold-carrying forests. Differences from the CPU default:
             - a 4x wider steering model: hidden 512, 8 heads x 64 (4 KV heads), intermediate
               1536, still 4 layers (13.6M params against 1.05M);
             - bf16 compute over float32 master params (model.dtype);
             - 7x the RL samples a step: 56 expansions x 8 = 448 (CPU 8 x 8), the same 150
               steps, and forests 7x larger to match (r2ag.forest.size 224, max_size 448), so
               that a level still takes as many steps as on CPU and is not one batch topped up
               with repeats. The default already reaches steps x SNR 4.1 (docs/results/
               README.md, "Gradient noise") and does not gain: this tests whether 7x more does;
             - lr SFT 1.5e-3 (CPU 3e-3) and RL 5e-5 (CPU 1e-4): scaled by 1/sqrt(width ratio
               4), between the standard parametrisation (same lr: a 4x wider model's function
               moves further per Adam step) and muP's 1/width; ours, to be tuned on a GPU.
  'paper'  appendix B.2: group 12, prompt batch 128, lr 1e-6, clip 0.2 / 0.28, no KL, 4,096
           output tokens, 5 iterations, k = 1, t = 4 base / 2 predicted, no SFT warm-up, no
           refill of dropped groups; the real data: 500 HotpotQA + 3,000 2Wiki + 1,174 MuSiQue
           training questions drawn at random per dataset with `seed` (data.mix quotas);
           300 validation questions (150 2Wiki + 150 MuSiQue, data.val_mix) evaluated every 10
           RL steps, the best state kept, early stopping (eval.val_*, early_stop_patience);
           evaluation with t = M/2 per dataset (r2ag.eval.t_base_by_dataset);
           Qwen3's thinking on for the steering model (model.thinking: its <think>...</think>
           is the format's reasoning segment, which the parser and reward read in the
           completion; the generator's answers keep it off, r2ag.eval.generator_thinking);
           evaluation on 1,000 random dev questions of each of HotpotQA, 2Wiki and MuSiQue
           (appendix C.2), drawn per dataset with `seed`.

GPU budget (':gpu'; assumptions, to be checked on a GPU): training FLOPs ~ 6 x params x
tokens, sampling ~ 2 x params x generated tokens; updates at 20% MFU of the H100's ~990 bf16
TFLOP/s (198 TFLOP/s); a decode step bound by reading the weights (54.5 MB in float32) and the
KV cache (4 KB a token) at ~2 TB/s, with a floor of 0.3 ms a step (a 4-layer step's kernel
launches); ~40 s of compile per seed. With N = 13.6M params (6N = 8.2e7 FLOP a token):
  SFT       600 steps x 32 rows x at most 256 tokens (padded) = 4.9M tokens: 4.0e14 FLOP, 2.0 s
  RL update 150 x 448 x 256 tokens (prompt, carried gold documents, 80 new) = 17.2M tokens, no
            reference forward (kl_beta 0): 1.4e15 FLOP, 7.1 s
  sampling  2N x 150 x 448 x 80 new tokens = 1.5e14 FLOP; 150 x 80 = 12k RL decode steps (up
            to 36k with refills), and ~12k for the two evaluations (4 chunks of 64 questions x
            3 tree variants x ~3 rounds x ~2 sub-batches x 80; up to 77k at the bounds of 5
            rounds and 8 branches): 24k-48k decode steps at the 0.3 ms floor (bandwidth:
            0.05-0.26 ms): 7-15 s
  compile   ~40 s
  once      the frozen generator on first use: 600 SFT steps of the 1.05M-param CPU model
            (float32), launch-bound: ~30-40 s, shared by the three seeds
That is ~56-64 s of the 156 s a seed; the rest is for host work (world, tokenizer, the forest,
retrieval of up to 6 queries per output with MiniLM, rewards, the evaluation's trees and
generator answers), which only a GPU run measures.

Differences from the paper, with the reason:
  - Training questions ('paper'): the quotas are the paper's, each min(quota, available)
    (data.allow_short): on the shared samples (../shared/data) all 110 HotpotQA and all 100
    MuSiQue train questions, and no 2Wiki (the samples hold no 2Wiki train split: drop
    '2wiki:train:3000' from data.mix there, or point data.dir at the full datasets).
  - Evaluation ('paper'): 1,000 random dev questions of HotpotQA, 2Wiki and MuSiQue, each
    min(1,000, available) (data.eval_allow_short): on the shared samples (../shared/data)
    1,000 HotpotQA, all 462 2Wiki and all 93 MuSiQue (1,555). Left out: Natural Questions dev
    (the shared samples hold only FlashRAG's NQ test subsample, and its questions carry no gold
    documents, which R2AG's recall metrics need; rlrag_jax/data/loaders.py reads NQ only in
    FlashRAG's format), MultiHopRAG and LongBench-v2 (no loaders, and no samples to build and
    test one on).
  - The steering prompt ('paper' style) is appendix G.1's instruction, the paper's text
    (methods/r2ag/prompts.py INSTRUCTION); the paper shows no user turn, so how the question and
    the evidences follow it ("Question: ...", "Evidences:" with numbered passages) is ours, and
    so is whatever the PDF-to-text conversion lost of G.1 (straight or curly quotes, the
    figure's line wrapping; the comment there says which).
  - Validation ('paper'): appendix B.2's 150 2Wiki + 150 MuSiQue training questions
    (data.val_mix), drawn from what the training quotas leave of those splits, evaluated every
    eval.val_every = 10 RL steps; the best state by eval.val_metric is kept and 3 validations
    without a better one stop RL (eval.early_stop_patience). The paper says only "early
    stopping applied to prevent overfitting": the interval, the metric (ours: held-out Recall
    of the main tree, R2AG's goal, Eq. 1) and the patience are ours, and our validation expands
    inference trees (as the evaluation does) where the paper's "validation RR-Forests" may
    score the training reward. On the shared samples there is no validation set (no 2Wiki
    train split; training takes all 100 MuSiQue train questions): set data.val_mix to what is
    left there, or eval.val_every=0.
  - Retrieval ('paper'): by default (retrieval.corpus '', retrieval.encoder_path '') the
    corpus is the deduplicated contexts of the selected questions (train, evaluation,
    validation: each HotpotQA / 2Wiki question's 10 paragraphs, each MuSiQue one's 20) and the
    encoder the packaged MiniLM-L6 (22M), because the paper's retrieval corpora ("their
    original document collections"; for NQ the 2021 Wikipedia dump) and its retriever
    multilingual-e5-large-instruct (0.56B) are not shipped with the repository. To use the
    paper's: retrieval.corpus=/path/to/collection.jsonl (one {"title", "text"} passage a line,
    holding the gold paragraphs with the examples' titles and texts: gold documents are matched
    by title and text) and retrieval.encoder_path=/path/to/multilingual-e5-large-instruct (a
    local HF checkpoint; the encoder mean-pools as E5 does, but queries are encoded without
    E5-instruct's "Instruct: ...\nQuery: " prefix, which our encoder does not add).
  - LLM accuracy (appendix G.2, GPT-4o; the paper reports it on MultiHopRAG only): off by
    default; with eval.judge_url / eval.judge_model set, every evaluation gains a 'judge'
    column asked with G.2's prompt (methods/r2ag/prompts.py JUDGE_SYSTEM, the paper's text; the
    user turn follows its instances, and at most 256 reply tokens for the analysis, ours).
  - The learning rate: the paper gives "an initial learning rate of 1e-6" and no schedule;
    ':paper' keeps it constant (rl.lr_schedule 'constant', no warm-up), our reading. It gives
    no mini-batches or PPO epochs either: one optimizer update per prompt batch (rl.mu 1),
    ours.
  - The SFT warm-up is ours (the paper RL-trains Qwen3-8B directly): a from-scratch CPU model
    cannot write the format without it. Its oracle (prompts.py) reads the gold decomposition;
    its predicted queries use the gold answers (the oracle "knows" the next hop). It is kept
    short (sft.steps) so that RL has room. `sft.steps=0` turns it off (':paper').
  - Eq. 5 weights the terms (α 0.2, β 0.3, γ 0.2) and Algorithm 1 sums them unweighted:
    r2ag.reward.weighting 'eq5' (default) or 'sum'.
  - The format reward: 0.01 for a well-formed base-Q part and 0.01 for a well-formed
    predicted-Q part after the <think> (the paper: "0.01 for each occurrence", at most 0.02).
  - A gold document hit by several queries of one step counts once (rewards.py says how).
  - The forest is bounded (config keys r2ag.forest.*): `size` questions per forest,
    `max_children` continuations per expansion (most gold found first; rollouts that end at the
    same context are one), `max_size` expansions per level. Algorithm 1 keeps every rollout's
    tree; with G = 12 that fan-out is unbounded. A level's last batch is topped up with repeats
    so every update has one shape. The trainer's rl.steps bounds training; a spent forest is
    followed by a new one over the next questions.
  - r2ag.forest.carry: 'gold' (default and ':paper', the paper's d^{j+1} = g~) carries only
    the gold documents found so far to the next iteration; 'branch' (':long_warmup') carries
    every document the branch retrieved, as inference's branches hold them. The forest's gold
    contexts and the SFT oracle's never show the steering model a non-gold document, while at
    evaluation most steps after the first have one, and there the default's model stops
    before the gold is complete (docs/results/README.md, "R2AG: the contexts inference
    builds").
  - Zero-spread groups are dropped as in Algorithm 1 (the engine's rl.dynamic_sampling: their
    loss masks zeroed); rl.dynamic_max_tries > 1 draws replacements (3 draws in the CPU
    default; 1, none, in ':paper'). In the CPU trials about 5% of groups were flat.
  - Evaluation: t limits the queries expanded per output (r2ag.eval.t_base; the paper's main
    tables t = M/2 with M the dataset's maximum hops: 2 on the world; ':paper' sets it per
    dataset with r2ag.eval.t_base_by_dataset, M from section 3.1's hop counts: HotpotQA 2
    -> t 1, 2Wiki 4 -> 2, MuSiQue 2-4 -> 2); predicted queries per
    output r2ag.eval.t_pred (the paper does not say; ours 1) join each base child (the
    composite node). The paper samples at T 0.6, top-p 0.9 (':paper'); the CPU default is greedy.
  - Iterations L_MAX-I = 5 in training and evaluation, as in the paper; the CPU forest stops at
    r2ag.forest.max_iterations.
  - Values the paper does not give, ours: at most r2ag.eval.max_branches = 8 open branches per
    question per round (bounds the tree's cost), the generator reads the first
    r2ag.eval.generator_max_docs = 8 retrieved documents and writes at most answer_tokens = 16
    tokens, with Qwen3's thinking off (r2ag.eval.generator_thinking=False: its template's empty
    think block, so the 16 tokens go to the answer; the policy's prompts: model.thinking), and
    ':paper' splits each update into rl.micro_batches = 64 (memory only). The single-step
    baseline retrieves r2ag.eval.sr_k = 5 documents (the paper's SR@5).
"""
import ml_collections

from rlrag_jax import config_base


def base_config() -> ml_collections.ConfigDict:
  c = config_base.trainer_config("r2ag", "runs/r2ag")
  c.r2ag = ml_collections.ConfigDict(dict(
      role="steering",
      train_top_k=1,                     # k in training (Top-Survivor: top-1)
      passage_words=0,                   # evidence cut to this many words (0: whole)
      oracle_predicted=True,             # the SFT oracle writes predicted queries
      reward=ml_collections.ConfigDict(dict(
          alpha=0.2, beta=0.3, gamma=0.2, ell=1.25, t_base=4, t_pred=2,
          format_per_part=0.01, format_max=0.02, weighting="eq5")),
      forest=ml_collections.ConfigDict(dict(size=32, max_iterations=5, max_children=2,
                                            max_size=64, carry="gold")),
      eval=ml_collections.ConfigDict(dict(
          top_k=1, other_top_k=(2,), base_only=True, t_base=2, t_pred=1, max_iterations=5,
          # 'dataset:t' entries: t_base for the evaluation questions of that dataset (source);
          # () or a dataset not named: t_base.
          t_base_by_dataset=(),
          max_branches=8, temperature=0.0, top_p=1.0, sr_k=5, generator_max_docs=8,
          answer_tokens=16,
          # Qwen3's template: False renders the empty think block, so the generator's
          # answer_tokens go to the answer, not to <think> (models.lm.encode_prompt).
          generator_thinking=False))))
  c.models.generator = ml_collections.ConfigDict(dict(
      path="runs/r2ag_generator", train_config="configs/r2ag_generator.py"))
  c.retrieval = config_base.retrieval_config()
  # DAPO as Eq. 6: token-level clipped loss, clip-higher, no KL term.
  c.rl.algo = "grpo"
  c.rl.aggregation = "token_mean"
  c.rl.clip_eps_low = 0.2
  c.rl.clip_eps_high = 0.28
  c.rl.kl_beta = 0.0
  # Algorithm 1 drops the groups whose rewards do not vary (the engine's dynamic sampling,
  # their loss masks zeroed); one draw a step: no replacements.
  c.rl.dynamic_sampling = True
  c.rl.dynamic_max_tries = 1
  return c


def get_config(arg: str = ""):
  c = base_config()
  if arg in ("", "default", "cpu", "long_warmup", "gpu"):
    c.data.world = config_base.world_config(**config_base.SMALL_WORLD)
    c.data.prompt_style = "compact"
    c.rl.dynamic_max_tries = 3           # two draws of replacements for dropped groups
    c.r2ag.forest.size = 32
    # A partial warm-up: after 500 steps the model writes the format but copies the question's
    # entities into its queries only some of the time (held-out recall ~0.12), so RL has room.
    c.sft.steps = 600
    c.sft.batch_size = 32
    c.sft.lr = 3e-3
    c.sft.max_len = 512
    c.sft.pack_bucket = 64
    c.rl.steps = 150
    c.rl.prompts_per_step = 8
    c.rl.group_size = 8
    c.rl.lr = 1e-4
    c.rl.temperature = 1.0
    c.rl.max_new_tokens = 80
    c.rl.pack_bucket = 64
    c.eval.max_new_tokens = 80
    c.eval.num_examples = 200
    c.checkpoint.every = 30
    c.export_hf = False
    if arg == "long_warmup":
      # A warm-up that copies the question's names (1,200 SFT steps; held-out recall ~0.56),
      # and RL over forests that carry every retrieved document on, as inference's branches
      # hold them. 20 min on 2 cores, past the default's 15-minute budget.
      c.sft.steps = 1200
      c.r2ag.forest.carry = "branch"
    if arg == "gpu":
      _gpu(c)
  elif arg == "paper":
    config_base.use_hf_model(c)
    # Appendix G.1: the steering model writes <think>...</think> before its queries, and a step
    # without it scores 0 (appendix B.2). That is Qwen3-8B's own thinking output: the template
    # leaves the model to open <think> (thinking off would pre-fill an empty think block in
    # the prompt, and the reward reads only the completion).
    c.model.thinking = True
    c.models.generator = ml_collections.ConfigDict(dict(path=""))
    c.data.prompt_style = "paper"
    # Appendix B.2: 500 random HotpotQA, 3,000 2Wiki and 1,174 MuSiQue training questions
    # (4,674 RR-Forests), drawn per dataset with `seed`; a split smaller than its quota (the
    # shared samples) is taken whole (data.allow_short, warned).
    c.data.mix = ("hotpotqa:train:500", "2wiki:train:3000", "musique:train:1174")
    c.data.allow_short = True
    # Appendix B.2: 150 2Wiki + 150 MuSiQue training questions as 300 validation RR-Forests,
    # drawn (seeded) from what the training quotas leave of those splits. Evaluated every 10 RL
    # steps (the checkpoint interval; the paper gives none) by held-out Recall (ours: the paper
    # names no validation metric); the best state is kept, and 3 validations without a better
    # one stop RL ("early stopping applied to prevent overfitting"; the patience is ours).
    c.data.val_mix = ("2wiki:train:150", "musique:train:150")
    c.eval.val_every = 10
    c.eval.val_metric = "recall"
    c.eval.early_stop_patience = 3
    # 1,000 random dev questions of each (appendix C.2), min(1,000, available) on smaller sets.
    c.data.eval_mix = ("hotpotqa:dev:1000", "2wiki:dev:1000", "musique:dev:1000")
    c.data.eval_allow_short = True
    c.data.max_eval = 0
    c.retrieval.backend = "scann"
    c.r2ag.forest.size = 4674          # 500 HotpotQA + 3,000 2Wiki + 1,174 MuSiQue
    c.r2ag.forest.max_size = 4674 * 2
    # Appendix C.2 / D.1: t = M/2 with M the dataset's maximum hops (section 3.1: HotpotQA 2,
    # 2Wiki 4, MuSiQue 2-4); t_base stays 2 for any other source.
    c.r2ag.eval.t_base_by_dataset = ("hotpotqa:1", "2wiki:2", "musique:2")
    c.r2ag.eval.temperature = 0.6
    c.r2ag.eval.top_p = 0.9
    c.sft.steps = 0
    c.rl.steps = 80                    # "converges within approximately 80 steps"
    c.rl.prompts_per_step = 128
    c.rl.group_size = 12
    c.rl.micro_batches = 64
    c.rl.lr = 1e-6
    c.rl.lr_schedule = "constant"
    c.rl.temperature = 1.0
    c.rl.max_new_tokens = 4096
    c.eval.max_new_tokens = 4096
    c.eval.num_examples = 3000
    c.checkpoint.every = 10
  else:
    raise ValueError(f"configs/r2ag.py: unknown preset {arg!r}; expected '', 'long_warmup', "
                     f"'gpu' or 'paper'")
  return c


def _gpu(c) -> None:
  """':gpu' on top of the CPU default: the model, compute dtype, RL batch, forest and lr that
  change (the module docstring gives the budget arithmetic)."""
  config_base.gpu_sized(c)
  c.r2ag.forest.size = 32 * 7         # 4 root steps a forest, as on CPU (32 / 8)
  c.r2ag.forest.max_size = 64 * 7
