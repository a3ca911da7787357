"""The trainer's config sections, shared by every method's `configs/<method>.py`.

A method config starts from `trainer_config(method, workdir)` and then sets what is its own:
its data mix, its reward section, its tool or rollout section, and the values of the shared
keys that differ for it (e.g. ARENA's k2 KL, the search agent's DAPO clip-higher). The
trainer (`rlrag_jax.trainer`) reads these sections for every method:

  data      source ('world' | 'files'), world (world.build keyword sizes), dir (RLRAG_DATA_DIR
            override for 'files'), max_train / max_eval (0 = all), prompt_style ('paper' |
            'compact'), skip_invalid (count and skip malformed records instead of failing),
            allow_short (a mix count above a split's size takes the whole split, warned),
            eval_allow_short (the same for eval_mix counts: min(count, available) per dataset),
            check_overlap (refuse train/eval question overlap); mix / eval_mix entries are
            'name:split[:count]' (see `rlrag_jax.data.sources`); val_mix: validation entries
            'name:split:count', drawn from what train and eval leave of each split (disjoint;
            () = no validation set), for eval.val_every.
  model     init ('scratch' | 'hf'), path (HF checkpoint dir when 'hf'), chat_template,
            thinking (Qwen3's enable_thinking in the chat template; False: a direct answer), dtype
            (compute), param_dtype (the trained master params: float32 by default, so that
            small-lr updates do not round away in bfloat16; exports are written in it),
            remat, attention_block (> 0: key-blocked attention with an online softmax, no
            [T, S] score matrix: for long contexts; 0: dense), scan_layers (the blocks of the
            update and log-prob forward as one lax.scan over stacked params: one layer
            compiled and, under FSDP, gathered at a time; the sampler stays unrolled),
            attention (the causal attention of the update, the log-probs and the sampler's
            prefills: 'xla', or 'pallas',
            Pallas forward and backward kernels that write no score, made for GPUs and not yet
            run on one: rlrag_jax/models/flash_attention.py; attention_block is then unused),
            decode_attention (the sampler's attention over the KV cache: 'xla', or 'pallas',
            one Pallas kernel a layer made for GPUs, not yet run on one:
            rlrag_jax/sampling/cache_attention.py), decode_attention_splits (with 'pallas':
            the cache split into this many ranges of blocks, combined after, so that a small
            batch still fills the GPU; 0: as many as reach cache_attention.MIN_PROGRAMS
            programs, 1: one pass), and the from-scratch shape
            (vocab_size is the size of the tokenizer trained on the world's text).
  mesh      data / fsdp / tensor axis sizes (-1: the rest of the devices).
  distributed  jax.distributed.initialize arguments for multi-host runs.
  sft       warm-up: steps (0 = none), epochs (> 0: the steps are computed at start-up as
            ceil(epochs x SFT samples / batch) over the task's real SFT samples, one model
            call each (training.stages.resolve_steps), and sft.steps must be 0; 0 = off),
            batch_size, lr, lr_schedule, warmup_ratio, weight_decay,
            max_len, pack_bucket (batch widths round up to it: fewer recompiles), group_by_length
            (batches of similar-length samples, within windows of that many batches),
            micro_batches, tokens_per_micro_batch, logits_chunk, head_backward (as rl's).
  rl        algo ('grpo' | 'dr_grpo' | 'rloo': group advantages of the named estimator;
            'ppo': a critic, see rl.ppo and rlrag_jax.training.learners), steps, epochs (as
            sft.epochs, over the training prompts at prompts_per_step a step; with dynamic
            sampling a step may draw more), prompts_per_step, group_size, sampling
            (temperature, top_k, top_p, max_new_tokens), optimiser (lr, lr_schedule cosine |
            linear | constant after the warmup, warmup_ratio, weight_decay, max_grad_norm), KL
            (kl_beta, kl_estimator k1 | k2 | k3, kl_form loss | reward: a term of the policy
            loss, or, PPO only, -kl_beta x the estimate on each policy token's reward before
            GAE with the loss term off), PPO clip (clip_eps_low / _high, dual_clip),
            entropy_coef (an entropy bonus: minus it times the aggregated entropy in the loss),
            aggregation (sequence_mean | token_mean | constant), advantages (scale_std,
            adv_eps), mu (updates per batch), micro_batches (equal splits accumulated in the
            step), tokens_per_micro_batch (> 0 replaces them: episodes sorted by length into
            micro-batches of at most that many padded tokens, each at its own width, for the
            updates and the log-prob / value forwards; peak memory follows it; 0: off),
            logits_chunk (logit elements computed at once: log-probs in chunks of tokens
            against the LM head, recomputed in the backward pass; 0: the full logits),
            head_backward (a chunk's backward pass: 'fused' = one recomputation of its logits
            and one elementwise pass, 'autodiff', 'auto' = fused in reduced precision),
            dynamic_sampling (+ max tries;
            dynamic_sampling_key: the reward entry whose spread within a group keeps it, e.g.
            'total' or 'correct' as DAPO does),
            pack_bucket; ppo (algo 'ppo': critic 'separate' = a value LM started from the
            policy's backbone and trained whole, or 'head' = a value head on the policy's
            current backbone, trained alone (no second backbone to train; the policy loss alone
            shapes the features), or 'tree_mc' = no value model: a tree rollout's parent-node
            Monte-Carlo returns are the values), gamma, lam (GAE), vf_lr, vf_clip (0 =
            unclipped value loss),
            whiten (advantages), whiten_by (an Episode.info key, e.g. SPARKLE's 'role': whiten
            separately within each of its values), mini_batches (per epoch; rl.mu epochs),
            mini_batch_size (> 0: episodes per mini-batch instead, max(1, round(n / size))
            mini-batches of the step's n episodes, sizes within one of each other; the RL lr
            schedules then count RL steps, every update of a step at that step's lr)).
  eval      every (RL steps; 0 = before and after RL only), num_examples, max_new_tokens,
            val_every (RL steps between evaluations of the validation set, data.val_mix; 0:
            none), val_metric (its summary's metric, higher is better: the best state is kept
            under <workdir>/best and is what the final evaluation, report and export use),
            early_stop_patience (validations without a new best before RL stops; 0: never),
            batch_size, optional OpenAI-compatible judge (judge_url, judge_model;
            judge_concurrency requests in flight at once; judge_max_failure_rate /
            judge_failure_window: stop once more than that share of the last that many judge
            calls failed, 1.0: never; see rlrag_jax.judge).
  stages    the training stages in order (training.stages.plan): ('sft', 'rl'); a stage with
            no steps is skipped; ('sft',) for a model that is only SFT-trained (R2AG's
            generator, SPARKLE's reader, APEX's executor).
  checkpoint  every, keep;  log_every;  export_hf (an HF checkpoint of the final policy).
  compile_cache  the persistent XLA compile cache ('auto': ~/.cache/rlrag_jax/xla; '': off).

`trainer.run` checks every value against the table of `rlrag_jax.config_check` (the shared
sections) and `rlrag_jax/methods/<method>/config_rules.py` (a method's own) before it builds
anything.
"""
import ml_collections

# `section`: how every method's settings.py parses its sections (rlrag_jax.settings).
from rlrag_jax.settings import ConfigError, section  # noqa: F401 (re-exported)


# The CPU defaults' smaller world (860 passages, 1920 / 240 / 240 questions): a from-scratch
# model meets each name often enough to learn to copy it within a 2-core CPU budget.
SMALL_WORLD = dict(num_countries=12, num_cities=48, num_people=320, num_orgs=80, num_films=200,
                   num_books=200, num_questions=2400)


def world_config(**overrides) -> ml_collections.ConfigDict:
  """`data.world`: the seed and every `world.WorldConfig` field at its default, so that any
  size or mix can be set from the command line (--config.data.world.num_people=320)."""
  import dataclasses
  from rlrag_jax.data import world as world_lib
  fields = {f.name: f.default for f in dataclasses.fields(world_lib.WorldConfig)}
  unknown = set(overrides) - set(fields) - {"seed"}
  if unknown:
    raise ValueError(f"data.world: unknown keys {sorted(unknown)}; expected seed or one of "
                     f"{sorted(fields)}")
  return ml_collections.ConfigDict({"seed": 0, **fields, **overrides})


def trainer_config(method: str, workdir: str) -> ml_collections.ConfigDict:
  """The shared sections with their defaults (a small from-scratch model, GRPO)."""
  c = ml_collections.ConfigDict()
  c.method = method
  c.seed = 0
  c.workdir = workdir

  c.data = ml_collections.ConfigDict(dict(
      source="world", world=world_config(), dir="", max_train=0,
      max_eval=200, prompt_style="paper", skip_invalid=False, allow_short=False,
      eval_allow_short=False, check_overlap=True, val_mix=()))

  c.model = ml_collections.ConfigDict(dict(
      init="scratch", path="", chat_template=True, dtype="float32", param_dtype="float32",
      # A chat template that reads `enable_thinking` (Qwen3's): False renders the empty think
      # block, so the model answers directly; True lets it open <think> (models.lm.encode_prompt).
      thinking=False, remat=False, scan_layers=False, attention="xla",
      decode_attention="xla", decode_attention_splits=0,
      attention_block=0, vocab_size=2048, hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4,
      num_kv_heads=2, head_dim=32, max_position_embeddings=1024))

  # Auxiliary frozen LMs by name, e.g. c.models.reader = ConfigDict(dict(path="runs/reader")):
  # loaded once, sharded on the mesh, handed to task.bind_models (rlrag_jax/run_dirs.py).
  c.models = ml_collections.ConfigDict()
  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
  c.distributed = ml_collections.ConfigDict(dict(initialize=False, coordinator_address="",
                                                 num_processes=0, process_id=-1))

  c.sft = ml_collections.ConfigDict(dict(
      steps=0, batch_size=32, lr=3e-3, lr_schedule="cosine", warmup_ratio=0.05,
      epochs=0.0,          # > 0: steps = ceil(epochs x SFT samples / batch), computed at
                           # start-up from the task's data (sft.steps then 0); 0: off
      weight_decay=0.0, max_len=512, pack_bucket=64,
      group_by_length=0,   # > 0: batches of similar-length SFT samples (sft_samples tasks),
                           # sorted within windows of this many batches (less padding)
      prompt_loss=0.0,     # > 0: that loss weight on prompt tokens too (LM training on the
                           # passages, the only "pretraining" a from-scratch model gets)
      micro_batches=1,     # gradient accumulation inside the step (smaller live buffers)
      tokens_per_micro_batch=0,    # > 0: micro-batches of at most this many padded tokens,
                                   # packed by length (replaces micro_batches; 0: off)
      logits_chunk=2 ** 26,        # logit elements (tokens x vocab) computed at once (as rl's)
      head_backward="auto"))       # the chunked head's backward pass (as rl's)

  c.rl = ml_collections.ConfigDict(dict(
      algo="grpo", steps=0, prompts_per_step=8, group_size=8, temperature=1.0, top_k=0,
      epochs=0.0,          # > 0: steps = ceil(epochs x training prompts / prompts_per_step)
      top_p=1.0, max_new_tokens=128, lr=1e-4, lr_schedule="cosine", warmup_ratio=0.0,
      weight_decay=0.0, max_grad_norm=1.0, kl_beta=0.04, kl_estimator="k3",
      kl_form="loss",     # 'reward' (PPO): -kl_beta * KL on each policy token's reward instead
      clip_eps_low=0.2, clip_eps_high=0.2,
      dual_clip=0.0, entropy_coef=0.0, aggregation="sequence_mean", scale_std=True, adv_eps=1e-4, mu=1,
      micro_batches=1, tokens_per_micro_batch=0, dynamic_sampling=False,
      dynamic_sampling_key="total",
      dynamic_max_tries=3, pack_bucket=64,
      # The LM head's logits in chunks of at most this many elements a device (tokens x vocab:
      # 2**26 is 256 MiB in float32, 441 tokens at Qwen's 151,936 vocabulary), each recomputed
      # in the backward pass: no [tokens, vocab] array in the updates and log-prob forwards. A batch
      # whose logits fit at once takes the unchunked path (the CPU defaults' always do); 0: off.
      logits_chunk=2 ** 26,
      # The backward pass of each chunk: 'fused' (one recomputation of the chunk's logits and
      # one elementwise pass; rl.logprobs.fused_head_stats), 'autodiff', or 'auto' (fused in
      # reduced-precision compute, autodiff in float32, whose exact sums the CPU defaults'
      # results were made with).
      head_backward="auto",
      # rl.algo == 'ppo' only: the critic and GAE (rlrag_jax.training.learners.PPOLearner)
      ppo=ml_collections.ConfigDict(dict(
          critic="separate", gamma=1.0, lam=0.95, vf_lr=1e-4, vf_clip=0.2, whiten=True,
          whiten_by="",   # an Episode.info key: whiten separately per value (e.g. 'role')
          mini_batches=1,
          # > 0: episodes per update instead: each epoch splits the step's (shuffled) episodes
          # into max(1, round(n / mini_batch_size)) mini-batches, and the lr schedules count
          # RL steps (learners.schedule_by_rl_step); 0: rl.ppo.mini_batches counts them
          mini_batch_size=0))))

  c.eval = ml_collections.ConfigDict(dict(
      every=0, num_examples=200, max_new_tokens=128, batch_size=64, judge_url="", judge_model="",
      val_every=0, val_metric="em", early_stop_patience=0,
      judge_concurrency=16,           # judge requests in flight at once
      # The evaluation stops once more than this share of the last judge_failure_window judge
      # calls failed (a failed call scores as a wrong answer); 1.0: never stop.
      judge_max_failure_rate=0.5, judge_failure_window=200))
  c.checkpoint = ml_collections.ConfigDict(dict(every=50, keep=2))
  c.stages = ("sft", "rl")  # the stages in order (training.stages.plan); a stage without
                            # steps is skipped; ("sft",): an SFT-only model (a reader, generator)
  c.log_every = 5
  c.compile_cache = "auto"  # persistent XLA cache folder; '': off (rlrag_jax.compile_cache)
  c.export_hf = True
  return c


def retrieval_config(**overrides) -> ml_collections.ConfigDict:
  """The `retrieval` section of every method that retrieves (rlrag_jax.retrieval.from_config).

    backend               'exact' | 'scann'
    corpus                '' = the data selection's own corpus (the embedded world), else the
                          deduplicated contexts of its examples; or a name in loaders.CORPORA /
                          a corpus file (FlashRAG JSONL, {title, text} JSONL, DPR TSV)
    index                 '' or a prebuilt index folder (`python -m rlrag_jax.retrieval.build`):
                          its passages are the corpus and its vectors are searched; refused when
                          its encoder or conventions differ from the ones below
    encoder_path          '' = the packaged MiniLM; else a BERT-family HF folder (E5, BGE, ...)
    pooling               '' = the encoder folder's (sentence-transformers files, E5/BGE name);
                          'mean' | 'cls'
    query_prefix, passage_prefix   'auto' = the encoder's ('query: ' / 'passage: ' for E5);
                          any other string is used as is ('' = none)
    cache_dir             where indexes built on first use are kept ('' = <workdir>/retriever)
    scann_brute_force_below  corpora smaller than this get ScaNN's float brute force (exact)
    url, url_*            a retrieval server of Search-R1's protocol instead (RETRIEVAL_SERVICE)

  A config that holds open-domain questions must set one of corpus / index / url
  (`config_check.NeedsCorpus`).
  """
  c = ml_collections.ConfigDict(dict(
      backend="exact", corpus="", index="", encoder_path="", pooling="", query_prefix="auto",
      passage_prefix="auto", cache_dir="",
      scann_brute_force_below=16384,    # scann: exact brute force for smaller corpora
      **RETRIEVAL_SERVICE))             # url: a retrieval server instead (README)
  c.update(overrides)
  return c


# Retrieval as a service: the keys every `retrieval` section takes beside its own (backend,
# corpus, ...). `url` '' searches in process; a url ('http://127.0.0.1:8000') sends the passage
# searches to a server of Search-R1's protocol (`python -m rlrag_jax.retrieval.serve`, or
# Search-R1's own) through `rlrag_jax.retrieval.client.RemoteRetriever`: each request bounded
# by url_timeout_s seconds and retried url_retries times (transport errors, 5xx, 429; the pause
# doubling from 0.5 s); a search that still fails gives its queries no passages and is counted,
# and the run stops once more than url_max_failure_rate of the last url_failure_window
# searches failed.
RETRIEVAL_SERVICE = dict(url="", url_timeout_s=30.0, url_retries=3, url_max_failure_rate=0.1,
                         url_failure_window=100)


# A run's saved config.json (read back by `methods/apex/pipeline.py`, the one reader of saved
# configs) lacks the keys added after the run started: each with the value that reproduces what
# such a run did. A method's own keys are in its `settings.ADDED_LATER`; `fill_added_later`
# applies both where the saved config is loaded, so that no reader defaults a key.
ADDED_LATER = {
    "model.thinking": False,     # Qwen3's template rendered as before the key: thinking off
    "sft.epochs": 0.0,           # sft.steps counted the SFT warm-up
    "model.scan_layers": False,  # the blocks ran unrolled
    "retrieval.scann_brute_force_below": 16384,   # ScaNN's default then (index.BRUTE_FORCE_BELOW)
    "retrieval.index": "",              # no prebuilt index: the corpus was indexed in the run
    "retrieval.pooling": "",            # the encoder folder's own conventions
    "retrieval.query_prefix": "auto",
    "retrieval.passage_prefix": "auto",
    **{f"retrieval.{k}": v for k, v in RETRIEVAL_SERVICE.items()},   # searched in process
}


def fill_added_later(config, *tables) -> list:
  """Sets each dotted key of `tables` that `config` (a saved config, unlocked) lacks to its
  value, in a section the config has; returns the keys set (for a log line)."""
  filled = []
  for table in tables:
    for key, value in table.items():
      *parents, leaf = key.split(".")
      node = config
      for p in parents:
        node = node[p] if (hasattr(node, "keys") and p in node) else None
        if node is None:
          break
      if node is not None and leaf not in node:
        node[leaf] = value
        filled.append(key)
  return filled


def stage_runs(section) -> bool:
  """Whether the stage of config section `sft` / `rl` trains: fixed steps or epochs above 0."""
  return int(section.steps) > 0 or float(section.epochs) > 0


def use_hf_model(c: ml_collections.ConfigDict, *, remat: bool = True,
                 attention_block: int = 512, scan_layers: bool = True) -> None:
  """The accelerator presets' model and mesh: an HF checkpoint computed in bf16 over float32
  master params (set model.path),
  rematerialised blocks and key-blocked attention (contexts of thousands of tokens), scanned
  over their stacked params (a 7B update on 8 devices plans 35.9 GiB a device instead of 69.8;
  on one device `--config.model.scan_layers=False` is leaner: docs/results/memory), parameters
  sharded over all devices (FSDP), no SFT warm-up."""
  c.data.source = "files"
  c.model.init = "hf"
  c.model.path = ""
  c.model.dtype = "bfloat16"
  c.model.remat = remat
  c.model.attention_block = attention_block
  c.model.scan_layers = scan_layers
  c.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, tensor=1))
  c.sft.steps = 0


# The ':gpu' presets' model: 4x the CPU defaults' width (hidden 128 -> 512), the same depth and
# head / GQA ratios, bf16 compute over float32 master params.
GPU_MODEL = dict(hidden_size=512, num_heads=8, num_kv_heads=4, head_dim=64,
                 intermediate_size=1536, num_layers=4, dtype="bfloat16", param_dtype="float32")
GPU_WIDTH_RATIO = 4
GPU_SAMPLES_RATIO = 7


def gpu_sized(c: ml_collections.ConfigDict) -> None:
  """What every ':gpu' preset changes in its CPU default: `GPU_MODEL`, 7x the prompts (or
  trees) a step, and the SFT and RL lrs divided by sqrt(4) for the 4x width (between the
  standard parametrisation's same lr and muP's 1/width; ours, to be tuned on a GPU)."""
  c.model.update(GPU_MODEL)
  c.rl.prompts_per_step *= GPU_SAMPLES_RATIO
  c.sft.lr /= GPU_WIDTH_RATIO ** 0.5
  c.rl.lr /= GPU_WIDTH_RATIO ** 0.5


def load_config_file(spec: str) -> ml_collections.ConfigDict:
  """`path/to/config.py[:preset]` -> the ConfigDict its `get_config(preset)` returns.

  A relative path resolves against the working directory, then the repository root.
  """
  import importlib.util
  import pathlib
  path_s, _, preset = str(spec).partition(":")
  path = pathlib.Path(path_s).expanduser()
  root = pathlib.Path(__file__).resolve().parents[1]
  if not path.is_absolute() and not path.exists():
    path = root / path
  if not path.is_file():
    raise FileNotFoundError(f"config {spec!r}: no file at {path_s} (nor under {root})")
  mod_spec = importlib.util.spec_from_file_location(f"_config_{path.stem}", path)
  mod = importlib.util.module_from_spec(mod_spec)
  mod_spec.loader.exec_module(mod)
  return mod.get_config(preset)
