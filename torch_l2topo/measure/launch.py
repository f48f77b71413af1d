"""One launch path for the package's kernels, over both backends (Triton and the CUDA extension).

A kernel is named once in KERNELS with its Triton function and its CUDA op; both take the same arguments
in the same order, and the grid (number of CTAs) comes separately. launch() puts the tensors' device
current (Triton launches on, and checks pointers against, the current device) and dispatches. Backend
choice ("auto", "triton", "cuda") is resolved here and nowhere else.
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Callable

from ..errors import BackendUnavailable, check_choice

BACKENDS = ("triton", "cuda")
BACKEND_CHOICES = ("auto", *BACKENDS)


@dataclass(frozen=True)
class Kernel:
    """triton: "module:function" in torch_l2topo.triton_kernels (None: no Triton version). cuda: the op in
    torch.ops.l2topo (None: no CUDA version). constexprs: Triton compile-time arguments derived from the
    call's arguments. num_warps: warps per CTA for Triton (the CUDA side fixes its own block size)."""

    triton: str | None
    cuda: str | None
    constexprs: Callable[[tuple], dict] = lambda args: {}
    num_warps: int = 1


KERNELS = {
    "chain_probe": Kernel("l2_probes:chain_probe_kernel", "chain_probe"),
    "line_probe": Kernel("l2_probes:line_probe_kernel", "line_probe"),
    "whereami": Kernel("whereami:whereami_kernel", "whereami", constexprs=lambda args: {"K": args[1].numel()}),
    "cluster_probe": Kernel(None, "cluster_probe"),
    "placement_demo": Kernel("placement_demo:checksum_kernel", "placement_demo", num_warps=4),
    "capped_chase": Kernel(None, "capped_chase"),
    "latency_oracle": Kernel("oracle:latency_oracle_kernel", None),
    "partition_probe": Kernel("partition_probe:partition_probe_kernel", "partition_probe"),
    "partition_reprobe": Kernel("partition_probe:partition_reprobe_kernel", None),
    "sm_census": Kernel("whereami:sm_census_kernel", None),
    "offsets_chase": Kernel("geometry:offsets_chase_kernel", None),
    "ring_chase": Kernel("geometry:ring_chase_kernel", None),
    # LANES chases per measuring SM: the starts (n_rows x LANES) over the output's rows
    "lanes_chase": Kernel("geometry:lanes_chase_kernel", None,
                          constexprs=lambda args: {"LANES": args[1].numel() // args[3].shape[0]}),
}


def resolve_backend(backend: str) -> str:
    """"auto" -> "triton" where Triton is installed (it compiles the probes in about a second; the CUDA
    extension's first build takes several), else "cuda". Other values are checked and returned."""
    check_choice("backend", backend, BACKEND_CHOICES)
    if backend != "auto":
        return backend
    return "triton" if importlib.util.find_spec("triton") is not None else "cuda"


def available(kernel: str) -> tuple[str, ...]:
    """The backends that implement `kernel`."""
    spec = KERNELS[kernel]
    return tuple(b for b, name in (("triton", spec.triton), ("cuda", spec.cuda)) if name)


def launch(kernel: str, backend: str, grid: int, *args) -> None:
    """Launch `kernel` with `grid` CTAs on the current stream of its tensors' device."""
    import torch

    check_choice("kernel", kernel, KERNELS)
    check_choice(f"backend for {kernel}", backend, available(kernel))
    spec = KERNELS[kernel]
    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    with torch.cuda.device(device):
        if backend == "triton":
            launch_triton(_triton_function(spec.triton), grid, args, spec.num_warps, spec.constexprs(args))
        else:
            getattr(cuda_ops(device), spec.cuda)(*args, grid)


def launch_triton(fn, grid, args: tuple, num_warps: int, constexprs: dict | None = None) -> None:
    """Launch a @triton.jit function with a 1-D grid of `grid` programs (the current device must be the
    tensors' device). The one place the package launches Triton kernels: a lean launch (lean_launch.py), the
    compiled kernel without Triton's per-launch check of the kernel's globals."""
    from .lean_launch import lean  # here: importing this module must not import Triton

    lean(fn)[(int(grid),)](*args, num_warps=num_warps, **(constexprs or {}))


def cuda_ops(device):
    """torch.ops.l2topo for `device`, building the extension for its architecture on first use."""
    import torch

    from .extension import load

    return load(torch.cuda.get_device_capability(device))


def _triton_function(path: str):
    module, name = path.split(":")
    try:
        return getattr(importlib.import_module(f"torch_l2topo.triton_kernels.{module}"), name)
    except ImportError as exc:
        raise BackendUnavailable(f"the Triton backend needs Triton ({exc}); use backend='cuda'") from None
