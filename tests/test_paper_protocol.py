"""Each `paper` preset against its paper's protocol, one table row a preset: the training quota
per dataset, the batch per optimizer update, the optimizer updates one RL step makes, the
epochs, the lr and its schedule, the KL (coefficient, estimator, where it acts) and the clip.
The values are the papers' (section in each row's comment), not read from the configs, so a
preset that drifts from its paper fails here; a value a paper lost is left out of its row (the
config docstring lists our choice). Evaluation counts per dataset are tests/test_eval_protocol.py's;
epochs counted over the data loaded are tests/test_train_protocol.py's. Configs only: no data,
no model."""
import pytest

from rlrag_jax import config_base
from rlrag_jax.config_base import load_config_file
from rlrag_jax.data import sources
from rlrag_jax.rl import batching
from rlrag_jax.training import learners

PROTOCOL = {
    # Section 4 / appendix F: 10k / 10k / 5k training questions; total batch 256 with 7 rollouts
    # each, one update a batch; lr 3e-6; the k2 estimator (section 3.2) as GRPO's loss term.
    "arena": dict(train={"hotpotqa": 10000, "2wiki": 10000, "musique": 5000},
                  algo="grpo", prompts=256, group=7, updates=1, lr=3e-6,
                  kl=dict(estimator="k2", form="loss")),
    # Table 5 (verl): batch 32 = PPO mini-batch 32 (one update a step), lr 1e-6 constant, KL loss
    # coefficient 1e-4; DAPO's decoupled clip 0.2 / 0.28.
    "search": dict(algo="grpo", prompts=32, updates=1, lr=1e-6, schedule="constant",
                   kl=dict(beta=1e-4, form="loss"), clip=(0.2, 0.28)),
    # Tables 5-6 and D.3: 3,000 HotpotQA and 2Wiki training questions each (NQ has no sample
    # here); SFT lr 5e-6, batch 64, 1 epoch; PPO policy lr 5e-7 cosine, value lr 5e-6, KL 0.002
    # in the reward (OpenRLHF's PPO, which the authors' C-3PO recipe uses), batch 1,024
    # decisions per update.
    "sparkle": dict(train={"hotpotqa": 3000, "2wiki": 3000}, algo="ppo", prompts=64, group=1,
                    mini_batch=1024, lr=5e-7, vf_lr=5e-6, schedule="cosine", rl_epochs=1.0,
                    sft=dict(lr=5e-6, batch=64, epochs=1.0),
                    kl=dict(beta=0.002, form="reward")),
    # Appendix D.3 (verl GRPO): 3 epochs, 8 trajectories a group, a KL loss and an entropy bonus
    # (their coefficients and the batch sizes are lost in the text).
    "apex_planner": dict(train={"musique": 0}, algo="grpo", group=8, rl_epochs=3.0,
                         kl=dict(form="loss"), entropy=True),
    # Appendix D.4: full-parameter SFT with a cosine schedule and warm-up (epochs, lr, batch
    # lost); SFT only.
    "apex_executor": dict(sft=dict(schedule="cosine", warmup=True), rl_steps=0),
    # Appendix B.2: 500 / 3,000 / 1,174 training questions, prompt batch 128, group 12, AdamW
    # at 1e-6, clip 0.2 / 0.28 and no KL (DAPO).
    "r2ag": dict(train={"hotpotqa": 500, "2wiki": 3000, "musique": 1174}, algo="grpo",
                 prompts=128, group=12, updates=1, lr=1e-6, clip=(0.2, 0.28),
                 kl=dict(beta=0.0)),
}


def _quotas(mix) -> dict:
  out = {}
  for spec in mix:
    name, split, count = sources.parse_spec(spec)
    assert split == "train", f"{spec}: training draws from a train split"
    out[name] = count
  return out


@pytest.mark.parametrize("preset", sorted(PROTOCOL))
def test_paper_preset_follows_its_papers_protocol(preset):
  want = PROTOCOL[preset]
  c = load_config_file(f"configs/{preset}.py:paper")
  rl, sft = c.rl, c.sft
  if "train" in want:
    assert _quotas(c.data.mix) == want["train"]
  if "algo" in want:
    assert batching.check_algo(rl) == want["algo"]
  if "prompts" in want:
    assert int(rl.prompts_per_step) == want["prompts"]
  if "group" in want:
    assert int(rl.group_size) == want["group"]
  if "updates" in want:
    assert learners.updates_per_step(rl) == want["updates"]
  if "mini_batch" in want:
    size = want["mini_batch"]
    assert batching.mini_batch_size(rl) == size
    # a step's decisions are cut into max(1, round(n / size)) updates, rl.mu 1 epoch of them
    for n, updates in ((640, 1), (1536, 2), (2500, 2), (3072, 3), (5000, 5)):
      assert learners.updates_per_step(rl, n) == updates
  if "lr" in want:
    assert float(rl.lr) == pytest.approx(want["lr"])
  if "vf_lr" in want:
    assert float(rl.ppo.vf_lr) == pytest.approx(want["vf_lr"])
  if "schedule" in want:
    assert rl.lr_schedule == want["schedule"]
  if "rl_epochs" in want:
    assert float(rl.epochs) == want["rl_epochs"] and int(rl.steps) == 0
  if "rl_steps" in want:
    assert not config_base.stage_runs(rl)
  if "clip" in want:
    assert (float(rl.clip_eps_low), float(rl.clip_eps_high)) == want["clip"]
  kl = want.get("kl", {})
  if "beta" in kl:
    assert float(rl.kl_beta) == pytest.approx(kl["beta"])
  if "estimator" in kl:
    assert rl.kl_estimator == kl["estimator"]
  if "form" in kl:
    assert rl.kl_form == kl["form"]
  if want.get("entropy"):
    assert float(rl.entropy_coef) > 0
  s = want.get("sft", {})
  if "lr" in s:
    assert float(sft.lr) == pytest.approx(s["lr"])
  if "batch" in s:
    assert int(sft.batch_size) == s["batch"]
  if "epochs" in s:
    assert float(sft.epochs) == s["epochs"] and int(sft.steps) == 0
  if "schedule" in s:
    assert sft.lr_schedule == s["schedule"]
  if s.get("warmup"):
    assert float(sft.warmup_ratio) > 0
