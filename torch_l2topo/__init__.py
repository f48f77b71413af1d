"""torch_l2topo: the L2 cache of an NVIDIA GPU as each SM sees it, measured and put to work.

Public verbs: calibrate() measures (or loads from the cache) a Topology; Topology.load() reads a saved
one; load_example() returns a bundled real H200 calibration; sm_labels() labels its SMs and lines;
fit_nuca() and analyze() explain it; write_report() writes it up; Localizer tells a kernel where it runs;
signature() and Registry fingerprint a device; on_sms() runs unmodified ops on the SMs a calibration ranks
best (green contexts).
"""
from .analysis import analyze
from .bundled import list_examples, load_example
from .calibration import calibrate
from .errors import (BackendUnavailable, CalibrationDisturbed, DeviceError, L2TopoError, PlacementError, ProbeError,
                     ProbeTimeout, RegistryError, TopologyFormatError)
from .fingerprint import signature
from .green_contexts import on_sms
from .labels import sm_labels
from .nuca import fit_nuca
from .probes import ProbeConfig
from .registry import Registry
from .report import write_report
from .selfloc import Localizer
from .topology import Topology
from .version import __version__

__all__ = ["calibrate", "Topology", "ProbeConfig", "load_example", "list_examples", "sm_labels", "fit_nuca",
           "analyze", "write_report", "Localizer", "signature", "Registry", "on_sms", "L2TopoError", "DeviceError",
           "BackendUnavailable", "ProbeError", "ProbeTimeout", "CalibrationDisturbed", "TopologyFormatError",
           "RegistryError", "PlacementError", "__version__"]
