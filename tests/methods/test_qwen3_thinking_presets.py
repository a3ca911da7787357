"""The presets whose output format is Qwen3's own thinking output, through Qwen3's real chat
template: R2AG's steering model (appendix G.1: <think>…</think> then <base-Q> / <predicted-Q>;
no <think>, reward 0) and the search `paper` presets (B.4: "Always begin with <think>").

Each preset's task is built on a tiny random Qwen3 checkpoint whose tokenizer carries Qwen3's
chat template and added tokens (hf_tiny.qwen3_chat_tokenizer) and on the real data samples; the
prompt comes from the task's own prompt code, a well-formed and a malformed completion are
appended as token ids, decoded as the rollout decodes them and scored by the task's reward.
With thinking on the prompt ends at the assistant header, so the think block is the model's,
in the completion, where the parsers look for it (thinking off would pre-fill an empty one in
the prompt, out of the parser's sight)."""
import pathlib
import sys

import pytest

from _deps import require
from configs import r2ag, search
from hf_tiny import make_tiny_qwen3_chat_checkpoint
from rlrag_jax.methods.r2ag import task as r2ag_task
from rlrag_jax.methods.search import task as search_task
from rlrag_jax.rollout.single_turn import decode_keeping_tags
from rlrag_jax.tasks import Episode

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "retrieval"))
from retrieval_helpers import HashEncoder  # noqa: E402  (tests/retrieval/retrieval_helpers.py)

ASSISTANT = "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
  require("torch")
  return make_tiny_qwen3_chat_checkpoint(tmp_path_factory.mktemp("qwen3"))


def _prompt_text(task, ids) -> str:
  text = task.tokenizer.decode(ids, skip_special_tokens=False)
  assert text.endswith(ASSISTANT), text[-80:]        # thinking on: no pre-filled think block
  return text


def _completion(task, text) -> list:
  """The tokens a model writes for `text`, ending with its EOS."""
  return task.tokenizer(text, add_special_tokens=False)["input_ids"] + [
      task.tokenizer.eos_token_id]


def test_r2ag_paper_scores_the_think_block_qwen3_writes(qwen3, tmp_path, shared_data_dir):
  del shared_data_dir
  c = r2ag.get_config("paper")
  assert c.model.thinking is True
  c.workdir, c.model.path, c.data.dir = str(tmp_path / "run"), str(qwen3), ""
  c.data.mix = ("hotpotqa:train", "musique:train")      # the samples hold no 2Wiki train split
  c.data.val_mix = ("hotpotqa:dev:2",)
  c.data.eval_mix = ("hotpotqa:dev:2",)
  c.data.max_train = 4
  c.retrieval.backend = "exact"
  c.r2ag.forest.update(dict(size=2, max_size=4))
  task = r2ag_task.SteeringTask(c, encoder=HashEncoder())
  ex = task.train[0]
  prompt = task.prompt_ids(ex)
  _prompt_text(task, prompt)
  gold_titles = [task.corpus.pairs([d])[0][0] for d in task.gold(ex)]
  well = ("<think>\nThe question needs the first hop's answer.\n</think>\n\n"
          f"<base-Q>{gold_titles[0]}</base-Q><predicted-Q>{gold_titles[-1]}</predicted-Q>")
  malformed = f"<base-Q>{gold_titles[0]}</base-Q><predicted-Q>none</predicted-Q>"
  scores = {}
  for name, text in (("well", well), ("malformed", malformed), ("garbage", "<think><base-Q")):
    comp = _completion(task, text)
    ep = Episode(example=ex, prompt_ids=prompt, completion_ids=comp, loss_mask=[1] * len(comp),
                 text=decode_keeping_tags(task.tokenizer, comp),
                 info={"context": (), "truncated": False})
    scores[name] = task.rewards([ep])[0]
  assert scores["well"]["total"] > 0 and scores["well"]["format"] == pytest.approx(0.02)
  assert scores["malformed"]["total"] == 0.0 and scores["malformed"]["zeroed"] == 1.0
  assert scores["garbage"]["total"] == 0.0


@pytest.mark.parametrize("preset", search.PAPER_PRESETS)
def test_search_paper_presets_score_the_think_block_qwen3_writes(preset, qwen3, tmp_path,
                                                                shared_data_dir):
  """B.4's format reward is the paper's: +1 for structure A or B, -1 otherwise, so a malformed
  completion scores below a well-formed one (negative, not 0: the penalty is the paper's)."""
  del shared_data_dir
  c = search.get_config(preset)
  assert c.model.thinking is True
  c.workdir, c.model.path, c.data.dir = str(tmp_path / "run"), str(qwen3), ""
  c.data.mix = ("2wiki:dev",)
  c.data.max_train, c.data.max_eval = 10, 2
  c.retrieval.corpus, c.retrieval.backend = "", "exact"
  c.tool.max_prompt_len = 0            # byte-level tokens: the B.4 prompt is ~2k of them
  c.reward.match = "em"                # no judge endpoint in tests
  task = search_task.SearchTask(c, encoder=HashEncoder())
  ex = task.train[0]
  prompt = task.prompt_ids(ex)
  _prompt_text(task, prompt)
  gold = ex.answers[0]
  well = ("<think>\nI should look this up.\n</think>\n\n<search>director film</search>"
          "<information>Doc 1: some passage.</information>"
          f"<reflect>The passage answers it.</reflect><answer>{gold}</answer>")
  malformed = f"<search>director film</search><answer>{gold}</answer>"   # no <think>
  scores = {}
  for name, text in (("well", well), ("malformed", malformed), ("garbage", "<think><answer")):
    comp = _completion(task, text)
    ep = Episode(example=ex, prompt_ids=prompt, completion_ids=comp, loss_mask=[1] * len(comp),
                 text=task.decode(comp), info={"retrievals": text.count("<information>")})
    scores[name] = task.rewards([ep], step=1)[0]
  assert scores["well"]["format"] == 1.0 and scores["well"]["total"] > 0
  assert scores["well"]["correct"] == 1.0 or not c.reward.use_answer
  for name in ("malformed", "garbage"):
    assert scores[name]["format"] == -1.0
    assert scores[name]["total"] < scores["well"]["total"]
