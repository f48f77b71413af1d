"""Partition probes of a tensor's storage: which L2 partition each block of bytes is homed in.

The host side is torch_l2topo/placement/partition_map.py (the map) and partition_check.py (the re-probe). Both
kernels time dependent loads of the first line of each block. The data is arbitrary (not pointers), so a
load's value cannot be the next address: the next address is the line's own address, made to wait for the
loaded value (protocol.address_after: + (value AND zero), `zero` a runtime 0 the host passes, in asm that
neither Triton nor ptxas can fold), so each load waits for the one before, and the chain never leaves the
line. Scalar work per program: launch with num_warps=1.

partition_probe_kernel (the map): all SMs at once (wave = n_sm), each pair of SMs over its own contiguous range.
Every block is timed twice, by the two SMs of a pair (one near each partition): their difference decides the
home (partition_decision.py says why one SM's latency alone does not). Each timing is the FASTEST of N_TIMED
single loads, each between two clock reads. Why: on two H200s (benchmarks/record_partition_probe.py),
~1% of the former 4-load timings of a tensor's first probe came out 8-46 cycles per load slower than in a
second probe (a few up to 285), never faster; the second probe had none. Read as one load of the four
delayed by up to ~190 cycles (4 x 46), it flips the pair's difference, and the minimum drops it (a delay
of all four loads it would not: the GPU run checks).
Count for 32 MB in 256-byte blocks: 131072 blocks x 2 timings / 132 SMs = 1986 blocks per SM, each
1 warm load (a DRAM miss for the first SM of its pair, ~700 cycles; an L2 hit for the second, ~300) +
N_TIMED = 4 timed loads of ~335 cycles each (~310 for the L2 load and the AND and add that chain it; ~25 for
the clock read after it: the compare that makes it wait for the load, the read, two selects) + ~60 cycles of
bookkeeping: ~1900 cycles a block, 3.8 M cycles per SM, ~1.9 ms at 1.98 GHz. The same count for the former
4-load sums (two clock reads a block) gave ~1800 cycles, and they took 2.25 ms on the H200: expect ~2.4 ms.

partition_reprobe_kernel (the independent check): one SM at a time (wave = 1), only the SMs with a row
measure (one per partition), a given sample of blocks, N_WARM = 2 warm loads, then the SUM of N_TIMED = 16
timed loads between two clock reads (the host divides: the mean). It stays a mean: a slow load as above
moves it by at most ~190 / 16 = 12 cycles, and no recorded re-probe difference of the two SMs lies within
26 cycles of 0.
4096 blocks x 2 SMs x 18 loads x ~320 cycles = 47 M cycles, ~24 ms.
"""
import triton
import triton.language as tl

from torch_l2topo.triton_kernels.protocol import address_after, chase, claim_sm, clock_after, finish_turn

# The two SMs of a pair take turns with the halves of each CHUNK blocks of their range: SM row 0 starts at
# the chunk's first block, SM row 1 at its middle. Both pay the DRAM miss of half the chunk's blocks, so
# they keep pace, stay half a chunk apart (two SMs loading one line at once merge their requests, which
# lowers the latency both see), and time each block within ~30 us of each other (a drifting clock shifts
# both timings alike).
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
