"""Per-CTA records from any Triton kernel: which SM ran each program, when, and how much work it did.

Public API (cuda_ext/recorder.cuh mirrors every function under the same name; tests/test_kernel_sources.py
checks that the two lists agree):

    record_start(RECORD) -> (sm, t0)
        %smid of this program (int64) and its %globaltimer start, ns. (0, 0) and no instruction at all when
        RECORD is false.
    record_cta(rec_ptr, tag, sm, t0, n_items, n_near, RECORD)
        append this program's record to the recorder buffer: tag, sm, program id, t0, the %globaltimer now,
        n_items, n_near (items whose data is homed in this SM's L2 partition; pass -1 when not known). One
        relaxed atomic reserves the slot; a full buffer drops the record (the cursor keeps counting, so the
        host knows how many were dropped). Nothing is compiled in when RECORD is false.
    recorder_at(address) -> rec_ptr
        the buffer as a pointer, from its address held as an int64 (for example in a placement plan's header)

RECORD is a tl.constexpr, so a kernel compiled with RECORD false carries none of it: no timer reads, no
atomic, no stores (tests/test_profiler_kernels_compile.py compares its PTX with that of the same kernel
written without the helpers). Usage, in any kernel (the recorder buffer and tag come from
torch_l2topo.placement.recording.CtaRecorder: .buffer and .register(name)):

    @triton.jit
    def my_kernel(x_ptr, n, rec_ptr, tag, RECORD: tl.constexpr):
        sm, t0 = record_start(RECORD)
        ...the program's work...
        record_cta(rec_ptr, tag, sm, t0, 1, -1, RECORD)

Graph-safe: the buffer has a fixed address and nothing here needs the host; the host drains it after the
step. Works for any num_warps: the helpers do scalar work (the atomic runs once per program, as in
placement.py). The buffer layout is torch_l2topo/layout.py's (REC_*).

This module imports only torch_l2topo.layout and the public names of triton_kernels/protocol.py.
"""
import triton
import triton.language as tl

from torch_l2topo import layout as _layout
from torch_l2topo.triton_kernels.protocol import global_ns, sm_id

# Triton kernels may only read module globals that are constexpr.
REC_CURSOR = tl.constexpr(_layout.REC_CURSOR)
REC_CAPACITY = tl.constexpr(_layout.REC_CAPACITY)
REC_HEADER = tl.constexpr(_layout.REC_HEADER)
REC_TAG = tl.constexpr(_layout.REC_TAG)
REC_SM = tl.constexpr(_layout.REC_SM)
REC_PROGRAM = tl.constexpr(_layout.REC_PROGRAM)
REC_START_NS = tl.constexpr(_layout.REC_START_NS)
REC_END_NS = tl.constexpr(_layout.REC_END_NS)
REC_ITEMS = tl.constexpr(_layout.REC_ITEMS)
REC_NEAR = tl.constexpr(_layout.REC_NEAR)
REC_WORDS = tl.constexpr(_layout.REC_WORDS)


@triton.jit
def record_start(RECORD: tl.constexpr):
    if RECORD:
        sm = sm_id()
        t0 = global_ns()
    else:
        sm = tl.zeros((), tl.int64)
        t0 = tl.zeros((), tl.int64)
    return sm, t0


@triton.jit
def _linear_program_id():
    # The CUDA mirror records blockIdx linearized the same way (x fastest).
    x = tl.program_id(0).to(tl.int64)
    y = tl.program_id(1).to(tl.int64)
    z = tl.program_id(2).to(tl.int64)
    return x + tl.num_programs(0).to(tl.int64) * (y + tl.num_programs(1).to(tl.int64) * z)


@triton.jit
def record_cta(rec_ptr, tag, sm, t0, n_items, n_near, RECORD: tl.constexpr):
    if RECORD:
        t1 = global_ns()
        # relaxed: the slot orders nothing else; the host reads the buffer after the kernel has ended
        slot = tl.atomic_add(rec_ptr + REC_CURSOR, tl.full((), 1, tl.int64), sem="relaxed")
        if slot < tl.load(rec_ptr + REC_CAPACITY):
            rec = rec_ptr + REC_HEADER + slot * REC_WORDS
            tl.store(rec + REC_TAG, tl.zeros((), tl.int64) + tag)
            tl.store(rec + REC_SM, sm)
            tl.store(rec + REC_PROGRAM, _linear_program_id())
            tl.store(rec + REC_START_NS, t0)
            tl.store(rec + REC_END_NS, t1)
            tl.store(rec + REC_ITEMS, tl.zeros((), tl.int64) + n_items)
            tl.store(rec + REC_NEAR, tl.zeros((), tl.int64) + n_near)


@triton.jit
def recorder_at(address):
    return (tl.zeros((), tl.int64) + address).to(tl.pointer_type(tl.int64))
