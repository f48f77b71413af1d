"""torch_l2topo: the L2 cache of an NVIDIA GPU as each SM sees it, measured and put to work.

Public verbs: calibrate() measures (or loads from the cache) a Topology; Topology.load() reads a saved
one; load_example() returns a bundled real H200 calibration; sm_labels() labels its SMs and lines;
fit_nuca() and analyze() explain it; write_report() writes it up; Localizer tells a kernel where it runs;
signature() and Registry fingerprint a device; sm_aware places a kernel's work items on SMs by the map;
partition_map() says which L2 partition each block of a tensor is homed in; on_sms() runs unmodified ops
on the SMs a calibration ranks best (green contexts); profile() is torch.profiler.profile writing traces
with the L2 map and per-CTA timelines (torch_l2topo.profiler). calibrate_all() calibrates every local GPU at
once; torch_l2topo.distributed gathers the maps of every GPU of a torch.distributed job into a fleet table.

The package has one folder per role (tests/test_import_graph.py states what each may import): measure/
(kernels launched to measure), analysis/ (CPU only), placement/, identity/, geometry/, report/, profiler/.
The verbs that need torch at import time (sm_aware, partition_map, profile) load on first use, so `import
torch_l2topo` needs neither torch's CUDA side nor Triton.
"""
from .analysis.labels import partition_column, sm_labels
from .analysis.nuca import fit_nuca
from .analysis.summary import analyze
from .bundled import list_examples, load_example
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
from .identity.fingerprint import signature
from .identity.registry import Registry
from .identity.selfloc import Localizer
from .measure.calibration import calibrate
from .measure.multi import calibrate_all
from .measure.probes import ProbeConfig
from .placement.green_contexts import on_sms
from .report.markdown import write_report
from .topology import Topology, register_sm_column
from .version import __version__

# Topology sits below analysis/ and may not import it: its per-SM frame gets the partition column from here.
register_sm_column("partition", partition_column)

# name -> (module, attribute), imported on first access (PEP 562)
_LAZY = {
    "sm_aware": ("torch_l2topo.placement.sm_aware", "sm_aware"),
    "partition_map": ("torch_l2topo.placement.partition_map", "partition_map"),
    "profile": ("torch_l2topo.profiler.session", "profile"),
}

__all__ = ["calibrate", "calibrate_all", "Topology", "ProbeConfig", "load_example", "list_examples", "sm_labels",
           "fit_nuca",
           "analyze", "write_report", "Localizer", "signature", "Registry", "sm_aware", "partition_map", "on_sms",
           "profile",
           "L2TopoError", "DeviceError", "BackendUnavailable", "ProbeError", "ProbeTimeout", "CalibrationDisturbed",
           "CalibrationMismatch", "TopologyFormatError", "RegistryError", "PlacementError", "TraceFormatError",
           "ForestFormatError", "GeometryFormatError", "FleetError",
           "__version__"]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attribute = _LAZY[name]
        value = getattr(importlib.import_module(module), attribute)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'torch_l2topo' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
