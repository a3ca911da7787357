"""One example schema for every dataset, plus corpus records and knowledge triples.

Ids are strings. A context id is unique within its example (HotpotQA/2Wiki: the paragraph title;
MuSiQue: the paragraph `idx`; the embedded world: the global passage id), and every `gold_ids`
list refers to those context ids. Methods that number references 1..n in a prompt (ARENA) map
context order to numbers themselves.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Optional, Sequence


@dataclasses.dataclass(frozen=True)
class Triple:
  head: str
  relation: str
  tail: str

  def to_list(self) -> list:
    return [self.head, self.relation, self.tail]


@dataclasses.dataclass
class Context:
  id: str
  title: str
  text: str
  sentences: list = dataclasses.field(default_factory=list)   # list[str]; text == " ".join
  triples: list = dataclasses.field(default_factory=list)     # list[Triple], where known


@dataclasses.dataclass
class Step:
  """One sub-question of a gold decomposition; may reference earlier answers as '#1', '#2'."""
  question: str
  answer: str
  gold_ids: list = dataclasses.field(default_factory=list)    # context ids supporting this step


@dataclasses.dataclass
class Example:
  id: str
  question: str
  answers: list                                               # all aliases, first is canonical
  contexts: list = dataclasses.field(default_factory=list)    # list[Context]
  gold_ids: list = dataclasses.field(default_factory=list)    # list[str] of context ids
  decomposition: list = dataclasses.field(default_factory=list)  # list[Step]
  hops: int = 1
  kind: str = ""                                              # bridge, comparison, ...
  source: str = ""                                            # hotpotqa, 2wiki, musique, ...
  triples: list = dataclasses.field(default_factory=list)     # reasoning-path triples (2Wiki)
  meta: dict = dataclasses.field(default_factory=dict)

  def context(self, cid: str) -> Optional[Context]:
    for c in self.contexts:
      if c.id == cid:
        return c
    return None

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict) -> "Example":
    d = dict(d)
    d["contexts"] = [Context(**{**c, "triples": [Triple(*_triple(t)) for t in c.get("triples", [])]})
                     for c in d.get("contexts", [])]
    d["decomposition"] = [Step(**s) for s in d.get("decomposition", [])]
    d["triples"] = [Triple(*_triple(t)) for t in d.get("triples", [])]
    return cls(**d)


@dataclasses.dataclass
class CorpusRecord:
  id: str
  title: str
  text: str
  triples: list = dataclasses.field(default_factory=list)     # list[Triple]

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


def _triple(t: Any):
  if isinstance(t, dict):
    return t["head"], t["relation"], t["tail"]
  return tuple(t)


_REF = re.compile(r"#(\d+)")


def step_references(question: str) -> set:
  """The 1-based decomposition steps a step question refers to with '#k'."""
  return {int(k) for k in _REF.findall(question)}


def fill_references(question: str, answers: Sequence[str]) -> str:
  """A step question with each '#k' replaced by the k-th step's answer (kept when out of range)."""
  return _REF.sub(lambda m: answers[int(m.group(1)) - 1]
                  if 0 < int(m.group(1)) <= len(answers) else m.group(0), question)
