"""ARENA glue: chain-style gold targets, context limiting, prompts and rewards through the task."""
import dataclasses

import pytest

from configs import arena as arena_config
from rlrag_jax.data.schema import Context, Example, Step
from rlrag_jax.data.sources import limit_contexts
from rlrag_jax.methods.arena import parse, reward, sft
from rlrag_jax.tasks import Episode, get_task


def _example():
  ctx = [Context("a", "Anna Bell", "Anna Bell was born in Rome."),
         Context("d1", "Decoy", "Decoy is a film."),
         Context("b", "Rome", "Rome is in Italy."),
         Context("d2", "Other", "Other is a book.")]
  steps = [Step("Where was Anna Bell born?", "Rome", ["a"]),
           Step("Which country is #1 in?", "Italy", ["b"])]
  return Example(id="x", question="Which country was Anna Bell born in?", answers=["Italy"],
                 contexts=ctx, gold_ids=["a", "b"], decomposition=steps, hops=2)


def test_chain_style_target_is_cite_and_subanswer_per_step():
  ex = _example()
  got = sft.gold_completion(ex, style="chain")
  assert got == ("<relevance>[1, 3]</relevance>\n<analysis>[1] Rome. [3] Italy. "
                 "So the answer is Italy.</analysis>\n<answer>Italy</answer>")
  assert parse(got).well_formed
  assert reward(got, ex.answers, [1, 3])["total"] == 13.0
  with pytest.raises(ValueError, match="analysis style"):
    sft.gold_completion(ex, style="terse")


def test_chain_style_falls_back_without_decomposition():
  ex = dataclasses.replace(_example(), decomposition=[])
  assert sft.gold_completion(ex, style="chain") == sft.gold_completion(ex, style="full")


def test_limit_contexts_keeps_gold_and_is_seeded():
  ex = _example()
  small = limit_contexts(ex, 3, seed=0)
  ids = [c.id for c in small.contexts]
  assert len(ids) == 3 and {"a", "b"} <= set(ids)
  assert ids == [c.id for c in limit_contexts(ex, 3, seed=0).contexts]
  assert limit_contexts(ex, 0) is ex and limit_contexts(ex, 10) is ex
  # Gold beyond the limit is never dropped.
  assert {c.id for c in limit_contexts(ex, 1).contexts} == {"a", "b"}


@pytest.fixture(scope="module")
def task(tmp_path_factory):
  c = arena_config.get_config("")
  c.workdir = str(tmp_path_factory.mktemp("arena_task"))
  c.data.world = dict(seed=0, num_questions=300)
  c.model.vocab_size = 512
  return get_task("arena", c)


def test_task_prompts_and_rewards(task):
  ex = task.train[0]
  text = task.prompt_text(ex)
  assert ex.question in text and text.startswith("[1] ")
  assert text.count("\n[") == len(ex.contexts) - 1
  # Round trip through the tokenizer the task trained.
  assert task.tokenizer.decode(task.prompt_ids(ex)) == text
  gold = task.sft_target(ex)
  ids = task.sft_target_ids(ex)
  assert ids[-1] == task.tokenizer.eos_token_id
  ep = Episode(ex, [], ids, [1] * len(ids), task.decode(ids))
  assert ep.text == gold
  assert task.rewards([ep])[0]["total"] == 13.0
  m = task.eval_metrics([ep])[0]
  assert m["em"] == 1.0 and m["format"] == 1.0 and m["relevance"] == 1.0


@pytest.mark.parametrize("text", ["", "<answer>", "<relevance>[99]</relevance><answer>x",
                                  "\x00" * 50, "<analysis><analysis></analysis>"])
def test_task_reward_on_malformed_generations_is_zero_not_an_error(task, text):
  ep = Episode(task.train[0], [], [], [], text)
  r = task.rewards([ep])[0]
  assert r["format"] == 0.0 and r["bonus"] == 0.0
  assert task.eval_metrics([ep])[0]["em"] in (0.0, 1.0)
