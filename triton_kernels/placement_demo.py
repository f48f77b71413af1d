"""A checksum kernel written against the placement helpers: the proof that every item is processed once.

Item i adds item_value(i) into out[i % n_out] and 1 into count[i]; after a launch over n items, count is all
ones and out equals checksum_reference(n, n_out) exactly (integer adds commute). The GPU tests run it with
every policy, under CUDA graphs and next to a kernel that occupies half the SMs; the compile test reads its
PTX. cuda_ext/placement_demo.cu is the same kernel in CUDA.
"""
import triton
import triton.language as tl

from torch_l2topo.triton_kernels.placement import plan_finish, plan_next, plan_start

# item_value(i) = 1 + (i * VALUE_MUL) % VALUE_MOD: distinct enough across neighbours that an item done twice
# or skipped changes its slot's sum, small enough that 2^31 items cannot overflow an int64 slot.
VALUE_MUL = tl.constexpr(40503)
VALUE_MOD = tl.constexpr(65536)


@triton.jit
def checksum_kernel(out_ptr, count_ptr, n_out, plan_ptr, state_ptr, PLACE: tl.constexpr):
    sm, t0 = plan_start(plan_ptr, state_ptr, PLACE)
    item, phase = plan_next(plan_ptr, state_ptr, sm, 0, PLACE)
    n_done = 0
    while item >= 0:
        tl.atomic_add(out_ptr + item % n_out, 1 + (item.to(tl.int64) * VALUE_MUL) % VALUE_MOD, sem="relaxed")
        tl.atomic_add(count_ptr + item, 1, sem="relaxed")
        n_done += 1
        item, phase = plan_next(plan_ptr, state_ptr, sm, phase, PLACE)
    plan_finish(plan_ptr, state_ptr, sm, t0, n_done, PLACE)


def checksum_reference(n_items: int, n_out: int):
    """What out holds after one launch over n_items items (numpy int64)."""
    import numpy as np

    items = np.arange(n_items, dtype=np.int64)
    return np.bincount(items % n_out, weights=1 + (items * VALUE_MUL.value) % VALUE_MOD.value,
                       minlength=n_out).astype(np.int64)
