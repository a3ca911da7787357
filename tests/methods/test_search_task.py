"""Search task glue: SFT targets and masks, the retriever environment, rewards with the stage
switch, and the reference pipelines; on a small world with a bag-of-words hashing encoder (so
retrieval is checked against plain numpy search) and scripted or tiny random policies."""
import dataclasses
import pathlib
import re
import sys
import zlib

import jax
import numpy as np
import pytest

from rlrag_jax.methods import search
from rlrag_jax.methods.search import conciseness, prompts
from rlrag_jax.methods.search import task as task_lib
from rlrag_jax.sampling import Generation
from rlrag_jax.tasks import Episode

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "configs"))
import search as search_config  # noqa: E402  (configs/search.py)

SMALL_WORLD = dict(seed=0, num_countries=6, num_cities=20, num_people=80, num_orgs=30,
                   num_films=40, num_books=40, num_questions=80)


class HashEncoder:
  """Unit-norm sum of per-word random vectors (seeded by crc32 of the word)."""
  dim = 32
  id = "hash-bow@test"

  def vector(self, text):
    v = np.zeros(self.dim)
    for w in conciseness.words(text):
      v += np.random.default_rng(zlib.crc32(w.encode())).standard_normal(self.dim)
    n = np.linalg.norm(v)
    return v / n if n else v

  # queries and passages without prefixes, as the packaged MiniLM
  encode_queries = encode_passages = property(lambda self: self.encode)

  def encode(self, texts, batch_size=64):
    del batch_size
    return np.asarray([self.vector(t) for t in texts], np.float32).reshape(-1, self.dim)


def _config(tmp, **tool):
  c = search_config.get_config("")
  c.workdir = str(tmp)
  c.data.world = dict(SMALL_WORLD)
  c.data.max_eval = 8
  c.model.vocab_size = 600
  c.sft.steps = 10
  c.reward.stage2_step = 3
  c.search.sft.known_min_seen = 2
  c.search.sft.observation_loss = False   # the rollout's mask; the flag is tested on its own
  c.tool.max_total_len = 1200          # room for naive RAG's five documents (small vocab)
  c.tool.update(tool)
  return c


@pytest.fixture(scope="module")
def task(tmp_path_factory):
  return task_lib.SearchTask(_config(tmp_path_factory.mktemp("search")), encoder=HashEncoder())


def _numpy_top(task, query, k):
  """Ids of the exact top-k passages for `query`, by numpy over the encoder's vectors."""
  enc = task.encoder
  q = enc.vector(query)
  docs = np.stack([enc.vector(f"{r.title}\n{r.text}" if r.title else r.text)
                   for r in task.corpus])
  order = np.argsort(-(docs @ q), kind="stable")[:k]
  return [task.corpus[i].id for i in order]


def _titles(information):
  return re.findall(r"^Doc \d+ \(Title: (.*?)\) ", information, flags=re.M)


def _titles_of(task, ids):
  by_id = {r.id: r.title for r in task.corpus}
  return [by_id[i] for i in ids]


# ---------------------------------------------------------------- SFT targets
def test_sft_target_mask_is_zero_exactly_on_observations(task):
  ex = next(e for e in task.train if not task.is_direct(e) and len(e.decomposition) >= 2)
  ids, mask = task.sft_target_ids(ex), task.sft_loss_mask(ex)
  assert len(ids) == len(mask) and ids[-1] == task.tokenizer.eos_token_id and mask[-1] == 1
  tok = task.tokenizer
  assert tok.decode(ids[:-1]) == task.sft_target(ex)
  # the masked tokens spell exactly the observation blocks, the others the model's text
  masked = tok.decode([t for t, m in zip(ids, mask) if m == 0])
  p = search.parse(task.sft_target(ex))
  assert masked == "".join(prompts.observation_block(o) for o in p.information)
  assert p.structure == "B" and all(conciseness.is_concise(q) for q in p.queries)
  # one search per step with gold passages that is not recalled; observations: top-k
  known = task.known_steps(ex)
  assert p.retrieval_count == sum(bool(s.gold_ids) and k not in known
                                  for k, s in enumerate(ex.decomposition))
  recalled = [ex.decomposition[k].answer for k in sorted(known)]
  assert re.findall(r"Known: (.*?)\. ", task.sft_target(ex)) == recalled
  for q, info in zip(p.queries, p.information):
    assert _titles(info) == _titles_of(task, _numpy_top(task, q, task.config.tool.top_k))


def test_observation_loss_flag_trains_on_the_passages_too(task):
  ex = next(e for e in task.train if not task.is_direct(e))
  plain = task.sft_loss_mask(ex)
  assert 0 in plain
  kept = task.settings
  task.settings = dataclasses.replace(
      kept, sft=dataclasses.replace(kept.sft, observation_loss=True))
  try:
    assert task.sft_loss_mask(ex) == [1] * len(plain)
    assert task.sft_target_ids(ex)[-1] == task.tokenizer.eos_token_id
  finally:
    task.settings = kept


def test_comparison_gold_skips_the_reasoning_step(task):
  ex = next(e for e in task.train if e.kind == "comparison" and not task.known_steps(e))
  p = search.parse(task.sft_target(ex))
  assert len(ex.decomposition) == p.retrieval_count + 1 and not ex.decomposition[-1].gold_ids
  assert p.answer == ex.answers[0]


def test_known_steps_are_facts_that_recur():
  from rlrag_jax.data.schema import Example, Step
  def ex(i, facts):
    prog = [{"op": "hop", "head": h, "relation": r} for h, r in facts]
    steps = [Step(f"{r} of {h}?", "x", ["p"]) for h, r in facts]
    return Example(id=str(i), question="q", answers=["x"], decomposition=steps,
                   meta={"program": prog})
  train = [ex(0, [("A", "r"), ("B", "s")]), ex(1, [("A", "r")]), ex(2, [("A", "r"), ("B", "s")]),
           ex(3, [("C", "t")])]
  # (A, r) occurs in 3 examples, (B, s) in 2, (C, t) in 1
  assert task_lib._known_steps(train, 1) == {"0": {0, 1}, "1": {0}, "2": {0, 1}}
  assert task_lib._known_steps(train, 2) == {"0": {0}, "1": {0}, "2": {0}}
  assert task_lib._known_steps(train, 0) == {}


def test_gold_with_recalled_steps():
  from rlrag_jax.data.schema import Example, Step
  e = Example(id="e", question="q", answers=["D"],
              decomposition=[Step("Who directed Film X?", "A", ["p1"]),
                             Step("Where was #1 born?", "B", ["p2"]),
                             Step("Which country is #2 in?", "C", ["p3"]),
                             Step("What is the capital of #3?", "D", ["p4"])])
  obs = lambda q: f"about {q}"
  p = search.parse(prompts.gold_trajectory(e, obs, known={0, 2}))
  assert p.structure == "B" and p.queries == ["A born", "the capital of C"]   # #1 -> A
  assert p.segments[0] == ("think", "Known: A. I need to search.")
  assert p.reflects == ["Found B. Known: C. Next step.", "Found D. Done."]
  a = search.parse(prompts.gold_trajectory(e, obs, known={0, 1, 2, 3}))
  assert a.structure == "A" and a.reflects == ["Known: A. Known: B. Known: C. It is D."]
  assert a.answer == "D"


def test_direct_targets_are_structure_a(task):
  direct = [e for e in task.train if task.is_direct(e)]
  assert direct, "the small world should have some recurring facts"
  e = direct[0]
  assert search.parse(task.sft_target(e)).structure == "A"
  assert set(task.sft_loss_mask(e)) == {1}


# ---------------------------------------------------------------- environment and rollout
@dataclasses.dataclass
class ScriptedPolicy:
  """Writes the given model pieces of each row, one per turn (tokenized like SFT targets)."""
  turns: list                      # per row: list of token lists
  max_new_tokens: int = 200
  seen: list = dataclasses.field(default_factory=list)

  def sample(self, prompt_ids, rng, *, greedy=False, max_new_tokens=None, stop=(),
             max_new_tokens_per_row=None, batch_multiple=1, prompt_length=None):
    rows = [self.row_of(p) for p in prompt_ids]
    self.seen.append(rows)
    n = max_new_tokens
    out = np.zeros((len(rows), n), np.int32)
    lengths, reasons = [], []
    for j, r in enumerate(rows):
      k = (sum(r in s for s in self.seen) - 1) % len(self.turns[r])
      seg = self.turns[r][k]
      out[j, :len(seg)] = seg
      lengths.append(len(seg))
      reasons.append("stop" if k < len(self.turns[r]) - 1 else "eos")
    lengths = np.asarray(lengths, np.int32)
    z = np.zeros(out.shape, np.float32)
    return Generation(out, z, z, lengths, (np.arange(n) < lengths[:, None]).astype(np.int32),
                      reasons)

  def row_of(self, ids):
    return next(i for i, p in enumerate(self.prompts) if ids[:len(p)] == p)


def _gold_turns(task, ex):
  """The model pieces of the gold trajectory, token ids, split where the rollout stops."""
  turns = [task.tokenizer(t, add_special_tokens=False)["input_ids"]
           for t, by_model in task.sft_pieces(ex) if by_model]
  turns[-1] = turns[-1] + [task.tokenizer.eos_token_id]
  return turns


def test_rollout_replays_gold_trajectories_with_the_retriever(task):
  exs = [e for e in task.train if not task.is_direct(e)][:3]
  policy = ScriptedPolicy([_gold_turns(task, e) for e in exs])
  policy.prompts = [task.prompt_ids(e) for e in exs]
  eps = task.rollout(policy, exs, jax.random.PRNGKey(0), group_size=1)
  for ex, ep in zip(exs, eps):
    assert ep.text == task.sft_target(ex)                     # the env returned the gold obs
    assert ep.completion_ids == task.sft_target_ids(ex)       # token for token
    assert ep.loss_mask == task.sft_loss_mask(ex)
    queries = search.parse(ep.text).queries
    assert ep.info["queries"] == queries
    assert ep.info["retrieved"] == [_numpy_top(task, q, task.config.tool.top_k)
                                    for q in queries]
    assert ep.info["finish"] == "eos" and ep.info["tool_calls"] == len(queries)
  # rows finished at different turns: the shortest one left the batch first
  n_turns = [len(_gold_turns(task, e)) for e in exs]
  assert [len(s) for s in policy.seen] == [sum(n > t for n in n_turns)
                                           for t in range(max(n_turns))]


def test_with_retrieval_url_the_passages_and_sft_targets_come_from_the_server(task):
  """retrieval.url set: the agent's retrieve and the observations of its SFT targets come from
  a server of the same index (over real HTTP on 127.0.0.1), exactly as in process."""
  from serve_helpers import serving
  from rlrag_jax.retrieval import Retriever, serve
  from rlrag_jax.retrieval.client import RemoteRetriever
  index = serve.LoadedIndex(Retriever.load(task._index_dir, task.encoder),  # pylint: disable=protected-access
                            {"n": len(task.corpus), "encoder": task.encoder.id,
                             "backend": "exact"})
  exs = [e for e in task.train if not task.is_direct(e)][:4]
  queries = sorted({q for e in exs for q in prompts.gold_queries(e) if q})
  k = task.config.tool.top_k
  with serving(serve.create_app(index)) as url:
    c = _config(pathlib.Path(task.config.workdir))     # the same workdir: the tokenizer is reused
    c.retrieval.url = url
    remote = task_lib.SearchTask(c, encoder=HashEncoder())
    assert isinstance(remote.retriever, RemoteRetriever)
    got, want = remote.retrieve(queries, k), task.retrieve(queries, k)
    assert [[(h.id, h.title, h.text) for h in row] for row in got] == \
        [[(h.id, h.title, h.text) for h in row] for row in want]
    assert [h.score for row in got for h in row] == pytest.approx(
        [h.score for row in want for h in row], abs=1e-5)
    assert [remote.sft_target(e) for e in exs] == [task.sft_target(e) for e in exs]
    assert remote.retriever.monitor.failures == 0
    remote.retriever.close()


def test_env_returns_none_for_a_missing_query(task):
  env = task_lib.SearchEnv(task, 2)
  out = env.batch([0, 1, 2], ["", "", ""], ["<think>x</think><search> </search>",
                                            "<think>x</think><search>Venistan capital</search>",
                                            "no tags</search>"])
  assert out[0] is None and out[2] is None
  assert out[1].info == {"query": "Venistan capital",
                         "ids": _numpy_top(task, "Venistan capital", 2)}
  assert out[1].text.startswith("\n\n<information>Doc 1 (Title: ")
  assert out[1].tail == "</information>\n\n"


# ---------------------------------------------------------------- rewards
def _episode(task, text, ex=None):
  ex = ex or task.train[0]
  return Episode(example=ex, prompt_ids=[], completion_ids=[], loss_mask=[], text=text)


def _reward(task, episode, step):
  """The reward dict of one episode (the batch hook on a batch of one)."""
  return task.rewards([episode], step)[0]


def test_reward_stage_switch_on_the_rl_step(task):
  ex = task.train[0]
  ans = ex.answers[0]
  text = ("<think>t</think>\n<search>alpha beta</search>\n\n<information>d</information>\n\n"
          "<reflect>r</reflect>\n<search>gamma delta</search>\n\n<information>d</information>"
          f"\n\n<reflect>r</reflect>\n<answer>{ans}</answer>")
  enc = task.encoder
  cos = float(enc.vector("alpha beta") @ enc.vector("gamma delta"))
  # stage 2 from RL step 3 (the engine passes the RL step, whatever sft.steps is: 10 here)
  assert [task.stage(s) for s in (0, 1, 2, 3, 50)] == [1, 1, 1, 2, 2]
  r1 = _reward(task, _episode(task, text, ex), 2)
  r2 = _reward(task, _episode(task, text, ex), 3)
  assert r1 == pytest.approx({"format": 1.0, "search": -cos, "answer": 1.0,
                              "total": 2.0 - cos, "retrieval_count": 2, "stage": 1.0,
                              "correct": 1.0}, abs=1e-5)
  assert r2 == pytest.approx({"format": 1.0, "search": -cos, "answer": 1.0 - 0.6,
                              "total": 1.4 - cos, "retrieval_count": 2, "stage": 2.0,
                              "correct": 1.0}, abs=1e-5)
  wrong = text.replace(f"<answer>{ans}</answer>", "<answer>nobody at all</answer>")
  assert _reward(task, _episode(task, wrong, ex), 2)["answer"] == pytest.approx(-1 + 0.6)
  assert _reward(task, _episode(task, wrong, ex), 3)["answer"] == -1.0
  # The rollout ran one retrieval (the second query was refused past max_turns): RC = 1.
  one = _episode(task, text, ex)
  one.info["retrievals"] = 1
  r = _reward(task, one, 3)
  assert r["retrieval_count"] == 1 and r["answer"] == pytest.approx(1.0 - 0.3)
  assert r["search"] == 0.0                            # one concise query


def test_reward_never_raises_on_malformed_output(task):
  for text in ["", "</s>", "<search>x", "<think>a</think><answer>", "\x00\xff<search></search>",
               "<think>t</think>\n<reflect>r</reflect>\n<answer>x</answer> trailing"]:
    r = _reward(task, _episode(task, text), 1)
    assert r["format"] == -1.0 and np.isfinite(r["total"])


def test_eval_metrics(task):
  ex = task.train[0]
  text = f"<think>t</think>\n<reflect>r</reflect>\n<answer>{ex.answers[0]}</answer>"
  m = task.eval_metrics([_episode(task, text, ex)])[0]
  assert (m["em"], m["f1"], m["accuracy"], m["rc"], m["format"], m["direct"]) == (
      1.0, 1.0, 1.0, 0.0, 1.0, 1.0)
  assert m["reward_stage1"] == m["reward_stage2"] == 2.0


def test_judge_gets_the_question(task, monkeypatch):
  from rlrag_jax import judge
  calls = []
  monkeypatch.setattr(judge.OpenAIJudge, "_judge_one",      # every question the batch asks
                      lambda self, item: calls.append((item[0], item[1], list(item[2]))) or True)
  task._judge = judge.OpenAIJudge("http://localhost:1/v1", "m")
  try:
    ex = task.train[0]
    r = _reward(task, _episode(task, "<think>t</think>\n<reflect>r</reflect>\n<answer>zz</answer>",
                             ex), 1)
  finally:
    task._judge = None
  # The judge sees the question and, as the paper's B.4 says, normalised strings.
  from rlrag_jax.metrics import normalize_answer
  assert r["answer"] == 1.0 and r["judge_failed"] == 0.0
  assert calls == [(ex.question, "zz", [normalize_answer(a) for a in ex.answers])]
  assert task.judge_prompt.template.startswith("You are an evaluation assistant.")


def test_unjudged_reply_scores_wrong_and_is_counted(task, monkeypatch):
  from rlrag_jax import judge
  monkeypatch.setattr(judge.OpenAIJudge, "_judge_one", lambda self, item: None)
  task._judge = judge.OpenAIJudge("http://localhost:1/v1", "m")
  try:
    ex = task.train[0]
    r = _reward(task, _episode(task, "<think>t</think>\n<reflect>r</reflect>\n<answer>"
                             f"{ex.answers[0]}</answer>", ex), 1)
  finally:
    task._judge = None
  assert r["correct"] == 0.0 and r["answer"] == -1.0 and r["judge_failed"] == 1.0


def test_batched_rewards_ask_the_judge_once_per_distinct_answer(task):
  """task.rewards (the trainer's batch hook) asks each distinct answer once, concurrently, and
  scores as batches of one do; task.monitors() hands the judge's counters to the trainer."""
  from chat_server import serve
  from rlrag_jax import judge
  ex = task.train[0]
  texts = [f"<think>t</think>\n<reflect>r</reflect>\n<answer>{a}</answer>"
           for a in (ex.answers[0], "zz", ex.answers[0], "qq")] + ["<think>no answer</think>"]
  eps = [_episode(task, t, ex) for t in texts]
  with serve(lambda body: "no" if "zz" in body["messages"][-1]["content"] else
             ("maybe" if "qq" in body["messages"][-1]["content"] else "yes")) as chat:
    task._judge = judge.OpenAIJudge(chat.url, "m", prompt=task.judge_prompt, concurrency=4)
    try:
      batch = task.rewards(eps, 1)
      assert len(chat.bodies) == 3                 # the repeated answer is asked once
      one_by_one = [_reward(task, e, 1) for e in eps]      # a batch of one each
      assert task.monitors() == [task._judge.monitor] and task._judge.failures == 2
    finally:
      task._judge = None
  assert batch == one_by_one
  assert [r["correct"] for r in batch] == [1.0, 0.0, 1.0, 0.0, 0.0]
  assert [r["judge_failed"] for r in batch] == [0.0, 0.0, 0.0, 1.0, 0.0]
  assert task.monitors() == []


# ---------------------------------------------------------------- reference pipelines
def test_pipelines_with_a_scripted_policy(task):
  from rlrag_jax.methods.search import baselines
  exs = task.eval[:4]
  answer = lambda e: task.tokenizer(f"\n<reflect>r</reflect>\n<answer>{e.answers[0]}</answer>",
                                    add_special_tokens=False)["input_ids"] + [2]
  policy = ScriptedPolicy([[answer(e)] for e in exs])
  policy.prompts = [task.prompt_ids(e) for e in exs]
  res = baselines.evaluate_pipelines(task, policy, exs,
                                            pipelines=("no_retrieval", "naive_rag"))
  assert res["no_retrieval"]["world"] == pytest.approx(
      {"f1": 1.0, "em": 1.0, "accuracy": 1.0, "rc": 0.0, "format": 1.0, "n": 4})
  assert res["naive_rag"]["world"] == pytest.approx(
      {"f1": 1.0, "em": 1.0, "accuracy": 1.0, "rc": 1.0, "format": 1.0, "n": 4})
  # the naive-RAG prefix: the question as the query, its top-5 as the observation, masked
  ep = task.rollout(policy, exs[:1], jax.random.PRNGKey(0), pipeline="naive_rag")[0]
  p = search.parse(ep.text)
  assert p.queries == [" ".join(exs[0].question.split())]
  assert _titles(p.information[0]) == _titles_of(task, _numpy_top(task, exs[0].question, 5))
  n_policy = len(answer(exs[0]))
  assert ep.loss_mask == [0] * (len(ep.loss_mask) - n_policy) + [1] * n_policy
  assert ep.info["tool_calls"] == 0


def test_the_report_runs_the_pipelines_on_the_engines_final_evaluation(task, tmp_path):
  """`report` evaluates the reference pipelines with the policy, examples, batch size and seed
  the engine hands it (`tasks.EvalSetup`), not ones rebuilt from config sections eval / rl:
  its table is `evaluate_pipelines` on exactly those, here 3 examples where the config's
  evaluation would take 8."""
  import json
  from rlrag_jax import runlog, tasks
  from rlrag_jax.methods.search import baselines
  assert task.settings.eval.baselines and int(task.config.data.max_eval) == 8
  exs = task.eval[:3]
  answer = lambda e: task.tokenizer(f"\n<reflect>r</reflect>\n<answer>{e.answers[0]}</answer>",
                                    add_special_tokens=False)["input_ids"] + [2]

  def policy():
    p = ScriptedPolicy([[answer(e)] for e in exs])
    p.prompts = [task.prompt_ids(e) for e in exs]
    return p
  rlog = runlog.RunLog(tmp_path, tensorboard=False)
  task.report(tmp_path, rlog, tasks.EvalSetup(policy(), exs, batch_size=2, seed=3))
  saved = json.loads((tmp_path / "search_report.json").read_text())["pipelines"]
  assert saved == baselines.evaluate_pipelines(task, policy(), exs, batch_size=2, seed=3)
  assert {name: t["world"]["n"] for name, t in saved.items()} == {
      "agent": 3, "no_retrieval": 3, "naive_rag": 3}
  assert saved["no_retrieval"]["world"]["em"] == 1.0     # the scripted answers are gold
  assert "Agent vs reference pipelines" in (tmp_path / "search_report.txt").read_text()


@pytest.mark.slow
def test_pipelines_on_a_tiny_random_model(task):
  """The whole path with the real sampler: every pipeline runs, serves no search beyond what
  it allows, and its forced prefix is in place and masked."""
  from rlrag_jax.methods.search import baselines
  from rlrag_jax.models import DecoderLM, ModelConfig, init_params
  from rlrag_jax.rollout.policy import Policy
  tok = task.tokenizer
  cfg = ModelConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_layers=1,
                    num_heads=2, num_kv_heads=1, head_dim=16, max_position_embeddings=1024,
                    model_type="llama", eos_token_id=(tok.eos_token_id,), pad_token_id=0)
  policy = Policy(cfg, init_params(DecoderLM(cfg), jax.random.PRNGKey(0)), max_new_tokens=12,
                  eos_ids=(tok.eos_token_id,))
  exs = task.eval[:4]
  res = baselines.evaluate_pipelines(task, policy, exs)
  assert set(res) == {"agent", "no_retrieval", "naive_rag"}
  for name in res:
    assert res[name]["world"]["n"] == 4
  direct = task.rollout(policy, exs, jax.random.PRNGKey(1), greedy=True, pipeline="no_retrieval")
  naive = task.rollout(policy, exs, jax.random.PRNGKey(1), greedy=True, pipeline="naive_rag")
  for ep in direct:
    assert ep.text.startswith(prompts.DIRECT_THINK) and ep.info["tool_calls"] == 0
  for ep in naive:
    assert ep.text.startswith(prompts.SEARCH_THINK) and ep.info["tool_calls"] == 0
    assert search.parse(ep.text).information[:1] and ep.loss_mask[0] == 0


def test_the_report_counts_rl_steps_from_the_run_log():
  from rlrag_jax.methods.search import baselines
  rows = ([{"step": s, "stage": "sft"} for s in range(1, 8)] + [{"step": 7, "stage": "eval_before"}]
          + [{"step": s, "stage": "rl"} for s in range(8, 11)])
  assert baselines.sft_length(rows) == 7                  # RL step 1 is global step 8
  assert baselines.sft_length(rows[:7]) == 7              # no RL row yet: the last SFT row
  assert baselines.sft_length([{"step": 1, "stage": "rl"}]) == 0   # no warm-up
