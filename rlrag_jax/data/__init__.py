"""Datasets: schema, raw-file loaders, the input pipeline (TFDS builders: `data.tfds_builders`)."""
from rlrag_jax.data.loaders import (CORPORA, DATASETS, SPLITS, DataError, LoadReport,
                                    available_splits, corpus_path, dataset_path, iter_dataset,
                                    load_corpus, load_dataset)
from rlrag_jax.data.pipeline import BatchIterator, epoch_order
from rlrag_jax.data.schema import Context, CorpusRecord, Example, Step, Triple
