"""Learning When to Search: a multi-turn search agent trained with DAPO and the two-stage
retrieval-count reward.

  python -m rlrag_jax.train --config=configs/search.py            # CPU default, embedded world
  python -m rlrag_jax.train --config=configs/search.py:paper \\
      --config.model.path=/path/to/Qwen2.5-3B-Instruct --config.data.dir=/path/to/data \\
      --config.retrieval.corpus=/path/to/wiki.jsonl

Presets (`get_config(arg)`):
  ''      a small model trained from scratch on the embedded world: SFT warm-up on gold search
          trajectories (real retrieval in the observations), then RL with stage-1 rewards and,
          from RL step `reward.stage2_step`, stage-2 rewards; held-out evaluation every
          `eval.every` RL steps (the accuracy-vs-RC curve) and, at the end, the agent against the
          no-retrieval and naive-RAG pipelines. Sized for a 2-core CPU (one document per
          search).
  'gpu'   the CPU default sized for one NVIDIA H100: three seeds in about 8 minutes (2.6 min a
          seed, compile included), an estimate until measured on a GPU (see "GPU budget"
          below). The same world, retriever, rewards, stage switch (RL step 11), evaluations
          and SFT-then-DAPO pipeline. Differences from the CPU default:
            - a 4x wider model: hidden 512, 8 heads x 64 (4 KV heads), intermediate 1536,
              still 4 layers (13.6M params against 1.05M);
            - bf16 compute over float32 master params (model.dtype);
            - 7x the RL samples a step: 56 prompts x 8 = 448 (CPU 8 x 8), the same 40 steps.
              Stage 1 reaches steps x SNR 0.16 at the default, and the APEX planner's RL,
              which gains, 3.5 (docs/results/README.md, "Gradient noise"); 7x the batch is
              7x the SNR, 1.1: better, still short of the 22x that would match it;
            - lr SFT 1.5e-3 (CPU 3e-3) and RL 5e-5 (CPU 1e-4): scaled by 1/sqrt(width ratio
              4), between the standard parametrisation (same lr: a 4x wider model's function
              moves further per Adam step) and muP's 1/width; ours, to be tuned on a GPU.
  'paper' the paper's protocol (appendix B, Table 5): Qwen3-4B/8B (set model.path; Qwen2.5
          and Qwen3 checkpoints load), 32 rollouts per prompt, 32 prompts per step, 500 steps,
          at most 5 searches, temperature 1.0, top-p 1.0, lr 1e-6 constant (no warmup, no
          decay), KL 1e-4, DAPO (clip 0.2 / 0.28, token-mean loss, dynamic sampling on the
          group's correctness spread), top-5 documents, 2Wiki train split 80/20, the B.4
          instruction, correctness (reward and accuracy) by the B.4 LLM judge (set
          reward.judge_url / reward.judge_model), r_s as Eq. 8, the table's lengths (prompt
          2048, observation 4096, action 8192, response 16384 tokens). Stage 2 from step 251.
          Qwen3's thinking on (model.thinking): the B.4 format's opening <think>...</think> is
          the reasoning model's own, written in the completion where the parser reads it.
  Ablations of the paper's Table 4 / Table 2, each 'paper' with one change:
  'paper_no_stage1'  stage-2 rewards from the first step (no stage 1).
  'paper_no_stage2'  stage-1 rewards throughout (no stage 2).
  'paper_no_rs'      without the search reward r_s.
  'paper_no_ra'      without the answer reward r_a.
  'paper_unified'    the unified single-stage answer reward (correct 1 - beta RC, wrong
                     -1 + beta RC) of the paper's Table 2 comparison.

GPU budget (':gpu'; assumptions, to be checked on a GPU): training FLOPs ~ 6 x params x
tokens, sampling ~ 2 x params x generated tokens; updates at 20% MFU of the H100's ~990 bf16
TFLOP/s (198 TFLOP/s); a decode step bound by reading the weights (54.5 MB in float32) and the
KV cache (4 KB a token) at ~2 TB/s, with a floor of 0.3 ms a step (a 4-layer step's kernel
launches); compile at 2.18 s a program, the H100's cold compile of the main job (91.4 s for its
42 programs, docs/results/accelerator/), times the programs counted (`compile/count`) over a
CPU run of the CPU default (120 SFT + 4 RL steps and both evaluations; the :gpu run's own
count is the check; the model's 4 layers make the same graphs).
With N = 13.6M params (6N = 8.2e7 FLOP a token):
  SFT       600 steps x 16 rows x 256 tokens (padded) = 2.46M tokens: 2.0e14 FLOP, 1.0 s
  RL update 40 x 448 episodes x at most 384 tokens (tool.max_total_len) = 6.9M tokens, no
            reference forward (kl_beta 0): 5.6e14 FLOP, 2.8 s
  sampling  at most 5 turns x 40 new tokens a step: 2N x 40 x 448 x 200 = 9.8e13 FLOP (up to
            3x with dynamic sampling's redraws); 40 x 200 RL decode steps (up to 24k with
            redraws) + 5 evaluations x 200 = 13k-29k decode steps at ~0.3 ms (bandwidth:
            0.03-0.37 ms as the KV cache grows to 0.7 GB): 4-9 s
  compile   77 programs x 2.18 s = 168 s, cold (seeds 2 and 3 read them from the
            persistent compilation cache: on CPU 7 s for 101 s cold, docs/results/compile_cache/)
That is ~176-181 s for a cold seed, over its 156 s share: the tool loop's context buckets make
the most programs of the methods; seeds 2 and 3 read them back, so three seeds take ~190-210 s
and two cache reads. The rest is for host work (world, tokenizer, the retrieval index and
MiniLM query encodings, the tool loop's parsing and observations, evaluations and baselines),
which only a GPU run measures.

Differences from the paper ('paper' and its ablations), with the reason:
  - Learning-rate schedule: constant. The paper names no schedule; its training framework's
    default is a constant lr, so we use that (our inference) and stage 2 trains at the full lr.
  - KL: the prose (section 3) says DAPO removes the KL term, Table 5 sets kl_loss_coef 1e-4; we
    keep the table's 1e-4 (set rl.kl_beta=0 for the prose's reading).
  - r_s: Eq. 8 as printed (the pair sum over i<j divided by N(N-1)), which is half the "mean of
    pairwise cosine similarities" the prose describes; `reward.rs_form='pairwise_mean'` is the
    prose's reading (the CPU default uses it). The equation is the paper's definition, so the
    preset follows it.
  - r_s embeddings: the paper uses Qwen3-Embedding; we use the packaged MiniLM encoder
    (all-MiniLM-L6-v2) for r_s and retrieval. The paper retrieves with e5 (mean pooling) over
    the September 2025 Wikipedia, prepared with FlashRAG (its retriever setup section); the
    preset searches the shared 2Wiki corpus sample (retrieval.corpus '2wiki'): point it at
    your corpus (ScaNN index; the encoder is MiniLM, not e5). Evaluating open-domain sets
    (NQ, TriviaQA, PopQA, Bamboogle) with no corpus named is refused at the config check
    (config_check.NeedsCorpus) rather than searching the 2Wiki questions' paragraphs.
  - Stage switch: the paper does not say when stage 2 starts; we switch at step 251 (half way).
  - Evaluation breadth: the paper evaluates seven benchmarks (NQ, TriviaQA, PopQA, HotpotQA,
    2Wiki, MuSiQue, Bamboogle); this preset evaluates on the held-out 20% of 2Wiki train.
    Loaders exist for all seven (`rlrag_jax.data.loaders`: popqa included); run
    `python -m rlrag_jax.evaluate` with data.eval_mix set to each. The paper gives no
    per-benchmark counts. The validation check every 30 steps reads 1,000 random questions
    (seeded) of the held-out 20% (data.max_eval; the paper: the whole 20%, ~33k questions, too
    many to decode every 30 steps at 8,192 tokens a turn).
  - Judge: the paper's judge is Qwen3-235B-A22B-Instruct; any OpenAI-compatible endpoint works
    here. Prediction and gold answers are normalised (lowercase, no punctuation or articles)
    before they fill the B.4 template, as B.4 says; a reply that is neither yes nor no, and a
    failed request, count as "not judged" (reward 0 for correctness, logged as judge_failed;
    judge/calls, judge/failures, judge/failure_rate per step). More than
    reward.judge_max_failure_rate of the last reward.judge_failure_window calls failed, the run
    stops (judge.EndpointFailing) instead of training on the zeros.
  - The B.4 instruction is followed by "Question: {question}" on its own line (the paper does
    not show where the question goes).
  - Lengths: prompts over 2048 tokens are left out of training (counted); observations are cut to
    4096 tokens; each model turn (action) is limited to 8192 new tokens and prompt + response
    to 2048 + 16384.
  - Micro-batching (16 per update) is ours (memory), the update itself is one step per batch of
    32 x 32 completions (ppo_mini_batch_size 32).
  - Values the paper does not give, ours: the clip range 0.2 / 0.28 (rl.clip_eps_low /
    rl.clip_eps_high: Eq. 3 names epsilon_low and epsilon_high without values; these are
    DAPO's), the retrieval-count weight beta 0.3 in Eqs. 10-11 (reward.beta), top-5 documents a
    search (tool.top_k; Figure 5 varies k without naming the training value), redraws of
    flat groups (rl.dynamic_max_tries 3).

Method-specific sections (the trainer reads the others):
  reward     beta, stage2_step (first RL step with stage-2 rewards; <= 0: never), match ('em' |
             'f1' | 'judge'), f1_threshold, max_query_words (conciseness rule), judge_url / judge_model
             (optional OpenAI-compatible judge of correctness; off by default), judge_concurrency
             (its requests in flight at once), judge_max_failure_rate / judge_failure_window
             (the run stops once more than that share of the last that many judge calls failed;
             1.0: never; past 5% a warning is logged), rs_form ('eq8' |
             'pairwise_mean'), answer_form ('staged' | 'unified'), use_search / use_answer
             (ablations: r_s / r_a left out of the total).
  tool       top_k documents per search, max_turns (searches per episode), max_obs_tokens (per
             observation, closing tag kept), max_prompt_len (> 0: longer training prompts are
             left out, counted), max_total_len (prompt + completion), min_batch and
             context_bucket (padding of the tool loop's generate calls: fewer compiled programs),
             kv_reuse (keep each row's KV cache between turns and prefill only the new
             observation, and prefill a GRPO group's prompt once; False re-prefills every
             context each turn).
  retrieval  backend ('exact' | 'scann'), corpus ('' = the data source's own corpus, else a name
             in loaders.CORPORA or a JSONL path), encoder_path ('' = packaged MiniLM),
             cache_dir ('' = <workdir>/retriever), scann_brute_force_below (a corpus with fewer
             passages gets ScaNN's exact float brute force, not the partitioned index),
             url ('' = search in process; else a retrieval server of Search-R1's protocol,
             `python -m rlrag_jax.retrieval.serve`: the passage searches go there, r_s still
             embeds queries locally) with url_timeout_s, url_retries, url_max_failure_rate and
             url_failure_window (config_base.RETRIEVAL_SERVICE).
  search     the agent's own SFT and evaluation keys (methods/search/settings.py):
             sft.known_min_seen (SFT targets recall, do not search, the gold steps whose fact
             occurs in at least this many other training questions; all steps recalled =
             structure A; 0: every step searched), sft.observation_loss (SFT also trains on the
             retrieved passages in its targets), eval.baselines (the no-retrieval and naive-RAG
             pipelines in the final report), eval.naive_k (naive RAG's top-k).
`rl.max_new_tokens` and `eval.max_new_tokens` are per-turn limits here.
"""
import ml_collections

from rlrag_jax import config_base


def base_config() -> ml_collections.ConfigDict:
  """The trainer's shared sections (`rlrag_jax.config_base`) plus the search agent's keys."""
  c = config_base.trainer_config("search", "runs/search")
  c.data.mix = ("2wiki:train",)         # name:split for 'files'
  c.data.eval_mix = ("2wiki:dev",)      # ignored when train_frac < 1
  c.data.train_frac = 1.0               # < 1: hold out the rest of the training selection
  c.data.max_contexts = 0               # contexts are not shown: the agent retrieves

  c.sft.pack_bucket = 128
  # The agent's own keys; the trainer's shared sections (sft, eval) hold none of them.
  c.search = ml_collections.ConfigDict(dict(
      sft=ml_collections.ConfigDict(dict(
          known_min_seen=8,
          observation_loss=False)),     # also train on the retrieved passages in SFT targets
      eval=ml_collections.ConfigDict(dict(
          baselines=True,               # no-retrieval and naive-RAG pipelines in the report
          naive_k=5))))

  # DAPO: clip-higher, token-level loss, dynamic sampling, a tiny KL (the paper's table: 1e-4).
  c.rl.max_new_tokens = 48              # per turn
  c.rl.kl_beta = 1e-4
  c.rl.clip_eps_high = 0.28
  c.rl.aggregation = "token_mean"
  c.rl.dynamic_sampling = True          # refill groups whose rewards are all equal
  c.rl.dynamic_max_tries = 2
  c.rl.pack_bucket = 128

  c.reward = ml_collections.ConfigDict(dict(
      beta=0.3, stage2_step=0, match="em", f1_threshold=0.5, max_query_words=6,
      judge_url="", judge_model="",
      judge_concurrency=16,             # judge requests in flight at once
      # The run stops once more than this share of the last judge_failure_window judge calls
      # failed (a failed call scores as a wrong answer); 1.0: never stop.
      judge_max_failure_rate=0.5, judge_failure_window=200,
      rs_form="pairwise_mean", answer_form="staged", use_search=True, use_answer=True))
  c.tool = ml_collections.ConfigDict(dict(
      top_k=5, max_turns=5, max_obs_tokens=600, max_total_len=4096, min_batch=8,
      context_bucket=128, max_prompt_len=0, kv_reuse=True))
  c.retrieval = config_base.retrieval_config()

  c.eval.max_new_tokens = 48
  return c


def get_config(arg: str = ""):
  c = base_config()
  if arg in ("", "default", "cpu", "gpu"):
    # A smaller world than the project default (860 passages, 1920 / 240 / 240 questions): the
    # tiny model meets every name often enough to learn to copy names into queries and answers
    # within the CPU budget (on the full world 300 SFT steps left it below 5% EM).
    c.data.world = config_base.world_config(**config_base.SMALL_WORLD)
    c.data.prompt_style = "compact"     # a from-scratch model gains nothing from a fixed preamble
    c.data.max_eval = 240               # the whole dev split
    c.sft.steps = 600
    c.sft.batch_size = 16
    c.sft.lr = 3e-3
    c.sft.max_len = 384
    c.sft.pack_bucket = 64
    c.search.sft.observation_loss = True   # its only "pretraining": the passages it retrieves
    c.search.sft.known_min_seen = 8
    c.rl.steps = 40
    c.rl.prompts_per_step = 8
    c.rl.group_size = 8
    c.rl.lr = 1e-4
    # Sampling temperature 0.7, not the paper's 1.0: at 1.0 only ~17% of this tiny model's
    # training rollouts answer correctly (greedy: ~36%), so stage-2 groups rarely hold correct
    # answers with different search counts and stage 2 cannot tell cheap from costly successes
    # (a 40-step trial at 1.0 left mean RC flat through stage 2). At 0.7: ~27% correct.
    c.rl.temperature = 0.7
    c.rl.max_new_tokens = 40
    c.rl.kl_beta = 0.0                  # DAPO drops the KL term; ':paper' keeps the table's 1e-4
    c.rl.pack_bucket = 64
    # Short stage 1: the SFT warm-up already searches, and stage 1's "wrong: -1 + beta*RC" pays
    # for extra searches on wrong answers (the policy learns "Next step." + an irrelevant search
    # after it found the answer; 20 stage-1 steps raised RC 1.94 -> 2.79 and cut EM 0.36 -> 0.30).
    # Ten steps of it, then 30 of stage 2. Both knobs were picked from four 40-step RL trials
    # on the same warm-up, judged on the held-out eval curve (the world has no third split):
    # T 1.0 / switch 21: stage 2 RC 2.47 -> 2.47; T 0.7 / 21: 2.79 -> 2.66; T 0.7 / 11, two
    # sampling seeds: 2.35 -> 2.22 and 2.25 -> 2.07, EM up 4.1 and 0.9 points.
    c.reward.stage2_step = 11           # RL steps 1-10 stage 1, 11-40 stage 2
    # One document per search: gold keyword queries find their passage at rank 1 in 99% of
    # cases on the world, so a second one would only lengthen every sequence.
    c.tool = ml_collections.ConfigDict(dict(
        top_k=1, max_turns=5, max_obs_tokens=64, max_total_len=384, min_batch=16,
        context_bucket=128, max_prompt_len=0, kv_reuse=True))
    c.eval.every = 10                   # RL step 10 is the end of stage 1
    c.eval.num_examples = 240
    c.eval.max_new_tokens = 40
    c.eval.batch_size = 240
    c.checkpoint.every = 1000           # the final checkpoint only (the report reloads it)
    c.export_hf = False
    if arg == "gpu":
      _gpu(c)
  elif arg in PAPER_PRESETS:
    _paper(c)
    if arg == "paper_no_stage1":
      c.reward.stage2_step = 1
    elif arg == "paper_no_stage2":
      c.reward.stage2_step = 0
    elif arg == "paper_no_rs":
      c.reward.use_search = False
    elif arg == "paper_no_ra":
      c.reward.use_answer = False
    elif arg == "paper_unified":
      c.reward.answer_form = "unified"
  else:
    raise ValueError(f"configs/search.py: unknown preset {arg!r}; expected '', 'gpu' or one "
                     f"of {PAPER_PRESETS}")
  return c


PAPER_PRESETS = ("paper", "paper_no_stage1", "paper_no_stage2", "paper_no_rs", "paper_no_ra",
                 "paper_unified")


def _gpu(c) -> None:
  """':gpu' on top of the CPU default: the model, compute dtype, RL batch and lr that change
  (the module docstring gives the budget arithmetic)."""
  config_base.gpu_sized(c)


def _paper(c) -> None:
  """The paper's protocol (see the module docstring for each value's source)."""
  config_base.use_hf_model(c)         # set --config.model.path=/path/to/Qwen3-4B
  # B.4: "Always begin with <think>...</think>", Qwen3's own thinking output: the template
  # leaves the model to open <think> (thinking off would pre-fill an empty think block in the
  # prompt, and the parser reads only the completion).
  c.model.thinking = True
  c.data.prompt_style = "paper"
  c.data.mix = ("2wiki:train",)
  c.data.eval_mix = ()                # evaluation = the held-out 20% of the training selection
  c.data.train_frac = 0.8
  c.data.max_eval = 1000
  c.rl.steps = 500
  c.rl.prompts_per_step = 32
  c.rl.group_size = 32
  c.rl.temperature = 1.0
  c.rl.top_p = 1.0
  c.rl.max_new_tokens = 8192          # max_action_length, per model turn
  c.rl.lr = 1e-6
  c.rl.lr_schedule = "constant"
  c.rl.warmup_ratio = 0.0
  c.rl.kl_beta = 1e-4
  c.rl.clip_eps_low = 0.2
  c.rl.clip_eps_high = 0.28
  c.rl.aggregation = "token_mean"
  c.rl.dynamic_sampling = True
  c.rl.dynamic_sampling_key = "correct"
  c.rl.dynamic_max_tries = 3
  c.rl.micro_batches = 16
  c.rl.mu = 1
  c.reward.stage2_step = 251
  c.reward.rs_form = "eq8"
  c.reward.match = "judge"            # correctness by the B.4 judge (reward and accuracy)
  c.reward.judge_model = "Qwen3-235B-A22B-Instruct"   # set reward.judge_url to its endpoint
  c.tool = ml_collections.ConfigDict(dict(
      top_k=5, max_turns=5, max_obs_tokens=4096, max_total_len=2048 + 16384, min_batch=8,
      context_bucket=256, max_prompt_len=2048, kv_reuse=True))
  c.retrieval.backend = "scann"
  c.retrieval.corpus = "2wiki"        # the shared sample's corpus; point it at a full one
  c.eval.every = 30                   # "a validation check every 30 optimization steps"
  c.eval.num_examples = 1000
  c.eval.max_new_tokens = 8192
  c.eval.batch_size = 256
  c.eval.judge_url = ""               # the accuracy metric's judge (python -m rlrag_jax.evaluate)
  c.checkpoint.every = 30
