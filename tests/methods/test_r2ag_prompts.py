"""R2AG's prompts: appendix G.1's instruction as the paper gives it, and the CPU presets'
tokenizer text unchanged."""
import hashlib

from rlrag_jax.methods.r2ag import prompts

# Lines of appendix G.1 (Figure A.3), typed from the paper's text.
G1_LINES = (
    "#Decomposition#",
    "Steps:",
    "1. Base Questions (<base-Q>):",
    "- Each must target a single fact (WHO/WHEN/WHERE/etc.)",
    "- If evidences already answer the user question, respond with \"stop retrieval\" as the "
    "base question.",
    "2. Predicted Questions (<predicted-Q>):",
    "- Forecast next-hop questions based on the base questions only if you have knowledge to "
    "any base questions",
    "Keep your thinking process useful and brief.",
    "Wrap reasoning process inside: <think></think>.",
    "Wrap each of the base questions (or \"stop retrieval\") inside: <base-Q></base-Q>.",
    "Wrap each of the predicted question (or \"none\") inside: <predicted-Q></predicted-Q>",
)


def test_paper_instruction_is_appendix_g1():
  lines = prompts.INSTRUCTION.split("\n")
  assert all(line in lines for line in G1_LINES)
  assert ("then decompose into \"B\". Note do not repeat questions already answered by the "
          "provided evidences).") in prompts.INSTRUCTION
  assert prompts.prompt_text("Q?", [], "paper").startswith(prompts.INSTRUCTION)
  assert prompts.INSTRUCTION not in prompts.prompt_text("Q?", [], "compact")


def test_cpu_tokenizer_text_is_the_one_the_committed_results_were_trained_with():
  """The CPU presets' BPE merges are learned from it (SteeringTask.tokenizer_texts)."""
  digest = hashlib.sha1(prompts.TOKENIZER_TEXT.encode()).hexdigest()
  assert digest == "cd9f72f96f691ab34565735dec933ca607a33c6c"
