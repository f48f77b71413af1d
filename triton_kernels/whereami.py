"""Self-localization signature in Triton: a kernel measures its own L2 latency to a few chosen lines.

`l2_signature` is a device function any Triton kernel can call (one warp's scalar work, like the probes):
for each of K chosen lines of a buffer that this process calibrated, a few warm loads, then timed dependent
loads. The K cycle counts, matched against the calibration by torch_l2topo/identity/selfloc.py, say which SM (or
TPC, GPC, partition) the kernel runs on. `whereami_kernel` records %smid next to the signature, as ground
truth for evaluating that classifier. `sm_census_kernel` only records %smid: which SMs a launch may use.
"""
import triton
import triton.language as tl

from torch_l2topo.layout import LINE_BYTES as _LINE_BYTES
from torch_l2topo.triton_kernels.protocol import chase, clock_after, global_ns, sm_id

LINE_BYTES = tl.constexpr(_LINE_BYTES)


@triton.jit
def l2_signature(lines_ptr, idx_ptr, start, K: tl.constexpr, N_WARM: tl.constexpr, N_TIMED: tl.constexpr):
    """[K] int64: clock64 cycles of N_TIMED dependent loads of line idx[i] of the self-pointing buffer.

    Lines are visited from position `start` (mod K) on: pass something that differs between CTAs (the
    program id) so that CTAs measuring at once do not all load the same line together, which merges their
    requests and lowers the latency each sees. K must be a power of two (tl.arange). Run with num_warps=1.
    """
    offs = tl.arange(0, K)
    sig = tl.zeros([K], dtype=tl.int64)
    base = lines_ptr.to(tl.int64, bitcast=True)
    for step in tl.static_range(K):
        i = (start + step) % K
        p = base + tl.load(idx_ptr + i).to(tl.int64) * LINE_BYTES
        for _ in tl.static_range(N_WARM):
            p = chase(p)
        t0 = clock_after(p)
        for _ in tl.static_range(N_TIMED):
            p = chase(p)
        t1 = clock_after(p)
        sig = tl.where(offs == i, t1 - t0, sig)
    return sig


@triton.jit
def whereami_kernel(lines_ptr, idx_ptr, out_ptr, N_WARM: tl.constexpr, N_TIMED: tl.constexpr, K: tl.constexpr):
    """out[pid] = (%smid, signature[0..K-1])."""
    pid = tl.program_id(0)
    sig = l2_signature(lines_ptr, idx_ptr, pid, K, N_WARM, N_TIMED)
    row = out_ptr + pid * (K + 1)
    tl.store(row, sm_id())
    tl.store(row + 1 + tl.arange(0, K), sig)


@triton.jit
def sm_census_kernel(out_ptr, spin_ns):
    """out[pid] = %smid, after holding the SM for `spin_ns` ns: with many more programs than SMs, every SM the
    launch may use gets some (torch_l2topo/placement/green_contexts.py finds which SMs a green context holds)."""
    t0 = global_ns()
    while global_ns() - t0 < spin_ns:
        pass
    tl.store(out_ptr + tl.program_id(0), sm_id())
