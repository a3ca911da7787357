"""Generate text with a Hugging Face Llama/Qwen2 checkpoint through the jitted sampler.

  python -m rlrag_jax.generate --model DIR --prompt "..." [--max-new-tokens N --temperature T
      --top-k K --top-p P --seed S --stop STR --no-chat-template --thinking]
  python -m rlrag_jax.generate --demo

`--demo` (without --model) builds a tiny random Llama-style model with a byte-level tokenizer in
a temporary directory (no download, no torch), saves it with `save_hf`, loads it back with
`load_hf` and samples from a few prompts, printing tokens/s. A random model writes random bytes:
the demo shows the pipeline, not language.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time

DEMO_PROMPTS = ("The capital of France is", "Q: Who wrote Hamlet?\nA:",
                "Retrieval-augmented generation")
EXIT_BAD_CHECKPOINT = 2


# --------------------------------------------------------------------------- demo model
def byte_level_tokenizer():
  """A `PreTrainedTokenizerFast` over the 256 bytes (no merges) + <pad>=0, <s>=1, </s>=2.

  Built in memory with `tokenizers`; every string round-trips, one token per UTF-8 byte.
  """
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast
  specials = ["<pad>", "<s>", "</s>"]
  vocab = {s: i for i, s in enumerate(specials)}
  for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
    vocab[ch] = len(vocab)
  tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens(specials)
  return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                 pad_token="<pad>", unk_token=None)


def build_demo_checkpoint(out_dir, seed: int = 0, **config_overrides):
  """Writes a tiny random Llama-style checkpoint with the byte-level tokenizer to `out_dir`."""
  import jax
  from rlrag_jax.models import LM, DecoderLM, ModelConfig, init_params, save_hf
  tokenizer = byte_level_tokenizer()
  kw = dict(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=344, num_layers=2,
            num_heads=4, num_kv_heads=2, head_dim=32, max_position_embeddings=512,
            model_type="llama", bos_token_id=tokenizer.bos_token_id,
            eos_token_id=(tokenizer.eos_token_id,), pad_token_id=tokenizer.pad_token_id)
  kw.update(config_overrides)
  config = ModelConfig(**kw)
  params = init_params(DecoderLM(config), jax.random.PRNGKey(seed))
  save_hf(LM(config, params, tokenizer), out_dir)
  return out_dir


# --------------------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m rlrag_jax.generate", description=__doc__.split("\n")[0])
  p.add_argument("--model", metavar="DIR", help="Hugging Face checkpoint directory (config.json, "
                 "*.safetensors, tokenizer files)")
  p.add_argument("--prompt", action="append", help="prompt text (repeat for a batch)")
  p.add_argument("--demo", action="store_true", help="build a tiny random model and sample from it")
  p.add_argument("--max-new-tokens", type=int, default=64)
  p.add_argument("--temperature", type=float, default=0.7, help="0 for greedy")
  p.add_argument("--top-k", type=int, default=0, help="0 disables")
  p.add_argument("--top-p", type=float, default=1.0, help="1 disables")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--stop", action="append", default=[], metavar="STR",
                 help="stop string (repeatable); the printed text is cut after it")
  p.add_argument("--no-chat-template", action="store_true",
                 help="encode the prompt as plain text even if the tokenizer has a chat template")
  p.add_argument("--thinking", action="store_true",
                 help="a chat template with Qwen3's enable_thinking switch lets the model open "
                      "<think> (default: its empty think block, a direct answer)")
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  return p


def _cut_at_stop(text: str, stops) -> str:
  """Cuts after the first stop string (catches tokenizations the in-loop matcher did not)."""
  ends = [text.find(s) + len(s) for s in stops if s and s in text]
  return text[:min(ends)] if ends else text


def run(lm, prompts, args, out=None, escape: bool = False) -> dict:
  """Encodes `prompts`, samples, prints each completion (as a Python literal when `escape`, for
  random models that emit control bytes); returns timing figures."""
  import jax
  from rlrag_jax.models import encode_prompt
  from rlrag_jax.sampling import generate
  out = out or sys.stdout
  if lm.tokenizer is None:
    raise ValueError("the checkpoint has no tokenizer files (tokenizer.json / tokenizer_config.json)"
                     "; cannot encode text prompts")
  ids = [encode_prompt(lm.tokenizer, p, not args.no_chat_template, args.thinking)
         for p in prompts]
  kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
            top_p=args.top_p, stop=tuple(args.stop), pad_id=lm.config.pad_token_id or 0)
  t0 = time.perf_counter()
  gen = generate(lm, ids, rng=jax.random.PRNGKey(args.seed), **kw)   # compiles, then runs
  t1 = time.perf_counter()
  gen = generate(lm, ids, rng=jax.random.PRNGKey(args.seed), **kw)   # cached program
  t2 = time.perf_counter()
  texts = gen.texts(lm.tokenizer, skip_special_tokens=True)
  for prompt, text, n, why in zip(prompts, texts, gen.lengths, gen.stopped_by):
    print(f"--- prompt: {prompt!r}", file=out)
    text = _cut_at_stop(text, args.stop)
    print(repr(text) if escape else text, file=out)
    print(f"--- ({int(n)} tokens, stopped by {why})", file=out)
  tokens = int(gen.lengths.sum())
  stats = {"tokens": tokens, "seconds": t2 - t1, "tokens_per_s": tokens / max(t2 - t1, 1e-9),
           "first_call_s": t1 - t0}
  print(f"{tokens} tokens in {stats['seconds']:.3f}s = {stats['tokens_per_s']:.1f} tokens/s "
        f"(first call incl. compile: {stats['first_call_s']:.2f}s)", file=out)
  return stats


def main(argv=None) -> int:
  parser = _parser()
  args = parser.parse_args(argv)
  if args.max_new_tokens < 1:
    parser.error(f"--max-new-tokens must be >= 1; got {args.max_new_tokens}")
  if not args.model and not args.demo:
    parser.error("give --model DIR (a Hugging Face checkpoint) or --demo")
  from rlrag_jax.models import load_hf
  if args.model:
    if not args.prompt:
      parser.error("--model needs at least one --prompt")
    try:
      lm = load_hf(args.model, dtype=args.dtype)
    except (FileNotFoundError, NotADirectoryError, ValueError) as e:
      print(f"error: --model {args.model}: cannot load a checkpoint: {e}", file=sys.stderr)
      return EXIT_BAD_CHECKPOINT
    run(lm, args.prompt, args)
    return 0
  with tempfile.TemporaryDirectory(prefix="rlrag_demo_") as tmp:
    build_demo_checkpoint(tmp, seed=args.seed)
    lm = load_hf(tmp, dtype=args.dtype)
    print(f"demo: random {lm.config.model_type} model, {lm.config.num_params():,} params, "
          f"byte-level tokenizer ({len(lm.tokenizer)} tokens), saved to and loaded from {tmp}")
    run(lm, args.prompt or list(DEMO_PROMPTS), args, escape=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
