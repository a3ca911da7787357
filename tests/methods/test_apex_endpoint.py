"""APEX's two endpoint commands against a local OpenAI-compatible server: the LLM rewrite of
MuSiQue's symbolic steps (cached, bad replies fall back to the templates and are counted) and
self-instructed executor trajectories (only correct ones kept, readable back for SFT)."""
import dataclasses

import pytest

from chat_server import serve
from configs import apex_executor
from rlrag_jax.methods.apex import executor, prompts, rewrite, self_instruct
from rlrag_jax.methods.apex.task import ExecutorTask, gold_plan


@pytest.fixture
def chat():
  with serve(lambda body: "") as server:
    yield server


def test_llm_rewrite_caches_and_falls_back(chat, tmp_path):
  replies = {"Anna Bell >> place of birth": "Where was Anna Bell born?",
             "#1 >> country": "Which country is #1 in?",
             "#2 >> spouse": "Who is the spouse of the person?",       # lost its #2: rejected
             "Rome >> mayor": "Rome's mayor?\nAlso: ..."}               # two lines: rejected
  chat.respond = lambda body: replies.get(
      body["messages"][0]["content"].rsplit("Step: ", 1)[1], None)
  llm = rewrite.LLMRewriter(chat.url, "m", tmp_path / "cache.json", timeout=5)
  steps = ["Anna Bell >> place of birth", "#1 >> country", "#2 >> spouse", "Rome >> mayor",
           "Who wrote Ulysses?", "Paris >> twin town"]          # the last: a 500 from the server
  out, counts = rewrite.rewrite_plan(steps, llm)
  assert out[:2] == ["Where was Anna Bell born?", "Which country is #1 in?"]
  assert out[2] == "Who is the spouse of #2?"                   # the template rule instead
  assert out[4] == "Who wrote Ulysses?"
  assert counts == {"llm": 2, "llm_failed": 3, "natural": 1}
  # natural steps ask nothing; the 500 is retried twice (judge.chat_completion)
  assert llm.failures == 3 and len(chat.bodies) == 4 + 3
  llm.save()
  again = rewrite.LLMRewriter(chat.url, "m", tmp_path / "cache.json", timeout=5)
  assert again(steps[0]) == ("Where was Anna Bell born?", "llm")
  assert len(chat.bodies) == 7                                   # answered from the cache
  (tmp_path / "bad.json").write_text("{")
  with pytest.raises(ValueError, match="bad.json"):
    rewrite.LLMRewriter(chat.url, "m", tmp_path / "bad.json")


@pytest.fixture(scope="module")
def task(tmp_path_factory):
  c = apex_executor.get_config("")
  c.workdir = str(tmp_path_factory.mktemp("apex_endpoint"))
  c.data.world = dict(seed=0, num_countries=12, num_cities=48, num_people=320, num_orgs=80,
                      num_films=200, num_books=200, num_questions=200)
  c.data.max_train = 6
  c.model.vocab_size = 512
  return ExecutorTask(c)


def test_self_instruct_keeps_correct_trajectories_and_sft_reads_them(chat, task, tmp_path):
  exs = list(task.train)[:3]
  # The "model": decides like the oracle, copies the sub-question as its query, answers each
  # sub-question with its gold answer, and gets the last question's final answer wrong.
  sub = {q: st.answer for ex in exs for q, st in zip(gold_plan(ex), ex.decomposition)}
  final = {ex.question: ex.answers[0] for ex in exs[:2]}

  def respond(body):
    system, user = (m["content"] for m in body["messages"])
    kind = next(k for k, v in prompts.INSTRUCTIONS.items() if v == system)
    question = next(l.split(": ", 1)[1] for l in user.splitlines()
                    if l.startswith(("Question: ", "Main question: ")))
    if kind == "check":
      return "retrieve"
    if kind == "continue":
      return "stop"
    if kind.startswith("query"):
      return question
    if kind == "synthesis":
      return final.get(question, "nobody")
    # resolved sub-questions differ from the plan's #k text: match on the answer table
    return next((a for q, a in sub.items() if q.split("#")[0] in question), "?")
  chat.respond = respond
  model = self_instruct.EndpointModel(chat.url, "m", workers=4, timeout=5)
  res = self_instruct.generate_trajectories(task, model, tmp_path / "t.jsonl", max_examples=3,
                                            batch=2)
  assert res["tried"] == 3 and res["kept"] == 2 and res["failed_requests"] == 0
  calls = prompts.read_trajectories(tmp_path / "t.jsonl")
  assert sorted(calls) == sorted(str(ex.id) for ex in exs[:2])
  first = calls[str(exs[0].id)]
  assert first[0][0].kind == "check" and first[-1] == (first[-1][0], exs[0].answers[0])
  # SFT on the file: one sample per call, the outputs as targets
  # settings are parsed once, when the task is built: the file is set as a built task sees it
  task.settings = dataclasses.replace(task.settings, trajectories=str(tmp_path / "t.jsonl"))
  task._calls = None
  samples = task.sft_samples(exs[0])
  assert len(samples) == len(first)
  assert task.tokenizer.decode(samples[-1][1], skip_special_tokens=True).strip() == \
      exs[0].answers[0]
  assert task.sft_samples(exs[2]) == []
  (tmp_path / "bad.jsonl").write_text('{"id": "x", "calls": [{"ask": {"kind": "dance"}}]}\n')
  with pytest.raises(ValueError, match="bad.jsonl:1"):
    prompts.read_trajectories(tmp_path / "bad.jsonl")


def test_executor_generate_chunks_batches_and_guards_long_prompts(task):
  """The executor's model calls go out in eval.batch_size chunks, and a prompt longer than the
  model's positions keeps its end instead of failing; greedy outputs do not depend on the
  chunking."""
  import jax
  from rlrag_jax.models import DecoderLM, ModelConfig
  from rlrag_jax.models.decoder import init_params
  from rlrag_jax.rollout.policy import Policy
  cfg = ModelConfig(vocab_size=len(task.tokenizer), hidden_size=32, intermediate_size=64,
                    num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                    max_position_embeddings=256)
  policy = Policy(cfg, init_params(DecoderLM(cfg), jax.random.PRNGKey(0)), max_new_tokens=32,
                  eos_ids=(task.tokenizer.eos_token_id,))
  asks = [prompts.Ask("sub_answer", f"Who is number {i}?", passages=(("T", "word " * 20),))
          for i in range(5)]
  asks.append(prompts.Ask("sub_answer", "Long?", passages=(("T", "word " * 2000),)))
  task.config.eval.batch_size = 64
  whole = task.generate_fn(policy)(asks)
  task.config.eval.batch_size = 2
  chunked = task.generate_fn(policy)(asks)
  assert len(whole) == len(chunked) == 6 and whole == chunked
  assert task.truncated_prompts == 2                   # the long prompt, once per call
  assert executor.clip("a b c d", 2) == "a b ..." and executor.clip("a b", 0) == "a b"
