"""Triton kernels of the L2 geometry suite (host side: torch_l2topo/geometry/chases.py, for suite.py).

Three probe kernels on the public protocol (protocol.py): every SM is claimed, only the SMs given a row measure
(rows[sm] >= 0), all at once (wave = n_sm); scalar or one-warp work, so launch them with num_warps=1.
- offsets_chase_kernel: one dependent chain per measuring SM through a list of byte offsets, each load timed
  alone; one list serves first touch, stride sweeps, regular against random orders and footprint sweeps.
- ring_chase_kernel: the chain probe's pointer chase on chosen SMs, for footprints each SM fills itself.
- lanes_chase_kernel: LANES independent pointer chases per SM (one per thread of the warp), for contention and
  the layout fixes' warp-wide bursts.
And column_read_kernel, the layout fixes' throughput kernel (any SM, many warps): one kernel run without a fix,
padded and XOR-swizzled, so the host compares like with like. Each kernel's docstring gives its contract.
Docs: docs/geometry.md.
"""
import triton
import triton.language as tl

from torch_l2topo.triton_kernels.protocol import (
    address_after,
    chase,
    claim_sm,
    clock_after,
    finish_turn,
    global_ns,
)


@triton.jit(do_not_specialize=["zero"])
def offsets_chase_kernel(ctrl_ptr, base, offsets_ptr, rows_ptr, cycles_ptr, per_row_ptr, n_loads, zero, n_sm,
                         wave, timeout_ns):
    """rows[sm] = r >= 0: SM `sm` loads base + offsets[r, i] for i = 0..n_loads-1 in one dependent chain
    (offsets: (n_rows, n_loads + 1) int64, the last column unused padding for the read-ahead) and stores each
    load's clock64 cycles to cycles[r, i]; per_row[r] = (cycles, globaltimer ns, start ns, end ns) of the
    whole chain.

    The data is arbitrary (not pointers): the next address is base + offset, made to wait for the loaded value
    (protocol.address_after). The next offset is read while the current load is in flight (an L1 hit, or an L2
    load once every 16 offsets), so it overlaps the chain. A timing is one L2 or DRAM load plus the clock read
    and the loop's bookkeeping: what one dependent load costs a real chain."""
    sm, go = claim_sm(ctrl_ptr, n_sm, wave, timeout_ns)
    if go:
        row = tl.load(rows_ptr + sm)
        if row >= 0:
            z = zero.to(tl.int64)
            offs = offsets_ptr + row * (n_loads + 1)
            nxt = tl.load(offs)
            g0 = global_ns()
            t_prev = clock_after(nxt)
            t_first = t_prev
            v = t_prev
            for i in range(n_loads):
                addr = address_after(base + nxt, v, z)
                nxt = tl.load(offs + i + 1)  # in flight while the chain load is
                v = chase(addr)
                t = clock_after(v)
                tl.store(cycles_ptr + row * n_loads + i, t - t_prev)
                t_prev = t
            g1 = global_ns()
            tl.store(per_row_ptr + row * 4 + 0, t_prev - t_first)
            tl.store(per_row_ptr + row * 4 + 1, g1 - g0)
            tl.store(per_row_ptr + row * 4 + 2, g0)
            tl.store(per_row_ptr + row * 4 + 3, g1)
        finish_turn(ctrl_ptr)


@triton.jit
def lanes_chase_kernel(ctrl_ptr, starts_ptr, rows_ptr, out_ptr, n_warm, n_timed, n_sm, wave, timeout_ns,
                       LANES: tl.constexpr):
    """rows[sm] = r >= 0: SM `sm` runs LANES pointer chases from starts[r, 0..LANES-1]: n_warm steps, then
    n_timed timed ones. out[r] = (clock64 cycles, globaltimer ns, start ns, end ns, XOR of the final
    addresses: the host checks the chase ends where its ring says). Each word of the line buffer holds the
    address of the word its lane visits next: with LANES = 1 a ring's loads issue one by one, with LANES = M,
    M at once."""
    sm, go = claim_sm(ctrl_ptr, n_sm, wave, timeout_ns)
    if go:
        row = tl.load(rows_ptr + sm)
        if row >= 0:
            p = tl.load(starts_ptr + row * LANES + tl.arange(0, LANES))
            for _ in range(n_warm):
                p = chase(p)
            g0 = global_ns()
            t0 = clock_after(tl.max(p, axis=0))
            for _ in range(n_timed):
                p = chase(p)
            t1 = clock_after(tl.max(p, axis=0))
            g1 = global_ns()
            tl.store(out_ptr + row * 5 + 0, t1 - t0)
            tl.store(out_ptr + row * 5 + 1, g1 - g0)
            tl.store(out_ptr + row * 5 + 2, g0)
            tl.store(out_ptr + row * 5 + 3, g1)
            tl.store(out_ptr + row * 5 + 4, tl.xor_sum(p, axis=0))
        finish_turn(ctrl_ptr)


@triton.jit
def ring_chase_kernel(ctrl_ptr, starts_ptr, rows_ptr, out_ptr, n_warm, n_timed, n_sm, wave, timeout_ns):
    """rows[sm] = r >= 0: SM `sm` chases the pointer ring from starts[r]: n_warm loads (a whole pass fills
    the L2 with the ring as this SM sees it), then n_timed timed ones. out[r] = (clock64 cycles, globaltimer
    ns, final address). The chain probe's loop, on chosen SMs and without per-load clock reads."""
    sm, go = claim_sm(ctrl_ptr, n_sm, wave, timeout_ns)
    if go:
        row = tl.load(rows_ptr + sm)
        if row >= 0:
            p = tl.load(starts_ptr + row)
            for _ in range(n_warm):
                p = chase(p)
            g0 = global_ns()
            t0 = clock_after(p)
            for _ in range(n_timed):
                p = chase(p)
            t1 = clock_after(p)
            g1 = global_ns()
            tl.store(out_ptr + row * 3 + 0, t1 - t0)
            tl.store(out_ptr + row * 3 + 1, g1 - g0)
            tl.store(out_ptr + row * 3 + 2, p)
        finish_turn(ctrl_ptr)


@triton.jit
def column_read_kernel(src_ptr, out_ptr, n_rows, pitch_structs, reps, COLS: tl.constexpr, SWIZZLE: tl.constexpr,
                       BLOCK_R: tl.constexpr):
    """Program c sums column c of an (n_rows, COLS) table of 16-byte structs (4 floats) laid out with a row
    pitch of `pitch_structs` structs, `reps` times, and stores the sum to out[c]. SWIZZLE: the struct of column c in
    row r sits at column c ^ (r % COLS). n_rows: a multiple of BLOCK_R. Loads skip L1 (.cg): every pass
    reads the L2."""
    col = tl.program_id(0)
    rows = tl.arange(0, BLOCK_R)
    lanes = tl.arange(0, 4)
    acc = tl.zeros([BLOCK_R, 4], dtype=tl.float32)
    for _ in range(reps):
        for r0 in range(0, n_rows, BLOCK_R):
            r = r0 + rows
            if SWIZZLE:
                c = col ^ (r & (COLS - 1))
            else:
                c = col + 0 * r
            # struct index * 4: a multiple of 4 floats, so one 16-byte load per struct
            acc += tl.load(src_ptr + (r[:, None] * pitch_structs + c[:, None]) * 4 + lanes[None, :],
                           cache_modifier=".cg")
    tl.store(out_ptr + col, tl.sum(acc))
