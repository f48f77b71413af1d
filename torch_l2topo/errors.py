"""The exceptions torch_l2topo raises, and the one check of a choice among named options.

One base class, L2TopoError, and one subclass per thing a caller may handle. Every message is one line
that says what failed and what to do; the command line prints it as it is. Bad arguments raise
ValueError or TypeError, as Python does.
"""
from __future__ import annotations


class L2TopoError(RuntimeError):
    """Base class of every error this package raises on purpose."""


class DeviceError(L2TopoError):
    """No usable CUDA device: none present, index out of range, compute capability < 8.0, MIG limits."""


class BackendUnavailable(L2TopoError):
    """A kernel backend cannot run here: Triton missing, no CUDA torch, or the CUDA extension failed to build."""


class ProbeError(L2TopoError):
    """A probe ran but did not cover every SM, or its watchdog fired, or its invariants failed."""


class ProbeTimeout(ProbeError):
    """A probe kernel did not finish within the host-side deadline (the GPU is busy with other work)."""


class CalibrationDisturbed(ProbeError):
    """A calibration failed its self-checks on every attempt (other work evicted the rings, moved the clock,
    or made the repeats disagree); it was not returned as trusted and not cached."""


class TopologyFormatError(L2TopoError):
    """A saved calibration is corrupt, truncated, of another format version, or inconsistent."""


class RegistryError(L2TopoError):
    """A registry entry is missing, unreadable or invalid, or an entry name is taken or malformed."""


class FleetError(L2TopoError):
    """A torch.distributed job's fleet could not be gathered: a rank did not join the process group, or a collective
    did not complete, within the timeout (a rank hung or died elsewhere)."""


class CalibrationMismatch(L2TopoError, ValueError):
    """A calibration of another GPU model or SM count was handed to work on this device (its SM ids, labels
    and pairs would name the wrong SMs)."""


class PlacementError(L2TopoError):
    """A placement plan cannot be built or used: a kernel written without the placement helpers, or a plan
    asked for during CUDA graph capture before it was built."""


class TraceFormatError(L2TopoError):
    """A profiler trace is malformed, truncated, or not a PyTorch profiler (Kineto) trace; or a Proton trace is
    not in the format the profiler merges. The file is never modified."""


class ForestFormatError(L2TopoError, ValueError):
    """A tree-ensemble model (an xgboost JSON file, a scikit-learn model) is malformed or of a kind forest_predict
    does not run: out-of-range features or children, a node reached twice, an invalid base score."""


class GeometryFormatError(L2TopoError, ValueError):
    """A geometry result file (`geometry --out`, benchmarks/run_geometry.py) is malformed or lacks what its
    summary or figures read."""


def check_choice(name: str, value, choices) -> None:
    """Raise ValueError unless `value` is one of `choices` (the one check of a named option)."""
    if value not in tuple(choices):
        raise ValueError(f"{name} must be one of {', '.join(map(str, choices))}; got {value!r}")
