"""Search-R1 (Jin et al. 2025, "Search-R1: Training LLMs to Reason and Leverage Search Engines
with Reinforcement Learning", arXiv 2503.09516): one LLM reasons in <think>, searches with
<search> query </search>, reads <information> blocks and answers in <answer>; trained with PPO
(or GRPO) on the exact match of its answer, the retrieved tokens masked out of the loss.

  python -m rlrag_jax.train --config=configs/search_r1.py          # CPU default, embedded world
  python -m rlrag_jax.train --config=configs/search_r1.py:paper \\
      --config.model.path=/path/to/Qwen2.5-7B --config.data.dir=/path/to/flashrag_data \\
      --config.retrieval.corpus=/path/to/wiki-18.jsonl
  python -m rlrag_jax.evaluate --config=configs/search_r1.py:paper --checkpoint=DIR \\
      --config.retrieval.corpus=wiki18 --config.search_r1.published=qwen2.5-7b-base-ppo

Its own method folder (rlrag_jax/methods/search_r1/: prompt, parsing, EM reward, Task, report)
on the shared tool loop, rather than presets of configs/search.py: the search agent's task is
built around that paper's protocol (structure A/B parsing, the two-stage retrieval-count
reward, <reflect>, its SFT recall rule), none of which Search-R1 has, and branching it on a
preset would put two protocols' rules in one prompt, parser and reward.

Presets (`get_config(arg)`):
  ''            a small model trained from scratch on the embedded world (its passages are the
                corpus): an SFT warm-up on demonstrations in Search-R1's format (one search per
                gold step, the retrieved passages masked), then PPO on EM with a separate
                critic; Search-R1's tags, masking and EM reward, sized for a 2-core CPU (top-1,
                short observations). One run, seed 0, at a80e49e (23.5 min on 2 cores shared
                with other jobs): held-out EM on the 240 world dev questions 0.163 after the
                warm-up, 0.183 after 20 PPO steps (interval [0.133, 0.233] over questions,
                evaluate); one seed, so no claim that PPO helps. `python -m rlrag_jax.evaluate
                --config=configs/search_r1.py --checkpoint=<run>` gives the same 0.183.
  'grpo'        the CPU default with GRPO, 5 samples per question, instead of PPO.
  'paper'       the paper's protocol with PPO, for its models: Qwen2.5-3B or -7B, base or
                instruct (set model.path; the evaluation report stands beside the published row
                named by search_r1.published). NQ + HotpotQA train merged; top-3 passages of
                the 2018 Wikipedia (wiki-18) corpus, which must be given (retrieval.corpus, or
                retrieval.index / retrieval.url: the preset refuses to start without one); at
                most 4 searches; 500-token turns and 500-token observations; 4,096 tokens in
                all; reward = EM of the extracted answer, no format reward; retrieved tokens
                masked; PPO: actor lr 1e-6, critic lr 1e-5, KL 0.001 (k3, verl's low_var_kl)
                as a loss term, clip 0.2, GAE lambda 1 and gamma 1; temperature 1; evaluation:
                EM on NQ, TriviaQA, PopQA (test), HotpotQA, 2Wiki, MuSiQue (dev), Bamboogle
                (test), greedy.
  'paper_grpo'  'paper' with GRPO: 5 responses per prompt, no critic (the same lr, KL, clip).

Values from the paper that this file sets (tests/test_search_r1.py checks them): actor lr 1e-6,
critic lr 1e-5, KL 0.001 (low_var_kl), clip 0.2, GAE lambda 1 / gamma 1, top-3, 4 searches,
500-token responses and observations, GRPO group 5, EM reward without a format term, NQ +
HotpotQA training, the seven evaluation sets.

Values we set from our memory of the authors' released scripts (verl-based), not checked
against them here; marked so that nobody cites them as the paper's:
  - 512 prompts a step, PPO mini-batch 256 (rl.ppo.mini_batches 2), 1,005 steps, a constant lr
    after a linear warm-up of 0.285 of the steps (the critic's warm-up, 0.015, has no key here:
    the critic warms up as the policy does), 4,096 tokens in all, value clip 0.5 (verl's
    default), whitened advantages, a token-mean loss.

Differences from the paper ('paper', 'paper_grpo'), with the reason:
  - Retriever: the paper searches wiki-18 (21M passages) with e5-base-v2. Here the encoder is
    the packaged MiniLM unless retrieval.encoder_path names an e5-base-v2 folder (its 'query: '
    / 'passage: ' prefixes and mean pooling come with it; this project may not download it),
    and the corpus is whatever retrieval.corpus / index / url names (an index built by
    `python -m rlrag_jax.retrieval.build`, or a server of Search-R1's retrieval protocol,
    theirs or `python -m rlrag_jax.retrieval.serve`): the shared sample `wiki18` holds 1,000
    of the 21M passages, enough to run the protocol, far too few to reproduce its numbers.
  - Training data: NQ train is not among the shared samples and HotpotQA train holds 110
    questions; point data.dir at FlashRAG's full sets. A missing training file leaves the task
    without training data (a training run stops; evaluation runs).
  - Evaluation on the shared samples: NQ and TriviaQA are 800-question subsamples of FlashRAG's
    test splits, HotpotQA 1,000 of 7,405 dev, 2Wiki 462 of 12,576, MuSiQue 93 of 2,417 (the
    ones with paragraphs; their paragraphs are not used), Bamboogle 100 of 125, PopQA absent
    (listed as missing). The paper evaluates the full sets.
  - The authors' loop appends a message asking the model to try again after a turn that
    neither searches nor answers, and lets it answer once more after its last search; here
    such a turn ends the episode (EM 0), and a fifth search ends it at 'max_turns'.
  - The prompt: the released template (rlrag_jax/methods/search_r1/prompts.py), reproduced
    from memory. It goes through the tokenizer's chat template when it has one (Qwen2.5's base
    and instruct tokenizers both do; model.chat_template=False sends plain text), as we
    remember the released data pipeline doing; not checked.

Method-specific sections (the trainer reads the others):
  tool       top_k passages per search, max_turns (searches per episode), max_obs_tokens (per
             <information> block, closing tag kept), max_total_len (prompt + completion),
             min_batch and context_bucket (padding of the tool loop's generate calls),
             kv_reuse (keep each row's KV cache between turns).
  retrieval  config_base.retrieval_config: corpus / index / url (one of them for real data),
             backend, encoder_path, cache_dir, scann_brute_force_below.
  search_r1  eval_per_dataset (> 0: a seeded draw of at most that many questions of each
             evaluation set; 0: all), published (the row of methods/search_r1/report.py's
             PUBLISHED the evaluation report stands beside; '' none).
`rl.max_new_tokens` and `eval.max_new_tokens` are per-turn limits (the paper's response length).
"""
import ml_collections

from rlrag_jax import config_base

# The seven evaluation sets ('name:split'): test where the set has a public one, else dev.
SEARCH_R1_EVAL = ("nq:test", "triviaqa:test", "popqa:test", "hotpotqa:dev", "2wiki:dev",
                  "musique:dev", "bamboogle:test")
PRESETS = ("", "grpo", "paper", "paper_grpo")


def base_config() -> ml_collections.ConfigDict:
  """The trainer's shared sections plus Search-R1's: the paper's tool, reward and PPO values."""
  c = config_base.trainer_config("search_r1", "runs/search_r1")
  c.data.mix = ("nq:train", "hotpotqa:train")          # merged and shuffled
  c.data.eval_mix = SEARCH_R1_EVAL
  c.search_r1 = ml_collections.ConfigDict(dict(eval_per_dataset=0, published=""))
  c.tool = ml_collections.ConfigDict(dict(
      top_k=3, max_turns=4, max_obs_tokens=500, max_total_len=4096, min_batch=8,
      context_bucket=256, kv_reuse=True))
  c.retrieval = config_base.retrieval_config()
  c.rl.algo = "ppo"
  c.rl.max_new_tokens = 500             # per turn
  c.rl.lr = 1e-6
  c.rl.kl_beta = 0.001
  c.rl.kl_estimator = "k3"              # verl's low_var_kl
  c.rl.kl_form = "loss"
  c.rl.clip_eps_low = 0.2
  c.rl.clip_eps_high = 0.2
  c.rl.temperature = 1.0
  c.rl.top_p = 1.0
  c.rl.aggregation = "token_mean"
  c.rl.ppo.update(dict(critic="separate", gamma=1.0, lam=1.0, vf_lr=1e-5, vf_clip=0.5,
                       whiten=True, mini_batches=1))
  c.eval.max_new_tokens = 500
  return c


def get_config(arg: str = ""):
  c = base_config()
  if arg in ("", "default", "cpu", "grpo"):
    _cpu(c)
    if arg == "grpo":
      _grpo(c)
  elif arg in ("paper", "paper_grpo"):
    _paper(c)
    if arg == "paper_grpo":
      _grpo(c)
  else:
    raise ValueError(f"configs/search_r1.py: unknown preset {arg!r}; expected one of "
                     f"{PRESETS}")
  return c


def _grpo(c) -> None:
  """GRPO instead of PPO: 5 responses per prompt, group-relative advantages, no critic."""
  c.rl.algo = "grpo"
  c.rl.group_size = 5


def _cpu(c) -> None:
  """The embedded world on a 2-core CPU (see the module docstring)."""
  c.data.source = "world"
  c.data.world = config_base.world_config(**config_base.SMALL_WORLD)
  c.data.prompt_style = "compact"
  c.data.max_eval = 240
  c.sft.steps = 400
  c.sft.batch_size = 16
  c.sft.lr = 3e-3
  c.sft.max_len = 384
  c.rl.steps = 20
  c.rl.prompts_per_step = 8
  c.rl.group_size = 1                   # PPO: one response a prompt ('grpo': 5)
  c.rl.lr = 1e-4
  c.rl.ppo.vf_lr = 5e-4
  c.rl.max_new_tokens = 40
  c.rl.kl_beta = 0.001
  c.tool = ml_collections.ConfigDict(dict(
      top_k=1, max_turns=4, max_obs_tokens=64, max_total_len=384, min_batch=16,
      context_bucket=128, kv_reuse=True))
  c.eval.num_examples = 240
  c.eval.batch_size = 240
  c.eval.max_new_tokens = 40
  c.checkpoint.every = 1000
  c.export_hf = False


def _paper(c) -> None:
  """The paper's protocol (module docstring: which values are the paper's, which ours)."""
  config_base.use_hf_model(c)           # set --config.model.path=/path/to/Qwen2.5-7B
  c.data.prompt_style = "paper"
  c.data.max_eval = 0
  c.retrieval.backend = "scann"
  c.rl.steps = 1005
  c.rl.prompts_per_step = 512
  c.rl.group_size = 1
  c.rl.lr_schedule = "constant"
  c.rl.warmup_ratio = 0.285
  c.rl.ppo.mini_batches = 2             # 512 / 256
  c.rl.micro_batches = 8
  c.eval.num_examples = 10 ** 9         # every question of the seven sets
  c.eval.batch_size = 256
  c.checkpoint.every = 100
