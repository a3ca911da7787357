"""SPARKLE's frozen reader behind one call, `reader(requests) -> [text]`, each request being
(question, [(title, text)] context, [thoughts so far]) and each text the reader's next step:

  LMReader        an in-process Flax LM (a training run dir or HF checkpoint, loaded as the
                  config's auxiliary model `models.reader`), greedy, one batched call, stopping
                  after its thought or answer.
  EndpointReader  an OpenAI-compatible chat endpoint (plug-and-play: any reader, no retraining).
                  The thoughts so far are in the user message; a batch is asked by a pool of
                  `concurrency` threads, in order. A failed request is an empty text (a
                  malformed step), never an exception of its own; its `monitor` (a
                  judge.FailureMonitor, metrics reader/...) warns when failures pass 5% of the
                  recent requests and stops the run (`judge.EndpointFailing`) past
                  `max_failure_rate` of the last `failure_window`.

Both write the paper's prompts (prompts.reader_text; with `search`, the w/o-RD ablation's, the
instruction offers the <search> token); a reasoning reader writes free text split on newlines
and answers in \\boxed{}. LMReader renders the prompt through its tokenizer's chat template when
it has one (the thoughts so far continue the assistant's reply).
"""
from __future__ import annotations

import time
from typing import Sequence

from rlrag_jax.methods.sparkle import prompts

STOPS = ("</think>", "</answer>")


class LMReader:

  def __init__(self, lm, *, style: str, max_new_tokens: int = 48,
               passage_words: int = 0, reasoning: bool = False, search: bool = False,
               chat_template: bool = True, thinking: bool = False):
    from rlrag_jax.rollout.policy import Policy
    self.lm, self.tokenizer = lm, lm.tokenizer
    self.style, self.passage_words, self.reasoning = style, int(passage_words), bool(reasoning)
    self.search, self.thinking = bool(search), bool(thinking)
    # An instruct reader (the paper's Qwen2.5-7B-Instruct) reads its chat template, as
    # ProxyTask.encode gives the proxy its own; a tokenizer without one (the CPU default's
    # world reader) reads plain text, as before.
    self.use_chat = bool(chat_template and getattr(self.tokenizer, "chat_template", None))
    tok = self.tokenizer
    eos = tuple(lm.config.eos_token_id or ()) or (tok.eos_token_id,)
    from rlrag_jax.sampling import normalize_stops
    stops = () if self.reasoning else tuple(normalize_stops(STOPS, tok))
    self.policy = Policy(lm.config, lm.params, max_new_tokens=int(max_new_tokens), eos_ids=eos,
                         pad_id=tok.pad_token_id or 0, stop=stops)
    self.calls, self.rows, self.seconds = 0, 0, 0.0

  def monitors(self) -> list:
    return []                        # in-process: nothing to fail like an endpoint

  def prompt_ids(self, question: str, docs: Sequence[tuple], thoughts: Sequence[str]) -> list:
    """Plain text: the prompt and the thoughts so far. Chat template: the prompt as the user
    message, the thoughts so far after the generation prompt (the reply it continues)."""
    if not self.use_chat:
      text = prompts.reader_text(question, docs, thoughts, self.style, self.passage_words,
                                 self.reasoning, self.search)
      return self.tokenizer(text, add_special_tokens=False)["input_ids"]
    from rlrag_jax.models import encode_prompt
    user = prompts.reader_request(question, docs, self.style, self.passage_words,
                                  self.reasoning, self.search)
    head = encode_prompt(self.tokenizer, [{"role": "user", "content": user}],
                         thinking=self.thinking)
    history = prompts.reader_history(thoughts, self.reasoning)
    return head + (self.tokenizer(history, add_special_tokens=False)["input_ids"]
                   if history else [])

  def __call__(self, requests: Sequence[tuple], *, rows_per_call: int = 64) -> list:
    """The reader's next thought for each (question, docs, thoughts) request, greedy,
    `rows_per_call` prompts a sampler call (the proxy policy's)."""
    import jax
    if not requests:
      return []
    t0 = time.perf_counter()
    room = int(self.lm.config.max_position_embeddings) - int(self.policy.max_new_tokens)
    ids = [self.prompt_ids(q, d, t)[-room:] for q, d, t in requests]
    rows, _ = self.policy.sample_chunked(ids, jax.random.PRNGKey(0), chunk=rows_per_call,
                                         greedy=True)
    from rlrag_jax.rollout.single_turn import decode_keeping_tags
    out = [decode_keeping_tags(self.tokenizer, comp) for comp, _ in rows]
    self.calls += 1
    self.rows += len(requests)
    self.seconds += time.perf_counter() - t0
    return out


class EndpointReader:

  def __init__(self, url: str, model: str, *, style: str = "paper", max_tokens: int = 256,
               reasoning: bool = False, passage_words: int = 0, search: bool = False,
               timeout: float = 60.0,
               api_key: str = "", concurrency: int = 16, max_failure_rate: float = 0.5,
               failure_window: int = 200, key_prefix: str = "sparkle.reader."):
    from rlrag_jax.judge import FailureMonitor, at_least_one
    base = url.rstrip("/")
    self.url = base if base.endswith("/chat/completions") else base + "/chat/completions"
    self.model, self.style, self.max_tokens = model, style, int(max_tokens)
    self.reasoning, self.passage_words = bool(reasoning), int(passage_words)
    self.search = bool(search)
    self.timeout, self.api_key = float(timeout), api_key
    self.concurrency = at_least_one(concurrency, f"{key_prefix}concurrency")
    self.monitor = FailureMonitor("reader", self.url, max_failure_rate=max_failure_rate,
                                  window=failure_window, key_prefix=key_prefix,
                                  consequence="is an empty, malformed reader step")
    self.calls, self.rows, self.seconds = 0, 0, 0.0      # calls: batches asked

  @property
  def failures(self) -> int:
    return self.monitor.failures

  def monitors(self) -> list:
    return [self.monitor]

  def body(self, question: str, docs: Sequence[tuple], thoughts: Sequence[str]) -> dict:
    text = prompts.reader_text(question, docs, thoughts, self.style, self.passage_words,
                               self.reasoning, self.search)
    if thoughts:
      text += "\nWrite only your next step."
    body = {"model": self.model, "temperature": 0.0, "max_tokens": self.max_tokens,
            "messages": [{"role": "user", "content": text}]}
    if not self.reasoning:
      body["stop"] = list(STOPS)
    return body

  def __call__(self, requests: Sequence[tuple], *, rows_per_call: int = 0) -> list:
    """As LMReader's; `rows_per_call` is unused (requests go out `concurrency` at a time)."""
    from rlrag_jax.judge import map_bounded
    t0 = time.perf_counter()
    out = map_bounded(self._one, requests, self.concurrency, self.monitor)
    self.calls += 1
    self.rows += len(requests)
    self.seconds += time.perf_counter() - t0
    return out

  def _one(self, request: tuple) -> str:
    from rlrag_jax.judge import ask
    reply = ask(self.url, self.body(*request), api_key=self.api_key, timeout=self.timeout)
    if reply.text is None:
      self.monitor.record(reply.error, reply.kind)
      return ""
    self.monitor.record()
    return reply.text if self.reasoning else _close(reply.text)


def _close(reply: str) -> str:
  """An endpoint drops the stop string it stopped on: close the tag it opened last."""
  i, j = reply.rfind("<think>"), reply.rfind("<answer>")
  if j > i and "</answer>" not in reply[j:]:
    return reply + "</answer>"
  if i > j and "</think>" not in reply[i:]:
    return reply + "</think>"
  return reply
