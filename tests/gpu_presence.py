"""Whether the GPU tests can run here, told apart three ways (tests/conftest.py acts on it): no GPU (a CPU build of
torch, no NVIDIA device, or every device hidden by CUDA_VISIBLE_DEVICES: the GPU tests skip), a usable GPU (they
run), or a GPU that is there but fails (NVIDIA device files with torch.cuda.is_available() False, or a device whose
properties cannot be read: they fail, loudly, so that a broken driver never passes as a CPU-only machine).
"""
from __future__ import annotations

import glob
import os

ABSENT, USABLE, BROKEN = "absent", "usable", "broken"
MIN_CAPABILITY = (8, 0)
HIDDEN = ("", "-1", "none", "NoDevFiles")  # CUDA_VISIBLE_DEVICES values that hide every GPU on purpose


def gpu_presence(torch=None, device_files=None, environ=None) -> tuple:
    """(ABSENT | USABLE | BROKEN, why). torch, device_files (the /dev/nvidia<N> found) and environ stand in for the
    real ones in tests."""
    environ = os.environ if environ is None else environ
    if torch is None:
        try:
            import torch
        except ImportError:
            return ABSENT, "torch is not installed"
    if torch.version.cuda is None:
        return ABSENT, f"torch {torch.__version__} is a CPU build"
    if environ.get("CUDA_VISIBLE_DEVICES", "unset").strip() in HIDDEN:
        return ABSENT, "CUDA_VISIBLE_DEVICES hides every GPU"
    files = sorted(glob.glob("/dev/nvidia[0-9]*")) if device_files is None else device_files
    try:
        available = torch.cuda.is_available()
    except Exception as exc:  # noqa: BLE001 - any failure here is the finding
        return BROKEN, f"torch.cuda.is_available() raised {type(exc).__name__}: {exc}"
    if not available:
        if files:
            return BROKEN, (f"NVIDIA device files {', '.join(files)} exist but torch.cuda.is_available() is False: "
                            "a broken driver or CUDA runtime?")
        return ABSENT, "no CUDA device"
    try:
        capability = tuple(torch.cuda.get_device_capability(0))
    except Exception as exc:  # noqa: BLE001
        return BROKEN, f"CUDA device 0 is visible but fails: {type(exc).__name__}: {exc}"
    if capability < MIN_CAPABILITY:
        return ABSENT, f"device 0 has compute capability {capability[0]}.{capability[1]}, below 8.0"
    return USABLE, f"device 0, compute capability {capability[0]}.{capability[1]}"
