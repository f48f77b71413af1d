"""The recorder's device helpers without a GPU: compiled out when RECORD is off (the PTX of a kernel built on
them equals that of the same kernel written without them, recorder_demo.row_sum_plain_kernel), one predicated
atomic and predicated stores when on, the constexpr a placement kernel derives from its PLACE bits accepted,
and the CUDA header the same: nothing with RECORD false, the atomic and the barrier with RECORD true.

On CI (CI=true) a missing nvcc or Triton is a failure, not a skip (as in test_kernel_sources.py).
"""
import re
import subprocess
from pathlib import Path

import pytest
from kernel_compile import derives_from_thread_id, nvcc, register_definitions, sm90_ptx, triton_module

from torch_l2topo.profiler.demo import ptx_instructions

try:  # @triton.jit functions defined in the tests read `tl` from this module's globals
    import triton.language as tl
except ImportError:
    tl = None

ROOT = Path(__file__).resolve().parents[1]
ROW_SUM_SIG = dict(x_ptr="*fp32", out_ptr="*fp32", n_rows="i32", dim="i32", class_ptr="*i32", part_ptr="*i32",
                   rec_ptr="*i64", tag="i64", RECORD="constexpr", BLOCK="constexpr")
RECORDING = ("%smid", "%globaltimer", "atom.")


@pytest.mark.parametrize("num_warps", [1, 4])
def test_recording_off_compiles_to_the_helper_free_kernel(num_warps):
    triton_module()
    from torch_l2topo.triton_kernels.recorder_demo import row_sum_kernel, row_sum_plain_kernel

    off = sm90_ptx(row_sum_kernel, ROW_SUM_SIG, {"RECORD": False, "BLOCK": 64}, num_warps)
    plain = sm90_ptx(row_sum_plain_kernel, ROW_SUM_SIG, {"RECORD": False, "BLOCK": 64}, num_warps)
    assert not any(needle in off for needle in RECORDING)
    assert ptx_instructions(off, "row_sum_kernel") == ptx_instructions(plain, "row_sum_plain_kernel")


def test_the_comparison_sees_a_recording_kernel():
    # negative control: with RECORD on, the same comparison must fail
    triton_module()
    from torch_l2topo.triton_kernels.recorder_demo import row_sum_kernel, row_sum_plain_kernel

    on = sm90_ptx(row_sum_kernel, ROW_SUM_SIG, {"RECORD": True, "BLOCK": 64})
    plain = sm90_ptx(row_sum_plain_kernel, ROW_SUM_SIG, {"RECORD": False, "BLOCK": 64})
    assert ptx_instructions(on, "row_sum_kernel") != ptx_instructions(plain, "row_sum_plain_kernel")


@pytest.mark.parametrize("num_warps", [1, 4])
def test_recording_on_writes_one_record_from_one_thread(num_warps):
    triton_module()
    from torch_l2topo.triton_kernels.recorder_demo import row_sum_kernel

    ptx = sm90_ptx(row_sum_kernel, ROW_SUM_SIG, {"RECORD": True, "BLOCK": 64}, num_warps)
    for needle in RECORDING:
        assert needle in ptx, needle
    atomics = [line for line in ptx.splitlines() if re.match(r"\s*(@!?%p\d+\s+)?(atom|red)\.", line)]
    assert len(atomics) == 1 and "relaxed.add" in atomics[0], atomics  # one atomic reserves the slot
    defs = register_definitions(ptx)
    stores = [line for line in ptx.splitlines() if "st.global.b64" in line]
    assert len(stores) == 7, stores  # the seven words of layout.REC_*
    for line in atomics + stores:
        pred = re.match(r"\s*@(%p\d+)\s", line)
        assert pred, f"runs on every thread: {line.strip()}"
        # the predicate comes from the thread id: one thread of the program writes
        assert derives_from_thread_id(pred.group(1), defs), line


def test_record_flag_may_come_from_placement_bits():
    """plan_finish passes `PLACE & PLACE_RECORD`: a constexpr computed from another constexpr."""
    triton = triton_module()
    from torch_l2topo.triton_kernels.recorder import record_cta, record_start

    @triton.jit
    def placed(out_ptr, rec_ptr, tag, PLACE: tl.constexpr):
        sm, t0 = record_start(PLACE & 4)
        tl.store(out_ptr + tl.program_id(0), 1)
        record_cta(rec_ptr, tag, sm, t0, 1, -1, PLACE & 4)

    sig = dict(out_ptr="*i32", rec_ptr="*i64", tag="i32", PLACE="constexpr")
    assert all(n in sm90_ptx(placed, sig, {"PLACE": 5}) for n in RECORDING)
    assert not any(n in sm90_ptx(placed, sig, {"PLACE": 1}) for n in RECORDING)


def test_recorder_at_turns_an_address_into_the_buffer():
    triton = triton_module()
    from torch_l2topo.triton_kernels.recorder import record_cta, record_start, recorder_at

    @triton.jit
    def from_address(address, RECORD: tl.constexpr):
        sm, t0 = record_start(RECORD)
        record_cta(recorder_at(address), 0, sm, t0, 1, -1, RECORD)

    ptx = sm90_ptx(from_address, dict(address="i64", RECORD="constexpr"), {"RECORD": True})
    assert "atom.global" in ptx and ptx.count("st.global.b64") == 7


def test_cuda_recorder_compiles_out_and_in(tmp_path):
    src = tmp_path / "user.cu"
    src.write_text('''#include "recorder.cuh"
template <bool RECORD>
__global__ void user(const float* x, float* out, int64_t* rec, int64_t tag) {
  const l2topo::CtaStamp cta = l2topo::record_start<RECORD>();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  out[i] = 2 * x[i];
  l2topo::record_cta<RECORD>(l2topo::recorder_at(reinterpret_cast<int64_t>(rec)), tag, cta.sm, cta.t0, 1, -1);
}
template __global__ void user<false>(const float*, float*, int64_t*, int64_t);
template __global__ void user<true>(const float*, float*, int64_t*, int64_t);
''')
    ptx = tmp_path / "user.ptx"
    out = subprocess.run([nvcc(), "-arch=sm_90", "-O3", "-I", str(ROOT / "cuda_ext"), "-ptx", str(src), "-o",
                          str(ptx)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    bodies = {m.group(1): m.group(2) for m in re.finditer(r"\.entry (\w+)\((.*?)\n}", ptx.read_text(), re.S)}
    off = next(b for name, b in bodies.items() if "ILb0E" in name)
    on = next(b for name, b in bodies.items() if "ILb1E" in name)
    assert not any(n in off for n in (*RECORDING, "bar.sync"))
    assert all(n in on for n in (*RECORDING, "bar.sync"))
    assert len(re.findall(r"st\.global\.u64|st\.global\.b64", on)) == 7
