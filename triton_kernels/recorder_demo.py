"""A kernel written against the recorder helpers alone (no placement): row sums, one record per program.

Program p sums rows p, p + grid, p + 2 grid, ... of a (n_rows, dim) float32 matrix into out[row], then
records its CTA: items = rows it summed, near = those whose class (the L2 partition their data is homed in)
is the partition of the SM it ran on (part_ptr: one partition per SM, -1 undecided). out equals
x.sum(dim=1) whatever RECORD is; with RECORD the recorder holds exactly one record per program. The GPU
tests, the profiler benchmark and the fixture recording use it (profiler/demo.py launches it).

row_sum_plain_kernel is the same kernel written without the recorder, with the same parameters: the
reference that "compiled out" is checked against (its PTX must equal row_sum_kernel's with RECORD false,
tests/test_profiler_compile.py; benchmarks/bench_profiler.py times the two side by side).
"""
import triton
import triton.language as tl

from torch_l2topo.triton_kernels.recorder import record_cta, record_start


@triton.jit
def row_sum_kernel(x_ptr, out_ptr, n_rows, dim, class_ptr, part_ptr, rec_ptr, tag, RECORD: tl.constexpr,
                   BLOCK: tl.constexpr):
    sm, t0 = record_start(RECORD)
    n_done = 0
    n_near = 0
    cols = tl.arange(0, BLOCK)
    for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        v = tl.load(x_ptr + row.to(tl.int64) * dim + cols, mask=cols < dim, other=0.0)
        tl.store(out_ptr + row, tl.sum(v, axis=0))
        n_done += 1
        if RECORD:
            n_near += (tl.load(class_ptr + row) == tl.load(part_ptr + sm)).to(tl.int32)
    record_cta(rec_ptr, tag, sm, t0, n_done, n_near, RECORD)


@triton.jit
def row_sum_plain_kernel(x_ptr, out_ptr, n_rows, dim, class_ptr, part_ptr, rec_ptr, tag, RECORD: tl.constexpr,
                         BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        v = tl.load(x_ptr + row.to(tl.int64) * dim + cols, mask=cols < dim, other=0.0)
        tl.store(out_ptr + row, tl.sum(v, axis=0))
