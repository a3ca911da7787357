"""Compile for a GPU that is not attached: XLA:GPU's own memory plan from a CPU-only host.

jax can compile a program for a described accelerator topology without owning one
(`jax.experimental.topologies.get_topology_desc`; MaxText's `train_compile` does the same for
TPU pods). For NVIDIA GPUs the description is XLA's GPU target config (the card's SM count,
memory sizes, bandwidth, compute capability): `gpu_targets/<name>.txtpb` ships the H100's, and
any other card's file can be passed by path. What this needs beyond the CPU install is JAX's
CUDA plugin at exactly jax's version (no GPU, no driver, no CUDA libraries):

  pip install "jax-cuda13-plugin==<jax version>" "jax-cuda13-pjrt==<jax version>"

(`jax-cuda12-*` works too.) Set `JAX_PLATFORMS=cpu` before jax starts (bench.memory does): the
plugin then only compiles, and the missing CUDA libraries are never loaded.

The compiled program's `memory_analysis()` is XLA:GPU's buffer plan (arguments, outputs,
temporaries per device): what the update or decode step would ask of the card. A deviceless
compile has no cost analysis and no autotuning (XLA picks GEMM and fusion configurations by its
heuristics), so bench.memory counts memory traffic from the compiled HLO instead
(`hlo_traffic`).
"""
from __future__ import annotations

import importlib.util
import pathlib
from typing import Sequence

TARGET_DIR = pathlib.Path(__file__).parent / "gpu_targets"
PLUGINS = ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12")


class GpuPlanError(RuntimeError):
  """The deviceless GPU compile cannot be set up: unknown card, or no CUDA plugin."""


def known_targets() -> tuple:
  return tuple(sorted(p.stem for p in TARGET_DIR.glob("*.txtpb")))


def target_config(target: str) -> tuple:
  """(card name, GpuTargetConfigProto text) of a shipped name ('h100') or a .txtpb path."""
  path = TARGET_DIR / f"{target}.txtpb"
  if not path.is_file():
    path = pathlib.Path(target)
    if path.suffix != ".txtpb" or not path.is_file():
      raise GpuPlanError(f"--gpu {target!r}: not one of {', '.join(known_targets())} and no "
                         "GPU target config (.txtpb) at that path")
  return path.stem, path.read_text()


def plugin_installed() -> bool:
  for name in PLUGINS:
    try:
      if importlib.util.find_spec(name) is not None:
        return True
    except ModuleNotFoundError:
      continue
  return False


def install_hint() -> str:
  import jax
  v = jax.__version__
  return (f'pip install "jax-cuda13-plugin=={v}" "jax-cuda13-pjrt=={v}" (JAX\'s CUDA plugin at '
          f"jax's version {v}; no GPU or CUDA libraries needed)")


def devices(target: str = "h100", count: int = 1) -> Sequence:
  """`count` deviceless devices of the card `target` on one host: pass them to a mesh and
  compile with `.lower(...).compile()`; nothing can run on them."""
  name, text = target_config(target)
  if count < 1:
    raise GpuPlanError(f"--devices {count}: at least 1")
  if not plugin_installed():
    raise GpuPlanError(f"--gpu {target}: the deviceless GPU compile needs JAX's CUDA plugin: "
                       + install_hint())
  from jax.experimental import topologies
  try:
    topo = topologies.get_topology_desc(name, "cuda", target_config=text,
                                        topology=f"1x1x{count}")
  except Exception as e:                           # the plugin's own message, shortened
    raise GpuPlanError(f"--gpu {target}: jax could not describe the topology ({e}); is the "
                       f"plugin at jax's version? {install_hint()}") from None
  return list(topo.devices)
