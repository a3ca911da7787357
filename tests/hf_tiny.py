"""Tiny random Hugging Face checkpoints built with `transformers` + CPU torch, for parity tests.

  path = make_tiny_checkpoint(tmp_path, "qwen2")            # or "llama", "qwen3"
  ref = transformers.AutoModelForCausalLM.from_pretrained(path)
  lm = rlrag_jax.models.load_hf(path)

The tokenizer is the byte-level one from `rlrag_jax.generate` (<pad>=0, <s>=1, </s>=2, then one
token per byte), so string stops and text round-trips can be tested too. Weights use a wider init
than HF's default (std 0.02) so that greedy decoding has clear winners instead of near-ties that
float round-off could flip.
"""
from __future__ import annotations

import pathlib

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, rope_theta=10000.0,
             rms_norm_eps=1e-6, initializer_range=0.15, tie_word_embeddings=False)

# The end-to-end tests' checkpoints: long enough for the presets' prompts, and one layer, since
# XLA compiles each layer of the unrolled stack apart and these tests check plumbing, not depth
# (the parity tests keep SMALL's two layers). One layer instead of two took a paper-preset test
# from 71 s to 54 s.
E2E_HF = dict(max_position_embeddings=4096, num_hidden_layers=1)


def make_tiny_checkpoint(tmp_path, model_type: str = "qwen2", *, seed: int = 0,
                         name: str = None, with_tokenizer: bool = True, **overrides) -> pathlib.Path:
  """Builds, saves (save_pretrained, safetensors) and returns the dir of a tiny random model.

  `overrides` are `transformers` config fields (e.g. tie_word_embeddings=True, vocab_size=...).
  """
  import torch
  import transformers
  from rlrag_jax.generate import byte_level_tokenizer

  tokenizer = byte_level_tokenizer()
  fields = dict(SMALL, vocab_size=len(tokenizer), bos_token_id=1, eos_token_id=2, pad_token_id=0)
  fields.update(overrides)
  if model_type == "qwen2":
    config = transformers.Qwen2Config(**fields)
  elif model_type == "llama":
    config = transformers.LlamaConfig(**fields)
  elif model_type == "qwen3":
    fields.setdefault("head_dim", 16)
    config = transformers.Qwen3Config(**fields)
  else:
    raise ValueError(f"model_type must be 'qwen2', 'qwen3' or 'llama'; got {model_type!r}")
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
  out = pathlib.Path(tmp_path) / (name or f"tiny_{model_type}_{seed}")
  model.save_pretrained(out, safe_serialization=True)
  if with_tokenizer:
    tokenizer.save_pretrained(out)
  return out


def load_reference(path):
  """The `transformers` model of a checkpoint dir, in eval mode, float32."""
  import torch
  import transformers
  return transformers.AutoModelForCausalLM.from_pretrained(
      path, dtype=torch.float32).eval()


# Qwen3's chat template, transcribed from the "chat_template" field of Qwen/Qwen3-8B's
# tokenizer_config.json (the same text ships with Qwen3-4B; Apache-2.0). Tests run offline, so
# the text lives here rather than being downloaded. What matters to the presets: after
# '<|im_start|>assistant\n' the generation prompt adds the empty think block
# '<think>\n\n</think>\n\n' only when enable_thinking is false; with thinking on the model opens
# its own <think>. Earlier assistant turns lose their reasoning (the split on '</think>').
QWEN3_CHAT_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- messages[0].content + '\\n\\n' }}\n"
    "    {%- endif %}\n"
    "    {{- \"# Tools\\n\\nYou may call one or more functions to assist with the user query."
    "\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n"
    "<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name "
    "and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": "
    "<function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n"
    "{%- for message in messages[::-1] %}\n"
    "    {%- set index = (messages|length - 1) - loop.index0 %}\n"
    "    {%- if ns.multi_step_tool and message.role == \"user\" and message.content is string "
    "and not(message.content.startswith('<tool_response>') and "
    "message.content.endswith('</tool_response>')) %}\n"
    "        {%- set ns.multi_step_tool = false %}\n"
    "        {%- set ns.last_query_index = index %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- for message in messages %}\n"
    "    {%- if message.content is string %}\n"
    "        {%- set content = message.content %}\n"
    "    {%- else %}\n"
    "        {%- set content = '' %}\n"
    "    {%- endif %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {%- set reasoning_content = '' %}\n"
    "        {%- if message.reasoning_content is string %}\n"
    "            {%- set reasoning_content = message.reasoning_content %}\n"
    "        {%- else %}\n"
    "            {%- if '</think>' in content %}\n"
    "                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n')"
    ".split('<think>')[-1].lstrip('\\n') %}\n"
    "                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}\n"
    "            {%- endif %}\n"
    "        {%- endif %}\n"
    "        {%- if loop.index0 > ns.last_query_index %}\n"
    "            {%- if loop.last or (not loop.last and reasoning_content) %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + "
    "reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}\n"
    "            {%- else %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    "            {%- endif %}\n"
    "        {%- else %}\n"
    "            {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    "        {%- endif %}\n"
    "        {%- if message.tool_calls %}\n"
    "            {%- for tool_call in message.tool_calls %}\n"
    "                {%- if (loop.first and content) or (not loop.first) %}\n"
    "                    {{- '\\n' }}\n"
    "                {%- endif %}\n"
    "                {%- if tool_call.function %}\n"
    "                    {%- set tool_call = tool_call.function %}\n"
    "                {%- endif %}\n"
    "                {{- '<tool_call>\\n{\"name\": \"' }}\n"
    "                {{- tool_call.name }}\n"
    "                {{- '\", \"arguments\": ' }}\n"
    "                {%- if tool_call.arguments is string %}\n"
    "                    {{- tool_call.arguments }}\n"
    "                {%- else %}\n"
    "                    {{- tool_call.arguments | tojson }}\n"
    "                {%- endif %}\n"
    "                {{- '}\\n</tool_call>' }}\n"
    "            {%- endfor %}\n"
    "        {%- endif %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if loop.first or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}")

# Qwen3's added tokens the presets meet, as its tokenizer marks them: the chat markers are
# special (skip_special_tokens drops them), the think tags are not (decoded text keeps them).
QWEN3_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
QWEN3_PLAIN = ("<think>", "</think>")


def qwen3_chat_tokenizer():
  """The byte-level tokenizer with Qwen3's chat markers and think tags added as Qwen3's
  tokenizer adds them, its chat template and its EOS ('<|im_end|>', the chat models' end of
  turn) and pad ('<|endoftext|>')."""
  from tokenizers import AddedToken
  from rlrag_jax.generate import byte_level_tokenizer
  tok = byte_level_tokenizer()
  tok.add_special_tokens({"additional_special_tokens": list(QWEN3_SPECIAL)})
  tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN3_PLAIN])
  tok.eos_token, tok.pad_token = "<|im_end|>", "<|endoftext|>"
  tok.chat_template = QWEN3_CHAT_TEMPLATE
  return tok


def make_tiny_qwen3_chat_checkpoint(tmp_path, *, seed: int = 0, name: str = None,
                                    **overrides) -> pathlib.Path:
  """A tiny random Qwen3 checkpoint whose tokenizer carries Qwen3's real chat template and
  added tokens (qwen3_chat_tokenizer); its vocabulary covers them."""
  tok = qwen3_chat_tokenizer()
  out = make_tiny_checkpoint(tmp_path, "qwen3", seed=seed, name=name or f"tiny_qwen3_chat_{seed}",
                             with_tokenizer=False, vocab_size=len(tok),
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                             **overrides)
  tok.save_pretrained(out)
  return out
