"""Stop sequences: string -> token-id alternatives, the padded table and the in-loop matcher."""
import jax.numpy as jnp
import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from rlrag_jax.generate import byte_level_tokenizer
from rlrag_jax.sampling import normalize_stops, stop_table, string_stop_variants
from rlrag_jax.sampling.stop import ends_with_stop


def _bpe_with_space_merge():
  """Byte-level BPE where a space merges into a following '<' ("Ġ<"), as in GPT-2/Qwen vocabularies."""
  alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
  vocab = {ch: i for i, ch in enumerate(alphabet)}
  vocab["Ġ<"] = len(vocab)
  tok = Tokenizer(models.BPE(vocab=vocab, merges=[("Ġ", "<")]))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  tok.decoder = decoders.ByteLevel()
  return PreTrainedTokenizerFast(tokenizer_object=tok)


def test_string_variants_include_the_space_merged_tokenization():
  tok = _bpe_with_space_merge()
  alone = tok.encode("</a>", add_special_tokens=False)
  merged = tok.encode(" </a>", add_special_tokens=False)
  assert len(merged) == len(alone) and merged[0] == tok.convert_tokens_to_ids("Ġ<")
  variants = string_stop_variants("</a>", tok)
  assert tuple(alone) in variants and tuple(merged) in variants
  for v in variants:                      # every alternative's text ends with the stop string
    assert tok.decode(list(v)).endswith("</a>")


def test_byte_tokenizer_variants_end_with_the_plain_encoding():
  tok = byte_level_tokenizer()
  ids = tuple(tok.encode("ab", add_special_tokens=False))
  assert len(ids) == 2
  for v in string_stop_variants("ab", tok):
    assert v[-2:] == ids


def test_normalize_mixes_strings_and_ids_and_dedups():
  tok = byte_level_tokenizer()
  ab = tuple(tok.encode("ab", add_special_tokens=False))
  out = normalize_stops(["ab", list(ab), (7, 8), np.array([9])], tok)
  assert out[0] == ab and (7, 8) in out and (9,) in out
  assert len(out) == len(set(out))
  assert normalize_stops(None) == [] and normalize_stops(()) == []


@pytest.mark.parametrize("bad,match", [
    (["x"], "no tokenizer"), ([[]], "empty token sequence"), ([[3, -1]], "negative"),
    ([""], "non-empty")])
def test_normalize_rejects_bad_stops(bad, match):
  tok = byte_level_tokenizer() if bad == [""] else None
  with pytest.raises(ValueError, match=match):
    normalize_stops(bad, tok)


def test_table_is_right_aligned_and_padded():
  table, valid = stop_table([(5,), (1, 2, 3)])
  assert table.shape == valid.shape == (4, 4)
  assert table[0, -1] == 5 and valid[0].tolist() == [False, False, False, True]
  assert table[1, 1:].tolist() == [1, 2, 3] and valid[1].tolist() == [False, True, True, True]
  assert stop_table([])[0].shape == (0, 0)


def test_matcher_against_a_python_scan():
  stops = [(1, 2, 3), (7,), (4, 4)]
  table, valid = stop_table(stops)
  rng = np.random.default_rng(0)
  for _ in range(200):
    seq = rng.integers(0, 9, rng.integers(1, 7)).tolist()
    window = ([-1] * table.shape[1] + seq)[-table.shape[1]:]
    got = bool(ends_with_stop(jnp.asarray([window]), jnp.asarray(table), jnp.asarray(valid))[0])
    want = any(len(seq) >= len(s) and tuple(seq[-len(s):]) == s for s in stops)
    assert got == want, (seq, window)
