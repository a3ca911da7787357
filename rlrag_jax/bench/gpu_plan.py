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
import re
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


def compile_pallas_kernels(target: str = "h100") -> dict:
  """Both Pallas kernels compiled by XLA:GPU for `target` without the GPU (Triton to the card's
  machine code: what a GPU run compiles first): the causal attention's forward and backward
  (`models.flash_attention`, model.attention='pallas') and the decode attention over a cache
  (`sampling.cache_attention`, model.decode_attention='pallas') in one pass and split into
  cache ranges. {program: the names of its Triton kernels in the optimised HLO, in order};
  a compile error raises."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import SingleDeviceSharding
  from rlrag_jax.models import flash_attention
  from rlrag_jax.sampling import cache_attention
  one = SingleDeviceSharding(devices(target)[0])
  sd = lambda shape, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dtype, sharding=one)

  def fwd_bwd(q, k, v, m, g):
    out, vjp = jax.vjp(lambda q, k, v: flash_attention.attend(q, k, v, m), q, k, v)
    return out, vjp(g)

  programs = {"flash_attention_fwd_bwd": (fwd_bwd, sd((2, 256, 8, 64)), sd((2, 256, 2, 64)),
                                          sd((2, 256, 2, 64)), sd((2, 256), jnp.bool_),
                                          sd((2, 256, 8, 64)))}
  for name, rows in (("decode_attention_one_pass", 128), ("decode_attention_split", 8)):
    attend = lambda q, k, v, b: cache_attention.attend(q, k, v, b, 0.125, "pallas")
    programs[name] = (attend, sd((rows, 14, 64)), sd((rows, 300, 2, 64)),
                      sd((rows, 300, 2, 64)), sd((rows, 300), jnp.float32))
  kernels = {}
  for name, (fn, *args) in programs.items():
    text = jax.jit(fn).lower(*args).compile().as_text()
    calls = [l for l in text.splitlines() if 'custom_call_target="__gpu$xla.gpu.triton"' in l]
    kernels[name] = [(re.search(r'/(\w+)/pallas_call"', l) or re.search("()", l)).group(1)
                     for l in calls]
  return kernels
