"""World tokenizer: exact round trip, single-id tags, save/load via AutoTokenizer, determinism."""
import hashlib
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from rlrag_jax.data import tokenizer as tk
from rlrag_jax.data import world as world_lib

SMALL = dict(num_countries=6, num_cities=30, num_people=160, num_orgs=36, num_films=80,
             num_books=80, num_questions=300)
ODD = ["", " ", "  two  spaces ", "\n\ttab\r\n", "naïve café – “quotes”", "日本語のテキスト",
       "emoji 😀👍🏽 and ZWJ 👩‍👩‍👧", "e\u0301 combining", "עברית ومرحبا", "\x00\x01 nul",
       "a<answer>b</answer>c", "<s>not bos</s>", "<answer><answer>", "<ans wer>", "1987"]


@pytest.fixture(scope="module")
def world():
  return world_lib.build(seed=0)


@pytest.fixture(scope="module")
def tok(world):
  return tk.world_tokenizer(world)


def _texts(world):
  return ([r.text for r in world.corpus] + [e.question for e in world.dev + world.test]
          + [s.question for e in world.test for s in e.decomposition])


def test_control_tokens_and_size(tok):
  assert (tok.pad_token, tok.bos_token, tok.eos_token, tok.unk_token) == tk.CONTROL_TOKENS
  assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
  assert len(tok) == tk.DEFAULT_VOCAB_SIZE
  assert tok("Who directed it?")["input_ids"][0] != tok.bos_token_id   # no BOS added


def test_round_trip_on_world_text(world, tok):
  for s in _texts(world):
    ids = tok(s)["input_ids"]
    assert tok.unk_token_id not in ids
    assert tok.decode(ids) == s


def test_round_trip_on_odd_strings(tok):
  for s in ODD:
    assert tok.decode(tok(s)["input_ids"]) == s, s


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_round_trip_on_any_unicode(tok, s):
  assert tok.decode(tok(s)["input_ids"]) == s


def test_learned_merges_compress_world_text(world, tok):
  """Against the bytes the model starts from: merges must shorten world text a lot."""
  passages = [r.text for r in world.corpus]
  n_tokens = sum(len(tok(s)["input_ids"]) for s in passages)
  n_bytes = sum(len(s.encode()) for s in passages)
  assert n_tokens < 0.3 * n_bytes
  # Template words are single tokens with their leading space.
  assert tok.tokenize(" was born in") == ["Ġwas", "Ġborn", "Ġin"]


def test_special_tokens_are_single_ids_and_survive_skip(tok):
  ids = [tok.convert_tokens_to_ids(t) for t in tk.DEFAULT_TAGS]
  assert len(set(ids)) == len(ids) and min(ids) >= len(tok) - len(tk.DEFAULT_TAGS)
  for t, i in zip(tk.DEFAULT_TAGS, ids):
    assert tok(t)["input_ids"] == [i]
    assert i in tok(f"x{t}y z")["input_ids"]
  text = "<answer>Quorin</answer>"
  ids = tok(text)["input_ids"] + [tok.eos_token_id, tok.pad_token_id]
  assert tok.decode(ids, skip_special_tokens=True) == text
  assert tok.decode(ids) == text + "</s><pad>"


def test_save_and_load_with_auto_tokenizer(tmp_path, world):
  out = tmp_path / "tok"
  tok = tk.world_tokenizer(world, vocab_size=1024, special_tokens=("<search>", "</search>"),
                           out_dir=out)
  loaded = AutoTokenizer.from_pretrained(out)
  assert loaded.get_vocab() == tok.get_vocab() and len(loaded) == 1024
  assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id,
          loaded.unk_token_id) == (0, 1, 2, 3)
  for s in _texts(world)[::7] + ODD + ["<search>a query</search>"]:
    ids = tok(s)["input_ids"]
    assert loaded(s)["input_ids"] == ids, s
    assert loaded.decode(ids) == s
  assert loaded("<search>")["input_ids"] == [tok.convert_tokens_to_ids("<search>")]
  batch = loaded(["a b", "a"], padding=True)["input_ids"]
  assert batch[1][-1] == 0


def test_deterministic_in_process_and_across_processes(world):
  texts = tk.world_texts(world_lib.build(seed=2, **SMALL))
  a = tk.train_tokenizer(texts, 600, ("<answer>",)).backend_tokenizer.to_str()
  b = tk.train_tokenizer(texts, 600, ("<answer>",)).backend_tokenizer.to_str()
  assert a == b
  code = ("import hashlib;from rlrag_jax.data import world as W, tokenizer as T;"
          f"w = W.build(seed=2, **{SMALL!r});"
          "print(hashlib.sha256(T.train_tokenizer(T.world_texts(w), 600, ('<answer>',))"
          ".backend_tokenizer.to_str().encode()).hexdigest())")
  env = {**os.environ, "PYTHONHASHSEED": "999", "TOKENIZERS_PARALLELISM": "true"}
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       check=True).stdout.strip().splitlines()[-1]
  assert out == hashlib.sha256(a.encode()).hexdigest()
  # Counts do not depend on the order of the texts either.
  assert tk.train_tokenizer(texts[::-1], 600, ("<answer>",)).backend_tokenizer.to_str() == a


def test_bad_arguments_raise():
  with pytest.raises(ValueError, match="vocab_size=100"):
    tk.train_tokenizer(["a b"], vocab_size=100)
  with pytest.raises(ValueError, match="clash"):
    tk.train_tokenizer(["a b"], vocab_size=400, special_tokens=("<pad>",))


def test_an_inherited_tokenizer_that_fits_other_texts_is_reported(tmp_path, caplog):
  """model.init='hf' from a run directory: its tokenizer, trained on that run's texts, is
  compared with one trained on this task's; a poor fit is logged, a good one is not."""
  import logging
  import types
  own = [f"the red fox {i} jumps over the lazy dog near the river bank" for i in range(300)]
  other = [f"qzv wpxk {i} blorft zindle quaxo mervish tolp grandeq" for i in range(300)]
  run = tmp_path / "run"
  tk.train_tokenizer(own, vocab_size=400, special_tokens=("<answer>",), out_dir=run / "model")
  cfg = types.SimpleNamespace(init="hf", path=str(run))
  loaded = tk.tokenizer_for(cfg, tmp_path, lambda: own, ("<answer>",))
  assert tk.inherited_token_ratio(loaded, own, ("<answer>",)) == pytest.approx(1.0, abs=0.05)
  assert tk.inherited_token_ratio(loaded, other, ("<answer>",)) > 2.0
  with caplog.at_level(logging.WARNING, logger="rlrag_jax.data.tokenizer"):
    tk.tokenizer_for(cfg, tmp_path, lambda: own, ("<answer>",))
    assert not caplog.records
    tk.tokenizer_for(cfg, tmp_path, lambda: other, ("<answer>",))
  assert len(caplog.records) == 1 and str(run) in caplog.records[0].getMessage()


def test_train_with_a_missing_hf_checkpoint_says_it_does_not_exist(tmp_path):
  """model.init 'hf' and a model.path that is not there: the run stops at the tokenizer, the
  first thing that reads the checkpoint, naming the key and saying the path does not exist."""
  from configs import arena
  from rlrag_jax import config_base, trainer
  c = arena.get_config("")
  c.workdir = str(tmp_path / "run")
  c.data.world = config_base.world_config(num_countries=6, num_cities=24, num_people=80,
                                          num_orgs=20, num_films=40, num_books=40,
                                          num_questions=60)
  c.model.init, c.model.path = "hf", str(tmp_path / "no_such_checkpoint")
  with pytest.raises(FileNotFoundError) as e:
    trainer.run(c, progress=False)
  assert str(e.value) == (f"config key 'model.path' is '{tmp_path / 'no_such_checkpoint'}', which "
                          "does not exist (model.init 'hf' starts from an HF checkpoint directory "
                          "or a training run directory)")
  c.model.path = ""
  with pytest.raises(ValueError, match="config key 'model.path' is empty but 'model.init' is"):
    trainer.run(c, progress=False)
  c.model.path = str(tmp_path)                        # a folder without a tokenizer
  with pytest.raises(ValueError, match="which has no tokenizer files"):
    trainer.run(c, progress=False)
