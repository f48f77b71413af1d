"""The exceptions torch_l2topo raises: one base class, one subclass per thing a caller may handle."""


class L2TopoError(RuntimeError):
    """Base class of every error this package raises on purpose."""


class DeviceError(L2TopoError):
    """No usable CUDA device: none present, index out of range, compute capability < 8.0, MIG limits."""


class ProbeError(L2TopoError):
    """A probe ran but did not cover every SM, or its watchdog fired, or its invariants failed."""


class ProbeTimeout(ProbeError):
    """A probe kernel did not finish within the host-side deadline (the GPU is busy with other work)."""


class TopologyFormatError(L2TopoError):
    """A saved calibration is corrupt, truncated, of another format version, or inconsistent."""
