"""Multi-stage rewards of "Learning When to Search": format, search and answer, returned apart.

  format  r_f = +1 when the completion follows structure A or B (see parsing), else -1.
  search  RC = number of retrievals performed (the rollout's count of observations appended;
          without it, the completion's search calls). A query refused past `max_turns` is not a
          retrieval and does not count.
          RC == 0: 0.   RC == 1: 0 if the query is concise (conciseness.RULES), else -1.
          RC > 1: -avg_sim over the performed queries' embeddings, where avg_sim is
            rs_form='eq8':          the paper's Eq. 8, sum over i<j of cos / (RC (RC-1)), or
            rs_form='pairwise_mean': the mean over the RC (RC-1) / 2 pairs (twice Eq. 8; what the
                                     paper's prose calls "the mean of pairwise similarities").
  answer  answer_form='staged' (the paper's two stages):
            stage 1: correct 1, wrong -1 + beta*RC   (searching is cheap while learning to search)
            stage 2: correct 1 - beta*RC, wrong -1   (searching costs once answers are right)
          answer_form='unified' (the paper's Table 2 comparison, no stages): correct 1 - beta*RC,
          wrong -1 + beta*RC.
          A missing answer is wrong. The answer is scored even when the format is invalid.
  total   r_f + r_s + r_a; the ablations drop r_s (use_search=False) or r_a (use_answer=False)
          from the total (the components are still reported).

Correctness is normalised exact match by default, token F1 >= f1_threshold with
match='f1', or an injected `judge(prediction, answers) -> bool`, e.g. the shared
`rlrag_jax.judge.OpenAIJudge` with the question bound (the search task does this when
`reward.judge_url` is set).

Model output never makes these functions raise. Caller errors do, with a message: an unknown
stage or match, and, for RC > 1, missing or mis-shaped `queries_embeddings` (the caller embeds
`parsing.parse(completion).queries`, or passes a callable that does).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import numpy as np

from rlrag_jax import metrics
from rlrag_jax.methods.search import conciseness
from rlrag_jax.methods.search.parsing import Parsed, parse

STAGES = (1, 2)
MATCHES = ("em", "f1", "judge")
RS_FORMS = ("eq8", "pairwise_mean")
ANSWER_FORMS = ("staged", "unified")


def format_reward(parsed: Parsed) -> float:
  return 1.0 if parsed.valid else -1.0


def mean_pairwise_cosine(embeddings) -> float:
  """Mean cosine similarity over the n*(n-1)/2 pairs of rows of `embeddings` [n, d], n >= 2.

  Rows are L2-normalised here; an all-zero row has cosine 0 with every other row.
  """
  e = np.asarray(embeddings, dtype=np.float64)                         # [n, d]
  if e.ndim != 2 or e.shape[0] < 2:
    raise ValueError(f"mean_pairwise_cosine: expected an [n >= 2, d] array, got shape {e.shape}")
  if not np.all(np.isfinite(e)):
    raise ValueError("mean_pairwise_cosine: embeddings hold NaN or inf")
  norms = np.linalg.norm(e, axis=1, keepdims=True)                     # [n, 1]
  u = e / np.where(norms > 0, norms, 1.0)
  sim = u @ u.T                                                        # [n, n]
  iu = np.triu_indices(e.shape[0], k=1)
  return float(sim[iu].mean())


def search_reward(queries: list, queries_embeddings=None,
                  max_words: int = conciseness.MAX_WORDS, rs_form: str = "pairwise_mean") -> float:
  """r_s for the performed queries. For more than one query, `queries_embeddings` is an
  [len(queries), d] array or a callable mapping the list of queries to one."""
  if rs_form not in RS_FORMS:
    raise ValueError(f"reward.rs_form is {rs_form!r}; expected one of {RS_FORMS}")
  rc = len(queries)
  if rc == 0:
    return 0.0
  if rc == 1:
    return 0.0 if conciseness.is_concise(queries[0], max_words) else -1.0
  if queries_embeddings is None:
    raise ValueError(f"search_reward: the completion has {rc} search calls, so "
                     f"queries_embeddings must be an [{rc}, d] array (or a callable that embeds "
                     "parse(completion).queries); got None")
  emb = queries_embeddings(list(queries)) if callable(queries_embeddings) else queries_embeddings
  shape = np.shape(emb)
  if len(shape) != 2 or shape[0] != rc:
    raise ValueError(f"search_reward: queries_embeddings must have shape [{rc}, d] (one row per "
                     f"query of parse(completion).queries), got {shape}")
  mean = mean_pairwise_cosine(emb)
  return -mean / 2.0 if rs_form == "eq8" else -mean     # Eq. 8 divides the pair sum by N(N-1)


def answer_reward(correct: bool, retrieval_count: int, stage: int = 1,
                  beta: float = 0.3, answer_form: str = "staged") -> float:
  """r_a of the two-stage design, or of the unified one (see module docstring)."""
  if answer_form == "unified":
    return 1.0 - beta * retrieval_count if correct else -1.0 + beta * retrieval_count
  if answer_form != "staged":
    raise ValueError(f"reward.answer_form is {answer_form!r}; expected one of {ANSWER_FORMS}")
  if stage == 1:
    return 1.0 if correct else -1.0 + beta * retrieval_count
  if stage == 2:
    return 1.0 - beta * retrieval_count if correct else -1.0
  raise ValueError(f"answer_reward: stage must be one of {STAGES}, got {stage!r}")


def is_correct(prediction: Optional[str], answers, match: str = "em",
               f1_threshold: float = 0.5,
               judge: Optional[Callable[[str, list], bool]] = None) -> bool:
  """Whether `prediction` answers the question; None (no answer) is wrong."""
  if match not in MATCHES:
    raise ValueError(f"is_correct: match must be one of {MATCHES}, got {match!r}")
  if prediction is None:
    return False
  aliases = [answers] if isinstance(answers, str) else list(answers)
  if judge is not None:
    return bool(judge(prediction, aliases))
  if match == "judge":
    raise ValueError("is_correct: match='judge' needs a judge (set reward.judge_url)")
  if match == "f1":
    return metrics.f1(prediction, aliases) >= f1_threshold
  return metrics.exact_match(prediction, aliases) == 1.0


@dataclasses.dataclass
class Score:
  format: float
  search: float
  answer: float
  total: float
  retrieval_count: int
  correct: bool
  parsed: Parsed

  def as_dict(self) -> dict:
    return {"format": self.format, "search": self.search, "answer": self.answer,
            "total": self.total, "retrieval_count": self.retrieval_count,
            "correct": float(self.correct)}


def score(completion: str, answers: list, queries_embeddings=None, stage: int = 1,
          beta: float = 0.3, *, match: str = "em", f1_threshold: float = 0.5,
          judge: Optional[Callable[[str, list], bool]] = None,
          max_query_words: int = conciseness.MAX_WORDS, retrieval_count: Optional[int] = None,
          rs_form: str = "pairwise_mean", answer_form: str = "staged", use_search: bool = True,
          use_answer: bool = True) -> Score:
  """Every component of the reward, with the parse and the correctness verdict.

  `retrieval_count`: retrievals the rollout performed (None: the completion's search calls);
  only the first that many queries are scored by r_s."""
  if stage not in STAGES:
    raise ValueError(f"reward: stage must be one of {STAGES}, got {stage!r}")
  parsed = parse(completion)
  rc = parsed.retrieval_count if retrieval_count is None else min(int(retrieval_count),
                                                                  parsed.retrieval_count)
  r_f = format_reward(parsed)
  r_s = search_reward(parsed.queries[:rc], queries_embeddings, max_query_words, rs_form)
  correct = is_correct(parsed.answer, answers, match, f1_threshold, judge)
  r_a = answer_reward(correct, rc, stage, beta, answer_form)
  total = r_f + (r_s if use_search else 0.0) + (r_a if use_answer else 0.0)
  return Score(r_f, r_s, r_a, total, rc, correct, parsed)


def reward(completion: str, answers: list, queries_embeddings=None, stage: int = 1,
           beta: float = 0.3, **options) -> dict:
  """{'format', 'search', 'answer', 'total', 'retrieval_count', 'correct'} for one completion.

  The keyword options are score()'s (match, f1_threshold, judge, max_query_words,
  retrieval_count, rs_form, answer_form, use_search, use_answer).
  """
  return score(completion, answers, queries_embeddings, stage, beta, **options).as_dict()
