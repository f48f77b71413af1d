"""The GPU's %globaltimer read once, to relate the clock the CTA records carry to the host's clock
(torch_l2topo/profiler/runtime/clock.py).

    timer_kernel(out_ptr)    out[0] = %globaltimer, ns (launch one program with num_warps=1)

This module imports only the public names of triton_kernels/protocol.py.
"""
import triton
import triton.language as tl

from torch_l2topo.triton_kernels.protocol import global_ns


@triton.jit
def timer_kernel(out_ptr):
    tl.store(out_ptr, global_ns())
