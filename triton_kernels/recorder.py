"""Per-CTA records from any Triton kernel: which SM ran each program, when, and how much work it did.

Public API, each function documented where it is defined (cuda_ext/recorder.cuh mirrors every one under the
same name; tests/test_kernel_sources.py checks the lists): record_start, record_cta, recorder_at. The buffer
(layout.py's REC_*) and tag come from torch_l2topo.measure.recording.CtaRecorder (.buffer, .register(name)).

    @triton.jit
    def my_kernel(x_ptr, n, rec_ptr, tag, RECORD: tl.constexpr):
        sm, t0 = record_start(RECORD)
        ...the program's work...
        record_cta(rec_ptr, tag, sm, t0, 1, -1, RECORD)

RECORD is a tl.constexpr: compiled with it false, a kernel carries no timer read, atomic or store (a PTX test
checks). Graph-safe (a fixed buffer, no host work) and any num_warps (scalar work, one atomic per program).
Imports only torch_l2topo.layout and protocol.py's public names. Docs: docs/profiler.md.
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
    """(sm, t0): %smid of this program (int64) and its %globaltimer start, ns; (0, 0) and no instruction at all
    when RECORD is false."""
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
    """Append this program's record to the recorder buffer: tag, sm, program id, t0, the %globaltimer now,
    n_items, n_near (items whose data is homed in this SM's L2 partition; -1 when not known). One relaxed
    atomic reserves the slot; a full buffer drops the record (the cursor keeps counting, so the host knows how
    many were dropped). Nothing is compiled in when RECORD is false."""
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
    """The buffer as a pointer, from its address held as an int64 (a placement plan's header holds one)."""
    return (tl.zeros((), tl.int64) + address).to(tl.pointer_type(tl.int64))
