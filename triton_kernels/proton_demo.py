"""A kernel instrumented with Proton's scopes, not with this package's recorder: what the profiler's Proton
merge reads (its GPU test and the recorded fixture). Each program copies one block of a float32 vector
inside the scope "copy"; y equals x. Under `proton.start(..., backend="instrumentation", data="trace")`
Proton records each warp's entry and exit of the scope and each CTA's SM; without a Proton session the
scope markers compile to nothing. Host side: torch_l2topo.profiler.demo.scoped_copy.
"""
import triton
import triton.language as tl
import triton.profiler.language as pl

pl.enable_semantic("triton")  # the scope markers below are Proton's Triton-level ops


@triton.jit
def scoped_copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pl.enter_scope("copy")
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)
    pl.exit_scope("copy")
