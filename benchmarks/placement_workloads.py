"""The workloads of benchmarks/bench_placement.py: a latency-bound chase, the same chase in a kernel whose
resources cap it at one or two CTAs per SM (1024 threads, a register tile held across the chase, as
attention-like kernels hold theirs), and an embedding-bag-like gather; each as a kernel on the placement helpers
and as the hand-written plain kernel a user would write instead (one program per item, no helpers), with
their data laid out by the buffer's partition map and an independent reference to check every result.

Chase: item i chases `loads` dependent lines (one thread, ld.global.cg) through a random ring of the lines
homed in partition class[i]; classes alternate 0, 1, 0, ... so that a plan blind to homes gives every SM
half near and half far items. Gather: bag i sums 32 rows of a float32 table (64 columns = 256 bytes, one
partition block per row), all rows homed in partition class[i].
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import triton
import triton.language as tl

from torch_l2topo.layout import LINE_BYTES, LINE_WORDS
from torch_l2topo.triton_kernels.placement import (
    PLAN_N_SLOTS,
    STATE_FINISHED,
    STATE_TAIL,
    _claim_share,
    _next_share,
    plan_finish,
    plan_next,
    plan_start,
)
from torch_l2topo.triton_kernels.protocol import chase, global_ns, sm_id


@triton.jit
def _chase_item(starts_ptr, ends_ptr, n_loads, item):
    p = tl.load(starts_ptr + item)
    for _ in range(n_loads):
        p = chase(p)
    tl.store(ends_ptr + item, p)


@triton.jit
def chase_kernel(starts_ptr, ends_ptr, n_loads, plan_ptr, state_ptr, PLACE: tl.constexpr):
    sm, t0 = plan_start(plan_ptr, state_ptr, PLACE)
    item, phase = plan_next(plan_ptr, state_ptr, sm, 0, PLACE)
    n_done = 0
    while item >= 0:
        _chase_item(starts_ptr, ends_ptr, n_loads, item)
        n_done += 1
        item, phase = plan_next(plan_ptr, state_ptr, sm, phase, PLACE)
    plan_finish(plan_ptr, state_ptr, sm, t0, n_done, PLACE)


@triton.jit
def traced_chase_kernel(starts_ptr, ends_ptr, n_loads, trace_ptr, plan_ptr, state_ptr, PLACE: tl.constexpr):
    """chase_kernel that also records, per item, the SM that ran it and its %globaltimer start and end (3 int64
    at trace[3 * item]): where placement put each item and how long it took (the benchmark's diagnosis)."""
    sm, t0 = plan_start(plan_ptr, state_ptr, PLACE)
    item, phase = plan_next(plan_ptr, state_ptr, sm, 0, PLACE)
    n_done = 0
    while item >= 0:
        start = global_ns()
        _chase_item(starts_ptr, ends_ptr, n_loads, item)
        tl.store(trace_ptr + 3 * item, sm_id())
        tl.store(trace_ptr + 3 * item + 1, start)
        tl.store(trace_ptr + 3 * item + 2, global_ns())
        n_done += 1
        item, phase = plan_next(plan_ptr, state_ptr, sm, phase, PLACE)
    plan_finish(plan_ptr, state_ptr, sm, t0, n_done, PLACE)


@triton.jit
def chase_plain_kernel(starts_ptr, ends_ptr, n_loads):
    """The hand-written plain kernel: program p chases item p."""
    _chase_item(starts_ptr, ends_ptr, n_loads, tl.program_id(0).to(tl.int64))


@triton.jit
def chase_exit_kernel(starts_ptr, ends_ptr, n_loads, plan_ptr, state_ptr, EXIT: tl.constexpr):
    """A diagnosis of the shares mode's way out (bench_placement.py --only uniform): each program makes the real
    claim of one item of its SM's share (a uniform plan without a tail, as many CTAs per SM as items), chases it,
    then runs the first EXIT steps of what a shares-mode program does once its items are done: 1 a failed claim
    of its share, 2 and a failed tail claim, 3 and the way into the scan for a victim (skipped once every share
    is drained), 4 and plan_finish's acq_rel count of finished programs; 5 is 4 with that count relaxed. The
    host zeroes the state before every launch (nothing here resets it)."""
    sm = sm_id()
    n_slots = tl.load(plan_ptr + PLAN_N_SLOTS)
    item = _claim_share(plan_ptr, state_ptr, sm, n_slots)
    if item >= 0:
        _chase_item(starts_ptr, ends_ptr, n_loads, item)
    if EXIT >= 1:
        _claim_share(plan_ptr, state_ptr, sm, n_slots)
    if EXIT >= 2:
        tl.atomic_add(state_ptr + STATE_TAIL, tl.full((), 1, tl.int64), sem="relaxed")
    if EXIT >= 3:
        _next_share(plan_ptr, state_ptr, sm, tl.full((), 2, tl.int64))  # PHASE_STEAL: finds no victim here
    if EXIT == 4:
        tl.atomic_add(state_ptr + STATE_FINISHED, tl.full((), 1, tl.int64), sem="acq_rel")
    if EXIT == 5:
        tl.atomic_add(state_ptr + STATE_FINISHED, tl.full((), 1, tl.int64), sem="relaxed")


# The capped kernel: 512 threads per program (16 warps) and a TILE-float register tile per thread that the
# chase's start depends on and whose result is stored after it, so it stays live across the chase: ~80
# registers per thread (counted by ptxas for sm_90), 40K of an SM's 64K registers, so an SM holds one program.
CAPPED_WARPS = 16
CAPPED_THREADS = tl.constexpr(32 * CAPPED_WARPS)
TILE = 64


@triton.jit
def _capped_item(starts_ptr, ends_ptr, tile_ptr, n_loads, item, TILE: tl.constexpr):
    rows = tl.arange(0, CAPPED_THREADS)[:, None] * TILE + tl.arange(0, TILE)[None, :]
    acc = tl.load(tile_ptr + rows)
    p = tl.load(starts_ptr + item) + (tl.max(tl.max(acc, axis=1), axis=0) * 0).to(tl.int64)
    for _ in range(n_loads):
        p = chase(p)
    tl.store(ends_ptr + item, p)
    tl.store(tile_ptr + rows, acc + (p & 1).to(tl.float32))  # +0 or +1: the tile is read back, not checked


@triton.jit
def capped_kernel(starts_ptr, ends_ptr, tile_ptr, n_loads, plan_ptr, state_ptr, TILE: tl.constexpr,
                  PLACE: tl.constexpr):
    sm, t0 = plan_start(plan_ptr, state_ptr, PLACE)
    item, phase = plan_next(plan_ptr, state_ptr, sm, 0, PLACE)
    n_done = 0
    while item >= 0:
        _capped_item(starts_ptr, ends_ptr, tile_ptr, n_loads, item, TILE)
        n_done += 1
        item, phase = plan_next(plan_ptr, state_ptr, sm, phase, PLACE)
    plan_finish(plan_ptr, state_ptr, sm, t0, n_done, PLACE)


@triton.jit
def capped_plain_kernel(starts_ptr, ends_ptr, tile_ptr, n_loads, TILE: tl.constexpr):
    _capped_item(starts_ptr, ends_ptr, tile_ptr, n_loads, tl.program_id(0).to(tl.int64), TILE)


@triton.jit
def _bag_sum(table_ptr, idx_ptr, out_ptr, item, BAG: tl.constexpr, DIM: tl.constexpr):
    rows = tl.load(idx_ptr + item * BAG + tl.arange(0, BAG)).to(tl.int64)
    values = tl.load(table_ptr + rows[:, None] * DIM + tl.arange(0, DIM)[None, :])
    tl.store(out_ptr + item * DIM + tl.arange(0, DIM), tl.sum(values, axis=0))


@triton.jit
def gather_kernel(table_ptr, idx_ptr, out_ptr, BAG: tl.constexpr, DIM: tl.constexpr, plan_ptr, state_ptr,
                  PLACE: tl.constexpr):
    sm, t0 = plan_start(plan_ptr, state_ptr, PLACE)
    item, phase = plan_next(plan_ptr, state_ptr, sm, 0, PLACE)
    n_done = 0
    while item >= 0:
        _bag_sum(table_ptr, idx_ptr, out_ptr, item, BAG, DIM)
        n_done += 1
        item, phase = plan_next(plan_ptr, state_ptr, sm, phase, PLACE)
    plan_finish(plan_ptr, state_ptr, sm, t0, n_done, PLACE)


@triton.jit
def gather_plain_kernel(table_ptr, idx_ptr, out_ptr, BAG: tl.constexpr, DIM: tl.constexpr):
    _bag_sum(table_ptr, idx_ptr, out_ptr, tl.program_id(0), BAG, DIM)


@triton.jit
def gather_lookup_kernel(table_ptr, idx_ptr, out_ptr, order_ptr, BAG: tl.constexpr, DIM: tl.constexpr):
    """The least a static plan costs: program p works on item order[p] (one dependent load of the item id)."""
    _bag_sum(table_ptr, idx_ptr, out_ptr, tl.load(order_ptr + tl.program_id(0)), BAG, DIM)


@triton.jit
def gather_ticket_kernel(table_ptr, idx_ptr, out_ptr, order_ptr, counters_ptr, per_counter, BAG: tl.constexpr,
                         DIM: tl.constexpr, COUNTERS: tl.constexpr):
    """The least a dynamic claim costs: one relaxed atomic ticket, then one load of the item id; no plan check, no
    failed claim, no finish. Program p draws from counter p % COUNTERS (spread, so the claims do not queue on one
    address). The counters are never reset: each launch adds per_counter tickets to every counter, and ticket t
    of counter g is item order[(t % per_counter) * COUNTERS + g], so every item is taken once per launch."""
    g = tl.program_id(0) % COUNTERS
    t = tl.atomic_add(counters_ptr + g, 1, sem="relaxed")
    _bag_sum(table_ptr, idx_ptr, out_ptr, tl.load(order_ptr + (t % per_counter) * COUNTERS + g), BAG, DIM)


def _alternating(n: int) -> np.ndarray:
    return (np.arange(n) % 2).astype(np.int8)


@dataclass
class Chase:
    buffer: object          # the ring buffer (int64 tensor), kept alive: its partition map is cached
    starts: object          # (n_items,) int64 tensor: the address where item i starts
    expected: np.ndarray    # (n_items,) where item i must end
    classes: np.ndarray     # (n_items,) int8 home partition of item i's lines
    loads: int
    ring_lines: tuple       # lines homed in partition 0, 1 (each ring's length)
    map_s: float            # time of the buffer's partition map


def chase_workload(device, footprint_bytes: int, n_items: int, loads: int, seed: int = 0,
                   shuffled: bool = False) -> Chase:
    """Two random rings through the lines of a `footprint_bytes` buffer, one per home partition, and n_items
    items evenly spaced along them (classes alternating; shuffled: the same classes in a random order)."""
    import torch

    from torch_l2topo.placement.partition.maps import partition_map

    n_lines = footprint_bytes // LINE_BYTES
    buf = torch.zeros(n_lines * LINE_WORDS, dtype=torch.int64, device=device)
    pmap = partition_map(buf)
    line_home = np.repeat(pmap.homes, pmap.block_bytes // LINE_BYTES)[:n_lines]
    base, rng = buf.data_ptr(), np.random.default_rng(seed)
    classes = _alternating(n_items)
    if shuffled:
        classes = rng.permutation(classes)
    starts = np.empty(n_items, np.int64)
    expected = np.empty(n_items, np.int64)
    lengths = []
    lines = buf.view(n_lines, LINE_WORDS)
    for c in (0, 1):
        order = rng.permutation(np.flatnonzero(line_home == c))  # undecided lines are in no ring
        lengths.append(len(order))
        ring = torch.from_numpy(order).to(device)
        lines[ring, 0] = base + torch.roll(ring, -1) * LINE_BYTES
        mine = np.flatnonzero(classes == c)
        pos = (np.arange(len(mine)) * len(order)) // max(len(mine), 1)
        starts[mine] = base + order[pos] * LINE_BYTES
        expected[mine] = base + order[(pos + loads) % len(order)] * LINE_BYTES
    return Chase(buf, torch.from_numpy(starts).to(device), expected, classes, loads, tuple(lengths), pmap.elapsed_s)


@dataclass
class Gather:
    table: object
    idx: object
    reference: object       # (n_bags, DIM) float32 tensor: the sums, computed by torch
    classes: np.ndarray
    bag: int
    dim: int


def gather_workload(device, table_bytes: int, n_bags: int, bag: int = 32, dim: int = 64, seed: int = 0) -> Gather:
    """A float32 table of `table_bytes` (rows of dim floats) and n_bags bags of `bag` random rows, all homed in
    the bag's partition (classes alternating)."""
    import torch

    from torch_l2topo.placement.partition.maps import partition_map

    row_bytes = dim * 4
    n_rows = table_bytes // row_bytes
    table = torch.randn(n_rows, dim, device=device)
    pmap = partition_map(table)
    if pmap.block_bytes != row_bytes:
        raise ValueError(f"rows of {row_bytes} bytes must be the partition map's blocks ({pmap.block_bytes})")
    rng = np.random.default_rng(seed)
    classes = _alternating(n_bags)
    idx = np.empty((n_bags, bag), np.int32)
    for c in (0, 1):
        rows = np.flatnonzero(pmap.homes[:n_rows] == c)
        mine = np.flatnonzero(classes == c)
        idx[mine] = rng.choice(rows, size=(len(mine), bag))
    idx_t = torch.from_numpy(idx).to(device)
    return Gather(table, idx_t, table[idx_t.long()].sum(dim=1), classes, bag, dim)
