"""The geometry kernels (triton_kernels/geometry.py) compile to sm_90 PTX without a GPU and emit what they rely
on: L2 loads that skip L1, %clock64 / %smid / %globaltimer reads, the chain's AND with the runtime zero (not
folded), and, in the offsets chase, the read of the next offset issued before the timed load."""
import re

import pytest
from test_partition_probe_compile import I32, I64, PTR, _triton_compile, _zero_register


def _offsets_ptx():
    from torch_l2topo.triton_kernels import geometry as k

    sig = dict(ctrl_ptr=PTR, base=I64, offsets_ptr=PTR, rows_ptr="*i32", cycles_ptr="*i32", per_row_ptr=PTR,
               n_loads=I32, zero=I32, n_sm=I32, wave=I32, timeout_ns=I64)
    return _triton_compile(k.offsets_chase_kernel, sig, {})


def _lanes_ptx(lanes):
    from torch_l2topo.triton_kernels import geometry as k

    sig = dict(ctrl_ptr=PTR, starts_ptr=PTR, rows_ptr="*i32", out_ptr=PTR, n_warm=I32, n_timed=I32, n_sm=I32,
               wave=I32, timeout_ns=I64, LANES="constexpr")
    return _triton_compile(k.lanes_chase_kernel, sig, {"LANES": lanes})


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


@pytest.mark.parametrize("lanes", [2, 32])
def test_lanes_chase_keeps_one_chain_per_thread(lanes):
    ptx = _lanes_ptx(lanes)
    # one warp: one load instruction per loop (warm, timed), each thread its own element
    assert ptx.count("ld.global.cg.u64") == 2 and "ld.global.ca" not in ptx
    assert ptx.count("%clock64") == 2 and "%smid" in ptx


def test_ring_chase_is_the_chain_probe_loop():
    from torch_l2topo.triton_kernels import geometry as k

    sig = dict(ctrl_ptr=PTR, starts_ptr=PTR, rows_ptr="*i32", out_ptr=PTR, n_warm=I32, n_timed=I32, n_sm=I32,
               wave=I32, timeout_ns=I64)
    ptx = _triton_compile(k.ring_chase_kernel, sig, {})
    assert ptx.count("ld.global.cg.u64") == 2 and ptx.count("%clock64") == 2 and "ld.global.ca" not in ptx
