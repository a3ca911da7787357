"""launch/colab.ipynb executes top to bottom on CPU in its reduced mode (set by its parameters
cell), trains, draws the curves, evaluates and writes an HF export that transformers loads."""
import pathlib

import numpy as np
import pytest

from _deps import require

pytestmark = pytest.mark.slow
REPO = pathlib.Path(__file__).resolve().parents[1]


def test_colab_notebook_runs_reduced_on_cpu(tmp_path):
  nbformat = require("nbformat")
  nbclient = require("nbclient")
  torch = require("torch")
  transformers = require("transformers")
  require("ipykernel")                   # the notebook's python3 kernel
  nb = nbformat.read(REPO / "launch" / "colab.ipynb", as_version=4)
  params = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
  assert len(params) == 1, "the notebook needs exactly one cell tagged 'parameters'"
  work, export = tmp_path / "run", tmp_path / "export"
  # What papermill does: a cell after the parameters cell that overrides them.
  inject = nbformat.v4.new_code_cell(
      f"REDUCED = True\nWORKDIR = {str(work)!r}\nEXPORT_DIR = {str(export)!r}\n"
      "CONFIG = 'configs/arena.py'")
  nb.cells.insert(nb.cells.index(params[0]) + 1, inject)
  client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                   resources={"metadata": {"path": str(REPO)}})
  client.execute()
  outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
  assert not [o for o in outputs if o.get("output_type") == "error"]
  assert any("image/png" in o.get("data", {}) for o in outputs), "no inline plot"
  text = "".join(o.get("text", "") for o in outputs)
  assert "Held-out evaluation" in text and "after RL" in text
  assert (work / "metrics.jsonl").exists()
  model = transformers.AutoModelForCausalLM.from_pretrained(str(export)).eval()
  with torch.no_grad():
    logits = model(input_ids=torch.tensor([[1, 5, 9, 2]])).logits.numpy()
  assert np.isfinite(logits).all() and logits.shape[:2] == (1, 4)
