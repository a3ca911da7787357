"""SPARKLE's reader prompts: the w/o-RD ablation's <search> token reaches the decision, the
in-process reader reads its tokenizer's chat template, and the 'paper' QF / KI instructions are
Figures 5 and 8's text (no output-format lines of ours)."""
from rlrag_jax.methods.sparkle import agent as agent_lib
from rlrag_jax.methods.sparkle import parsing, prompts, readers


class CharTokenizer:
  """One id per character; a chat template that wraps the user message in ids 1 ... 2."""
  chat_template = "{{ messages }}"

  def __call__(self, text, add_special_tokens=False):
    return {"input_ids": [ord(c) for c in text]}

  def apply_chat_template(self, msgs, add_generation_prompt=True, tokenize=True):
    assert add_generation_prompt and tokenize and [m["role"] for m in msgs] == ["user"]
    return [1] + [ord(c) for c in msgs[0]["content"]] + [2]


def _reader(tokenizer, search=False, chat=True):
  r = object.__new__(readers.LMReader)      # the prompt only: no model, no sampler
  r.tokenizer, r.style, r.passage_words, r.reasoning = tokenizer, "paper", 0, False
  r.search, r.thinking = search, False
  r.use_chat = bool(chat and getattr(tokenizer, "chat_template", None))
  return r


def test_without_rd_the_reader_is_told_of_search_and_its_token_triggers_retrieval():
  docs = [("Film", "The Promise is a film.")]
  plain = prompts.reader_text("Who directed it?", docs, ["a"], "paper")
  asked = prompts.reader_text("Who directed it?", docs, ["a"], "paper", search=True)
  assert "<search>" not in plain and prompts.READER_SEARCH_INSTRUCTION in asked
  # The compact (CPU, world-trained) reader asks by its need thoughts: its prompt is unchanged.
  assert prompts.reader_text("Q", docs, [], "compact", search=True) == \
      prompts.reader_text("Q", docs, [], "compact")
  # What a reader following the instruction writes (its call stops at </think>):
  t = parsing.parse_thought("<think> I need the film's director. <search> </think>")
  st = agent_lib.State(question="Q", tree=0, thoughts=(t.text,))
  assert t.kind == "think" and agent_lib.Agent.wants_search(None, st)
  st = agent_lib.State(question="Q", tree=0, thoughts=("The film is German.",))
  assert not agent_lib.Agent.wants_search(None, st)


def test_lm_reader_uses_the_chat_template_with_the_thoughts_as_the_reply_so_far():
  tok = CharTokenizer()
  docs = [("Film", "The Promise is a film.")]
  ids = _reader(tok, search=True).prompt_ids("Q?", docs, ["first"])
  user = prompts.reader_request("Q?", docs, "paper", search=True)
  want = [1] + [ord(c) for c in user] + [2] + [ord(c) for c in "<think>first</think>\n"]
  assert ids == want
  assert _reader(tok).prompt_ids("Q?", docs, []) == [1] + [ord(c) for c in
                                                          prompts.reader_request("Q?", docs,
                                                                                 "paper")] + [2]
  # No template (the CPU default's world tokenizer) or chat_template off: plain text as before.
  tok.chat_template = None
  text = prompts.reader_text("Q?", docs, ["first"], "paper")
  assert _reader(tok).prompt_ids("Q?", docs, ["first"]) == [ord(c) for c in text]
  tok.chat_template = "x"
  assert _reader(tok, chat=False).prompt_ids("Q?", docs, ["first"]) == [ord(c) for c in text]


def test_paper_qf_and_ki_instructions_are_the_figures_text():
  # Figure 5's Step 1 output format has no "Reasoning Chain:" label and Step 3 no output
  # format; Figure 8 ends at "...toward the final answer."
  assert "Output Format: <head1; relation1; tail1>, <head2; relation2; tail2>, ... " \
      "<headN; relationN; tailN>\n\n[Step 2" in prompts.QF_INSTRUCTION
  assert prompts.QF_INSTRUCTION.endswith("be suitable for a retrieval system.")
  assert prompts.KI_INSTRUCTION.endswith("help bridge the gap toward the final answer.")
  # Without Figure 5's missing query label, the line after the need's is the query.
  f = parsing.parse_formulation(
      "<The Promise; directed by; [unknown]>\nTo continue answering the question, we need to "
      "know: its director\n[Step 3: Formulate Retrieval Query]\nWho directed The Promise?", "fb")
  assert (f.need, f.query, f.well_formed) == ("its director", "Who directed The Promise?", True)
  f = parsing.parse_formulation("<a; b; [unknown]>\nTo continue answering the question, we "
                                "need to know: b of a\nStep 3: Query: b of a?", "fb")
  assert (f.query, f.well_formed) == ("b of a?", True)
