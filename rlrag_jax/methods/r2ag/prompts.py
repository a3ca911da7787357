"""The steering model's prompt and the oracle that writes its SFT targets on the embedded world.

The 'paper' prompt is appendix G.1's decomposition instruction, the paper's text (base questions
for the current hop, predicted next-hop questions from the model's own knowledge, "stop
retrieval" / "none"); the user turn that carries the question and the evidences is ours.
The 'compact' prompt of the small from-scratch CPU model is the question, the evidence and a cue.

The oracle (the SFT warm-up, ours: the paper has none) reads the gold decomposition. At a context
(the gold documents found so far) a decomposition step is done when its gold documents are all
in the context and ready when it is not done and every step it references ('#k') is done. The
oracle's base queries are the ready steps with their references filled in; its predicted
queries are, for each ready step, the next step that needs only it, filled in with the ready
step's answer (the oracle "knows" it); stop once every gold document is in the context. Its
<think> names the answers found so far.
"""
from __future__ import annotations

from typing import Sequence

from rlrag_jax.data.schema import fill_references, step_references
from rlrag_jax.methods.r2ag import parsing
from rlrag_jax.retrieval.retriever import numbered_passages

# Appendix G.1 ("Prompt Example For R to Generate Intermediate Queries", Figure A.3), verbatim
# from the paper's text as converted from its PDF: the PDF's line numbers and end-of-line
# hyphenation ("ques- tion" -> "question") are removed, its paragraphs and line breaks kept.
# What the conversion cannot tell: whether the quotes were straight or curly (straight here, as
# extracted) and how a line that wraps in the figure was broken in the original (joined here).
# The paper gives no user-turn template: how the question and the evidences follow this
# instruction (user_text) is ours.
INSTRUCTION = (
    "#Decomposition#\n"
    "Task: You will be provided with a user question and evidences that may help to answer the "
    "question. Decompose the complex user question into single-hop retrievable sub-questions "
    "following these rules:\n"
    "Steps:\n"
    "1. Base Questions (<base-Q>):\n"
    "- Decompose the current-hop question directly from user question, taking the evidences for "
    "reference (if the user question is \"A \u2192 B \u2192 C\", and evidences cover \"A\", "
    "then decompose into \"B\". Note do not repeat questions already answered by the provided "
    "evidences).\n"
    "- Each must target a single fact (WHO/WHEN/WHERE/etc.)\n"
    "- If evidences already answer the user question, respond with \"stop retrieval\" as the "
    "base question.\n"
    "\n"
    "2. Predicted Questions (<predicted-Q>):\n"
    "- Forecast next-hop questions based on the base questions only if you have knowledge to "
    "any base questions\n"
    "- If you have no knowledge to predict further questions, or evidences already answers the "
    "user question, respond with \"none\" as the predicted question.\n"
    "\n"
    "Keep your thinking process useful and brief.\n"
    "\n"
    "Wrap reasoning process inside: <think></think>.\n"
    "Wrap each of the base questions (or \"stop retrieval\") inside: <base-Q></base-Q>.\n"
    "Wrap each of the predicted question (or \"none\") inside: <predicted-Q></predicted-Q>")

# An earlier paraphrase of G.1 (not the paper's text, and no longer a prompt). It stays only
# as training text of the from-scratch CPU presets' tokenizer (SteeringTask.tokenizer_texts):
# their 'compact' prompts never show an instruction, but the BPE merges were learned with this
# text among the rest, and a different text would change the tokenizer and their results.
TOKENIZER_TEXT = (
    "Task: You will be provided with a user question and evidences that may help to answer the "
    "question. Decompose the complex user question into single-hop retrievable sub-questions "
    "following these rules:\n"
    "1. Base Questions (<base-Q>): decompose the current-hop question from the user question, "
    "taking the evidences for reference (if the question is \"A -> B -> C\" and the evidences "
    "cover \"A\", ask for \"B\"; do not repeat questions the evidences already answer). Each "
    "must target a single fact (who, when, where, ...). If the evidences already answer the user "
    "question, write \"stop retrieval\" as the base question.\n"
    "2. Predicted Questions (<predicted-Q>): forecast next-hop questions from the base questions, "
    "only if you know the answer to a base question. Otherwise, or if the evidences already "
    "answer the user question, write \"none\".\n"
    "Keep your thinking brief. Wrap the reasoning in <think></think>, each base question (or "
    "\"stop retrieval\") in <base-Q></base-Q>, each predicted question (or \"none\") in "
    "<predicted-Q></predicted-Q>.")
CUE = "Steps:\n"


evidence_text = numbered_passages     # (title, text) pairs -> "[k] title: text" lines


def user_text(question: str, docs: Sequence[tuple], passage_words: int = 0) -> str:
  return f"Question: {question}\nEvidences:\n{evidence_text(docs, passage_words)}"


def prompt_text(question: str, docs: Sequence[tuple], style: str,
                passage_words: int = 0) -> str:
  body = user_text(question, docs, passage_words)
  if style == "compact":
    return f"{body}\n{CUE}"
  return f"{INSTRUCTION}\n\n{body}\n{CUE}"


# ------------------------------------------------------------------------------ the oracle
_refs = step_references
_fill = fill_references


def oracle_step(decomposition: Sequence, gold: Sequence[str], context: Sequence[str],
                predicted: bool = True) -> str:
  """The oracle's output at `context` (gold ids found so far)."""
  ctx = set(context)
  answers = [s.answer for s in decomposition]
  done = [bool(s.gold_ids) and set(s.gold_ids) <= ctx for s in decomposition]
  # A step without gold documents (a comparison) is done once what it references is.
  for i, s in enumerate(decomposition):
    if not s.gold_ids:
      done[i] = all(0 < r <= len(done) and done[r - 1] for r in _refs(s.question))
  known = [answers[i] for i, d in enumerate(done) if d and decomposition[i].gold_ids]
  think = "known: " + "; ".join(known) if known else "nothing known yet"
  if set(gold) <= ctx:
    return parsing.render(think, (), stop=True)
  ready = [i for i, s in enumerate(decomposition)
           if s.gold_ids and not done[i]
           and all(0 < r <= len(done) and done[r - 1] for r in _refs(s.question))]
  base = [_fill(decomposition[i].question, answers) for i in ready]
  preds = []
  if predicted:
    for i in ready:
      for j, s in enumerate(decomposition):
        if j > i and s.gold_ids and not done[j] and (i + 1) in _refs(s.question) and all(
            r == i + 1 or (0 < r <= len(done) and done[r - 1]) for r in _refs(s.question)):
          preds.append(_fill(s.question, answers))
          break
  return parsing.render(think, base, preds)


def oracle_contexts(decomposition: Sequence, gold: Sequence[str]) -> list:
  """The contexts along the oracle's base-only chain: empty, then after each round of ready
  steps, up to the full gold set (where the oracle stops)."""
  gold = list(gold)
  ctx, out = [], [()]
  for _ in range(len(decomposition) + 1):
    if set(gold) <= set(ctx):
      break
    done = {d for d in ctx}
    new = []
    for i, s in enumerate(decomposition):
      if not s.gold_ids or set(s.gold_ids) <= done:
        continue
      refs = _refs(s.question)
      if all(0 < r <= len(decomposition) and set(decomposition[r - 1].gold_ids) <= done
             for r in refs):
        new += [g for g in s.gold_ids if g not in done and g not in new]
    if not new:
      break
    ctx = ctx + new
    out.append(tuple(g for g in gold if g in set(ctx)))
  return out


# ------------------------------------------------------------------------------ the generator
GENERATOR_INSTRUCTION = ("Answer the question from the documents. Reply with the answer only: "
                         "a name, a year, a place or yes/no.")
ANSWER_CUE = "Answer:"


def generator_text(question: str, docs: Sequence[tuple], style: str,
                   passage_words: int = 0) -> str:
  body = f"Documents:\n{evidence_text(docs, passage_words)}\nQuestion: {question}\n{ANSWER_CUE}"
  return body if style == "compact" else f"{GENERATOR_INSTRUCTION}\n\n{body}"


def generator_ids(tokenizer, question: str, docs: Sequence[tuple], style: str, use_chat: bool,
                  passage_words: int = 0, thinking: bool = False) -> list:
  if use_chat:
    from rlrag_jax.models import encode_prompt
    return encode_prompt(tokenizer, [
        {"role": "system", "content": GENERATOR_INSTRUCTION},
        {"role": "user", "content": generator_text(question, docs, "compact", passage_words)}],
                         thinking=thinking)
  return tokenizer(generator_text(question, docs, style, passage_words),
                   add_special_tokens=False)["input_ids"]


def steering_ids(tokenizer, question: str, docs: Sequence[tuple], style: str, use_chat: bool,
                 passage_words: int = 0, thinking: bool = False) -> list:
  if use_chat:
    from rlrag_jax.models import encode_prompt
    return encode_prompt(tokenizer, [
        {"role": "system", "content": INSTRUCTION},
        {"role": "user", "content": user_text(question, docs, passage_words)}],
                         thinking=thinking)
  return tokenizer(prompt_text(question, docs, style, passage_words),
                   add_special_tokens=False)["input_ids"]


# ------------------------------------------------------------------------------ the LLM judge
# Appendix G.2 ("Prompt Used for LLM-EM Evaluation with GPT-4o", Figure A.4): the system prompt
# verbatim from the paper's text as converted from its PDF, its curly quotes and apostrophes as
# extracted (the conversion cannot tell whether the original had straight ones), the figure's
# line wraps joined. The paper shows the user turn only through its two instances ("User's
# input": Query / Label / Student's Answer), so the user template below follows them; the
# verdict is read from the last 'Validation:' (either quote style), and the reply may spend up to
# JUDGE_MAX_TOKENS (ours) on the "Analysis:" the instances write first.
JUDGE_SYSTEM = (
    "You are an excellent teacher. You will be given a query and its corresponding label, along "
    "with a student\u2019s answer to validate. Your task is to determine if the answer correctly "
    "answers the query based on the label.\n"
    "Provide your validation in the form: Validation: [\u201cCorrect\u201d] or Validation: "
    "[\u201cWrong\u201d]. Learn from the instances below:\n"
    "### Instance 1\n"
    "#### User\u2019s input:\n"
    "Query: \u201cWhat is the majority party in the country where Canberra is located in "
    "2024?\u201d\n"
    "Label: \u201cThe Labor Party.\u201d\n"
    "Student\u2019s Answer: \u201cThe Labor Party is the majority party in the country where "
    "Canberra is located in 2024.\u201d\n"
    "#### Expected response:\n"
    "Analysis:\n"
    "The student\u2019s answer correctly matches the label, as it accurately restates that the "
    "Labor Party is the majority party in the country where Canberra is located in 2024.\n"
    "Validation: [\u201cCorrect\u201d]\n"
    "### Instance 2\n"
    "#### User\u2019s input:\n"
    "Query: \u201cAre either Baz Warne or Marty Balin actors?\u201d\n"
    "Label: \u201cno\u201d\n"
    "Student\u2019s Answer: \u201cBaz Warne is an actor while Marty Balin is not.\u201d\n"
    "#### Expected response:\n"
    "Analysis:\n"
    "The label indicates that neither Baz Warne nor Marty Balin are actors. However, the "
    "student\u2019s answer incorrectly states that Baz Warne is an actor. This contradicts the "
    "label. Therefore, the student\u2019s answer does not match the correct information provided "
    "by the label.\n"
    "Validation: [\u201cWrong\u201d]\n"
    "\n"
    "Now process the user query.")
JUDGE_USER = ("Query: \u201c{question}\u201d\nLabel: \u201c{gold}\u201d\n"
              "Student\u2019s Answer: \u201c{pred}\u201d")
JUDGE_MAX_TOKENS = 256


def judge_verdict(reply: str):
  """True / False from the last 'Validation: ["Correct"]' / '["Wrong"]' of a reply (quotes
  and brackets optional, any case); None when there is none."""
  import re
  found = re.findall(r"validation\s*:\s*\[?\s*[\"'\u201c\u201d]?\s*(correct|wrong)",
                     reply or "", flags=re.I)
  return None if not found else found[-1].lower() == "correct"


def judge_prompt():
  """G.2 as a `judge.JudgePrompt` (eval.judge_url: the evaluation's 'judge' column)."""
  from rlrag_jax import judge
  return judge.JudgePrompt(JUDGE_USER, parse=judge_verdict, max_tokens=JUDGE_MAX_TOKENS,
                           system=JUDGE_SYSTEM)
