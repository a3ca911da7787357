"""run_tool_loop: loss mask, independent rows, limits, truncation; and the real sampler path
checked token by token against a plain full-forward greedy replay."""
import dataclasses

import jax
import numpy as np
import pytest

from rlrag_jax.generate import byte_level_tokenizer
from rlrag_jax.rollout import Observation, run_tool_loop
from rlrag_jax.sampling import Generation

TOK = byte_level_tokenizer()
EOS = TOK.eos_token_id
STOP = "|"                      # one byte, one token
STOP_ID = TOK.convert_tokens_to_ids(STOP)


def ids(text):
  return TOK(text, add_special_tokens=False)["input_ids"]


# ---------------------------------------------------------------- a scripted policy
@dataclasses.dataclass
class ScriptedPolicy:
  """Row r (prompt starts with token id `r + 3`) writes script[r][k] in its k-th turn, cut to the
  per-row budget; records which rows each call sampled."""
  script: dict
  max_new_tokens: int = 64
  calls: list = dataclasses.field(default_factory=list)
  batch_multiples: list = dataclasses.field(default_factory=list)

  def sample(self, prompt_ids, rng, *, greedy=False, max_new_tokens=None, stop=(),
             max_new_tokens_per_row=None, batch_multiple=1, prompt_length=None):
    del rng, greedy, stop
    assert prompt_length % 64 == 0 and prompt_length >= max(len(p) for p in prompt_ids)
    rows = [p[0] - 3 for p in prompt_ids]
    self.calls.append(rows)
    self.batch_multiples.append(batch_multiple)
    n = max_new_tokens
    toks = np.zeros((len(rows), n), np.int32)
    lengths, reasons = [], []
    for j, r in enumerate(rows):
      seg = list(self.script[r][sum(r in c for c in self.calls) - 1])
      cap = min(n, int(max_new_tokens_per_row[j]))
      reason = "eos" if seg[-1] == EOS else ("stop" if seg[-1] == STOP_ID else "length")
      if len(seg) > cap:
        seg, reason = seg[:cap], "length"
      toks[j, :len(seg)] = seg
      lengths.append(len(seg))
      reasons.append(reason)
    lengths = np.asarray(lengths, np.int32)
    mask = (np.arange(n)[None] < lengths[:, None]).astype(np.int32)
    zeros = np.zeros((len(rows), n), np.float32)
    return Generation(toks, zeros, zeros, lengths, mask, reasons)


def _prompt(row, text="Q:"):
  return [row + 3] + ids(text)


class ScriptedEnv:
  """Observation '<obs r.k>' for row r's k-th call, or None where `refuse` says so."""

  def __init__(self, refuse=()):
    self.refuse = set(refuse)
    self.seen = []

  def __call__(self, row, turn_text, completion):
    k = sum(r == row for r, _, _ in self.seen)
    self.seen.append((row, turn_text, completion))
    if (row, k) in self.refuse:
      return None
    return Observation(f"<obs {row}.{k}>", info={"call": k})


def _run(policy, prompts, env, **kw):
  args = dict(rng=jax.random.PRNGKey(0), tokenizer=TOK, max_turns=5, max_obs_tokens=100,
              max_total_len=500, stop=[STOP])
  args.update(kw)
  return run_tool_loop(policy, prompts, env, **args)


def test_loss_mask_is_zero_exactly_on_observation_tokens():
  script = {0: [ids("search a|"), ids("then b|"), ids("answer") + [EOS]]}
  env = ScriptedEnv()
  out = _run(ScriptedPolicy(script), [_prompt(0)], env)
  # the completion rebuilt by hand: policy turn, observation, policy turn, observation, policy
  pieces = [(ids("search a|"), 1), (ids("<obs 0.0>"), 0), (ids("then b|"), 1),
            (ids("<obs 0.1>"), 0), (ids("answer") + [EOS], 1)]
  want_ids = [t for p, _ in pieces for t in p]
  want_mask = [m for p, m in pieces for _ in p]
  assert out.completion_ids[0] == want_ids
  for pos, (got, want) in enumerate(zip(out.loss_mask[0], want_mask)):
    assert got == want, f"token {pos} ({TOK.decode([want_ids[pos]])!r}): mask {got}, want {want}"
  assert len(out.loss_mask[0]) == len(want_ids)
  assert out.finish_reason == ["eos"] and out.num_tool_calls == [2]
  assert [t.info for t in out.turns[0]] == [{"call": 0}, {"call": 1}, {}]
  assert [t.text for t in out.turns[0]] == ["search a|", "then b|", "answer</s>"]
  # the environment saw the turn text and the whole completion so far
  assert env.seen[1][1] == "then b|" and env.seen[1][2] == "search a|<obs 0.0>then b|"


def test_a_row_that_stops_early_is_not_held_back():
  script = {0: [ids("direct") + [EOS]],
            1: [ids("s|"), ids("s|"), ids("s|"), ids("done") + [EOS]],
            2: [ids("s|"), ids("stop here") + [EOS]]}
  policy = ScriptedPolicy(script)
  out = _run(policy, [_prompt(0), _prompt(1), _prompt(2)], ScriptedEnv(), min_batch=1)
  assert policy.calls == [[0, 1, 2], [1, 2], [1], [1]]          # finished rows leave the batch
  assert policy.batch_multiples == [4, 2, 1, 1]                  # padded to powers of two
  assert [len(t) for t in out.turns] == [1, 4, 2]
  assert out.num_tool_calls == [0, 3, 1]
  assert out.completion_ids[0] == ids("direct") + [EOS]          # row 0 untouched by the others
  assert out.finish_reason == ["eos", "eos", "eos"]


def test_turn_limit():
  script = {0: [ids("s|")] * 5}
  out = _run(ScriptedPolicy(script), [_prompt(0)], ScriptedEnv(), max_turns=2)
  assert out.num_tool_calls == [2] and len(out.turns[0]) == 3
  assert out.finish_reason == ["max_turns"]
  assert out.turns[0][-1].stopped_by == "stop" and out.turns[0][-1].observation_tokens == 0
  # max_turns=0: the first tool call already ends the row
  out = _run(ScriptedPolicy(script), [_prompt(0)], ScriptedEnv(), max_turns=0)
  assert out.num_tool_calls == [0] and out.completion_ids[0] == ids("s|")


def test_environment_none_finishes_the_row():
  script = {0: [ids("s|"), ids("s|")], 1: [ids("s|"), ids("x") + [EOS]]}
  out = _run(ScriptedPolicy(script), [_prompt(0), _prompt(1)], ScriptedEnv(refuse={(0, 0)}))
  assert out.finish_reason == ["no_tool_call", "eos"]
  assert out.completion_ids[0] == ids("s|") and out.loss_mask[0] == [1, 1]


def test_total_length_limit_cuts_turns_and_observations():
  prompt = _prompt(0)                                     # 3 tokens
  script = {0: [ids("abcd|"), ids("efghijkl|")]}
  # 3 + 5 policy tokens, then room for 12 - 8 = 4 observation tokens of '<obs 0.0>' (9)
  out = _run(ScriptedPolicy(script), [prompt], ScriptedEnv(), max_total_len=12)
  assert out.completion_ids[0] == ids("abcd|") + ids("<obs")
  assert out.turns[0][0].truncated and out.finish_reason == ["length"]
  assert len(prompt) + len(out.completion_ids[0]) == 12
  # room left after the observation: the next turn is cut to it
  out = _run(ScriptedPolicy(script), [prompt], ScriptedEnv(), max_total_len=20)
  assert out.completion_ids[0] == ids("abcd|") + ids("<obs 0.0>") + ids("efg")
  assert out.loss_mask[0] == [1] * 5 + [0] * 9 + [1] * 3
  assert out.turns[0][1].stopped_by == "length" and out.finish_reason == ["length"]
  with pytest.raises(ValueError, match="max_total_len=3"):
    _run(ScriptedPolicy(script), [prompt], ScriptedEnv(), max_total_len=3)


def test_observation_truncation_keeps_the_tail():
  class Env:
    def __call__(self, row, turn_text, completion):
      return Observation("<info>0123456789", info={"q": 1}, tail="</info>")
  script = {0: [ids("s|"), ids("a") + [EOS]]}
  out = _run(ScriptedPolicy(script), [_prompt(0)], Env(), max_obs_tokens=12)
  obs = out.completion_ids[0][2:-2]
  assert obs == ids("<info>")[:5] + ids("</info>")            # 12 = 5 of the body + 7 of tail
  assert out.turns[0][0].truncated and out.turns[0][0].observation_tokens == 12
  out = _run(ScriptedPolicy(script), [_prompt(0)], Env(), max_obs_tokens=100)
  assert TOK.decode(out.completion_ids[0]) == "s|<info>0123456789</info>a</s>"
  assert not out.turns[0][0].truncated
  # a limit below the tail alone: plain cut
  out = _run(ScriptedPolicy(script), [_prompt(0)], Env(), max_obs_tokens=3)
  assert out.completion_ids[0][2:5] == ids("<in")


def test_env_batch_protocol_gets_one_call_per_turn():
  class BatchEnv:
    def __init__(self):
      self.calls = []

    def batch(self, rows, turn_texts, completions):
      self.calls.append(list(rows))
      return [f"[{r}]" for r in rows]
  script = {0: [ids("s|"), ids("s|"), [EOS]], 1: [ids("s|"), [EOS]]}
  env = BatchEnv()
  out = _run(ScriptedPolicy(script), [_prompt(0), _prompt(1)], env)
  assert env.calls == [[0, 1], [0]]
  assert TOK.decode(out.completion_ids[0]) == "s|[0]s|[0]</s>"


# ---------------------------------------------------------------- the real sampler
@pytest.fixture(scope="module")
def tiny_policy():
  from rlrag_jax.models import DecoderLM, ModelConfig, init_params
  from rlrag_jax.rollout.policy import Policy
  cfg = ModelConfig(vocab_size=len(TOK), hidden_size=64, intermediate_size=128, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=256,
                    model_type="llama", eos_token_id=(EOS,), pad_token_id=0)
  params = init_params(DecoderLM(cfg), jax.random.PRNGKey(3))
  return Policy(cfg, params, max_new_tokens=6, eos_ids=(EOS,), pad_id=0)


@pytest.mark.slow
def test_real_sampler_rollout_replays_as_plain_greedy_decoding(tiny_policy):
  """Every policy token is the argmax of a full forward over prompt + completion so far, and
  every observation is exactly the environment's text: the re-prefilled multi-turn contexts are
  right and nothing else slips in."""
  from rlrag_jax.models import LM
  # a third of the byte tokens end a turn, so turns are short and tool calls frequent
  stops = [[t] for t in range(3, len(TOK)) if t % 3 == 0]
  prompts = [ids("hello"), ids("a longer prompt here"), ids("x")]
  env = ScriptedEnv(refuse={(2, 1)})
  out = run_tool_loop(tiny_policy, prompts, env, rng=jax.random.PRNGKey(0), tokenizer=TOK,
                      max_turns=3, max_obs_tokens=7, max_total_len=60, stop=stops, greedy=True)
  lm = LM(tiny_policy.config, tiny_policy.params)
  stop_ids = {s[0] for s in stops}
  for row, prompt in enumerate(prompts):
    comp, mask = out.completion_ids[row], out.loss_mask[row]
    # one causal forward over the final sequence: position p predicts token p + 1
    seq = prompt + comp
    greedy = np.argmax(np.asarray(lm.logits([seq]))[0], axis=-1)       # [T]
    pos, k = 0, 0
    for turn in out.turns[row]:
      for _ in range(turn.generated):
        want = int(greedy[len(prompt) + pos - 1])
        assert comp[pos] == want and mask[pos] == 1, (row, pos)
        pos += 1
      assert turn.generated == tiny_policy.max_new_tokens or comp[pos - 1] in stop_ids | {EOS}
      obs = comp[pos:pos + turn.observation_tokens]
      if turn.observation_tokens:
        assert obs == ids(f"<obs {row}.{k}>")[:7] and set(mask[pos:pos + len(obs)]) == {0}
        k += 1
      pos += turn.observation_tokens
    assert pos == len(comp) == len(mask)
    assert len(prompt) + len(comp) <= 60 and out.num_tool_calls[row] <= 3
  assert sum(out.num_tool_calls) >= 3 and max(len(t) for t in out.turns) >= 3   # multi-turn
  asked_twice = [r for r, _, _ in env.seen].count(2) == 2
  assert (out.finish_reason[2] == "no_tool_call") == asked_twice
