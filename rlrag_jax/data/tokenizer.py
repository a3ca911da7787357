"""A small byte-level BPE tokenizer trained on our own text (by default, the embedded world).

Why byte-level BPE: its base alphabet is the 256 bytes, so any string encodes without an unknown
token and `decode(encode(s)) == s` exactly (no normaliser, no prefix space, no clean-up). Merges
learned on the world's text make its recurring pieces single tokens: name syllables, template
words with their leading space (" was born in"), frequent years. A word-level model would give
slightly shorter world text but needs a fallback for unseen words that does not round-trip as
simply; BPE with `byte_fallback` on a whitespace pre-tokenizer would do, with more moving parts.

Token ids: 0 <pad>, 1 <s> (bos), 2 </s> (eos), 3 <unk> (registered for APIs that expect one; the
byte-level model never emits it), then the 256 byte symbols and the merges, then the extra
tokens passed as `special_tokens`. Those extras (tags such as '<answer>') are added tokens that
always encode to one id, but are *not* special in the `transformers` sense: decoding with
`skip_special_tokens=True` drops pad/bos/eos and keeps the tags, which parsers need to see.
No BOS/EOS is added by `encode`; callers add them where a format needs them.
"""
from __future__ import annotations

import logging
import os
import pathlib
from typing import Iterable, Optional, Sequence, Union

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
CONTROL_TOKENS = (PAD, BOS, EOS, UNK)
# Tags the methods' prompts use; `world_tokenizer` registers them by default.
DEFAULT_TAGS = ("<think>", "</think>", "<search>", "</search>", "<information>",
                "</information>", "<answer>", "</answer>", "<relevance>", "</relevance>",
                "<analysis>", "</analysis>", "<reflect>", "</reflect>")
DEFAULT_VOCAB_SIZE = 2048
# A tokenizer inherited from another run that needs this many times the tokens of one trained
# on the task's own texts is reported: longer sequences, and output caps that cut steps.
INHERITED_TOKENS_WARN = 1.5

log = logging.getLogger(__name__)


def train_tokenizer(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE,
                    special_tokens: Sequence[str] = (),
                    out_dir: Optional[Union[str, os.PathLike]] = None,
                    min_frequency: int = 2) -> PreTrainedTokenizerFast:
  """Trains a byte-level BPE tokenizer on `texts`.

  Args:
    texts: training strings (iterated once).
    vocab_size: size of the whole vocabulary: the 4 control tokens, the 256 bytes, the merges
      and `special_tokens`. Fewer merges are learned when the text has too few pairs that occur
      `min_frequency` times.
    special_tokens: extra strings that must each encode to a single id (e.g. '<answer>').
    out_dir: if given, `save_pretrained(out_dir)`; `AutoTokenizer.from_pretrained(out_dir)`
      loads it back.
    min_frequency: a pair is merged only if it occurs at least this often.

  Returns:
    A `transformers` fast tokenizer with pad/bos/eos/unk set.
  """
  extra = list(dict.fromkeys(special_tokens))
  clash = [t for t in extra if t in CONTROL_TOKENS]
  if clash:
    raise ValueError(f"train_tokenizer: special_tokens {clash} clash with the control tokens "
                     f"{list(CONTROL_TOKENS)} (rlrag_jax/data/tokenizer.py)")
  if any(not isinstance(t, str) or not t for t in extra):
    raise ValueError(f"train_tokenizer: special_tokens must be non-empty strings, found {extra}")
  alphabet = pre_tokenizers.ByteLevel.alphabet()
  floor = len(CONTROL_TOKENS) + len(alphabet) + len(extra)
  if vocab_size < floor:
    raise ValueError(f"train_tokenizer: vocab_size={vocab_size} is below {floor} = "
                     f"{len(CONTROL_TOKENS)} control + {len(alphabet)} bytes + {len(extra)} "
                     f"special tokens")
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(extra), min_frequency=min_frequency,
                                show_progress=False, special_tokens=list(CONTROL_TOKENS),
                                initial_alphabet=alphabet)
  tok.train_from_iterator(texts, trainer=trainer)
  tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in extra])
  hf = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, bos_token=BOS,
                               eos_token=EOS, unk_token=UNK, clean_up_tokenization_spaces=False)
  if out_dir is not None:
    hf.save_pretrained(os.fspath(out_dir))
  return hf


def inherited_token_ratio(tok, texts: Iterable[str], special_tokens: Sequence[str] = ()) -> float:
  """Tokens of `texts` under `tok` over their tokens under a BPE of `tok`'s vocabulary size
  trained on them (about 1: `tok` fits these texts as well as their own would)."""
  sample = [t for t in texts if t]
  if not sample:
    return 1.0
  ref = train_tokenizer(sample, vocab_size=len(tok), special_tokens=special_tokens)
  count = lambda t: sum(len(ids) for ids in t(sample, add_special_tokens=False)["input_ids"])
  return count(tok) / max(count(ref), 1)


def world_texts(world) -> list:
  """The text a world tokenizer learns from: passages, train questions, steps and answers."""
  texts = [r.text for r in world.corpus]
  for e in world.train:
    texts.append(e.question)
    texts.extend(s.question for s in e.decomposition)
    texts.extend(e.answers)
  return texts


def world_tokenizer(world=None, vocab_size: int = DEFAULT_VOCAB_SIZE,
                    special_tokens: Sequence[str] = DEFAULT_TAGS,
                    out_dir: Optional[Union[str, os.PathLike]] = None,
                    extra_texts: Iterable[str] = ()) -> PreTrainedTokenizerFast:
  """`train_tokenizer` on `world_texts(world)` plus `extra_texts` (e.g. prompt templates).

  `world=None` builds the default world (`rlrag_jax.data.world.build(seed=0)`). Dev and test
  questions are left out of training; their names and templates occur in the corpus anyway.
  """
  if world is None:
    from rlrag_jax.data import world as world_lib  # pylint: disable=g-import-not-at-top
    world = world_lib.build(seed=0)
  return train_tokenizer(world_texts(world) + list(extra_texts), vocab_size=vocab_size,
                         special_tokens=special_tokens, out_dir=out_dir)


def tokenizer_for(model_cfg, workdir, texts, special_tokens=DEFAULT_TAGS):
  """The tokenizer a run uses, from its config's `model` section.

  model.init == 'hf': the checkpoint's own tokenizer (model.path: an HF checkpoint or a
  training run directory, whose tokenizer is in model/). Otherwise a byte-level BPE of
  model.vocab_size trained on `texts` (a callable returning an iterable of strings, called only
  when training is needed) and kept in <workdir>/tokenizer, so a resumed or evaluated run reuses
  the same one.
  """
  if model_cfg.init == "hf":
    from rlrag_jax.models.hf_io import load_tokenizer
    if not model_cfg.path:
      raise ValueError("config key 'model.path' is empty but 'model.init' is 'hf': set it to an "
                       "HF checkpoint directory or a training run directory")
    if not pathlib.Path(model_cfg.path).expanduser().exists():
      raise FileNotFoundError(f"config key 'model.path' is {model_cfg.path!r}, which does not "
                              "exist (model.init 'hf' starts from an HF checkpoint directory or "
                              "a training run directory)")
    run_model = pathlib.Path(model_cfg.path).expanduser() / "model"
    # A training run directory keeps its tokenizer (and config) in model/.
    from_run = (run_model / "tokenizer.json").exists()
    tok = load_tokenizer(run_model if from_run else model_cfg.path)
    if tok is None:
      raise ValueError(f"config key 'model.path' is {model_cfg.path!r}, which has no tokenizer "
                       "files (tokenizer.json, tokenizer_config.json, tokenizer.model or "
                       "vocab.json; a run directory's are in model/)")
    if from_run:      # ours, trained on another run's texts: does it fit this task's?
      ratio = inherited_token_ratio(tok, texts(), special_tokens)
      if ratio > INHERITED_TOKENS_WARN:
        log.warning("config key 'model.path' (%s): the run's tokenizer encodes this task's "
                    "texts into %.2fx the tokens of one trained on them (sequences longer, "
                    "output caps such as max_new_tokens reached sooner)", model_cfg.path, ratio)
    return tok
  out = pathlib.Path(workdir) / "tokenizer"
  if (out / "tokenizer.json").exists():
    import transformers
    return transformers.AutoTokenizer.from_pretrained(str(out), local_files_only=True)
  return train_tokenizer(texts(), vocab_size=model_cfg.vocab_size, special_tokens=special_tokens,
                         out_dir=str(out))
