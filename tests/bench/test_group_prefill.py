"""bench.group_prefill runs and its two paths draw the same tokens (no timing is asserted)."""
from _deps import require
from rlrag_jax.bench import group_prefill


def test_group_prefill_bench_paths_agree(capsys):
  require("torch")
  assert group_prefill.main(["--sizes", "tiny", "--prompts", "2", "--group", "3",
                             "--prompt-tokens", "16", "--new-tokens", "4",
                             "--repeats", "1"]) == 0
  out = capsys.readouterr().out
  assert "prefill tokens: shared 32  copies 96 (3.0x fewer)" in out
  assert "same tokens: True" in out
