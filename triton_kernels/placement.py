"""The device side of SM-aware placement in Triton: claim this SM's share of a plan, drain the tail, steal.

Public API for any persistent Triton kernel of torch_l2topo or of its users (cuda_ext/placement.cuh mirrors
every function under the same name; tests/test_kernel_sources.py checks that the two lists agree):

    plan_start(plan_ptr, state_ptr) -> (sm, t0)
        %smid of this program (int64) and its %globaltimer start. A plan without PLAN_MAGIC_VALUE (or with
        more than MAX_SLOTS slots) sets state[STATE_ERROR]; then plan_next hands this program nothing.
    plan_next(plan_ptr, state_ptr, sm, phase) -> (item, phase)
        the next item id (int64) for this program, or -1 when none is left. Start with phase 0 and pass back
        the phase it returns: 0 = this SM's share, 1 = the dynamic tail, 2 = steal from the SM with the most
        unclaimed items, 3 = done. A plan in direct mode (policy "plain") gives program p item p (if p is
        below the item count) and then -1, without touching the state.
    plan_finish(plan_ptr, state_ptr, sm, t0, n_done)
        add this program's items, busy ns and 1 CTA to its SM's statistics; the last program out resets the
        cursors, so the next launch (or CUDA graph replay) starts clean with no host work. Nothing in
        direct mode: no cursor moved, and a plain launch pays for no atomics.

Usage: launch ctas_per_sm x n_sm programs, or one program per item for a direct-mode plan
(torch_l2topo.placement.sm_aware does it, with the plan and state tensors of torch_l2topo.placement.slots as
the last two arguments):

    @triton.jit
    def my_kernel(x_ptr, out_ptr, plan_ptr, state_ptr):
        sm, t0 = plan_start(plan_ptr, state_ptr)
        item, phase = plan_next(plan_ptr, state_ptr, sm, 0)
        n_done = 0
        while item >= 0:
            ...work on item...
            n_done += 1
            item, phase = plan_next(plan_ptr, state_ptr, sm, phase)
        plan_finish(plan_ptr, state_ptr, sm, t0, n_done)

Layouts (plan: int32, read-only; state: int64, zero at rest) are torch_l2topo/layout.py's. Every item is
handed out exactly once per launch: each index of a share or of the tail is the return value of exactly one
atomic_add on its cursor, and a program stops only once the tail and every share are exhausted (cursors only
grow during a launch, so "all exhausted" is final). No wait here needs a watchdog: a program never waits
for another one; the steal loop ends after at most one failed claim per slot plus one per item it gets.

Works for any num_warps: the helpers do scalar work. Triton executes a scalar atomic once per program, on
thread 0, and broadcasts a used result through shared memory to every thread: in the num_warps=4 PTX every
`atom.global` / `red.global` is predicated on `setp.eq (tid & 31) | (tid >> 5), 0`, and every claim's result
goes st.shared -> bar.sync -> ld.shared (tests/test_placement_kernels_compile.py checks both). The steal
scan is a MAX_SLOTS-wide vector load spread over the program's threads (up to 8 warps hold no replica, so
every warp decides alike) and reduced with tl.max, whose result every thread gets.

Only constexpr globals and @triton.jit functions are referenced inside the helpers, so that torch.compile
(Inductor inlines a user kernel's helpers by source) can compile a kernel built on them.

This module imports only torch_l2topo.layout and the public names of triton_kernels/protocol.py.
"""
import triton
import triton.language as tl

from torch_l2topo import layout as _layout
from torch_l2topo.triton_kernels.protocol import global_ns, sm_id

# Triton kernels may only read module globals that are constexpr.
PLAN_N_SLOTS = tl.constexpr(_layout.PLAN_N_SLOTS)
PLAN_N_STATIC = tl.constexpr(_layout.PLAN_N_STATIC)
PLAN_N_TAIL = tl.constexpr(_layout.PLAN_N_TAIL)
PLAN_MAGIC = tl.constexpr(_layout.PLAN_MAGIC)
PLAN_HEADER = tl.constexpr(_layout.PLAN_HEADER)
PLAN_MAGIC_VALUE = tl.constexpr(_layout.PLAN_MAGIC_VALUE)
PLAN_MODE = tl.constexpr(_layout.PLAN_MODE)
PLAN_MODE_DIRECT = tl.constexpr(_layout.PLAN_MODE_DIRECT)
STATE_TAIL = tl.constexpr(_layout.STATE_TAIL)
STATE_FINISHED = tl.constexpr(_layout.STATE_FINISHED)
STATE_ERROR = tl.constexpr(_layout.STATE_ERROR)
STATE_CURSORS = tl.constexpr(_layout.STATE_CURSORS)
STAT_ITEMS = tl.constexpr(_layout.STAT_ITEMS)
STAT_BUSY_NS = tl.constexpr(_layout.STAT_BUSY_NS)
STAT_CTAS = tl.constexpr(_layout.STAT_CTAS)

MAX_SLOTS = tl.constexpr(_layout.PLAN_MAX_SLOTS)  # the width of the steal scan
LEFT_CAP = tl.constexpr(2**31 // _layout.PLAN_MAX_SLOTS - 1)  # the steal key's largest count (int32)

PHASE_SHARE = tl.constexpr(0)
PHASE_TAIL = tl.constexpr(1)
PHASE_STEAL = tl.constexpr(2)
PHASE_DONE = tl.constexpr(3)


@triton.jit
def _plan_ok(plan_ptr):
    # A plan without the magic word is not read any further: its sizes could point anywhere.
    ok = tl.load(plan_ptr + PLAN_MAGIC) == PLAN_MAGIC_VALUE
    if ok:
        n_slots = tl.load(plan_ptr + PLAN_N_SLOTS)
        ok = (n_slots >= 0) & (n_slots <= MAX_SLOTS)
    return ok


@triton.jit
def plan_start(plan_ptr, state_ptr):
    sm = sm_id()
    t0 = global_ns()
    if not _plan_ok(plan_ptr):
        tl.atomic_xchg(state_ptr + STATE_ERROR, tl.full((), 1, tl.int64), sem="relaxed")
    return sm, t0


@triton.jit
def _claim_share(plan_ptr, state_ptr, slot, n_slots):
    """Item at the next index of `slot`'s share, or -1 if the share is exhausted."""
    item = tl.full((), -1, tl.int64)
    lo = tl.load(plan_ptr + PLAN_HEADER + slot)
    hi = tl.load(plan_ptr + PLAN_HEADER + slot + 1)
    # relaxed: the claimed index orders nothing else (the plan is read-only during the launch)
    i = tl.atomic_add(state_ptr + STATE_CURSORS + slot, tl.full((), 1, tl.int64), sem="relaxed")
    if i < hi - lo:
        item = tl.load(plan_ptr + PLAN_HEADER + n_slots + 1 + lo + i).to(tl.int64)
    return item


@triton.jit
def plan_next(plan_ptr, state_ptr, sm, phase):
    item = tl.full((), -1, tl.int64)
    phase = tl.zeros((), tl.int32) + phase  # the first call passes a literal 0
    if not _plan_ok(plan_ptr):
        phase = tl.full((), PHASE_DONE, tl.int32)
    n_slots = tl.load(plan_ptr + PLAN_N_SLOTS)
    if (phase == PHASE_SHARE) & (tl.load(plan_ptr + PLAN_MODE) == PLAN_MODE_DIRECT):
        pid = tl.program_id(0).to(tl.int64)
        if pid < tl.load(plan_ptr + PLAN_N_TAIL):
            item = pid
        phase = tl.full((), PHASE_DONE, tl.int32)
    if phase == PHASE_SHARE:
        if sm < n_slots:  # an SM the plan does not know has no share
            item = _claim_share(plan_ptr, state_ptr, sm, n_slots)
        if item < 0:
            phase = tl.full((), PHASE_TAIL, tl.int32)
    if phase == PHASE_TAIL:
        n_static = tl.load(plan_ptr + PLAN_N_STATIC)
        t = tl.atomic_add(state_ptr + STATE_TAIL, tl.full((), 1, tl.int64), sem="relaxed")
        if t < tl.load(plan_ptr + PLAN_N_TAIL):
            item = tl.load(plan_ptr + PLAN_HEADER + n_slots + 1 + n_static + t).to(tl.int64)
        else:
            phase = tl.full((), PHASE_STEAL, tl.int32)
    if phase == PHASE_STEAL:
        # One MAX_SLOTS-wide vector over the program's threads (no thread holds a replica: the decision must
        # be the same in every warp), kept narrow so that a kernel's register count does not grow for a scan
        # it rarely runs: int32 share sizes and cursors (both below 2**31; a cursor is read as the low word of
        # its int64), and one int32 max over a key that packs the items left with the slot (ties: lowest slot,
        # as tl.argmax). Vectors of int64 and a max + argmax took a gather kernel from 64 to 96 registers per
        # thread and its residency from 32 to 21 single-warp CTAs per SM.
        slots = tl.arange(0, MAX_SLOTS)
        in_plan = slots < n_slots
        cursor_low = (state_ptr + STATE_CURSORS + slots).to(tl.pointer_type(tl.int32), bitcast=True)
        while (phase == PHASE_STEAL) & (item < 0):
            share = tl.load(plan_ptr + PLAN_HEADER + slots + 1, mask=in_plan, other=0) \
                - tl.load(plan_ptr + PLAN_HEADER + slots, mask=in_plan, other=0)
            # volatile: the cursors move under other programs' atomics; a cached copy would hide that
            left = share - tl.load(cursor_low, mask=in_plan, other=0, volatile=True)
            # int32 key: counts above LEFT_CAP compare as equal (any victim with items left is correct)
            packed = tl.minimum(left, LEFT_CAP) * MAX_SLOTS + (MAX_SLOTS - 1 - slots)
            key = tl.max(tl.where(in_plan & (left > 0), packed, -1), axis=0)
            if key >= 0:
                # most unclaimed items first: the victim is the SM furthest from finishing its share
                item = _claim_share(plan_ptr, state_ptr, MAX_SLOTS - 1 - key % MAX_SLOTS, n_slots)
            else:
                phase = tl.full((), PHASE_DONE, tl.int32)
    return item, phase


@triton.jit
def plan_finish(plan_ptr, state_ptr, sm, t0, n_done):
    ok = _plan_ok(plan_ptr)
    if ok & (tl.load(plan_ptr + PLAN_MODE) == PLAN_MODE_DIRECT):
        pass  # direct mode: no cursor moved, nothing to count or reset
    else:
        n_slots = tl.load(plan_ptr + PLAN_N_SLOTS)
        if ok & (sm < n_slots):
            stats = state_ptr + STATE_CURSORS + n_slots + sm  # statistic k of SM sm: stats + k * n_slots
            tl.atomic_add(stats + STAT_ITEMS * n_slots, tl.zeros((), tl.int64) + n_done, sem="relaxed")
            tl.atomic_add(stats + STAT_BUSY_NS * n_slots, global_ns() - t0, sem="relaxed")
            tl.atomic_add(stats + STAT_CTAS * n_slots, tl.full((), 1, tl.int64), sem="relaxed")
        # Why the last program out may reset the state without racing anyone: every program makes all its
        # claims (the last one being the failed claim that returned -1) before this increment, and acq_rel
        # orders them before it (release) and this program's resets after it (acquire). The program that sees
        # grid - 1 is therefore the last to touch the cursors in this launch, and the next launch starts after
        # this one ends in stream order.
        finished = tl.atomic_add(state_ptr + STATE_FINISHED, tl.full((), 1, tl.int64), sem="acq_rel")
        if finished == tl.num_programs(0) - 1:
            if ok:
                slots = tl.arange(0, MAX_SLOTS)
                tl.store(state_ptr + STATE_CURSORS + slots, tl.zeros((MAX_SLOTS,), tl.int64), mask=slots < n_slots)
            tl.store(state_ptr + STATE_TAIL, tl.full((), 0, tl.int64))
            tl.store(state_ptr + STATE_FINISHED, tl.full((), 0, tl.int64))
