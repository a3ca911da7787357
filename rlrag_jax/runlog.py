"""Run logging: metrics to JSONL and TensorBoard event files, curves to PNG, tables to text;
the run directory's one atomic file writer (`write_atomic`) and JSONL reader (`read_rows`)."""
from __future__ import annotations

import json
import logging
import math
import os
import pathlib
import uuid
from typing import Iterable, Mapping, Optional, Sequence

import numpy as np

log = logging.getLogger("rlrag_jax.runlog")


def write_atomic(path, text: str) -> pathlib.Path:
  """Writes `text` to `path` whole or not at all; returns the path.

  The text goes to a temporary file in the same folder, is flushed to disk, and then replaces
  `path` in one `os.replace`: a reader (or a process killed mid-write) sees the old file or the
  new one, never a part. When the write raises, the temporary file is removed and `path` is left
  as it was. Temporary names are unique, so processes writing the same path do not collide.
  """
  path = pathlib.Path(path)
  tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
  try:
    with open(tmp, "x", encoding="utf-8") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    tmp.unlink(missing_ok=True)
    raise
  return path


def read_rows(path) -> list:
  """The JSON object rows of a JSONL file ([] when it does not exist).

  A last line that does not parse is what a process killed in the middle of appending leaves:
  it is dropped with a warning naming the file and line. A bad line before the last cannot come
  from that, so it is an error naming the file and line.
  """
  path = pathlib.Path(path)
  if not path.exists():
    return []
  lines = path.read_text().splitlines()
  last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
  out = []
  for i, line in enumerate(lines):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
      if not isinstance(row, dict):
        raise ValueError(f"a JSON {type(row).__name__}, expected an object")
    except ValueError as e:            # json.JSONDecodeError is a ValueError
      why = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
      if i == last:
        log.warning("%s:%d: dropped a torn last line (%s), left by a process killed while "
                    "writing it: %.80r", path, i + 1, why, line)
        continue
      raise ValueError(f"{path}:{i + 1}: not a JSON row ({why}): {line[:80]!r}; only the last "
                       "line can be torn by a killed write, so this file was damaged otherwise "
                       "(fix or remove that line)") from None
    out.append(row)
  return out


class RunLog:
  """Appends `{'step', 'stage', **metrics}` rows to `<workdir>/metrics.jsonl` and TensorBoard."""

  def __init__(self, workdir, tensorboard: bool = True):
    self.dir = pathlib.Path(workdir)
    self.dir.mkdir(parents=True, exist_ok=True)
    self.path = self.dir / "metrics.jsonl"
    self._tb = None
    if tensorboard:
      try:
        from tensorboardX import SummaryWriter
        self._tb = SummaryWriter(str(self.dir / "tb"))
      except ImportError:  # optional: JSONL and PNG still work
        self._tb = None

  def write(self, step: int, stage: str, metrics: Mapping[str, float]) -> None:
    row = {"step": int(step), "stage": stage}
    for k, v in metrics.items():
      v = float(v)
      row[k] = v if math.isfinite(v) else str(v)
      if self._tb is not None and math.isfinite(v):
        self._tb.add_scalar(f"{stage}/{k}", v, step)
    with self.path.open("a") as f:
      f.write(json.dumps(row) + "\n")

  def rows(self, stage: Optional[str] = None) -> list:
    """The logged rows (of `stage`); a torn last line is dropped with a warning (`read_rows`)."""
    return [r for r in read_rows(self.path) if stage is None or r["stage"] == stage]

  def truncate_after(self, step: int) -> None:
    """On resume: drop rows logged after the checkpoint we restart from (and a torn last
    line), rewriting the file atomically."""
    rows = [r for r in self.rows() if r["step"] <= step]
    write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in rows))

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def subplots(*args, **kw):
  """matplotlib's `plt.subplots` on the file-only Agg backend (no display needed)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt.subplots(*args, **kw)


def save_figure(fig, out_png, title: str = "") -> pathlib.Path:
  """Titles, lays out, writes (PNG, 110 dpi) and closes `fig`; returns the path."""
  import matplotlib.pyplot as plt
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  out = pathlib.Path(out_png)
  fig.savefig(out, dpi=110)
  plt.close(fig)
  return out


def plot_curves(rows: Sequence[dict], keys: Sequence[str], out_png, title: str = "",
                smooth: int = 5) -> Optional[pathlib.Path]:
  """One panel per key (raw and moving average) against step; returns the path or None."""
  keys = [k for k in keys if any(isinstance(r.get(k), (int, float)) for r in rows)]
  if not keys:
    return None
  cols = min(3, len(keys))
  nrows = -(-len(keys) // cols)
  fig, axes = subplots(nrows, cols, figsize=(4.2 * cols, 3.0 * nrows), squeeze=False)
  for ax, k in zip(axes.flat, keys):
    pts = [(r["step"], r[k]) for r in rows if isinstance(r.get(k), (int, float))]
    xs, ys = np.array([p[0] for p in pts]), np.array([p[1] for p in pts], float)
    ax.plot(xs, ys, alpha=0.35, lw=1)
    if len(ys) >= smooth > 1:
      kern = np.ones(smooth) / smooth
      ax.plot(xs[smooth - 1:], np.convolve(ys, kern, mode="valid"), lw=2)
    ax.set_title(k, fontsize=9)
    ax.set_xlabel("step", fontsize=8)
    ax.grid(alpha=0.3)
  for ax in list(axes.flat)[len(keys):]:
    ax.axis("off")
  return save_figure(fig, out_png, title)


def format_table(rows: Sequence[Mapping], columns: Iterable[str], title: str = "") -> str:
  """A fixed-width text table; floats with 3 decimals."""
  columns = list(columns)
  cells = [[_fmt(r.get(c, "")) for c in columns] for r in rows]
  widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
  line = "  ".join(c.ljust(w) for c, w in zip(columns, widths))
  out = [title] if title else []
  out += [line, "-" * len(line)]
  out += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
  return "\n".join(out)


def _fmt(v) -> str:
  if isinstance(v, float):
    return f"{v:.3f}"
  return str(v)


def cli_logging() -> None:
  """Command-line logging: our loggers at INFO with timestamps on stderr, absl's (Orbax logs
  every save and restore at INFO) at WARNING."""
  import logging
  from absl import logging as absl_logging
  absl_logging.set_verbosity(absl_logging.WARNING)
  ours = logging.getLogger("rlrag_jax")
  if not any(getattr(h, "_rlrag_cli", False) for h in ours.handlers):
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s", "%H:%M:%S"))
    handler._rlrag_cli = True       # pylint: disable=protected-access
    ours.addHandler(handler)
  ours.setLevel(logging.INFO)
  ours.propagate = False
