"""SPARKLE's frozen reader for the CPU default: a small model SFT-trained on the embedded world
to write the next reasoning step from (context, question, thoughts so far): the fact of a step
whose documents are in the context, else the need for it, then the answer (the oracle reader of
rlrag_jax/methods/sparkle/prompts.py). Its training walks meet a need with probability
`sparkle.reader_sft.retrieve_prob` and add a retrieved distractor with `distractor_prob`, so the
reader sees unmet needs and noisy contexts. configs/sparkle.py points `models.reader` at this
run and trains it once, on first use.

  python -m rlrag_jax.train --config=configs/sparkle_reader.py

Evaluated under a perfect proxy (every need met with its gold documents): answer EM / F1 and
`thought_match`, how often a thought equals the oracle's at that state.

Presets (`get_config(arg)`):
  ''       a small model from scratch on the embedded world (the CPU default's reader).
  'paper'  a short SFT of an HF checkpoint (set model.path) on the oracle walks of the real
           data that has a gold decomposition (2Wiki, MuSiQue); only for a reader that needs
           adapting to the one-step-per-call format.

Differences from the paper, with the reason:
  - The paper's reader is Qwen2.5-7B-Instruct used as is (':paper' of configs/sparkle.py points
    `models.reader.path` at such a checkpoint and trains none). A from-scratch CPU model cannot
    reason without training, so the CPU default trains this one first.
"""
import ml_collections

from rlrag_jax import config_base


def get_config(arg: str = ""):
  if arg == "paper":
    c = config_base.load_config_file("configs/sparkle.py:paper")
    c.workdir = "runs/sparkle_reader_paper"
    c.sparkle.role = "reader"
    c.models = ml_collections.ConfigDict()
    c.stages = ("sft",)
    c.rl.steps = c.rl.epochs = 0         # SFT only (the proxy's preset counts RL epochs)
    c.rl.algo, c.rl.kl_form = "grpo", "loss"      # no RL: the learner is never stepped
    # Walks need a gold decomposition: examples without one are left out (logged).
    c.data.mix = ("2wiki:train", "musique:train")
    # The reader's own held-out check (ours; not a paper number): up to 500 random dev
    # questions of each, drawn per dataset (data.eval_allow_short from the proxy's preset).
    c.data.eval_mix = ("2wiki:dev:500", "musique:dev:500")
    c.eval.num_examples = 1000
    c.sft.epochs = 0                     # a fixed short SFT, not the proxy's 1 epoch
    c.sft.steps = 100
    c.sft.batch_size = 64
    c.sft.lr = 1e-5
    c.sft.max_len = 2048
    c.eval.max_new_tokens = 160
    return c
  if arg not in ("", "default", "cpu"):
    raise ValueError(f"configs/sparkle_reader.py: unknown preset {arg!r}; expected '' or "
                     "'paper'")
  c = config_base.load_config_file("configs/sparkle.py")
  c.workdir = "runs/sparkle_reader"
  c.model.init, c.model.path, c.model.train_config = "scratch", "", ""   # from scratch
  c.sparkle.role = "reader"
  c.models = ml_collections.ConfigDict()
  c.stages = ("sft",)
  c.rl.steps = 0
  c.rl.algo = "grpo"
  c.sft.steps = 850
  c.sft.group_by_length = 8   # length-sorted batches: a third of the padding, twice the steps
  c.sft.batch_size = 32
  c.sft.lr = 3e-3
  c.sft.max_len = 512
  c.sft.prompt_loss = 0.3     # LM loss on the context and question too: its only pretraining
  c.eval.num_examples = 100
  c.eval.max_new_tokens = 40
  c.checkpoint.every = 600
  return c
