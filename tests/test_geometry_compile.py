"""The geometry kernels (triton_kernels/geometry.py) compile to sm_90 PTX without a GPU and emit what they rely
on: L2 loads that skip L1, %clock64 / %smid / %globaltimer reads, the chain's AND with the runtime zero (not
folded), and, in the offsets chase, the read of the next offset issued before the timed load. The layout fixes'
column read is one 16-byte L2 load per struct, with and without the XOR swizzle, and the burst fix's lane counts
(1 and 8) compile."""
import re

import pytest
from kernel_compile import sm90_ptx
from test_partition_probe_compile import I32, I64, PTR, _zero_register


def _offsets_ptx():
    from torch_l2topo.triton_kernels import geometry as k

    sig = dict(ctrl_ptr=PTR, base=I64, offsets_ptr=PTR, rows_ptr="*i32", cycles_ptr="*i32", per_row_ptr=PTR,
               n_loads=I32, zero=I32, n_sm=I32, wave=I32, timeout_ns=I64)
    return sm90_ptx(k.offsets_chase_kernel, sig, {})


def _lanes_ptx(lanes):
    from torch_l2topo.triton_kernels import geometry as k

    sig = dict(ctrl_ptr=PTR, starts_ptr=PTR, rows_ptr="*i32", out_ptr=PTR, n_warm=I32, n_timed=I32, n_sm=I32,
               wave=I32, timeout_ns=I64, LANES="constexpr")
    return sm90_ptx(k.lanes_chase_kernel, sig, {"LANES": lanes})


def test_offsets_chase_times_each_load_and_reads_ahead():
    ptx = _offsets_ptx()
    assert ptx.count("ld.global.cg.u64") == 1 and "ld.global.ca" not in ptx
    assert ptx.count("%clock64") == 2 and "%smid" in ptx and "%globaltimer" in ptx
    zero = _zero_register(ptx, "offsets_chase_kernel", 7)
    assert len(re.findall(rf"and\.b64 m, %rd\d+, {re.escape(zero)};", ptx)) == 1
    body = ptx[ptx.index("and.b64 m,"):]
    # in the loop: link, the next offset's load, then the timed chain load, then its clock read
    ahead, chain, clock = (body.index(s) for s in ("ld.global.b64", "ld.global.cg.u64", "%clock64"))
    assert ahead < chain < clock


@pytest.mark.parametrize("lanes", [1, 2, 8, 32])
def test_lanes_chase_keeps_one_chain_per_thread(lanes):
    ptx = _lanes_ptx(lanes)
    # one warp: one load instruction per loop (warm, timed), each thread its own element
    assert ptx.count("ld.global.cg.u64") == 2 and "ld.global.ca" not in ptx
    assert ptx.count("%clock64") == 2 and "%smid" in ptx


def test_ring_chase_is_the_chain_probe_loop():
    from torch_l2topo.triton_kernels import geometry as k

    sig = dict(ctrl_ptr=PTR, starts_ptr=PTR, rows_ptr="*i32", out_ptr=PTR, n_warm=I32, n_timed=I32, n_sm=I32,
               wave=I32, timeout_ns=I64)
    ptx = sm90_ptx(k.ring_chase_kernel, sig, {})
    assert ptx.count("ld.global.cg.u64") == 2 and ptx.count("%clock64") == 2 and "ld.global.ca" not in ptx


def _column_ptx(swizzle: bool) -> str:
    """column_read_kernel for sm_90 as it is launched: 4 warps, the table pointer 16-byte aligned (torch's
    allocations are, and Triton specializes on it)."""
    from torch_l2topo.triton_kernels import geometry as k

    sig = dict(src_ptr="*fp32", out_ptr="*fp32", n_rows=I32, pitch_structs=I32, reps=I32, COLS="constexpr",
               SWIZZLE="constexpr", BLOCK_R="constexpr")
    return sm90_ptx(k.column_read_kernel, sig, {"COLS": 1024, "SWIZZLE": swizzle, "BLOCK_R": 128}, num_warps=4,
                    attrs={(0,): [["tt.divisibility", 16]]})


@pytest.mark.parametrize("swizzle", [False, True])
def test_column_read_is_one_16_byte_l2_load_per_struct(swizzle):
    ptx = _column_ptx(swizzle)
    assert re.findall(r"ld\.global[.\w]*", ptx) == ["ld.global.cg.v4.b32"]  # 128 rows / 128 threads, 4 floats
    assert ("xor.b32" in ptx) == swizzle
