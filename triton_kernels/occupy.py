"""A kernel that fills chosen SMs for a bounded time, so that nothing else can run on them.

Used to test the probes' watchdogs (a probe must fail fast, never hang, when SMs are taken) and to measure
work confined to the remaining SMs. One wave of 2-warp CTAs fills every SM's 32 block slots and 64 warp
slots (sm_80 and sm_90 limits); each CTA reads %smid, and those not on a chosen SM exit at once. The rest
spin until a %globaltimer deadline: the kernel always ends by itself.
"""
import triton
import triton.language as tl

from torch_l2topo.triton_kernels.protocol import global_ns, sm_id

BLOCKS_PER_SM = 32   # max resident CTAs per SM on cc 8.0 and 9.0
WARPS_PER_CTA = 2    # 32 CTAs x 2 warps = 64 warps, the per-SM warp limit on cc 8.0 and 9.0


@triton.jit
def occupy_kernel(chosen_ptr, held_ptr, duration_ns):
    """chosen[sm] != 0: stay on that SM for duration_ns. held[sm] counts the CTAs that stayed."""
    sm = sm_id()
    if tl.load(chosen_ptr + sm) != 0:
        tl.atomic_add(held_ptr + sm, 1)
        start = global_ns()
        now = start
        while now - start < duration_ns:
            now = global_ns()


def occupy_sms(device, sm_ids, seconds: float, stream=None):
    """Launch occupy_kernel on `stream` (default: a new one) holding `sm_ids` for `seconds`.

    Returns (stream, held): held[sm] is the number of CTAs that stayed on each SM (valid once the stream
    is synchronized); a fully held SM shows BLOCKS_PER_SM.
    """
    import torch

    n_sm = torch.cuda.get_device_properties(device).multi_processor_count
    stream = stream or torch.cuda.Stream(device=device)
    with torch.cuda.stream(stream):  # allocate on the stream that uses the buffers: stream-ordered frees
        chosen = torch.zeros(n_sm, dtype=torch.int32, device=device)
        chosen[list(sm_ids)] = 1
        held = torch.zeros(n_sm, dtype=torch.int32, device=device)
        occupy_kernel[(BLOCKS_PER_SM * n_sm,)](chosen, held, int(seconds * 1e9), num_warps=WARPS_PER_CTA)
    return stream, held
