"""configs/arena.py presets carry the paper's protocol values (appendices C and F, section 3)."""
import pytest

from configs import arena
from rlrag_jax.data import sources

PAPER = ("paper", "paper_no_bonus", "paper_f1", "paper_judge", "paper_naive", "paper_k3")


@pytest.mark.parametrize("preset", PAPER)
def test_paper_protocol(preset):
  c = arena.get_config(preset)
  quotas = {sources.parse_spec(s)[:2]: sources.parse_spec(s)[2] for s in c.data.mix}
  assert quotas == {("hotpotqa", "train"): 10000, ("2wiki", "train"): 10000,
                    ("musique", "train"): 5000}
  evals = {sources.parse_spec(s)[:2]: sources.parse_spec(s)[2] for s in c.data.eval_mix}
  assert evals == {("hotpotqa", "dev"): 500, ("2wiki", "dev"): 500, ("musique", "dev"): 500}
  assert c.eval.num_examples == 1500 and c.data.max_eval == 0 and c.data.max_train == 0
  assert c.data.check_overlap and not c.data.allow_short
  # 256 prompts x 7 generations per update, one epoch of 25k examples.
  assert c.rl.prompts_per_step == 256 and c.rl.group_size == 7
  assert c.rl.steps == 25000 // 256 == 97
  assert (256 * 7) % c.rl.micro_batches == 0
  assert c.rl.lr == 3e-6 and c.rl.lr_schedule == "cosine" and c.rl.warmup_ratio == 0.1
  assert c.rl.temperature == 0.9 and c.rl.algo == "grpo" and c.sft.steps == 0
  assert c.data.prompt_style == "paper" and c.reward.relevance_parse == "strict"
  assert c.model.init == "hf"


def test_ablations_change_only_their_part():
  base = arena.get_config("paper")
  assert (base.reward.accuracy, base.reward.bonus_value, base.rl.kl_estimator) == ("em", 10.0, "k2")
  assert arena.get_config("paper_no_bonus").reward.bonus_value == 0.0
  assert arena.get_config("paper_f1").reward.accuracy == "f1"
  assert arena.get_config("paper_judge").reward.accuracy == "judge"
  naive = arena.get_config("paper_naive")
  assert (naive.reward.w_relevance, naive.reward.bonus_value) == (0.0, 0.0)
  assert naive.reward.w_format == naive.reward.w_accuracy == 1.0
  assert arena.get_config("paper_k3").rl.kl_estimator == "k3"
  for name in ("paper_no_bonus", "paper_f1", "paper_judge", "paper_k3"):
    c = arena.get_config(name)
    assert (c.rl.prompts_per_step, c.rl.steps, tuple(c.data.mix)) == (
        256, 97, tuple(base.data.mix))


def test_sft_baselines_are_sft_only_with_their_targets():
  direct, reasoning = arena.get_config("sft_direct"), arena.get_config("sft_reasoning")
  assert direct.arena.sft.target == "direct" and reasoning.arena.sft.target == "teacher"
  for c in (direct, reasoning):
    assert c.rl.steps == 0 and c.sft.steps > 0 and c.model.init == "hf"
  with pytest.raises(ValueError, match="unknown preset 'papr'"):
    arena.get_config("papr")
