"""Triton backend of the per-SM L2 probes: the chain probe and the line probe.

Semantics match cuda_ext/l2_probes.cu line for line; torch_l2topo/measure/probes.py launches either (through
torch_l2topo/measure/launch.py). Built on the public device-side protocol (protocol.py): each program is one warp
doing scalar work (launch with num_warps=1); it claims its SM, and exactly one program measures per SM.
"""
import triton
import triton.language as tl

from torch_l2topo import layout as _layout
from torch_l2topo.triton_kernels.protocol import chase, claim_sm, clock_after, finish_turn, global_ns

OUT_WORDS = tl.constexpr(_layout.OUT_WORDS)
LINE_WORDS = tl.constexpr(_layout.LINE_WORDS)


@triton.jit
def chain_probe_kernel(ctrl_ptr, starts_ptr, out_ptr, n_loads, n_warm_first, n_first, n_warm, n_sm, wave,
                       timeout_ns):
    """Per SM: warm loads, then a timed pass over its whole ring.

    starts[sm] is the address of the word where SM `sm` starts: the line buffer holds LINE_WORDS
    independent rings, one per 8-byte word, so SMs of one wave chase different random orders. SMs 0 to
    n_first - 1 make n_warm_first warm loads (whole passes over every ring bring every word of the buffer
    into L2: a load fetches one 32-byte sector, so one ring alone leaves the others' sectors in DRAM); the
    others only n_warm, to settle their chase.

    out[sm] = (clock64 cycles, globaltimer ns, final address, globaltimer at the start) of the timed pass;
    after a whole pass the chase is back where the timed pass started, which the host checks.
    """
    sm, go = claim_sm(ctrl_ptr, n_sm, wave, timeout_ns)
    if go:
        p = tl.load(starts_ptr + sm)
        warm = n_warm
        if sm < n_first:
            warm = n_warm_first
        for _ in range(warm):
            p = chase(p)
        begin = p
        t0 = clock_after(p)
        g0 = global_ns()
        for _ in range(n_loads):
            p = chase(p)
        t1 = clock_after(p)
        g1 = global_ns()
        tl.store(out_ptr + sm * OUT_WORDS + 0, t1 - t0)
        tl.store(out_ptr + sm * OUT_WORDS + 1, g1 - g0)
        tl.store(out_ptr + sm * OUT_WORDS + 2, p - begin)
        tl.store(out_ptr + sm * OUT_WORDS + 3, g0)
        finish_turn(ctrl_ptr)


@triton.jit
def line_probe_kernel(ctrl_ptr, lines_ptr, cycles_ptr, per_sm_ptr, n_lines, n_warm, n_timed, n_sm, wave,
                      timeout_ns):
    """Per SM and line: n_warm loads, then n_timed dependent loads timed with clock64.

    Each line holds its own address, so the chase stays on one line. SMs start at different lines
    (rotation by position in the wave) so that SMs of one wave never load the same line at once.
    cycles[sm, line] = clock64 cycles of the timed run; per_sm[sm] = (cycles, ns, lines whose chase left
    the line, globaltimer at the start) over the whole SM's run.
    """
    sm, go = claim_sm(ctrl_ptr, n_sm, wave, timeout_ns)
    if go:
        rot = ((sm % wave) * n_lines) // wave
        g_start = global_ns()
        c_start = clock_after(g_start)
        broken = 0
        for j in range(n_lines):
            k = (j + rot) % n_lines
            home = lines_ptr.to(tl.int64, bitcast=True) + k * (LINE_WORDS * 8)
            p = home
            for _ in range(n_warm):
                p = chase(p)
            t0 = clock_after(p)
            for _ in range(n_timed):
                p = chase(p)
            t1 = clock_after(p)
            tl.store(cycles_ptr + sm * n_lines + k, t1 - t0)
            broken += (p != home).to(tl.int32)
        c_end = clock_after(broken.to(tl.int64))
        g_end = global_ns()
        tl.store(per_sm_ptr + sm * OUT_WORDS + 0, c_end - c_start)
        tl.store(per_sm_ptr + sm * OUT_WORDS + 1, g_end - g_start)
        tl.store(per_sm_ptr + sm * OUT_WORDS + 2, broken.to(tl.int64))
        tl.store(per_sm_ptr + sm * OUT_WORDS + 3, g_start)
        finish_turn(ctrl_ptr)
