"""ARENA's SFT baselines: the Table 7 teacher-trace builder (against a local stub endpoint) and
the SFT-direct / SFT-reasoning targets."""
import json

import pytest

from chat_server import serve
from configs import arena as arena_config
from rlrag_jax import judge
from rlrag_jax.methods import arena
from rlrag_jax.methods.arena import task as arena_task
from rlrag_jax.methods.arena import teacher_traces as tt


def _teacher(body):
  """Replies with a trace naming the question's answer; fails for questions containing 'FAIL'."""
  prompt = body["messages"][0]["content"]
  if "FAIL" in prompt:
    return None
  return f" So the answer is {prompt.rsplit('Answer: ', 1)[1]}. "


@pytest.fixture
def teacher():
  with serve(_teacher) as server:
    yield server


def _tiny_world_config(tmp_path, **sft):
  c = arena_config.get_config("")
  c.workdir = str(tmp_path / "run")
  c.data.world = dict(seed=0, num_questions=60)
  c.model.vocab_size = 512
  for k, v in sft.items():
    c.arena.sft[k] = v
  return c


def test_teacher_prompt_is_table7_and_the_builder_resumes_and_counts_skips(tmp_path, teacher):
  c = _tiny_world_config(tmp_path)
  examples = arena_task.ArenaTask(c).train[:4]
  ex = examples[0]
  p = tt.teacher_prompt(ex)
  gold = list(arena.reference_numbers(ex).gold)
  assert p.startswith("Generate a thinking process showing how to derive the given answer "
                      "using ONLY the specified relevance IDs from provided references.\n"
                      f"Question: {ex.question}\nReferences: \n[1] ")
  assert p.endswith(f"\nRelevance IDs: {json.dumps(gold)}\nAnswer: {ex.answers[0]}")
  failing = examples[3].__class__(**{**examples[3].__dict__,
                                     "question": examples[3].question + " FAIL"})
  ask = lambda prompt: judge.chat_completion(
      teacher.url + "/chat/completions",
      {"model": "t", "messages": [{"role": "user", "content": prompt}]},
      retries=0)
  out = tmp_path / "traces.jsonl"
  counts = tt.build(examples[:3] + [failing], ask, out, progress=False)
  assert counts == {"asked": 4, "written": 3, "skipped": 1, "already": 0}
  traces = tt.read_traces(out)
  assert traces[str(ex.id)] == f"So the answer is {ex.answers[0]}."
  teacher.bodies.clear()
  again = tt.build(examples[:3] + [failing], ask, out, progress=False)   # resumes
  assert again == {"asked": 1, "written": 0, "skipped": 1, "already": 3}
  assert len(teacher.bodies) == 1
  out.write_text(out.read_text() + "{not json\n")
  with pytest.raises(ValueError, match=r"traces.jsonl:4: expected a JSON object"):
    tt.read_traces(out)


def test_sft_targets_direct_and_teacher(tmp_path):
  base = arena_task.ArenaTask(_tiny_world_config(tmp_path))
  chosen = base.train[:3]
  traces = tmp_path / "t.jsonl"
  traces.write_text("".join(json.dumps({"id": str(ex.id), "trace": f"trace {i}"}) + "\n"
                            for i, ex in enumerate(chosen)))
  teach = arena_task.ArenaTask(_tiny_world_config(tmp_path, target="teacher",
                                                  teacher_traces=str(traces)))
  assert [ex.id for ex in teach.train] == [ex.id for ex in chosen]   # examples without a trace
  target = teach.sft_target(chosen[1])
  gold = list(arena.reference_numbers(chosen[1]).gold)
  assert target == (f"<relevance>{json.dumps(gold)}</relevance><analysis>trace 1</analysis>"
                    f"<answer>{chosen[1].answers[0]}</answer>")
  r = arena.reward(target, chosen[1].answers, gold)
  assert (r["format"], r["accuracy"], r["relevance"]) == (1.0, 1.0, 1.0)
  cfg = _tiny_world_config(tmp_path, target="direct")
  cfg.data.prompt_style = "paper"
  direct = arena_task.ArenaTask(cfg)
  assert direct.sft_target(chosen[0]) == chosen[0].answers[0]
  prompt = direct.prompt_text(chosen[0])
  assert prompt.startswith(arena.prompts.DIRECT_INSTRUCTION + "\nUser:\n<question>")
  assert arena.prompts.INSTRUCTION not in prompt
  with pytest.raises(ValueError, match="'arena.sft.teacher_traces' is empty"):
    arena_task.ArenaTask(_tiny_world_config(tmp_path, target="teacher"))
  with pytest.raises(ValueError, match="'arena.sft.target' is 'gold'"):
    arena_task.ArenaTask(_tiny_world_config(tmp_path, target="gold"))
