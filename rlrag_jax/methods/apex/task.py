"""APEX-Searcher glue for the shared trainer. `apex.role` picks the model being trained:

  planner   question -> numbered plan of sub-questions (plans.py); SFT on gold plans, then GRPO
            rewarded by SEPR (sepr.py), one batched encoder call per training batch.
  executor  not built yet (a clear error names the missing piece).
"""
from __future__ import annotations

import logging
from typing import Sequence

from rlrag_jax.data import sources
from rlrag_jax.methods.apex import plans, rewrite, sepr
from rlrag_jax.rollout.single_turn import decode_keeping_tags, single_turn

ROLES = ("planner", "executor")
PLAN_CUE = "Plan:\n"
log = logging.getLogger("rlrag_jax.apex")


class PlannerTask:
  """The planning agent: one single-turn rollout per question, SEPR against the gold plan."""
  name = "apex"

  def __init__(self, config, encoder=None):
    self.config = config
    a = config.apex
    self.max_steps = int(a.max_steps)
    if self.max_steps < 1:
      raise ValueError(f"config key 'apex.max_steps' is {self.max_steps}; expected >= 1")
    sel = sources.select(config.data, seed=config.seed)
    self.train = [ex for ex in sel.train if _gold_fits(ex, self.max_steps)]
    self.eval = [ex for ex in sel.eval if _gold_fits(ex, self.max_steps)]
    dropped = len(sel.train) + len(sel.eval) - len(self.train) - len(self.eval)
    if dropped:
      log.warning("apex: %d examples have no decomposition or more than apex.max_steps=%d gold "
                  "steps and are left out", dropped, self.max_steps)
    if not self.train:
      raise ValueError("apex planner: no training example has a gold decomposition of at most "
                       f"apex.max_steps={self.max_steps} steps")
    self.corpus = sel.corpus
    self.gold_plans = rewrite.read_plans(a.gold_plans) if a.get("gold_plans") else {}
    self.rewrite_symbolic = bool(a.get("rewrite_symbolic", True))   # counts: rewrite.py's CLI
    self._encoder = encoder
    self._scorer = None
    self.threshold = float(a.sepr_threshold)
    from rlrag_jax.data.tokenizer import tokenizer_for
    self.tokenizer = tokenizer_for(config.model, config.workdir, self.tokenizer_texts, ())
    self.use_chat = bool(config.model.chat_template and
                         getattr(self.tokenizer, "chat_template", None))

  # ---------------------------------------------------------------- prompts
  def prompt_text(self, ex) -> str:
    if self.config.data.prompt_style == "compact":
      return f"Question: {ex.question}\n{PLAN_CUE}"
    return f"{plans.instruction(self.max_steps)}\n\nQuestion: {ex.question}\n{PLAN_CUE}"

  def prompt_ids(self, ex) -> list:
    if self.use_chat:
      from rlrag_jax.models import encode_prompt
      return encode_prompt(self.tokenizer, [
          {"role": "system", "content": plans.instruction(self.max_steps)},
          {"role": "user", "content": f"Question: {ex.question}"}])
    return self.tokenizer(self.prompt_text(ex), add_special_tokens=False)["input_ids"]

  def gold(self, ex) -> list:
    """The gold plan: `apex.gold_plans`'s entry for the example, else its decomposition with
    MuSiQue's symbolic steps rewritten (apex.rewrite_symbolic)."""
    if str(ex.id) in self.gold_plans:
      return list(self.gold_plans[str(ex.id)])
    steps = plans.gold_steps(ex)
    return rewrite.rewrite_plan(steps)[0] if self.rewrite_symbolic else steps

  def sft_target(self, ex) -> str:
    return plans.render(self.gold(ex))

  def sft_target_ids(self, ex) -> list:
    eos = self.tokenizer.eos_token_id
    ids = self.tokenizer(self.sft_target(ex), add_special_tokens=False)["input_ids"]
    return ids + ([eos] if eos is not None else [])

  def tokenizer_texts(self):
    for ex in list(self.train) + list(self.eval):
      yield self.prompt_text(ex)
      yield self.sft_target(ex)

  # ---------------------------------------------------------------- rollouts and rewards
  def decode(self, ids: Sequence[int]) -> str:
    return decode_keeping_tags(self.tokenizer, ids)

  def rollout(self, policy, examples, rng, *, group_size=1, greedy=False):
    return single_turn(policy, examples, self.prompt_ids, self.decode, rng,
                       group_size=group_size, greedy=greedy)

  @property
  def scorer(self) -> sepr.SEPRScorer:
    if self._scorer is None:
      if self._encoder is None:
        from rlrag_jax.retrieval.encoder import Encoder
        path = self.config.apex.get("encoder_path", "") or None
        self._encoder = Encoder.from_pretrained(path, max_length=64)
      self._scorer = sepr.SEPRScorer(self._encoder, self.threshold)
    return self._scorer

  def score(self, episodes) -> list:
    """Per episode: SEPR of its parsed plan against the gold plan, with the parse details."""
    parsed = [plans.parse(ep.text, ep.example.question, self.max_steps) for ep in episodes]
    golds = [self.gold(ep.example) for ep in episodes]
    # A plan that does not parse scores 0: its fallback (the question as one step) is what the
    # pipeline would run, but rewarding it teaches the planner to write no plan at all (a 2-hop
    # question is often within the threshold of its first sub-question).
    values = self.scorer([[] if p.fallback else list(p.steps) for p in parsed], golds)
    out = []
    for p, g, v in zip(parsed, golds, values):
      out.append({"total": float(v), "sepr": float(v), "fallback": float(p.fallback),
                  "plan_steps": float(len(p.steps)),
                  "step_error": float(len(p.steps) - len(g)),
                  "exact": float(not p.fallback and list(p.steps) == list(g))})
    return out

  def rewards(self, episodes, step: int = 0) -> list:
    return self.score(episodes)

  def reward(self, episode, step: int = 0) -> dict:
    return self.score([episode])[0]

  def eval_metrics_batch(self, episodes) -> list:
    out = []
    for ep, s in zip(episodes, self.score(episodes)):
      out.append({"sepr": s["sepr"], "fallback": s["fallback"], "plan_steps": s["plan_steps"],
                  "step_abs_error": abs(s["step_error"]), "exact": s["exact"],
                  "prediction": ep.text})
    return out

  def eval_metrics(self, episode) -> dict:
    return self.eval_metrics_batch([episode])[0]


def _gold_fits(ex, max_steps: int) -> bool:
  steps = getattr(ex, "decomposition", None) or []
  return 0 < len(steps) <= max_steps


def make_task(config):
  role = config.get("apex", {}).get("role", "planner")
  if role == "planner":
    return PlannerTask(config)
  if role == "executor":
    raise NotImplementedError("config key 'apex.role' is 'executor': the APEX executor is not "
                              "built yet (issue: APEX-Searcher); train the planner with "
                              "apex.role='planner'")
  raise ValueError(f"config key 'apex.role' is {role!r}; expected one of {ROLES}")
