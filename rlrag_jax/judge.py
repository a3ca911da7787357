"""Optional LLM judge of answer correctness through an OpenAI-compatible chat endpoint.

Off by default everywhere; nothing in the default pipeline or the tests touches the network.
Enable with e.g. `--config.eval.judge_url=http://localhost:8000/v1 --config.eval.judge_model=NAME`
(an endpoint you run, such as a local vLLM or SGLang server).

The judge prompt is per method: a method passes its own `JudgePrompt` (the template with
`{question}`, `{gold}`, `{pred}` fields and the function that reads the reply). `DEFAULT_PROMPT`
is a neutral yes/no prompt for methods whose paper gives none.

A judge never takes a run down. A reply that cannot be read (no choices, `content: null`, a body
that is not a JSON object, a verdict the prompt's parser does not recognise) and a failed
request (connection refused or reset, the server hanging up mid-reply, a timeout, an HTTP error)
both give "not judged": `__call__` returns None, which callers score as incorrect, and
`.failures` counts it. Transport failures and 5xx/429 answers are retried `retries` times with a
doubling pause; every attempt is bounded by `timeout` seconds.
"""
from __future__ import annotations

import dataclasses
import http.client
import json
import os
import socket
import time
import urllib.error
import urllib.request
from typing import Callable, Optional, Sequence


def yes_no(reply: str) -> Optional[bool]:
  """'yes…' -> True, 'no…' -> False (case and surrounding punctuation ignored), else None."""
  word = reply.strip().strip("\"'`*.:").lower()
  if word.startswith("yes"):
    return True
  if word.startswith("no"):
    return False
  return None


@dataclasses.dataclass(frozen=True)
class JudgePrompt:
  """A method's judge instruction: `template.format(question=, gold=, pred=)` is the user message;
  `parse(reply_text)` is the verdict (None when the reply says neither)."""
  template: str
  parse: Callable[[str], Optional[bool]] = yes_no
  max_tokens: int = 8
  system: str = ""


DEFAULT_PROMPT = JudgePrompt(
    "You judge whether a predicted answer to a question means the same as one of the gold "
    "answers. Reply with exactly one word: yes or no.\n\nQuestion: {question}\n"
    "Gold answers: {gold}\nPredicted answer: {pred}\nSame meaning?")

# Kept for callers of the previous module-level name.
PROMPT = DEFAULT_PROMPT.template

_RETRY_STATUS = {429, 500, 502, 503, 504}
_TRANSPORT_ERRORS = (urllib.error.URLError, http.client.HTTPException, ConnectionError,
                     socket.timeout, TimeoutError, OSError)


class OpenAIJudge:
  """`judge(question, prediction, answers) -> True | False | None` (None: not judged)."""

  def __init__(self, base_url: str, model: str, *, prompt: JudgePrompt = DEFAULT_PROMPT,
               api_key_env: str = "OPENAI_API_KEY", timeout: float = 30.0, retries: int = 2,
               backoff: float = 0.5):
    self.url = base_url.rstrip("/") + "/chat/completions"
    self.model = model
    self.prompt = prompt
    self.api_key = os.environ.get(api_key_env, "")
    self.timeout = float(timeout)
    self.retries = int(retries)
    self.backoff = float(backoff)
    self.calls = 0
    self.failures = 0

  @property
  def errors(self) -> int:            # the older name of the counter
    return self.failures

  def request_body(self, question: str, prediction: str, answers: Sequence[str]) -> dict:
    content = self.prompt.template.format(question=question, gold=" | ".join(answers),
                                          pred=prediction)
    messages = [{"role": "user", "content": content}]
    if self.prompt.system:
      messages.insert(0, {"role": "system", "content": self.prompt.system})
    return {"model": self.model, "temperature": 0.0, "max_tokens": self.prompt.max_tokens,
            "messages": messages}

  def __call__(self, question: str, prediction: str, answers: Sequence[str]) -> Optional[bool]:
    if not (prediction or "").strip():
      return False                    # nothing to judge: wrong, and not a judge failure
    self.calls += 1
    text = self._reply_text(self.request_body(question, prediction, answers))
    verdict = None if text is None else self.prompt.parse(text)
    if verdict is None:
      self.failures += 1
    return verdict

  def _reply_text(self, body: dict) -> Optional[str]:
    return chat_completion(self.url, body, api_key=self.api_key, timeout=self.timeout,
                           retries=self.retries, backoff=self.backoff)


def chat_completion(url: str, body: dict, *, api_key: str = "", timeout: float = 30.0,
                    retries: int = 2, backoff: float = 0.5) -> Optional[str]:
  """POSTs `body` to an OpenAI-compatible `.../chat/completions` url; the first choice's message
  content, or None when the request failed or the reply has no readable content. Transport
  errors and 5xx/429 answers are retried `retries` times with a doubling pause; never raises."""
  data = json.dumps(body).encode()
  headers = {"Content-Type": "application/json"}
  if api_key:
    headers["Authorization"] = f"Bearer {api_key}"
  for attempt in range(retries + 1):
    if attempt:
      time.sleep(backoff * 2 ** (attempt - 1))
    try:
      req = urllib.request.Request(url, data=data, headers=headers)
      with urllib.request.urlopen(req, timeout=timeout) as resp:
        raw = resp.read()
    except urllib.error.HTTPError as e:
      if e.code in _RETRY_STATUS:
        continue
      return None                   # 4xx: the request itself is wrong; retrying won't help
    except _TRANSPORT_ERRORS:
      continue
    return _content(raw)            # a readable HTTP 200 is final, whatever it says
  return None


def _content(raw: bytes) -> Optional[str]:
  """The first choice's message content, or None for any other shape."""
  try:
    reply = json.loads(raw.decode("utf-8", errors="replace"))
  except ValueError:
    return None
  if not isinstance(reply, dict):
    return None
  choices = reply.get("choices")
  if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
    return None
  message = choices[0].get("message")
  content = message.get("content") if isinstance(message, dict) else None
  return content if isinstance(content, str) else None


def from_config(section, prompt: JudgePrompt = DEFAULT_PROMPT) -> Optional[OpenAIJudge]:
  """A judge from a config section's `judge_url` / `judge_model` (None when the url is empty)."""
  url = getattr(section, "judge_url", "") or ""
  if not url:
    return None
  return OpenAIJudge(url, section.judge_model, prompt=prompt)
