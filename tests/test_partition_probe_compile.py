"""The partition probes (triton_kernels/partition_probe.py) compile to sm_90 PTX without a GPU and emit what
they rely on: L2 loads that skip L1, %clock64 and %smid reads, and the AND with the runtime zero that chains
each load to the one before (not folded: its operand is a register loaded from the kernel parameter). The
map times each of its N_TIMED loads alone (a clock read after each); the reprobe times its loads together."""
import re

import pytest
from kernel_compile import sm90_ptx

PTR, I32, I64 = "*i64", "i32", "i64"


def _map_ptx(n_timed: int):
    from torch_l2topo.triton_kernels import partition_probe as k

    sig = dict(ctrl_ptr=PTR, base=I64, plan_ptr=PTR, cycles_ptr="*i32", n_blocks=I32, block_bytes=I32, zero=I32,
               N_TIMED="constexpr", n_sm=I32, wave=I32, timeout_ns=I64)
    return sm90_ptx(k.partition_probe_kernel, sig, {"N_TIMED": n_timed})


def _reprobe_ptx(n_warm: int, n_timed: int):
    from torch_l2topo.triton_kernels import partition_probe as k

    sig = dict(ctrl_ptr=PTR, base=I64, sample_ptr=PTR, rows_ptr="*i32", cycles_ptr=PTR, n_sample=I32,
               block_bytes=I32, zero=I32, N_WARM="constexpr", N_TIMED="constexpr", n_sm=I32, wave=I32,
               timeout_ns=I64)
    return sm90_ptx(k.partition_reprobe_kernel, sig, {"N_WARM": n_warm, "N_TIMED": n_timed})


def _zero_register(ptx: str, kernel: str, index: int) -> str:
    """The 64-bit register holding the kernel's `zero` parameter (its parameter number `index`)."""
    reg32 = re.search(rf"ld\.param\.b32\s+(%r\d+), \[{kernel}_param_{index}\];", ptx)
    assert reg32, f"{kernel}: `zero` is not read from its parameter (specialized to a constant?)"
    reg64 = re.search(rf"cvt\.s64\.s32\s+(%rd\d+), {re.escape(reg32.group(1))};", ptx)
    assert reg64, f"{kernel}: `zero` is not widened to 64 bits"
    return reg64.group(1)


def _check_chain(ptx: str, kernel: str, zero_index: int, loads: int, clocks: int, chained: int):
    """Counts in the PTX of one kernel: unrolled L2 loads, %clock64 reads, ANDs with the runtime `zero`."""
    assert ptx.count("ld.global.cg.u64") == loads
    assert ptx.count("%clock64") == clocks
    assert "%smid" in ptx and "%globaltimer" in ptx and "ld.global.ca" not in ptx
    zero = _zero_register(ptx, kernel, zero_index)
    ands = re.findall(rf"and\.b64 m, %rd\d+, {re.escape(zero)};", ptx)
    assert len(ands) == chained, ands
    assert not re.search(r"and\.b64 m, %rd\d+, 0;", ptx)


@pytest.mark.parametrize("n_timed", [1, 4])
def test_map_probe_times_each_load_alone(n_timed):
    """One warm + n_timed timed loads, a clock read before the first timed load and after each (1 + n_timed:
    the reads grow with N_TIMED). Through the AND with `zero` go: the previous block's end clock, every
    load's value, and every clock that a timed load must wait for (2 + 2 n_timed)."""
    ptx = _map_ptx(n_timed)
    _check_chain(ptx, "partition_probe_kernel", 6, loads=1 + n_timed, clocks=1 + n_timed, chained=2 + 2 * n_timed)
    # in program order: the warm load, the start clock, then each timed load followed by its own clock read
    order = "".join("L" if m.startswith("ld") else "C" for m in re.findall(r"ld\.global\.cg\.u64|%clock64", ptx))
    assert order == "LC" * (1 + n_timed)


def test_reprobe_times_its_loads_together():
    """N_WARM + N_TIMED loads, one clock read before and one after the timed ones; through the AND go the
    previous block's end clock, every load's value and the start clock (loads + 2)."""
    _check_chain(_reprobe_ptx(2, 16), "partition_reprobe_kernel", 7, loads=2 + 16, clocks=2, chained=2 + 16 + 2)


@pytest.mark.parametrize("n_timed", [1, 2, 4, 8, 16])
def test_the_cuda_map_probe_makes_the_triton_probes_loads_in_its_order(tmp_path, n_timed):
    """cuda_ext/partition_probe.cu against the Triton kernel, the oracle: per N_TIMED compiled, the same loads
    and clock reads in the same order (warm load, start clock, then each timed load and its clock read), and the
    same ANDs with the runtime zero: the previous block's end clock, every load's value, every clock a timed
    load waits for."""
    import subprocess
    from pathlib import Path

    from kernel_compile import nvcc

    ext = Path(__file__).resolve().parents[1] / "cuda_ext"
    out = subprocess.run([nvcc(), "-arch=sm_90", "-O3", "-I", str(ext), "-ptx", str(ext / "partition_probe.cu"),
                          "-o", str(tmp_path / "p.ptx")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    ptx = (tmp_path / "p.ptx").read_text()
    entries = re.split(r"\.entry ", ptx)[1:]
    (entry,) = [e for e in entries if re.match(rf"\w*partition_probe_kernelILi{n_timed}E", e)]
    triton = _map_ptx(n_timed)

    def order(text):
        return "".join("L" if m.startswith("ld") else "C" for m in re.findall(r"ld\.global\.cg\.u64|%clock64", text))

    assert order(entry) == order(triton) == "LC" * (1 + n_timed)
    assert len(re.findall(r"and\.b64 m, ", entry)) == len(re.findall(r"and\.b64 m, ", triton)) == 2 + 2 * n_timed
    assert "%smid" in entry and "ld.global.ca" not in entry
