"""experiments.headroom: greedy / sampled / best-of-k / spread, by hand and against the exact
first-token distribution of a tiny checkpoint computed with `transformers`."""
import numpy as np
import pytest

from hf_tiny import load_reference, make_tiny_checkpoint
from rlrag_jax.experiments import headroom
from rlrag_jax.generate import byte_level_tokenizer
from rlrag_jax.rollout.single_turn import single_turn
from stub_task import StubTask


def test_summarize_by_hand():
  r = [[0, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [0.5, 0, 0, 0]]
  s = headroom.summarize(r)
  assert s["sampled"] == pytest.approx((1 + 0 + 4 + 0.5) / 16)
  assert s["best"] == pytest.approx((1 + 0 + 1 + 0.5) / 4)
  assert s["spread"] == pytest.approx(2 / 4)      # rows 0 and 3 differ within the group


@pytest.mark.parametrize("bad", [[], [[]], [1, 0, 1]])
def test_summarize_rejects_a_bad_shape(bad):
  with pytest.raises(ValueError, match="questions, k"):
    headroom.summarize(bad)


class EvenFirstToken(StubTask):
  """Reward 1 when the first generated token id is even (plus a second, constant component)."""

  def __init__(self):
    self.tokenizer = byte_level_tokenizer()

  def prompt_ids(self, ex):
    return self.tokenizer(ex, add_special_tokens=False)["input_ids"]

  def rollout(self, policy, examples, rng, *, group_size=1, greedy=False):
    return single_turn(policy, examples, self.prompt_ids, lambda ids: "", rng,
                       group_size=group_size, greedy=greedy)

  def rewards(self, episodes, step=0):
    return [{"total": float(bool(e.completion_ids) and e.completion_ids[0] % 2 == 0),
             "constant": 1.0} for e in episodes]


def test_headroom_matches_the_exact_first_token_distribution(tmp_path):
  import jax
  import torch
  from rlrag_jax.rollout.policy import Policy
  from rlrag_jax.run_dirs import load_trained
  path = make_tiny_checkpoint(tmp_path, "qwen2", seed=3)
  task = EvenFirstToken()
  prompts = [f"q{i} say:" for i in range(12)]
  ref = load_reference(path)
  k, temps = 64, (1.0, 0.5)
  p_even, greedy_even = {t: [] for t in temps}, []
  with torch.no_grad():
    for p in prompts:
      logits = ref(torch.tensor([task.prompt_ids(p)])).logits[0, -1].double()
      greedy_even.append(float(int(logits.argmax()) % 2 == 0))
      for t in temps:
        prob = torch.softmax(logits / t, -1)
        p_even[t].append(float(prob[0::2].sum()))
  lm = load_trained(str(path))
  policy = Policy(lm.config, lm.params, max_new_tokens=1, eos_ids=(2,), pad_id=0)
  out = headroom.headroom(task, policy, prompts, k=k, temperatures=temps,
                          rng=jax.random.PRNGKey(0), chunk=5, progress=False)
  assert set(out) == {"total", "constant"}
  assert out["total"]["greedy"] == pytest.approx(np.mean(greedy_even))
  for t in temps:
    p = np.array(p_even[t])
    want_sampled = p.mean()
    sd = np.sqrt((p * (1 - p)).sum() / k) / len(p)
    assert abs(out["total"][t]["sampled"] - want_sampled) < 4 * sd + 1e-9, (t, out, want_sampled)
    # best-of-k is the mean over the prompts of Bernoulli(1 - m) draws, m = (1 - p)^k the
    # chance that none of a prompt's k samples is even: mean 1 - mean(m), sd sqrt(sum m(1-m))/n.
    # Here every p >= 0.15, so each m <= 3e-5: one missed prompt (best 11/12) is far outside.
    miss = (1 - p) ** k
    want_best = 1 - miss.mean()
    sd_best = np.sqrt((miss * (1 - miss)).sum()) / len(p)
    assert abs(out["total"][t]["best"] - want_best) < 4 * sd_best + 1e-9, (t, out, want_best)
    assert out["total"][t]["best"] >= out["total"][t]["sampled"]
    assert out["constant"][t] == {"sampled": 1.0, "best": 1.0, "spread": 0.0}
  print("P(even) per temperature:", {t: np.round(p_even[t], 2).tolist() for t in temps})


def test_headroom_rejects_k_below_two():
  with pytest.raises(ValueError, match="k >= 2"):
    headroom.headroom(EvenFirstToken(), None, ["q"], k=1, temperatures=(1.0,), rng=None)


class OneEpisodePerQuestion(EvenFirstToken):
  """A rollout that ignores group_size (as multi-call agents' do): headroom repeats questions."""

  def rollout(self, policy, examples, rng, *, group_size=1, greedy=False):
    return super().rollout(policy, examples, rng, group_size=1, greedy=greedy)


def test_a_rollout_without_groups_gets_each_question_k_times(tmp_path):
  import jax
  from rlrag_jax.rollout.policy import Policy
  from rlrag_jax.run_dirs import load_trained
  lm = load_trained(str(make_tiny_checkpoint(tmp_path, "qwen2", seed=3)))
  policy = Policy(lm.config, lm.params, max_new_tokens=1, eos_ids=(2,), pad_id=0)
  prompts = [f"q{i} say:" for i in range(6)]
  kw = dict(k=4, temperatures=(1.0,), chunk=3, progress=False)
  grouped = headroom.headroom(EvenFirstToken(), policy, prompts, rng=jax.random.PRNGKey(0), **kw)
  single = headroom.headroom(OneEpisodePerQuestion(), policy, prompts,
                             rng=jax.random.PRNGKey(0), **kw)
  assert single["total"]["greedy"] == grouped["total"]["greedy"]
  assert single["constant"][1.0] == {"sampled": 1.0, "best": 1.0, "spread": 0.0}
  assert 0.0 <= single["total"][1.0]["sampled"] <= single["total"][1.0]["best"] <= 1.0
