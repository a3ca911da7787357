"""Model selection on a validation set while RL trains: the best step so far and when to stop.

Every `eval.val_every` RL steps the trainer evaluates the task's validation examples
(`data.val_mix`) and hands `eval.val_metric` of the summary (higher is better) to `update`. A
value strictly above the best so far is a new best (the trainer saves that state under
`<workdir>/best`; the final evaluation, report and export use it); `eval.early_stop_patience`
validations in a row without one stop the RL stage (0: never stop, the best is still kept).
Pure bookkeeping, checkpointed with the run (`state_dict`), so a resumed run decides as an
uninterrupted one does.
"""
from __future__ import annotations

import dataclasses
from typing import Optional


@dataclasses.dataclass
class EarlyStopping:
  patience: int = 0                  # validations without a new best before stopping; 0: never
  best: Optional[float] = None
  best_step: Optional[int] = None
  since_best: int = 0                # validations since the best one

  def update(self, step: int, value: float) -> bool:
    """Records the validation of global step `step`; True when it is a new best."""
    value = float(value)
    if self.best is None or value > self.best:
      self.best, self.best_step, self.since_best = value, int(step), 0
      return True
    self.since_best += 1
    return False

  @property
  def should_stop(self) -> bool:
    return self.patience > 0 and self.since_best >= self.patience

  def state_dict(self) -> dict:
    return dataclasses.asdict(self)

  def load_state_dict(self, state: dict) -> None:
    """The counters of a checkpoint (`patience` stays the config's)."""
    self.best, self.best_step = state["best"], state["best_step"]
    self.since_best = int(state["since_best"])
