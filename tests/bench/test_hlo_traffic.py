"""`bench.hlo_traffic`: memory traffic counted kernel by kernel from compiled HLO, against
hand-computed bytes (a written module; programs compiled here on the CPU); and `bench.gpu_plan`'s
errors and its H100 description (the deviceless GPU compile itself needs JAX's CUDA plugin,
which the test install does not have: its figures are committed in docs/results/memory/)."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlrag_jax.bench import accelerator, gpu_plan, hlo_traffic, memory

# A scheduled module as XLA prints it: an elementwise fusion, a GEMM library call, a fusion
# that updates its parameter 0 in place, a loop of 3 known trips around another fusion, and a
# fusion that reads one row of a table.
MODULE = """HloModule jit_f, is_scheduled=true

%fused_add (param_0: f32[1000], param_1: f32[1000]) -> f32[1000] {
  %param_0 = f32[1000]{0} parameter(0)
  %param_1 = f32[1000]{0} parameter(1)
  ROOT %add.1 = f32[1000]{0} add(%param_0, %param_1)
}

%fused_dus (param_0.1: bf16[64,128], param_1.1: f32[128], param_2: s32[]) -> bf16[64,128] {
  %param_0.1 = bf16[64,128]{1,0} parameter(0)
  %param_1.1 = f32[128]{0} parameter(1)
  %convert.1 = bf16[128]{0} convert(%param_1.1)
  %bitcast.2 = bf16[1,128]{1,0} bitcast(%convert.1)
  %param_2 = s32[] parameter(2)
  %constant.3 = s32[] constant(0)
  ROOT %dynamic-update-slice.1 = bf16[64,128]{1,0} dynamic-update-slice(%param_0.1, %bitcast.2, %param_2, %constant.3)
}

%fused_scale (param_0.2: f32[256]) -> f32[256] {
  %param_0.2 = f32[256]{0} parameter(0)
  %constant.4 = f32[] constant(2)
  %broadcast.1 = f32[256]{0} broadcast(%constant.4), dimensions={}
  ROOT %multiply.1 = f32[256]{0} multiply(%param_0.2, %broadcast.1)
}

%fused_row (param_0.3: f32[100,64], param_1.3: s32[]) -> f32[1,64] {
  %param_0.3 = f32[100,64]{1,0} parameter(0)
  %bitcast.5 = f32[100,64]{1,0} bitcast(%param_0.3)
  %param_1.3 = s32[] parameter(1)
  %constant.6 = s32[] constant(0)
  ROOT %dynamic-slice.1 = f32[1,64]{1,0} dynamic-slice(%bitcast.5, %param_1.3, %constant.6), dynamic_slice_sizes={1,64}
}

%body (p: (s32[], f32[256])) -> (s32[], f32[256]) {
  %p = (s32[], f32[256]{0}) parameter(0)
  %gte.0 = s32[] get-tuple-element(%p), index=0
  %gte.1 = f32[256]{0} get-tuple-element(%p), index=1
  %loop_scale = f32[256]{0} fusion(%gte.1), kind=kLoop, calls=%fused_scale
  ROOT %tuple.1 = (s32[], f32[256]{0}) tuple(%gte.0, %loop_scale)
}

%cond (p.1: (s32[], f32[256])) -> pred[] {
  %p.1 = (s32[], f32[256]{0}) parameter(0)
  ROOT %constant.5 = pred[] constant(false)
}

ENTRY %main (a: f32[1000], b: f32[1000], cache: bf16[64,128], row: f32[128], i: s32[], x: f32[256], w: bf16[32,16], y: bf16[16,8], table: f32[100,64]) -> (f32[1000], bf16[64,128], (s32[], f32[256]), f32[32,8], f32[1,64]) {
  %a = f32[1000]{0} parameter(0)
  %b = f32[1000]{0} parameter(1)
  %cache = bf16[64,128]{1,0} parameter(2)
  %row = f32[128]{0} parameter(3)
  %i = s32[] parameter(4)
  %x = f32[256]{0} parameter(5)
  %w = bf16[32,16]{1,0} parameter(6)
  %y = bf16[16,8]{1,0} parameter(7)
  %table = f32[100,64]{1,0} parameter(8)
  %loop_add = f32[1000]{0} fusion(%a, %b), kind=kLoop, calls=%fused_add, metadata={op_name="add"}
  %update = bf16[64,128]{1,0} fusion(%cache, %row, %i), kind=kLoop, calls=%fused_dus
  %init = (s32[], f32[256]{0}) tuple(%i, %x)
  %while.1 = (s32[], f32[256]{0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  %gemm = f32[32,8]{1,0} custom-call(%w, %y), custom_call_target="__cublas$gemm"
  %row_of = f32[1,64]{1,0} fusion(%table, %i), kind=kLoop, calls=%fused_row
  ROOT %out = (f32[1000]{0}, bf16[64,128]{1,0}, (s32[], f32[256]{0}), f32[32,8]{1,0}, f32[1,64]{1,0}) tuple(%loop_add, %update, %while.1, %gemm, %row_of)
}
"""


def test_written_module_is_charged_by_hand():
  t = hlo_traffic.traffic(MODULE)
  add = 3 * 1000 * 4                         # two f32[1000] read, one written
  update = 128 * 4 + 4 + 128 * 2             # the f32 row and the index read, one bf16 row written
  loop = 3 * (256 * 4 + 256 * 4)             # 3 trips of an f32[256] read and written
  gemm = 32 * 16 * 2 + 16 * 8 * 2 + 32 * 8 * 4
  row = 64 * 4 + 4 + 64 * 4                  # one row of the f32[100,64] table, not all of it
  assert t.bytes == add + update + loop + gemm + row
  assert (t.kernels, t.in_place_updates, t.uncounted_loops) == (7, 1, 0)
  assert t.by_opcode["custom-call"] == gemm
  assert t.by_opcode["fusion:kLoop"] == add + update + loop + row


def test_a_loop_without_a_trip_count_is_charged_once_and_reported():
  t = hlo_traffic.traffic(MODULE.replace(', backend_config={"known_trip_count":{"n":"3"}}', ""))
  assert t.uncounted_loops == 1
  assert t.bytes == hlo_traffic.traffic(MODULE).bytes - 2 * (256 * 4 + 256 * 4)


def test_shapes_and_bad_text():
  assert hlo_traffic.shape_bytes("(bf16[4,2]{1,0}, s32[], pred[3])") == 16 + 4 + 3
  assert hlo_traffic.shape_bytes("f8e4m3fn[10]{0}") == 10
  with pytest.raises(ValueError, match="no ENTRY"):
    hlo_traffic.traffic("HloModule m\n")


def test_compiled_programs_on_this_cpu():
  x = jax.ShapeDtypeStruct((512, 512), jnp.float32)
  ew = jax.jit(lambda v: jnp.tanh(v) * 2.0 + 1.0).lower(x).compile()
  assert hlo_traffic.traffic(ew.as_text()).bytes == 2 * 512 * 512 * 4   # one fused pass
  cache = jax.ShapeDtypeStruct((1024, 256), jnp.float32)
  row = jax.ShapeDtypeStruct((1, 256), jnp.float32)
  i = jax.ShapeDtypeStruct((), jnp.int32)
  dus = jax.jit(lambda c, r, k: jax.lax.dynamic_update_slice(c, r, (k, 0)),
                donate_argnums=0).lower(cache, row, i).compile()
  t = hlo_traffic.traffic(dus.as_text())
  assert t.in_place_updates == 1
  assert 2 * 256 * 4 <= t.bytes <= 2 * 256 * 4 + 16, t   # the row read and written, the index
  # Run it too: the donated buffer is updated where it is (the traffic model's premise).
  c = jnp.zeros((1024, 256), jnp.float32)
  out = dus(c, jnp.ones((1, 256), jnp.float32), jnp.int32(7))
  assert float(out[7].sum()) == 256.0 and float(out.sum()) == 256.0


def test_gpu_plan_errors(monkeypatch, capsys):
  with pytest.raises(gpu_plan.GpuPlanError, match="not one of h100"):
    gpu_plan.devices("a100")
  monkeypatch.setattr(gpu_plan, "plugin_installed", lambda: False)
  with pytest.raises(gpu_plan.GpuPlanError) as e:
    gpu_plan.devices("h100")
  assert f'"jax-cuda13-plugin=={jax.__version__}"' in str(e.value)
  assert memory.main(["--gpu", "h100", "--parts", "decode"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("bench.memory: --gpu h100: ") and "\n" not in err, err


def test_shipped_h100_description_matches_the_accelerator_bench():
  name, text = gpu_plan.target_config("h100")
  field = lambda k: float(re.search(rf"\b{k}:\s*([0-9.e+]+)", text).group(1))
  assert name == "h100" and 'device_description_str: "NVIDIA H100 80GB HBM3"' in text
  sheet = accelerator.PEAKS["NVIDIA H100 80GB HBM3"]
  assert np.isclose(field("memory_bandwidth") / 1e12, sheet.hbm_tbs, rtol=1e-3)
  assert field("core_count") == 132 and field("major") == 9
  assert 79 < field("device_memory_size") / 2 ** 30 < 80
