"""Qwen3's thinking switch through the chat template (issue 32, defect 6): a prompt that wants a
direct answer renders Qwen3's empty think block; templates without the switch are unchanged.

No Qwen3 tokenizer is available offline: QWEN3_TEMPLATE is a minimal Jinja template whose
generation prompt is Qwen3's own (Qwen/Qwen3-8B tokenizer_config.json: after
'<|im_start|>assistant\\n', '<think>\\n\\n</think>\\n\\n' when enable_thinking is false)."""
import pytest

from rlrag_jax.generate import byte_level_tokenizer
from rlrag_jax.methods.apex.task import planner_prompt_ids
from rlrag_jax.methods.r2ag import prompts as r2ag_prompts
from rlrag_jax.models import encode_prompt
from rlrag_jax.models.lm import template_reads_thinking

TURNS = ("{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
         "'<|im_end|>\\n' }}{%- endfor %}")
QWEN3_TEMPLATE = TURNS + (
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}")
QWEN2_TEMPLATE = TURNS + (
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
MSGS = [{"role": "user", "content": "Who directed Heat?"}]


def _ids(out) -> list:
  """apply_chat_template's ids (transformers 5 returns a BatchEncoding, 4 a list)."""
  return list(out["input_ids"] if hasattr(out, "keys") else out)


def _tok(template):
  tok = byte_level_tokenizer()
  tok.chat_template = template
  return tok


@pytest.fixture(scope="module")
def qwen3():
  return _tok(QWEN3_TEMPLATE)


def test_direct_answer_renders_qwen3s_empty_think_block(qwen3):
  assert template_reads_thinking(qwen3)
  text = qwen3.decode(encode_prompt(qwen3, MSGS))           # thinking=False: a direct answer
  assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
  thinking = qwen3.decode(encode_prompt(qwen3, MSGS, thinking=True))
  assert thinking.endswith("<|im_start|>assistant\n") and "<think>" not in thinking


def test_a_template_without_the_switch_is_rendered_unchanged():
  tok = _tok(QWEN2_TEMPLATE)
  assert not template_reads_thinking(tok)
  plain = _ids(tok.apply_chat_template(MSGS, add_generation_prompt=True, tokenize=True))
  assert encode_prompt(tok, MSGS) == encode_prompt(tok, MSGS, thinking=True) == plain
  # transformers hands unknown keywords to the template, which ignores them: passing the switch
  # only where it is read changes nothing for such templates, and says what is meant.
  assert _ids(tok.apply_chat_template(MSGS, add_generation_prompt=True, tokenize=True,
                                      enable_thinking=False)) == plain


def test_method_prompts_pass_the_switch(qwen3):
  docs = [("Heat", "Heat is a 1995 film directed by Michael Mann.")]
  gen = qwen3.decode(r2ag_prompts.generator_ids(qwen3, "Who directed Heat?", docs, "paper", True))
  assert gen.endswith("<think>\n\n</think>\n\n")             # R2AG's 16-token generator
  steer = qwen3.decode(r2ag_prompts.steering_ids(qwen3, "Who directed Heat?", docs, "paper", True,
                                                 thinking=True))
  assert steer.endswith("<|im_start|>assistant\n")
  plan = qwen3.decode(planner_prompt_ids(qwen3, "Who directed Heat?", 4, "paper", True))
  assert plan.endswith("<think>\n\n</think>\n\n")
