"""QueryEmbeddings: one encoder call for the uncached queries, rows in the asked order, equal
to the encoder's own output; the cache is bounded."""
import numpy as np

from rlrag_jax.retrieval.query_cache import QueryEmbeddings


class Enc:
  dim = 3

  def __init__(self):
    self.calls = []

  # queries and passages without prefixes, as the packaged MiniLM
  encode_queries = encode_passages = property(lambda self: self.encode)

  def encode(self, texts, batch_size=64):
    self.calls.append(list(texts))
    return np.array([[len(t), t.count("a"), 1.0] for t in texts], np.float32)


def test_cached_rows_match_the_encoder_and_are_encoded_once():
  enc = Enc()
  embed = QueryEmbeddings(enc, max_size=3)
  out = embed(["aa", "b", "aa"])
  np.testing.assert_array_equal(out, enc.encode(["aa", "b", "aa"]))
  assert enc.calls[0] == ["aa", "b"]                  # one call, each query once
  embed(["b", "ccc"])
  assert enc.calls[2] == ["ccc"] and embed.encoded == 3
  embed(["dd", "e"])                                  # 3 + 2 > max_size: cleared first
  assert len(embed.cache) == 2 and embed(["x"][:0]).shape == (0, 3)
