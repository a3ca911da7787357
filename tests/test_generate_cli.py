"""`python -m rlrag_jax.generate`: error paths (exit 2, message naming DIR and what is missing),
a real run on a tiny checkpoint, and the --demo entry point as a subprocess."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from hf_tiny import make_tiny_checkpoint
from rlrag_jax import generate as cli

REPO = pathlib.Path(__file__).resolve().parents[1]


def _run_main(argv, capsys):
  rc = cli.main(argv)
  out = capsys.readouterr()
  return rc, out.out, out.err


def test_missing_dir_exits_2_naming_it(tmp_path, capsys):
  d = tmp_path / "nope"
  rc, _, err = _run_main(["--model", str(d), "--prompt", "hi"], capsys)
  assert rc == 2
  assert str(d) in err and "does not exist" in err


def test_dir_without_config_exits_2(tmp_path, capsys):
  rc, _, err = _run_main(["--model", str(tmp_path), "--prompt", "hi"], capsys)
  assert rc == 2
  assert str(tmp_path) in err and "config.json" in err


def test_dir_without_weights_exits_2(tmp_path, capsys):
  path = make_tiny_checkpoint(tmp_path, "llama")
  for f in path.glob("*.safetensors"):
    f.unlink()
  rc, _, err = _run_main(["--model", str(path), "--prompt", "hi"], capsys)
  assert rc == 2
  assert str(path) in err and "safetensors" in err


def test_file_instead_of_dir_exits_2(tmp_path, capsys):
  f = tmp_path / "config.json"
  f.write_text(json.dumps({"model_type": "llama"}))
  rc, _, err = _run_main(["--model", str(f), "--prompt", "hi"], capsys)
  assert rc == 2 and str(f) in err and "not a directory" in err


def test_no_model_no_demo_is_a_usage_error(capsys):
  with pytest.raises(SystemExit) as e:
    cli.main(["--prompt", "hi"])
  assert e.value.code == 2
  assert "--model" in capsys.readouterr().err


def test_generates_from_a_checkpoint(tmp_path, capsys):
  path = make_tiny_checkpoint(tmp_path, "qwen2")
  rc, out, _ = _run_main(["--model", str(path), "--prompt", "Hello", "--prompt", "Hi there",
                          "--max-new-tokens", "5", "--temperature", "0", "--no-chat-template"],
                         capsys)
  assert rc == 0
  assert out.count("--- prompt:") == 2
  assert "(5 tokens, stopped by length)" in out or "stopped by eos" in out
  assert "tokens/s" in out


def test_cut_at_stop():
  assert cli._cut_at_stop("abc</a>def</a>", ["</a>"]) == "abc</a>"
  assert cli._cut_at_stop("abcdef", ["x", "cd"]) == "abcd"
  assert cli._cut_at_stop("abcdef", ["zz"]) == "abcdef"


@pytest.mark.slow
def test_demo_runs_as_a_module():
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  res = subprocess.run([sys.executable, "-m", "rlrag_jax.generate", "--demo",
                        "--max-new-tokens", "8"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=600)
  assert res.returncode == 0, res.stderr[-2000:]
  assert "demo: random llama model" in res.stdout
  assert res.stdout.count("--- prompt:") == len(cli.DEMO_PROMPTS)
  assert "tokens/s" in res.stdout
