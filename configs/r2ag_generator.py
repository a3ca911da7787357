"""R2AG's frozen generator for the CPU default: a small model SFT-trained on the embedded world
to answer a question from a set of documents (the gold ones among up to
`r2ag.generator_distractors` retrieved distractors, shuffled). configs/r2ag.py points
`models.generator` at this run and trains it once, on first use, when the run does not exist.

  python -m rlrag_jax.train --config=configs/r2ag_generator.py

Presets (`get_config(arg)`):
  ''       a small model from scratch on the embedded world (the CPU default's generator).
  'paper'  a short SFT of an HF checkpoint (set model.path) on the real data's gold paragraphs
           among retrieved ones; only for a generator that needs it.

Differences from the paper, with the reason:
  - The paper's generator is Qwen3-8B used as is, frozen; configs/r2ag.py:paper points
    `models.generator.path` at such a checkpoint and trains none. A from-scratch CPU model
    cannot answer without training, so the CPU default trains one here first.
"""
import ml_collections

from rlrag_jax import config_base


def get_config(arg: str = ""):
  c = config_base.trainer_config("r2ag", "runs/r2ag_generator")
  c.r2ag = ml_collections.ConfigDict(dict(role="generator", passage_words=0,
                                          generator_distractors=4))
  c.retrieval = config_base.retrieval_config()
  c.stages = ("sft",)
  c.rl.steps = 0
  if arg == "paper":
    config_base.use_hf_model(c)
    c.data.prompt_style = "paper"
    c.data.mix = ("hotpotqa:train", "2wiki:train", "musique:train")
    # The generator's own held-out check (ours; not a paper number): up to 100 random dev
    # questions of each, drawn per dataset; a smaller split is taken whole.
    c.data.eval_mix = ("hotpotqa:dev:100", "2wiki:dev:100", "musique:dev:100")
    c.data.eval_allow_short = True
    c.data.max_eval = 0
    c.eval.num_examples = 300
    c.r2ag.passage_words = 200
    c.retrieval.backend = "scann"
    c.stages = ("sft",)
    c.sft.steps = 200
    c.sft.batch_size = 64
    c.sft.lr = 1e-5
    c.sft.max_len = 4096
    c.eval.max_new_tokens = 32
    return c
  if arg not in ("", "default", "cpu"):
    raise ValueError(f"configs/r2ag_generator.py: unknown preset {arg!r}; expected '' or "
                     "'paper'")
  c.data.world = config_base.world_config(**config_base.SMALL_WORLD)
  c.data.prompt_style = "compact"
  c.sft.steps = 600
  c.sft.batch_size = 32
  c.sft.lr = 3e-3
  c.sft.max_len = 512
  c.sft.pack_bucket = 64
  c.eval.max_new_tokens = 16
  c.eval.num_examples = 200
  c.checkpoint.every = 600
  c.export_hf = False
  return c
