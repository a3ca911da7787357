"""Jitted KV-cache sampling: prefill + compiled decode loop, stop handling."""
from rlrag_jax.sampling.sampler import (Generation, SamplingMode, bucket_length, decode,
                                        default_eos_ids, generate, generate_with_params, left_pad,
                                        prefill, sample_logits, sampling_mode)
from rlrag_jax.sampling.contexts import CachedContexts
from rlrag_jax.sampling.stop import normalize_stops, stop_table, string_stop_variants

__all__ = ["CachedContexts", "Generation", "SamplingMode", "bucket_length", "decode",
           "default_eos_ids", "generate", "generate_with_params", "left_pad", "prefill",
           "sample_logits", "sampling_mode",
           "normalize_stops", "stop_table", "string_stop_variants"]
