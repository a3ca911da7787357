"""Optional LLM judge of answer correctness through an OpenAI-compatible chat endpoint.

Off by default everywhere; nothing in the default pipeline or the tests touches the network.
Enable with e.g. `--config.eval.judge_url=http://localhost:8000/v1 --config.eval.judge_model=NAME`
(an endpoint you run, such as a local vLLM or SGLang server).
"""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Optional, Sequence

PROMPT = ("You judge whether a predicted answer to a question means the same as one of the gold "
          "answers. Reply with exactly one word: yes or no.\n\nQuestion: {question}\n"
          "Gold answers: {gold}\nPredicted answer: {pred}\nSame meaning?")


class OpenAIJudge:
  """`judge(question, prediction, answers) -> bool`; a failed request counts as 'no' and is
  counted in `.errors` (a flaky endpoint must not crash a run)."""

  def __init__(self, base_url: str, model: str, api_key_env: str = "OPENAI_API_KEY",
               timeout: float = 30.0, max_tokens: int = 4):
    self.url = base_url.rstrip("/") + "/chat/completions"
    self.model = model
    self.api_key = os.environ.get(api_key_env, "")
    self.timeout = timeout
    self.max_tokens = max_tokens
    self.errors = 0

  def request_body(self, question: str, prediction: str, answers: Sequence[str]) -> dict:
    content = PROMPT.format(question=question, gold=" | ".join(answers), pred=prediction)
    return {"model": self.model, "temperature": 0.0, "max_tokens": self.max_tokens,
            "messages": [{"role": "user", "content": content}]}

  def __call__(self, question: str, prediction: str, answers: Sequence[str]) -> bool:
    if not (prediction or "").strip():
      return False
    data = json.dumps(self.request_body(question, prediction, answers)).encode()
    req = urllib.request.Request(self.url, data=data, headers={
        "Content-Type": "application/json",
        **({"Authorization": f"Bearer {self.api_key}"} if self.api_key else {})})
    try:
      with urllib.request.urlopen(req, timeout=self.timeout) as resp:
        reply = json.loads(resp.read().decode())
      text = reply["choices"][0]["message"]["content"]
    except (urllib.error.URLError, TimeoutError, KeyError, IndexError, ValueError):
      self.errors += 1
      return False
    return text.strip().lower().startswith("yes")


def from_config(eval_cfg) -> Optional[OpenAIJudge]:
  url = getattr(eval_cfg, "judge_url", "") or ""
  if not url:
    return None
  return OpenAIJudge(url, eval_cfg.judge_model)
