"""The partition probes (triton_kernels/partition_probe.py) compile to sm_90 PTX without a GPU and emit what
they rely on: L2 loads that skip L1, %clock64 and %smid reads, and the AND with the runtime zero that chains
each load to the one before (not folded: its operand is a register loaded from the kernel parameter)."""
import os
import re

import pytest

PTR, I32, I64 = "*i64", "i32", "i64"
N_TIMED = 4


def _triton_compile(fn, signature, constexprs):
    """PTX of a one-warp program for sm_90, as tests/test_kernel_sources.py compiles (missing Triton: a skip
    here, a failure on CI)."""
    try:
        import triton
    except ImportError:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("triton is missing on CI")
        pytest.skip("triton not available here")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    return triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 1}).asm["ptx"]


def _map_ptx():
    from torch_l2topo.triton_kernels import partition_probe as k

    sig = dict(ctrl_ptr=PTR, base=I64, plan_ptr=PTR, cycles_ptr="*i32", n_blocks=I32, block_bytes=I32, zero=I32,
               N_TIMED="constexpr", n_sm=I32, wave=I32, timeout_ns=I64)
    return _triton_compile(k.partition_probe_kernel, sig, {"N_TIMED": N_TIMED})


def _reprobe_ptx():
    from torch_l2topo.triton_kernels import partition_probe as k

    sig = dict(ctrl_ptr=PTR, base=I64, sample_ptr=PTR, rows_ptr="*i32", cycles_ptr=PTR, n_sample=I32,
               block_bytes=I32, zero=I32, N_WARM="constexpr", N_TIMED="constexpr", n_sm=I32, wave=I32,
               timeout_ns=I64)
    return _triton_compile(k.partition_reprobe_kernel, sig, {"N_WARM": 2, "N_TIMED": 16})


def _zero_register(ptx: str, kernel: str, index: int) -> str:
    """The 64-bit register holding the kernel's `zero` parameter (its parameter number `index`)."""
    reg32 = re.search(rf"ld\.param\.b32\s+(%r\d+), \[{kernel}_param_{index}\];", ptx)
    assert reg32, f"{kernel}: `zero` is not read from its parameter (specialized to a constant?)"
    reg64 = re.search(rf"cvt\.s64\.s32\s+(%rd\d+), {re.escape(reg32.group(1))};", ptx)
    assert reg64, f"{kernel}: `zero` is not widened to 64 bits"
    return reg64.group(1)


@pytest.mark.parametrize("which, kernel, zero_index, loads", [
    ("map", "partition_probe_kernel", 6, 1 + N_TIMED),  # one warm + N_TIMED timed loads, unrolled
    ("reprobe", "partition_reprobe_kernel", 7, 2 + 16),
])
def test_partition_probe_compiles_to_sm90_ptx(which, kernel, zero_index, loads):
    ptx = _map_ptx() if which == "map" else _reprobe_ptx()
    assert ptx.count("ld.global.cg.u64") == loads
    assert ptx.count("%clock64") == 2  # one clock read before and one after the timed loads
    assert "%smid" in ptx and "%globaltimer" in ptx and "ld.global.ca" not in ptx
    zero = _zero_register(ptx, kernel, zero_index)
    chained = re.findall(rf"and\.b64 m, %rd\d+, {re.escape(zero)};", ptx)
    # every load's value, and the clocks that bracket the timed loads, go through the AND with `zero`
    assert len(chained) == loads + 2, chained
    assert not re.search(r"and\.b64 m, %rd\d+, 0;", ptx)
