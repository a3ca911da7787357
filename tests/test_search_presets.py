"""configs/search.py presets carry the paper's protocol values (Table 5, section 3, appendix B)."""
import pytest

from configs import search

PAPER = ("paper", "paper_no_stage1", "paper_no_stage2", "paper_no_rs", "paper_no_ra",
         "paper_unified")


@pytest.mark.parametrize("preset", PAPER)
def test_paper_protocol(preset):
  c = search.get_config(preset)
  assert (c.rl.group_size, c.rl.prompts_per_step, c.rl.steps) == (32, 32, 500)
  assert (c.rl.temperature, c.rl.top_p, c.rl.lr, c.rl.kl_beta) == (1.0, 1.0, 1e-6, 1e-4)
  assert c.rl.lr_schedule == "constant" and c.rl.warmup_ratio == 0.0    # stage 2 at full lr
  assert (c.rl.clip_eps_low, c.rl.clip_eps_high, c.rl.aggregation) == (0.2, 0.28, "token_mean")
  assert c.rl.dynamic_sampling and c.rl.dynamic_sampling_key == "correct"
  assert (c.rl.prompts_per_step * c.rl.group_size) % c.rl.micro_batches == 0
  assert c.tool.max_turns == 5 and c.tool.top_k == 5
  # Table 5 lengths: prompt, observation, action (per turn), response.
  assert (c.tool.max_prompt_len, c.tool.max_obs_tokens, c.rl.max_new_tokens) == (2048, 4096, 8192)
  assert c.tool.max_total_len == 2048 + 16384
  assert tuple(c.data.mix) == ("2wiki:train",) and c.data.train_frac == 0.8
  assert tuple(c.data.eval_mix) == ()
  assert c.reward.beta == 0.3 and c.reward.match == "judge" and c.reward.rs_form == "eq8"
  assert c.data.prompt_style == "paper" and c.model.init == "hf" and c.sft.steps == 0


def test_ablations_change_only_their_part():
  base = search.get_config("paper")
  assert (base.reward.stage2_step, base.reward.answer_form) == (251, "staged")
  assert base.reward.use_search and base.reward.use_answer
  assert search.get_config("paper_no_stage1").reward.stage2_step == 1
  assert search.get_config("paper_no_stage2").reward.stage2_step == 0
  assert not search.get_config("paper_no_rs").reward.use_search
  assert not search.get_config("paper_no_ra").reward.use_answer
  assert search.get_config("paper_unified").reward.answer_form == "unified"
  for name in PAPER[1:]:
    c = search.get_config(name)
    assert (c.rl.lr, c.rl.steps, c.rl.group_size) == (base.rl.lr, base.rl.steps, 32)


def test_cpu_default_keeps_its_own_choices():
  c = search.get_config("")
  assert c.data.prompt_style == "compact" and c.reward.match == "em"
  assert c.reward.rs_form == "pairwise_mean"
  with pytest.raises(ValueError, match="unknown preset"):
    search.get_config("papers")
