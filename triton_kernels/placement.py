"""The device side of SM-aware placement in Triton: take this program's items under one of three modes.

Public API for any Triton kernel (cuda_ext/placement.cuh mirrors every function under the same name;
tests/test_kernel_sources.py checks the lists agree): plan_start, plan_next, plan_finish, each documented below.
A kernel takes a constexpr PLACE (a torch_l2topo.layout.PLACE_* mode, passed by the launcher) and hands it on:
- PLACE_DIRECT ("plain"): program p takes item p; the helpers compile to nothing (tests check the PTX).
- PLACE_QUEUES ("partition_queues"): a plain-sized grid; each program claims items, PLAN_CHUNK at a time, from
  its SM's home queue (its L2 partition's items), then its group's other queues, then the other group's.
- PLACE_SHARES (persistent policies): items by program id, then the SM's share, the dynamic tail, stealing; the
  last CTA out resets the state, so launches and graph replays need no host work.
Invariant: every item is handed out exactly once per launch (each index is the result of exactly one atomic on
its cursor; cursors only grow during a launch), and no program ever waits for another, so nothing needs a
watchdog. Works for any num_warps: atomics run once per program and their result is broadcast. Only constexpr
globals and @triton.jit functions are referenced, so torch.compile can inline the helpers. Imports only
torch_l2topo.layout, protocol.py and recorder.py. Docs: docs/usage.md ("Placing work").
"""
import triton
import triton.language as tl

from torch_l2topo import layout as _layout
from torch_l2topo.triton_kernels.protocol import global_ns, sm_id
from torch_l2topo.triton_kernels.recorder import record_cta, recorder_at

# Triton kernels may only read module globals that are constexpr.
PLACE_DIRECT = tl.constexpr(_layout.PLACE_DIRECT)
PLACE_SHARES = tl.constexpr(_layout.PLACE_SHARES)
PLACE_QUEUES = tl.constexpr(_layout.PLACE_QUEUES)
PLACE_MODE_MASK = tl.constexpr(_layout.PLACE_MODE_MASK)
PLACE_RECORD = tl.constexpr(_layout.PLACE_RECORD)
PLAN_REC_LO = tl.constexpr(_layout.PLAN_REC_LO)
PLAN_REC_HI = tl.constexpr(_layout.PLAN_REC_HI)
PLAN_REC_TAG = tl.constexpr(_layout.PLAN_REC_TAG)
PLAN_N_FIRST = tl.constexpr(_layout.PLAN_N_FIRST)
PLAN_N_SLOTS = tl.constexpr(_layout.PLAN_N_SLOTS)
PLAN_N_STATIC = tl.constexpr(_layout.PLAN_N_STATIC)
PLAN_N_TAIL = tl.constexpr(_layout.PLAN_N_TAIL)
PLAN_MAGIC = tl.constexpr(_layout.PLAN_MAGIC)
PLAN_MODE = tl.constexpr(_layout.PLAN_MODE)
PLAN_N_QUEUES = tl.constexpr(_layout.PLAN_N_QUEUES)
PLAN_GROUP_QUEUES = tl.constexpr(_layout.PLAN_GROUP_QUEUES)
PLAN_CHUNK = tl.constexpr(_layout.PLAN_CHUNK)
PLAN_HEADER = tl.constexpr(_layout.PLAN_HEADER)
PLAN_MAGIC_VALUE = tl.constexpr(_layout.PLAN_MAGIC_VALUE)
STATE_TAIL = tl.constexpr(_layout.STATE_TAIL)
STATE_FINISHED = tl.constexpr(_layout.STATE_FINISHED)
STATE_ERROR = tl.constexpr(_layout.STATE_ERROR)
STATE_DRAINED_SHIFT = tl.constexpr(_layout.STATE_DRAINED_SHIFT)
TAIL_MASK = tl.constexpr(2**_layout.STATE_DRAINED_SHIFT - 1)
ONE_DRAINED = tl.constexpr(2**_layout.STATE_DRAINED_SHIFT)  # one drained share, added to the tail word
STATE_CURSORS = tl.constexpr(_layout.STATE_CURSORS)
STAT_ITEMS = tl.constexpr(_layout.STAT_ITEMS)
STAT_BUSY_NS = tl.constexpr(_layout.STAT_BUSY_NS)
STAT_CTAS = tl.constexpr(_layout.STAT_CTAS)

MAX_SLOTS = tl.constexpr(_layout.PLAN_MAX_SLOTS)  # the width of the steal scan
MAX_QUEUES = tl.constexpr(_layout.PLAN_MAX_QUEUES)  # the width of the queue scan
LEFT_CAP = tl.constexpr(2**31 // _layout.PLAN_MAX_SLOTS - 1)  # the steal key's largest count (int32)

# Shares mode's phases. PHASE_FIRST (the first call's 0) carries in bits PHASE_COUNT_SHIFT and up how many items
# this program took by its id (plan's items below PLAN_N_FIRST); the others are plain values.
PHASE_FIRST = tl.constexpr(0)
PHASE_SHARE = tl.constexpr(1)
PHASE_TAIL = tl.constexpr(2)
PHASE_STEAL = tl.constexpr(3)
PHASE_DONE = tl.constexpr(4)
PHASE_KIND_MASK = tl.constexpr(7)
PHASE_COUNT_SHIFT = tl.constexpr(3)
PHASE_ONE_TAKEN = tl.constexpr(2**PHASE_COUNT_SHIFT.value)  # one more item by program id, added to a PHASE_FIRST phase
# Queues mode packs the program's claim into the int64 phase: the next index in the claimed range of queue
# q (bits 0-31), the items left in that range (bits 32-55) and q + 1 (bits 56-62; 0: nothing claimed yet).
# A phase with bit 63 set (negative) is done.
Q_LEFT_SHIFT = tl.constexpr(32)
Q_QUEUE_SHIFT = tl.constexpr(56)
Q_MASK_INDEX = tl.constexpr(2**32 - 1)
Q_MASK_LEFT = tl.constexpr(2**24 - 1)


@triton.jit
def _mode(PLACE: tl.constexpr):
    # tl.constexpr(): Triton's interpreter passes PLACE as a plain int, which `&` with a constexpr refuses
    return tl.constexpr(PLACE) & PLACE_MODE_MASK


@triton.jit
def _recording(PLACE: tl.constexpr):
    return (tl.constexpr(PLACE) & PLACE_RECORD) != 0


@triton.jit
def _plan_ok(plan_ptr, PLACE: tl.constexpr):
    # The three header words in one round trip (every plan tensor holds a header; one read after the magic word
    # was a second dependent L2 round trip before any claim). A plan without the magic word is not read beyond
    # its header: its sizes could point anywhere.
    magic = tl.load(plan_ptr + PLAN_MAGIC)
    n_slots = tl.load(plan_ptr + PLAN_N_SLOTS)
    mode = tl.load(plan_ptr + PLAN_MODE)
    return (magic == PLAN_MAGIC_VALUE) & (n_slots >= 0) & (n_slots <= MAX_SLOTS) & (mode == _mode(PLACE))


@triton.jit
def plan_start(plan_ptr, state_ptr, PLACE: tl.constexpr):
    """(sm, t0): this program's %smid (int64) and its %globaltimer start (both 0 in direct mode: nothing is
    read). A plan without PLAN_MAGIC_VALUE, or built for another mode, sets state[STATE_ERROR] and returns
    sm = -1; then plan_next hands this program nothing."""
    if (_mode(PLACE) == PLACE_DIRECT) and not _recording(PLACE):
        sm = tl.zeros((), tl.int64)
        t0 = tl.zeros((), tl.int64)
    elif _mode(PLACE) == PLACE_DIRECT:  # recorded: the record needs the SM and the start, nothing else
        sm = sm_id()
        t0 = global_ns()
    else:
        sm = sm_id()
        t0 = global_ns()
        if not _plan_ok(plan_ptr, PLACE):
            tl.atomic_xchg(state_ptr + STATE_ERROR, tl.full((), 1, tl.int64), sem="relaxed")
            sm = tl.full((), -1, tl.int64)  # tells plan_next and plan_finish, without reading the plan again
    return sm, t0


@triton.jit
def _claim_share(plan_ptr, state_ptr, slot, n_slots):
    """Item at the next index of `slot`'s share, or -1 if the share is exhausted."""
    item = tl.full((), -1, tl.int32)
    lo = tl.load(plan_ptr + PLAN_HEADER + slot)
    hi = tl.load(plan_ptr + PLAN_HEADER + slot + 1)
    # relaxed: the claimed index orders nothing else (the plan is read-only during the launch)
    i = tl.atomic_add(state_ptr + STATE_CURSORS + slot, tl.full((), 1, tl.int64), sem="relaxed")
    if i < hi - lo:
        item = tl.load(plan_ptr + PLAN_HEADER + n_slots + 1 + lo + i)
    if i == tl.maximum(hi - lo - 1, 0):  # exactly one claim per share counts it drained: the one taking its last item
        tl.atomic_add(state_ptr + STATE_TAIL, tl.full((), ONE_DRAINED, tl.int64), sem="relaxed")
    return item


@triton.jit
def _claims(plan_ptr):
    """Whether the plan has items to claim (in shares or the tail) beyond those taken by program id."""
    return tl.load(plan_ptr + PLAN_N_STATIC) + tl.load(plan_ptr + PLAN_N_TAIL) > 0


@triton.jit
def _next_share(plan_ptr, state_ptr, sm, phase):
    """Shares mode: items by program id, this SM's share, the dynamic tail, then stealing. (item, phase).

    Exactly once: an item k below PLAN_N_FIRST goes to program k % grid at its (k // grid)-th call and to no
    claim; each index of a share or of the tail is the result of exactly one atomic_add on its cursor; a
    program stops only once everything it could still claim is exhausted (cursors only grow during a launch,
    so "all exhausted" is final; so is the count of drained shares, which lets it skip the scan). A plan with
    nothing to claim (as many programs as items) touches no state but the statistics."""
    item = tl.full((), -1, tl.int32)
    n_slots = tl.load(plan_ptr + PLAN_N_SLOTS)
    if (phase & PHASE_KIND_MASK) == PHASE_FIRST:
        # Items below PLAN_N_FIRST, program p taking p, p + grid, ... without an atomic, as persistent schedulers
        # take their first tile by block index (FlashAttention-3's, CUTLASS's): with one per program, the claims
        # at launch, when every program asks at once, are gone. A plan with nothing to claim ends here, so a
        # launch with as many programs as items touches no cursor at all.
        k = tl.program_id(0).to(tl.int64) + (phase >> PHASE_COUNT_SHIFT) * tl.num_programs(0)
        if k < tl.load(plan_ptr + PLAN_N_FIRST):
            item = k.to(tl.int32)
            phase = phase + PHASE_ONE_TAKEN
        elif _claims(plan_ptr):
            phase = tl.full((), PHASE_SHARE, tl.int64)
        else:
            phase = tl.full((), PHASE_DONE, tl.int64)
    if phase == PHASE_STEAL:  # back after a stolen item: is any share left? (the count, read by an atomic)
        if (tl.atomic_add(state_ptr + STATE_TAIL, tl.zeros((), tl.int64), sem="relaxed") >> STATE_DRAINED_SHIFT) \
                >= n_slots:
            phase = tl.full((), PHASE_DONE, tl.int64)
    if phase == PHASE_SHARE:
        if sm < n_slots:  # an SM the plan does not know has no share
            item = _claim_share(plan_ptr, state_ptr, sm, n_slots)
        if item < 0:
            phase = tl.full((), PHASE_TAIL, tl.int64)
    if phase == PHASE_TAIL:
        n_static = tl.load(plan_ptr + PLAN_N_STATIC)
        claimed = tl.atomic_add(state_ptr + STATE_TAIL, tl.full((), 1, tl.int64), sem="relaxed")
        t = claimed & TAIL_MASK
        if t < tl.load(plan_ptr + PLAN_N_TAIL):
            item = tl.load(plan_ptr + PLAN_HEADER + n_slots + 1 + n_static + t)
        elif (claimed >> STATE_DRAINED_SHIFT) >= n_slots:  # every share drained: no victim, no scan
            phase = tl.full((), PHASE_DONE, tl.int64)
        else:
            phase = tl.full((), PHASE_STEAL, tl.int64)
    if phase == PHASE_STEAL:
        # One MAX_SLOTS-wide vector over the program's threads (no thread holds a replica: the decision must
        # be the same in every warp), kept narrow so that a kernel's register count does not grow for a scan
        # it rarely runs: int32 share sizes and cursors (both below 2**31; a cursor is read as the low word of
        # its int64), and one int32 max over a key that packs the items left with the slot (ties: lowest slot,
        # as tl.argmax). int64 vectors and a max + argmax cost a gather kernel registers and residency.
        # A program gets here only while some share may have items (the drained count in the tail word, above):
        # thousands of programs scanning every cursor as they ended kept those lines' L2 slices busy enough to
        # slow the programs still working. The count is read by atomics, whose result every thread gets from
        # thread 0: a scalar load runs on every thread, and threads that read it at different times could
        # disagree on whether to scan, while the scan's reduction needs every warp. (A volatile load there once
        # led a one-item launch to an illegal address; an atomic did not.)
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
                phase = tl.full((), PHASE_DONE, tl.int64)
    return item, phase


@triton.jit
def _queue_order(home, j, n_queues, group_queues):
    """The j-th queue a program whose home queue is `home` tries: its own group's queues from home on, then
    the other groups' (each from the same position)."""
    width = tl.maximum(group_queues, 1)
    k = (home % width + j) % width
    return ((home // width + j // width) % tl.maximum(n_queues // width, 1)) * width + k


@triton.jit
def _next_queued(plan_ptr, state_ptr, sm, phase):
    """Queues mode: the next item of this program's claimed range, else a new claim. (item, phase).

    Each partition's items are split over several queues, so that thousands of programs starting at once do not
    all hit one counter. A program keeps claiming until every queue is empty, so any grid does every item once;
    with one chunk per program most programs make exactly one claim. The launcher zeroes the queue cursors
    before every launch (a memset that CUDA graphs capture with the kernel)."""
    item = tl.full((), -1, tl.int32)
    n_slots = tl.load(plan_ptr + PLAN_N_SLOTS)
    n_queues = tl.load(plan_ptr + PLAN_N_QUEUES)
    offsets = plan_ptr + PLAN_HEADER + n_slots  # queue q holds items[offsets[q]:offsets[q + 1]]
    items = offsets + n_queues + 1
    left = (phase >> Q_LEFT_SHIFT) & Q_MASK_LEFT
    queue = (phase >> Q_QUEUE_SHIFT) - 1  # -1: nothing claimed yet
    if left > 0:  # the claimed range still has items: one load of the item id, no atomic
        index = phase & Q_MASK_INDEX
        item = tl.load(items + tl.load(offsets + queue) + index)
        phase = ((queue + 1) << Q_QUEUE_SHIFT) | ((left - 1) << Q_LEFT_SHIFT) | (index + 1)
    else:
        group_queues = tl.load(plan_ptr + PLAN_GROUP_QUEUES)
        chunk = tl.load(plan_ptr + PLAN_CHUNK).to(tl.int64)
        home = tl.zeros((), tl.int64)
        if sm < n_slots:  # an SM the plan does not know starts at queue 0
            home = tl.load(plan_ptr + PLAN_HEADER + sm).to(tl.int64)
        if queue < 0:  # the first claim: the home queue has items for almost every program
            queue = home
        # (a later claim tries the queue of the previous one first: while it has items, no scan is needed)
        lanes = tl.arange(0, MAX_QUEUES)
        in_plan = lanes < n_queues
        while (item < 0) & (phase >= 0):
            if queue < 0:
                # Every queue's cursor in one vector (volatile: they move under other programs' atomics), in
                # this program's order; the first position with items left wins.
                order = _queue_order(home, lanes, n_queues, group_queues)
                sizes = tl.load(offsets + order + 1, mask=in_plan, other=0) \
                    - tl.load(offsets + order, mask=in_plan, other=0)
                cursors = tl.load(state_ptr + STATE_CURSORS + order, mask=in_plan, other=0, volatile=True)
                first = tl.min(tl.where(in_plan & (cursors < sizes), lanes, MAX_QUEUES), axis=0)
                if first < MAX_QUEUES:
                    queue = _queue_order(home, first, n_queues, group_queues).to(tl.int64)
                else:
                    phase = tl.full((), -1, tl.int64)  # every queue is empty: done
            if queue >= 0:
                start = tl.load(offsets + queue)
                size = (tl.load(offsets + queue + 1) - start).to(tl.int64)
                # relaxed: the claimed range orders nothing else (the plan is read-only during the launch)
                got = tl.atomic_add(state_ptr + STATE_CURSORS + queue, chunk, sem="relaxed")
                if got < size:
                    n_got = tl.minimum(chunk, size - got)
                    item = tl.load(items + start + got)
                    phase = ((queue + 1) << Q_QUEUE_SHIFT) | ((n_got - 1) << Q_LEFT_SHIFT) | (got + 1)
                else:
                    queue = tl.full((), -1, tl.int64)
    return item, phase


@triton.jit
def plan_next(plan_ptr, state_ptr, sm, phase, PLACE: tl.constexpr):
    """(item, phase): the next item id for this program (int32, as tl.program_id: cast to int64 before index
    arithmetic that can pass 2**31), or -1 when none is left. Start with phase 0 and pass back the phase it
    returns (an opaque int64).

        sm, t0 = plan_start(plan_ptr, state_ptr, PLACE)
        item, phase = plan_next(plan_ptr, state_ptr, sm, 0, PLACE)
        while item >= 0:
            ...work on item...; n_done += 1
            item, phase = plan_next(plan_ptr, state_ptr, sm, phase, PLACE)
        plan_finish(plan_ptr, state_ptr, sm, t0, n_done, PLACE)
    """
    phase = tl.zeros((), tl.int64) + phase  # the first call passes a literal 0
    if _mode(PLACE) == PLACE_DIRECT:
        # program p takes item p on the first call: the grid is exactly one program per item. An int32 item in
        # every mode (Triton 3.6 wants the branches to agree): an int64 one slowed a short gather measurably.
        item = tl.where(phase == 0, tl.program_id(0), -1)
        phase = tl.full((), PHASE_DONE, tl.int64)
    elif sm < 0:  # plan_start found a bad plan: nothing for this program
        item = tl.full((), -1, tl.int32)
    elif _mode(PLACE) == PLACE_QUEUES:
        item, phase = _next_queued(plan_ptr, state_ptr, sm, phase)
    else:
        item, phase = _next_share(plan_ptr, state_ptr, sm, phase)
    return item, phase


@triton.jit
def _record(plan_ptr, sm, t0, n_done):
    # the recorder's address, rebuilt from its two int32 header words (the low one read as unsigned)
    low = tl.load(plan_ptr + PLAN_REC_LO).to(tl.int64) & 0xFFFFFFFF
    address = (tl.load(plan_ptr + PLAN_REC_HI).to(tl.int64) << 32) | low
    record_cta(recorder_at(address), tl.load(plan_ptr + PLAN_REC_TAG), sm, t0, n_done, -1, True)


@triton.jit
def _count_out(plan_ptr, state_ptr, n_slots):
    """Count this program out of the launch; the last one resets the cursors, the tail and the count.

    Why the last program out may reset the state without racing anyone: every program makes all its claims
    (the last one being the failed claim that returned -1) before this increment, and acq_rel orders them
    before it (release) and this program's resets after it (acquire). The program that sees grid - 1 is
    therefore the last to touch the cursors in this launch, and the next launch starts after this one ends in
    stream order. (Counting in shards first, so that thousands of programs ending together do not all count on
    one address, was no faster.)"""
    finished = tl.atomic_add(state_ptr + STATE_FINISHED, tl.full((), 1, tl.int64), sem="acq_rel")
    if finished == tl.num_programs(0) - 1:
        slots = tl.arange(0, MAX_SLOTS)
        tl.store(state_ptr + STATE_CURSORS + slots, tl.zeros((MAX_SLOTS,), tl.int64), mask=slots < n_slots)
        tl.store(state_ptr + STATE_TAIL, tl.full((), 0, tl.int64))
        tl.store(state_ptr + STATE_FINISHED, tl.full((), 0, tl.int64))


@triton.jit
def plan_finish(plan_ptr, state_ptr, sm, t0, n_done, PLACE: tl.constexpr):
    """Shares mode: add this program's items, busy ns and 1 CTA to its SM's statistics; the last program out
    resets the cursors. Nothing in the other modes. With the PLACE_RECORD bit (profiling on), in every mode,
    this program's record (recorder.py) goes to the recorder buffer whose address and tag the plan's header
    holds (PLAN_REC_*); without the bit none of that is compiled in."""
    if _recording(PLACE):
        if sm >= 0:  # a bad plan (sm -1) holds no recorder address to trust
            _record(plan_ptr, sm, t0, n_done)
    if _mode(PLACE) == PLACE_SHARES:
        ok = sm >= 0  # a bad plan (sm -1): no claim was made, nothing to count or reset
        n_slots = tl.load(plan_ptr + PLAN_N_SLOTS)
        if ok & (sm < n_slots):
            stats = state_ptr + STATE_CURSORS + n_slots + sm  # statistic k of SM sm: stats + k * n_slots
            tl.atomic_add(stats + STAT_ITEMS * n_slots, tl.zeros((), tl.int64) + n_done, sem="relaxed")
            tl.atomic_add(stats + STAT_BUSY_NS * n_slots, global_ns() - t0, sem="relaxed")
            tl.atomic_add(stats + STAT_CTAS * n_slots, tl.full((), 1, tl.int64), sem="relaxed")
        if ok:
            if _claims(plan_ptr):  # else no program touched a cursor (_next_share): no count, no reset
                _count_out(plan_ptr, state_ptr, n_slots)
