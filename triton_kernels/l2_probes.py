"""Triton backend of the per-SM L2 probes: the chain probe and the line probe.

Semantics match cuda_ext/l2_probes.cu line for line; torch_l2topo/probes.py launches either.

Each program is one warp doing scalar work (launch with num_warps=1: inline asm repeats per replicated
element). A program reads %smid and claims its SM in the control block; losers exit at once, so exactly
one program measures per SM. The control block layout and error codes live in torch_l2topo/probe_layout.py
(mirrored in cuda_ext/probe_layout.h; a test checks that they agree).

Every wait is bounded by a %globaltimer watchdog that resets whenever the awaited counter moves: when no
progress is seen for `timeout_ns`, the waiter sets an error code and exits, and every other waiter exits as
soon as it sees the error. A probe never hangs the GPU.
"""
import triton
import triton.language as tl

from torch_l2topo import probe_layout as _layout

# Triton kernels may only read module globals that are constexpr.
ERROR = tl.constexpr(_layout.ERROR)
ERROR_DETAIL = tl.constexpr(_layout.ERROR_DETAIL)
ARRIVALS = tl.constexpr(_layout.ARRIVALS)
TURN = tl.constexpr(_layout.TURN)
CLAIMS = tl.constexpr(_layout.CLAIMS)
ERR_SMID_RANGE = tl.constexpr(_layout.ERR_SMID_RANGE)
ERR_BARRIER_TIMEOUT = tl.constexpr(_layout.ERR_BARRIER_TIMEOUT)
ERR_TURN_TIMEOUT = tl.constexpr(_layout.ERR_TURN_TIMEOUT)
OUT_WORDS = tl.constexpr(_layout.OUT_WORDS)
POLL_BACKOFF_NS = tl.constexpr(_layout.POLL_BACKOFF_NS)


@triton.jit
def _clock64(dep):
    # Read clock64 only once `dep` has arrived: the read is predicated on a compare of `dep`, so it cannot
    # issue before the load that produced it completes (an unused input alone does not stop ptxas from
    # scheduling the read early). dep is an address or a count, never -1. Same asm as cuda_ext.
    return tl.inline_asm_elementwise(
        "{ .reg .pred ready; setp.ne.s64 ready, $1, -1; @ready mov.u64 $0, %clock64; @!ready mov.u64 $0, 0; }",
        "=l,l", [dep], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _chase(addr):
    # One dependent L2 load: ld.global.cg skips L1, and the next address is the loaded value. Written as
    # asm rather than tl.load so that the emitted instruction is exactly the CUDA backend's.
    return tl.inline_asm_elementwise("ld.global.cg.u64 $0, [$1];", "=l,l", [addr], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def _nanosleep(ns):
    tl.inline_asm_elementwise("nanosleep.u32 $1; mov.u32 $0, 0;", "=r,r", [ns], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _i64(x):
    # The control block is int64; atomics need operands of exactly that type.
    return tl.full((), x, tl.int64)


@triton.jit
def _fail(ctrl_ptr, code, detail):
    # First error wins; its detail is written by the same winner only.
    if tl.atomic_cas(ctrl_ptr + ERROR, _i64(0), _i64(code)) == 0:
        tl.atomic_xchg(ctrl_ptr + ERROR_DETAIL, detail.to(tl.int64))


@triton.jit
def _wait_until_at_least(ctrl_ptr, word, target, timeout_ns, code):
    """Spin until ctrl[word] >= target. Returns 1 on success, 0 on timeout or another program's error."""
    last = tl.load(ctrl_ptr + word, volatile=True)
    since = tl.extra.cuda.globaltimer()
    state = 0  # 0 waiting, 1 reached, 2 gave up
    while state == 0:
        seen = tl.load(ctrl_ptr + word, volatile=True)
        now = tl.extra.cuda.globaltimer()
        if seen >= target:
            state = 1
        elif tl.load(ctrl_ptr + ERROR, volatile=True) != 0:
            state = 2
        elif seen != last:
            last = seen
            since = now
        elif now - since > timeout_ns:
            _fail(ctrl_ptr, code, seen)
            state = 2
        if state == 0:
            _nanosleep(tl.full((), POLL_BACKOFF_NS, tl.int32))
    return state == 1


@triton.jit
def _own_sm(ctrl_ptr, capacity, n_sm, wave, timeout_ns):
    """Claim this program's SM; wait until every SM is claimed, then for this SM's wave.

    SMs measure in waves of `wave` consecutive SM ids; wave k starts once the TURN counter shows every SM
    of the waves before it done (wave=1: serialized; wave=n_sm: all at once). Returns (sm, go): go is
    true for exactly one program per SM once it may measure.
    """
    sm = tl.extra.cuda.smid().to(tl.int64)
    go = False
    if sm >= capacity:
        _fail(ctrl_ptr, ERR_SMID_RANGE, sm)
    elif tl.atomic_cas(ctrl_ptr + CLAIMS + sm, _i64(0), _i64(1)) == 0:
        tl.atomic_add(ctrl_ptr + ARRIVALS, 1)
        go = _wait_until_at_least(ctrl_ptr, ARRIVALS, n_sm, timeout_ns, ERR_BARRIER_TIMEOUT)
        if go:
            go = _wait_until_at_least(ctrl_ptr, TURN, (sm // wave) * wave, timeout_ns, ERR_TURN_TIMEOUT)
    return sm, go


@triton.jit
def _done(ctrl_ptr):
    # Release: this SM's results are visible before the next wave starts measuring.
    tl.atomic_add(ctrl_ptr + TURN, 1, sem="release")


@triton.jit
def chain_probe_kernel(ctrl_ptr, starts_ptr, out_ptr, n_loads, capacity, n_sm, wave, timeout_ns):
    """Per SM: one warm pass over its ring, then a timed pass.

    starts[sm] is the address of the word where SM `sm` starts: the line buffer holds LINE_WORDS
    independent rings, one per 8-byte word, so SMs of one wave chase different random orders.

    out[sm] = (clock64 cycles, globaltimer ns, final address) of the timed pass; after a whole pass the
    chase is back at its start address, which the host checks.
    """
    sm, go = _own_sm(ctrl_ptr, capacity, n_sm, wave, timeout_ns)
    if go:
        p = tl.load(starts_ptr + sm)
        for _ in range(n_loads):
            p = _chase(p)
        t0 = _clock64(p)
        g0 = tl.extra.cuda.globaltimer()
        for _ in range(n_loads):
            p = _chase(p)
        end = p
        t1 = _clock64(end)
        g1 = tl.extra.cuda.globaltimer()
        tl.store(out_ptr + sm * OUT_WORDS + 0, t1 - t0)
        tl.store(out_ptr + sm * OUT_WORDS + 1, g1 - g0)
        tl.store(out_ptr + sm * OUT_WORDS + 2, end)
        _done(ctrl_ptr)


@triton.jit
def line_probe_kernel(ctrl_ptr, lines_ptr, cycles_ptr, per_sm_ptr, n_lines, n_warm, n_timed,
                      capacity, n_sm, wave, timeout_ns, LINE_WORDS: tl.constexpr):
    """Per SM and line: n_warm loads, then n_timed dependent loads timed with clock64.

    Each line holds its own address, so the chase stays on one line. SMs start at different lines
    (rotation by position in the wave) so that SMs of one wave never load the same line at once.
    cycles[sm, line] = clock64 cycles of the timed run; per_sm[sm] = (cycles, ns, lines whose chase left
    the line) over the whole SM's run.
    """
    sm, go = _own_sm(ctrl_ptr, capacity, n_sm, wave, timeout_ns)
    if go:
        rot = ((sm % wave) * n_lines) // wave
        g_start = tl.extra.cuda.globaltimer()
        c_start = _clock64(g_start)
        broken = 0
        for j in range(n_lines):
            k = (j + rot) % n_lines
            home = lines_ptr.to(tl.int64, bitcast=True) + k * (LINE_WORDS * 8)
            p = home
            for _ in range(n_warm):
                p = _chase(p)
            t0 = _clock64(p)
            for _ in range(n_timed):
                p = _chase(p)
            t1 = _clock64(p)
            tl.store(cycles_ptr + sm * n_lines + k, t1 - t0)
            broken += (p != home).to(tl.int32)
        c_end = _clock64(broken.to(tl.int64))
        g_end = tl.extra.cuda.globaltimer()
        tl.store(per_sm_ptr + sm * OUT_WORDS + 0, c_end - c_start)
        tl.store(per_sm_ptr + sm * OUT_WORDS + 1, g_end - g_start)
        tl.store(per_sm_ptr + sm * OUT_WORDS + 2, broken.to(tl.int64))
        _done(ctrl_ptr)
