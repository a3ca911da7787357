"""Dense retrieval: a Flax BERT sentence encoder (E5 / BGE / MiniLM conventions), a memory-mapped
passage store, exact and ScaNN indexes, the Retriever over an index folder, and the command
lines that build (`build`), search (`search`) and serve (`serve`, Search-R1's protocol; `client`)
an index."""
from rlrag_jax.retrieval.encoder import BertConfig, Encoder
from rlrag_jax.retrieval.index import ExactIndex, ScannIndex
from rlrag_jax.retrieval.retriever import Hit, Retriever, RetrieverFormatError, passage_text

__all__ = ["BertConfig", "Encoder", "ExactIndex", "ScannIndex", "Hit", "Retriever",
           "RetrieverFormatError", "passage_text"]
