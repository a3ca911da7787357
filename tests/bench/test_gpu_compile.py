"""Both Pallas kernels compiled for an H100 by XLA:GPU on this CPU host, no GPU attached
(`bench.gpu_plan.compile_pallas_kernels`: the CUDA plugin's deviceless compile, Triton lowered
to the card's code): the causal attention's forward and backward (model.attention='pallas')
and the decode attention over a cache (model.decode_attention='pallas'), one pass and split.
A kernel that does not compile for the GPU fails here, before a GPU session spends its time.

The compile needs JAX's CUDA plugin at jax's version (no GPU, no CUDA libraries). Where it is
not installed: RLRAG_CUDA_PLUGIN_DIR may name a folder that `pip install --target` filled;
under CI=true the test installs it into a temporary folder with pip (a failed install fails
the test, with pip's words); elsewhere it skips, saying how to install it. The folder only
joins the compiling subprocess's path, so the other tests never load the plugin."""
import json
import os
import subprocess
import sys

import jax
import pytest

from _deps import ci
from rlrag_jax.bench import gpu_plan

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLUGIN_DIR_ENV = "RLRAG_CUDA_PLUGIN_DIR"


def plugin_requirements() -> list:
  v = jax.__version__
  return [f"jax-cuda13-plugin=={v}", f"jax-cuda13-pjrt=={v}"]


def _plugin_dir(tmp_path_factory) -> str:
  """'' when the plugin imports here; else a folder that holds it (see the module docstring)."""
  if gpu_plan.plugin_installed():
    return ""
  if os.environ.get(PLUGIN_DIR_ENV):
    return os.environ[PLUGIN_DIR_ENV]
  if not ci():
    pytest.skip(f"JAX's CUDA plugin is not installed ({gpu_plan.install_hint()}; or set "
                f"{PLUGIN_DIR_ENV} to a folder filled by pip install --target); under CI=true "
                "this test installs it")
  target = tmp_path_factory.mktemp("cuda_plugin")
  cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
         *plugin_requirements()]
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
  if proc.returncode:
    pytest.fail(f"CI=true needs JAX's CUDA plugin for the deviceless GPU compile, and "
                f"`{' '.join(cmd[2:])}` failed (exit {proc.returncode}):\n"
                f"{(proc.stdout + proc.stderr)[-3000:]}", pytrace=False)
  return str(target)


@pytest.mark.slow
def test_both_pallas_kernels_compile_for_an_h100_without_one(tmp_path_factory):
  extra = _plugin_dir(tmp_path_factory)
  paths = [p for p in (extra, ROOT, os.environ.get("PYTHONPATH", "")) if p]
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(paths))
  code = ("import json; from rlrag_jax.bench import gpu_plan; "
          "print('KERNELS ' + json.dumps(gpu_plan.compile_pallas_kernels('h100')))")
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=600)
  out = proc.stdout + proc.stderr
  assert proc.returncode == 0, out[-4000:]
  (line,) = [l for l in proc.stdout.splitlines() if l.startswith("KERNELS ")]
  kernels = json.loads(line[len("KERNELS "):])
  # forward, dK/dV and dQ; the decode attention is one kernel either way (the split one's
  # ranges are combined by XLA)
  assert kernels == {"flash_attention_fwd_bwd": ["fwd_kernel", "dkdv_kernel", "dq_kernel"],
                     "decode_attention_one_pass": ["decode_cache_attention"],
                     "decode_attention_split": ["decode_cache_attention_split"]}, out[-2000:]
