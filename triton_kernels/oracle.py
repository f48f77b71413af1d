"""Physical oracles: the latency of an L1 hit and of a DRAM access, measured by one program each.

A probe's L2 map must lie well above an L1 hit and well below DRAM, measured in the same run: a map
outside that window is a broken probe (a chase that misses L2, or clock reads that skip the loads).
torch_l2topo/measure/oracles.py is the host side. Run with num_warps=1.
"""
import triton
import triton.language as tl

from torch_l2topo.triton_kernels.protocol import chase, chase_l1, clock_after, sm_id


@triton.jit
def _load(p, L1: tl.constexpr):
    if L1:
        q = chase_l1(p)
    else:
        q = chase(p)
    return q


@triton.jit
def latency_oracle_kernel(starts_ptr, out_ptr, n_warm, n_timed, L1: tl.constexpr):
    """Program i chases from starts[i]: n_warm loads, then n_timed timed dependent loads.

    L1: load with ld.global.ca (may hit in L1); else ld.global.cg (L2 and beyond). out[i] = (clock64 cycles
    of the timed loads, %smid, final address).
    """
    pid = tl.program_id(0)
    p = tl.load(starts_ptr + pid)
    for _ in range(n_warm):
        p = _load(p, L1)
    t0 = clock_after(p)
    for _ in range(n_timed):
        p = _load(p, L1)
    t1 = clock_after(p)
    tl.store(out_ptr + pid * 3 + 0, t1 - t0)
    tl.store(out_ptr + pid * 3 + 1, sm_id())
    tl.store(out_ptr + pid * 3 + 2, p)
