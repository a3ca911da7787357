"""Token-budget updates compile a bounded set of programs: over a run of steps whose episodes
vary in length, the learner's accumulate and log-prob jits compile at most once per width
bucket (`rl.packing.width_buckets`), though the micro-batches meet more (width, logits start)
pairs than that, each of which a static start compiled once. Counted from jax.monitoring's
compile events (`training.compiles.CompileCounter`), never timed."""
import jax
import jax.numpy as jnp
import numpy as np

from configs import arena
from rlrag_jax import trainer
from rlrag_jax.models import sharding as shd
from rlrag_jax.models.config import ModelConfig
from rlrag_jax.rl.packing import (logits_start, pack_micro_batch, packed_lengths,
                                  plan_micro_batches, width_buckets)
from rlrag_jax.tasks import Episode
from rlrag_jax.training import learners
from rlrag_jax.training.compiles import CompileCounter
from stub_task import batch_of

CFG = ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                  num_kv_heads=1, head_dim=8, max_position_embeddings=128, model_type="llama",
                  tie_word_embeddings=True, eos_token_id=(1,), pad_token_id=0)
BUCKET, BUDGET, MAX_PROMPT, MAX_COMPLETION, STEPS = 4, 96, 24, 24, 6


def _episodes(rng, n: int = 8) -> list:
  """n episodes in groups of 2 (shared prompts), lengths drawn anew each step."""
  eps = []
  for _ in range(n // 2):
    prompt = list(rng.integers(2, 64, size=int(rng.integers(1, MAX_PROMPT + 1))))
    for _ in range(2):
      c = int(rng.integers(1, MAX_COMPLETION + 1))
      eps.append(Episode(example=None, prompt_ids=prompt,
                         completion_ids=list(rng.integers(2, 64, size=c)), loss_mask=[1] * c,
                         text=""))
  return eps


def _width_starts(eps) -> set:
  """The (width, logits_start) pairs of the step's micro-batches: the programs a static
  start compiled."""
  prompts, completions = [e.prompt_ids for e in eps], [e.completion_ids for e in eps]
  masks = [e.loss_mask for e in eps]
  out = set()
  for mb in plan_micro_batches(*packed_lengths(prompts, completions), BUDGET, bucket=BUCKET):
    b = pack_micro_batch(prompts, completions, masks, mb, bucket=BUCKET)
    out.add((mb.width, logits_start(b["loss_mask"], BUCKET)))
  return out


def test_token_budget_run_compiles_at_most_one_program_per_width_bucket():
  c = arena.get_config("")
  c.rl.update(dict(algo="grpo", prompts_per_step=4, group_size=2, pack_bucket=BUCKET,
                   kl_beta=0.04, mu=2, micro_batches=1, tokens_per_micro_batch=BUDGET,
                   steps=STEPS))
  mesh = shd.make_mesh(data=1, fsdp=1, tensor=1)
  steps = trainer.Steps(c, CFG, mesh, 0, STEPS)
  params = steps.module.init(jax.random.PRNGKey(0), np.ones((1, 8), np.int32),
                             np.ones((1, 8), np.int32))["params"]
  learner = learners.make_learner(c, steps, mesh, CFG, pad_id=0)
  state = steps.new_state(params, "rl")
  ref = jax.tree_util.tree_map(jnp.copy, state.params)        # as the RL stage makes it
  rng = np.random.default_rng(0)
  pairs, widths = set(), set()
  with CompileCounter() as counter:
    for i in range(STEPS):
      eps = _episodes(rng)
      pairs |= _width_starts(eps)
      widths |= {w for w, _ in _width_starts(eps)}
      scores = [{"total": float(s)} for s in rng.uniform(0, 1, len(eps))]
      state, _, m = learner.update(state, None, batch_of(eps, scores, 2), ref,
                                   jax.random.PRNGKey(i))
      assert np.isfinite(m["loss"])
  bound = len(width_buckets(MAX_PROMPT + MAX_COMPLETION, BUCKET))
  programs = {name: n for name, (n, _, _) in counter.by_function.items()}
  # one accumulate program per width met (the batch's keys are the same every step), one
  # log-prob forward per width (old and reference log-probs share it: same shapes)
  assert programs["jit(accumulate)"] == len(widths) <= bound
  assert programs["jit(forward)"] == len(widths) <= bound
  assert len(pairs) > len(widths)          # what a static start compiled instead
