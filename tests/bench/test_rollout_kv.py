"""bench.rollout --kv-reuse runs, and its two paths write the same completions (no timing is
asserted)."""
import re

from _deps import require
from rlrag_jax.bench import rollout


def test_kv_reuse_bench_paths_agree(capsys):
  require("torch")
  assert rollout.main(["--kv-reuse", "--sizes", "tiny", "--prompts", "2", "--group", "4",
                       "--prompt-tokens", "48", "--obs-tokens", "24", "--turn-tokens", "6",
                       "--turns", "2", "--repeats", "1"]) == 0
  out = capsys.readouterr().out
  assert "rows with identical completions: 100%" in out
  tokens = [int(t.replace(",", "")) for t in re.findall(r"prefill ([\d,]+) tokens", out)]
  assert len(tokens) == 2 and tokens[1] < tokens[0] / 2      # re-prefill, then kv reuse
