"""Stop sequences: normalising user input to token-id sequences and the padded table the jitted
decode loop compares against.

The rule for string stops. A string can tokenize differently in context (BPE merges a leading
space or newline into the first token, and earlier text can merge into it too), and matching text
inside a jitted loop is not possible. So stops are matched on token ids, and a string `s` expands
to these alternatives:

  1. `tokenizer.encode(s)` with no special tokens,
  2. the encodings of `' ' + s` and `'\\n' + s` (whose text also ends with `s`, so they never stop
     early; they catch the common case where a space or newline merged into the first token).

A row stops when its generated tokens end with any alternative. Other tokenizations of `s` (for
example when `s` starts in the middle of a merged token) are not caught inside the loop; pass them
explicitly as token-id sequences. Stop sequences are matched only against generated tokens, never
against the prompt.
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence, Union

import numpy as np

StopSpec = Union[str, Sequence[int]]

# Never equal to a token id nor to the window's initial fill (-1).
_NEVER = -2
_CONTEXTS = (" ", "\n")


def _encode(tokenizer, text: str) -> tuple:
  if hasattr(tokenizer, "encode"):
    try:
      ids = tokenizer.encode(text, add_special_tokens=False)
    except TypeError:   # a tokenizers.Tokenizer: encode(text, add_special_tokens=...) -> Encoding
      ids = tokenizer.encode(text, add_special_tokens=False).ids
    if hasattr(ids, "ids"):
      ids = ids.ids
    return tuple(int(i) for i in ids)
  raise TypeError(f"tokenizer of type {type(tokenizer).__name__} has no encode() method")


def string_stop_variants(text: str, tokenizer) -> list:
  """The token-id sequences that end a row for the stop string `text` (see the module doc)."""
  if not text:
    raise ValueError("stop strings must be non-empty; got ''")
  out = []
  for t in (text,) + tuple(c + text for c in _CONTEXTS):
    ids = _encode(tokenizer, t)
    if ids and ids not in out:
      out.append(ids)
  return out


def normalize_stops(stop: Optional[Iterable[StopSpec]], tokenizer=None) -> list:
  """`stop` (strings and/or token-id sequences) -> deduplicated list of non-empty id tuples."""
  if stop is None:
    return []
  if isinstance(stop, str):
    stop = [stop]
  out = []
  for i, s in enumerate(stop):
    if isinstance(s, str):
      if tokenizer is None:
        raise ValueError(f"stop[{i}] is the string {s!r} but no tokenizer is available to encode "
                         "it; pass token-id sequences or an LM/tokenizer")
      seqs = string_stop_variants(s, tokenizer)
    else:
      try:
        seq = tuple(int(t) for t in np.asarray(s).reshape(-1))
      except (TypeError, ValueError):
        raise ValueError(f"stop[{i}] must be a string or a sequence of token ids; got {s!r}") \
            from None
      if not seq:
        raise ValueError(f"stop[{i}] is an empty token sequence")
      if min(seq) < 0:
        raise ValueError(f"stop[{i}] has a negative token id: {seq}")
      seqs = [seq]
    for seq in seqs:
      if seq not in out:
        out.append(seq)
  return out


def _round_up(n: int, m: int) -> int:
  return -(-n // m) * m


def stop_table(seqs: Sequence[tuple], multiple: int = 4):
  """Right-aligned padded table of stop sequences for the jitted matcher.

  Returns (table [S, L] int32, valid [S, L] bool); S and L are rounded up to `multiple` (padding
  rows never match) so that small changes to the stop list do not recompile. With no stops both
  have shape [0, 0] and the loop skips matching.
  """
  if not seqs:
    return np.zeros((0, 0), np.int32), np.zeros((0, 0), np.bool_)
  n = _round_up(len(seqs), multiple)
  width = _round_up(max(len(s) for s in seqs), multiple)
  table = np.full((n, width), _NEVER, np.int32)
  valid = np.ones((n, width), np.bool_)
  for i, s in enumerate(seqs):
    table[i, width - len(s):] = s
    valid[i, :width - len(s)] = False
  return table, valid


def ends_with_stop(window, table, valid):
  """window [B, L] (last L generated tokens, newest last; -1 before the first) -> [B] bool."""
  import jax.numpy as jnp
  eq = (window[:, None, :] == table[None]) | ~valid[None]      # [B, S, L]
  return jnp.any(jnp.all(eq, axis=-1), axis=-1)
