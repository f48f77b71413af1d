"""torch_l2topo: the L2 cache of an NVIDIA GPU as each SM sees it, measured and put to work.

Public verbs: calibrate() measures (or loads from the cache) a Topology; Topology.load() reads a saved
one; load_example() returns a bundled real H200 calibration.
"""
from .bundled import list_examples, load_example
from .calibration import calibrate
from .errors import DeviceError, L2TopoError, ProbeError, ProbeTimeout, TopologyFormatError
from .probes import ProbeConfig
from .topology import Topology
from .version import __version__

__all__ = ["calibrate", "Topology", "ProbeConfig", "load_example", "list_examples", "L2TopoError",
           "DeviceError", "ProbeError", "ProbeTimeout", "TopologyFormatError", "__version__"]
