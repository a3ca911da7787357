"""Dense retrieval: a Flax BERT sentence encoder, exact and ScaNN indexes, and the Retriever."""
from rlrag_jax.retrieval.encoder import BertConfig, Encoder
from rlrag_jax.retrieval.index import ExactIndex, ScannIndex
from rlrag_jax.retrieval.retriever import Hit, Retriever, RetrieverFormatError, passage_text

__all__ = ["BertConfig", "Encoder", "ExactIndex", "ScannIndex", "Hit", "Retriever",
           "RetrieverFormatError", "passage_text"]
