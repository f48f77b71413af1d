"""torch_l2topo: the L2 cache of an NVIDIA GPU as each SM sees it, measured and put to work.

Public verbs, grouped by role in __all__: calibrate() measures (or loads from the cache) a Topology, and
calibrate_all() every local GPU at once; Topology.load() reads a saved one and load_example() a bundled real
H200 calibration; sm_labels(), fit_nuca(), analyze() and write_report() explain it; sm_aware places a kernel's
work items on SMs by the map, partition_map() says which L2 partition each block of a tensor is homed in, and
on_sms() runs unmodified ops on the SMs a calibration ranks best; Localizer, signature() and Registry tell
which SM and which device; profile() is torch.profiler.profile writing traces with the L2 map and per-CTA
timelines. The ops (torch_l2topo.ops) and fleets of a torch.distributed job (torch_l2topo.distributed) are
subpackages.

One folder per role; tests/test_import_graph.py states what each may import (docs/layout.md). Every verb
loads on first use, so `import torch_l2topo` costs numpy and needs neither torch, scipy nor Triton (the
profiler's trace workers import it). Docs: docs/usage.md.
"""
from .errors import (
    BackendUnavailable,
    CalibrationDisturbed,
    CalibrationMismatch,
    DeviceError,
    FleetError,
    ForestFormatError,
    GeometryFormatError,
    L2TopoError,
    PlacementError,
    ProbeError,
    ProbeTimeout,
    RegistryError,
    TopologyFormatError,
    TraceFormatError,
)
from .topology import Topology, register_sm_column
from .version import __version__


def _partition_column(topo):
    from .analysis.labels import partition_column

    return partition_column(topo)


# Topology sits below analysis/ and may not import it: its per-SM frame gets the partition column from here.
register_sm_column("partition", _partition_column)

# name -> (module, attribute), imported on first access (PEP 562)
_LAZY = {
    "sm_labels": ("torch_l2topo.analysis.labels", "sm_labels"),
    "fit_nuca": ("torch_l2topo.analysis.nuca", "fit_nuca"),
    "analyze": ("torch_l2topo.analysis.summary", "analyze"),
    "list_examples": ("torch_l2topo.bundled", "list_examples"),
    "load_example": ("torch_l2topo.bundled", "load_example"),
    "signature": ("torch_l2topo.identity.fingerprint", "signature"),
    "Registry": ("torch_l2topo.identity.registry", "Registry"),
    "Localizer": ("torch_l2topo.identity.selfloc", "Localizer"),
    "calibrate": ("torch_l2topo.measure.calibration", "calibrate"),
    "calibrate_all": ("torch_l2topo.measure.multi", "calibrate_all"),
    "ProbeConfig": ("torch_l2topo.measure.probes", "ProbeConfig"),
    "on_sms": ("torch_l2topo.placement.green_contexts", "on_sms"),
    "write_report": ("torch_l2topo.report.markdown", "write_report"),
    "sm_aware": ("torch_l2topo.placement.sm_aware", "sm_aware"),
    "partition_map": ("torch_l2topo.placement.partition.maps", "partition_map"),
    "profile": ("torch_l2topo.profiler.session", "profile"),
}

__all__ = [
    # measure: calibrate this process's GPU (or load its cached calibration)
    "calibrate", "ProbeConfig",
    # Topology: one calibration, saved and loaded; the bundled real ones
    "Topology", "load_example", "list_examples",
    # analysis: explaining a map on the CPU, and the Markdown report
    "sm_labels", "fit_nuca", "analyze", "write_report",
    # placement: kernels' work items on SMs, tensors' partition maps, ops on chosen SMs
    "sm_aware", "partition_map", "on_sms",
    # identity: which SM a kernel runs on, which device made a calibration
    "Localizer", "signature", "Registry",
    # profiler: torch.profiler traces with the L2 map and per-CTA timelines
    "profile",
    # ops: none at the top level; embedding_bag, Forest and forest_predict are in torch_l2topo.ops
    # fleet: every local GPU at once (a torch.distributed job's fleet: torch_l2topo.distributed)
    "calibrate_all",
    # errors: the package's exception types
    "L2TopoError", "DeviceError", "BackendUnavailable", "ProbeError", "ProbeTimeout", "CalibrationDisturbed",
    "CalibrationMismatch", "TopologyFormatError", "RegistryError", "PlacementError", "TraceFormatError",
    "ForestFormatError", "GeometryFormatError", "FleetError",
    "__version__",
]


# subpackages reachable as attributes after a plain `import torch_l2topo` (torch_l2topo.profiler.trace_handler,
# torch_l2topo.ops.embedding_bag), imported on first use
SUBPACKAGES = ("measure", "analysis", "placement", "identity", "geometry", "report", "ops", "distributed", "profiler",
               "triton_kernels", "cuda_ext")


def __getattr__(name):
    import importlib

    if name in _LAZY:
        module, attribute = _LAZY[name]
        value = getattr(importlib.import_module(module), attribute)
    elif name in SUBPACKAGES:
        value = importlib.import_module(f"torch_l2topo.{name}")
    else:
        raise AttributeError(f"module 'torch_l2topo' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(SUBPACKAGES))
