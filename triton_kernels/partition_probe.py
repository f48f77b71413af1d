"""Partition probes of a tensor's storage: which L2 partition each block of bytes is homed in.

The host side is torch_l2topo/placement/partition/maps.py (the map) and partition_check.py (the re-probe). Both
kernels time dependent loads of the first line of each block. The data is arbitrary (not pointers), so the next
address is the line's own, made to wait for the loaded value (protocol.address_after), so each load waits for
the one before and the chain never leaves the line. Scalar work per program: launch with num_warps=1.

partition_probe_kernel (the map): all SMs at once, each pair of SMs (one near each partition) over its own
range, every block timed by both (partition_decision.py says why the difference decides). Each timing is the
FASTEST of N_TIMED single loads, each between two clock reads: a rare load delayed by tens of cycles (seen in a
tensor's first probe, never in a second) would flip a sum's pair difference; the minimum drops it.
partition_reprobe_kernel (the independent check): one SM at a time, only the SMs with a row (one per
partition), a given sample of blocks, N_WARM warm loads, then the SUM of N_TIMED timed loads (the host divides):
spread over N_TIMED (16 by default) loads, such a delay stays far from the decision. Docs: docs/results.md.
"""
import triton
import triton.language as tl

from torch_l2topo.triton_kernels.protocol import address_after, chase, claim_sm, clock_after, finish_turn

# The two SMs of a pair take turns with the halves of each CHUNK blocks of their range: SM row 0 starts at
# the chunk's first block, SM row 1 at its middle. Both pay the DRAM miss of half the chunk's blocks, so
# they keep pace, stay half a chunk apart (two SMs loading one line at once merge their requests, which
# lowers the latency both see), and time each block close together in time (a drifting clock shifts both
# timings alike).
CHUNK = tl.constexpr(64)


@triton.jit
def _time_line(addr, prev, zero, N_WARM: tl.constexpr, N_TIMED: tl.constexpr):
    """clock64 cycles of N_TIMED dependent loads of the line at `addr`, after N_WARM loads; starts only once
    `prev` (the previous block's end clock) has arrived, so no load of this block overlaps the last timing."""
    p = address_after(addr, prev, zero)
    for _ in tl.static_range(N_WARM):
        p = address_after(addr, chase(p), zero)
    t0 = clock_after(p)
    p = address_after(addr, t0, zero)  # the first timed load issues after the start clock is read
    for _ in tl.static_range(N_TIMED):
        p = address_after(addr, chase(p), zero)
    t1 = clock_after(p)
    return t1 - t0, t1


@triton.jit
def _fastest_load(addr, prev, zero, N_TIMED: tl.constexpr):
    """clock64 cycles of the fastest of N_TIMED dependent loads of the line at `addr`, each timed alone (a
    clock read after each, the next load waiting for it), after one warm load; starts once `prev` arrived."""
    p = address_after(addr, chase(address_after(addr, prev, zero)), zero)
    t0 = clock_after(p)
    fastest = tl.full((), 1 << 40, tl.int64)
    for _ in tl.static_range(N_TIMED):
        p = address_after(addr, chase(address_after(addr, t0, zero)), zero)  # issues after the clock read before it
        t1 = clock_after(p)
        fastest = tl.minimum(fastest, t1 - t0)
        t0 = t1
    return fastest, t0


@triton.jit(do_not_specialize=["zero"])
def partition_probe_kernel(ctrl_ptr, base, plan_ptr, cycles_ptr, n_blocks, block_bytes, zero,
                           N_TIMED: tl.constexpr, n_sm, wave, timeout_ns):
    """plan[sm] = (lo, hi, row): SM `sm` times blocks lo..hi-1 of the storage at address `base`: one warm load
    of the block's first line, then N_TIMED timed ones; the fastest goes to cycles[row, block] (int32, row =
    the SM's partition). SMs with lo == hi only claim their SM."""
    sm, go = claim_sm(ctrl_ptr, n_sm, wave, timeout_ns)
    if go:
        lo = tl.load(plan_ptr + sm * 3 + 0)
        hi = tl.load(plan_ptr + sm * 3 + 1)
        row = tl.load(plan_ptr + sm * 3 + 2)
        z = zero.to(tl.int64)
        prev = lo  # any value: the first block waits for nothing
        for c0 in range(lo, hi, CHUNK):
            m = tl.minimum(hi - c0, CHUNK)
            shift = row * (m // 2)
            for i in range(m):
                j = c0 + (i + shift) % m
                cycles, prev = _fastest_load(base + j * block_bytes, prev, z, N_TIMED)
                tl.store(cycles_ptr + row * n_blocks + j, cycles.to(tl.int32))
        finish_turn(ctrl_ptr)


@triton.jit(do_not_specialize=["zero"])
def partition_reprobe_kernel(ctrl_ptr, base, sample_ptr, rows_ptr, cycles_ptr, n_sample, block_bytes, zero,
                             N_WARM: tl.constexpr, N_TIMED: tl.constexpr, n_sm, wave, timeout_ns):
    """rows[sm] >= 0: SM `sm` times the first line of blocks sample[0..n_sample-1] (N_WARM warm, then N_TIMED
    timed loads each; the sum of the timed ones) into cycles[rows[sm], i] (int64). SMs with rows[sm] < 0
    only claim their SM."""
    sm, go = claim_sm(ctrl_ptr, n_sm, wave, timeout_ns)
    if go:
        row = tl.load(rows_ptr + sm)
        if row >= 0:
            z = zero.to(tl.int64)
            prev = row.to(tl.int64)
            for i in range(n_sample):
                block = tl.load(sample_ptr + i)
                cycles, prev = _time_line(base + block * block_bytes, prev, z, N_WARM, N_TIMED)
                tl.store(cycles_ptr + row * n_sample + i, cycles)
        finish_turn(ctrl_ptr)
