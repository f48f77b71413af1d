"""The device-side protocol in Triton: timers, dependent loads, and the claim / barrier / turn protocol.

Public API for any Triton kernel of torch_l2topo or of its users, each function documented where it is defined
(cuda_ext/protocol.cuh mirrors every one under the same name; tests/test_kernel_sources.py checks the lists):
timers sm_id, global_ns, clock_after; dependent loads chase, chase_l1, address_after; the protocol nanosleep,
fail, wait_at_least, claim_sm, finish_turn over a control block (layout.py).

Every function does scalar work: launch kernels that use them with num_warps=1 (inline asm repeats per
replicated element, and one warp keeps one dependent chain per SM). Every wait is bounded: the watchdog
restarts whenever the awaited word moves, and when nothing moves for `timeout_ns` the waiter records an error
and gives up; every other waiter gives up as soon as it sees the error. A kernel built on this protocol never
hangs the GPU, whatever else runs on it. Imports only torch_l2topo.layout (layout.py says why).
Docs: docs/method.md ("Making every SM measure, once").
"""
import triton
import triton.language as tl

from torch_l2topo import layout as _layout

# Triton kernels may only read module globals that are constexpr.
ERROR = tl.constexpr(_layout.ERROR)
ERROR_DETAIL = tl.constexpr(_layout.ERROR_DETAIL)
ARRIVALS = tl.constexpr(_layout.ARRIVALS)
TURN = tl.constexpr(_layout.TURN)
CLAIMS = tl.constexpr(_layout.CLAIMS)
ERR_SMID_RANGE = tl.constexpr(_layout.ERR_SMID_RANGE)
ERR_BARRIER_TIMEOUT = tl.constexpr(_layout.ERR_BARRIER_TIMEOUT)
ERR_TURN_TIMEOUT = tl.constexpr(_layout.ERR_TURN_TIMEOUT)
POLL_BACKOFF_NS = tl.constexpr(_layout.POLL_BACKOFF_NS)


@triton.jit
def sm_id():
    """%smid of the SM running this program (int64)."""
    return tl.extra.cuda.smid().to(tl.int64)


@triton.jit
def global_ns():
    """%globaltimer: ns, device-wide (32 ns steps on Hopper)."""
    return tl.extra.cuda.globaltimer().to(tl.int64)


@triton.jit
def clock_after(dep):
    """%clock64, read only once `dep` (an address or a count, never -1) has arrived."""
    # The read is predicated on a compare of `dep`, so it cannot issue before the load that produced `dep`
    # completes: an unused input alone does not stop ptxas from scheduling the read early, and then one
    # load latency is missing from the interval or added to it. dep is an address or a count, never -1.
    return tl.inline_asm_elementwise(
        "{ .reg .pred ready; setp.ne.s64 ready, $1, -1; @ready mov.u64 $0, %clock64; @!ready mov.u64 $0, 0; }",
        "=l,l", [dep], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def chase(addr):
    """One dependent load through L2 (ld.global.cg: skips L1); returns the loaded word."""
    # Written as asm rather than tl.load so that the emitted instruction is exactly the CUDA backend's.
    return tl.inline_asm_elementwise("ld.global.cg.u64 $0, [$1];", "=l,l", [addr], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def chase_l1(addr):
    """The same load allowed to hit in L1 (ld.global.ca): the L1-hit oracle."""
    return tl.inline_asm_elementwise("ld.global.ca.u64 $0, [$1];", "=l,l", [addr], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def address_after(addr, value, zero):
    """addr itself, but only once `value` has arrived: chains loads of data that are not pointers (zero: a
    runtime 0 the host passes)."""
    # addr + (value AND zero). `zero` is a runtime argument (0), and the AND is asm, so neither Triton nor
    # ptxas can fold it: the address depends on `value`, and a load from it waits for the load that made
    # `value`. Pure: it only orders, it reads nothing.
    return tl.inline_asm_elementwise("{ .reg .b64 m; and.b64 m, $2, $3; add.s64 $0, $1, m; }", "=l,l,l,l",
                                     [addr, value, zero], dtype=tl.int64, is_pure=True, pack=1)


@triton.jit
def nanosleep(ns):
    """Back off between polls."""
    tl.inline_asm_elementwise("nanosleep.u32 $1; mov.u32 $0, 0;", "=r,r", [ns], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _i64(x):
    # Control-block atomics need operands of exactly int64.
    return tl.full((), x, tl.int64)


@triton.jit
def fail(ctrl_ptr, code, detail):
    """Record the first error (code, detail) in the control block."""
    # First error wins; its detail is written by the same winner only.
    if tl.atomic_cas(ctrl_ptr + ERROR, _i64(0), _i64(code)) == 0:
        tl.atomic_xchg(ctrl_ptr + ERROR_DETAIL, detail.to(tl.int64))


@triton.jit
def wait_at_least(ctrl_ptr, word, target, timeout_ns, code):
    """1 once ctrl[word] >= target; 0 on timeout (recorded with `code`) or on another program's error."""
    last = tl.load(ctrl_ptr + word, volatile=True)
    since = global_ns()
    state = 0  # 0 waiting, 1 reached, 2 gave up
    while state == 0:
        seen = tl.load(ctrl_ptr + word, volatile=True)
        now = global_ns()
        if seen >= target:
            state = 1
        elif tl.load(ctrl_ptr + ERROR, volatile=True) != 0:
            state = 2
        elif seen != last:
            last = seen
            since = now
        elif now - since > timeout_ns:
            fail(ctrl_ptr, code, seen)
            state = 2
        if state == 0:
            nanosleep(tl.full((), POLL_BACKOFF_NS, tl.int32))
    return state == 1


@triton.jit
def claim_sm(ctrl_ptr, n_sm, wave, timeout_ns):
    """Claim this program's SM; wait until every SM is claimed, then for this SM's wave.

    SMs measure in waves of `wave` consecutive SM ids; wave k starts once TURN shows every SM of the earlier
    waves done (wave=1: serialized; wave=n_sm: all at once). Returns (sm, go): go is true for exactly one
    program per SM once it may measure; the others must exit without touching the SM's results.
    """
    sm = sm_id()
    go = False
    if sm >= n_sm:
        fail(ctrl_ptr, ERR_SMID_RANGE, sm)
    elif tl.atomic_cas(ctrl_ptr + CLAIMS + sm, _i64(0), _i64(1)) == 0:
        tl.atomic_add(ctrl_ptr + ARRIVALS, 1)
        go = wait_at_least(ctrl_ptr, ARRIVALS, n_sm, timeout_ns, ERR_BARRIER_TIMEOUT)
        if go:
            go = wait_at_least(ctrl_ptr, TURN, (sm // wave) * wave, timeout_ns, ERR_TURN_TIMEOUT)
    return sm, go


@triton.jit
def finish_turn(ctrl_ptr):
    """This SM is done: release the next wave."""
    # Release: this SM's results are visible before the next wave starts measuring.
    tl.atomic_add(ctrl_ptr + TURN, 1, sem="release")
