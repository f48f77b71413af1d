"""What part of one GPU's kernel time the per-SM view covers: its kernel events with CTA tracks against all of
them, the Triton launches covered, and the kernels left without tracks (docs/profiler.md, Which kernels get
CTA tracks).

coverage() takes the device's Kernels, the positions of the launches that got CTAs and the Triton kernels the
process knew in the cycle ({"instrumented": [names], "plain": [names]}, or None), and returns the keys the
device's metadata carries. GPU time is the sum of kernel event durations (kernels on concurrent streams each
count). A kernel event is a Triton launch when its name designates a named kernel (kineto.kernel_matches).
"""
from __future__ import annotations

import numpy as np

from .kineto import Kernels, kernel_matches

TRITON_LISTS = ("instrumented", "plain")


def triton_names(triton_kernels) -> set | None:
    """The kernel names of a triton_kernels argument ({"instrumented": [...], "plain": [...]}; None: not known)."""
    if triton_kernels is None:
        return None
    if not isinstance(triton_kernels, dict) or set(triton_kernels) - set(TRITON_LISTS):
        raise ValueError(f"triton_kernels must be a dict with keys {TRITON_LISTS}, not {triton_kernels!r:.80}")
    names = [n for key in TRITON_LISTS for n in triton_kernels.get(key) or ()]
    if not all(isinstance(n, str) for n in names):
        raise TypeError("triton_kernels: every kernel name must be a str")
    return set(names)


def _is_triton(name: str, triton: set) -> bool:
    return name in triton or any(kernel_matches(name, t) for t in triton)


def coverage(kernels: Kernels, covered, triton_kernels=None) -> dict:
    """{"kernel_gpu_ns", "kernel_launches", "instrumented_gpu_time_ratio", "triton_launch_coverage",
    "uncovered_kernels"} of one device (module docstring); covered: positions in `kernels` of the launches with
    CTA tracks. Each uncovered kernel: name, launches (without tracks), gpu_ns, share (of the device's kernel
    GPU time) and kind ("triton", "other", or "unknown" when triton_kernels is None); largest gpu_ns first."""
    triton = triton_names(triton_kernels)
    dur = kernels.end_ns - kernels.start_ns
    total = int(dur.sum())
    has = np.zeros(len(kernels), bool)
    has[np.asarray(covered, np.int64)] = True
    names, inverse = np.unique(kernels.names.astype(str), return_inverse=True)
    named = None if triton is None else np.array([_is_triton(n, triton) for n in names], bool)
    out = {"kernel_gpu_ns": total, "kernel_launches": int(len(kernels)),
           "instrumented_gpu_time_ratio": round(float(dur[has].sum() / total), 4) if total else None,
           "triton_launch_coverage": None}
    if named is not None and named[inverse].any():
        out["triton_launch_coverage"] = round(float((named[inverse] & has).sum() / named[inverse].sum()), 4)
    launches = np.bincount(inverse[~has], minlength=len(names))
    gpu_ns = np.bincount(inverse[~has], weights=dur[~has], minlength=len(names)).astype(np.int64)
    rows = []
    for j in np.flatnonzero(launches):
        kind = "unknown" if named is None else ("triton" if named[j] else "other")
        rows.append({"name": str(names[j]), "launches": int(launches[j]), "gpu_ns": int(gpu_ns[j]),
                     "share": round(float(gpu_ns[j] / total), 4) if total else 0.0, "kind": kind})
    out["uncovered_kernels"] = sorted(rows, key=lambda r: (-r["gpu_ns"], r["name"]))
    return out
