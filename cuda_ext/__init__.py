"""CUDA sources of the kernels (installed as torch_l2topo.cuda_ext): headers, kernels and torch bindings.

torch_l2topo/measure/extension.py builds them on first use; nothing here imports the rest of the package. The
public device-side headers for users' kernels are protocol.cuh (claim an SM, timers, bounded waits),
l2_signature.cuh (self-localization) and placement.cuh (SM-aware work plans).
"""
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent
SOURCES = ("l2_probes.cu", "cluster_probe.cu", "whereami.cu", "partition_probe.cu", "placement_demo.cu",
           "bindings.cpp")
# the eager kernels (embedding bags, forests): their own small pybind11 module (torch_l2topo/ops/eager_kernels.py)
EAGER_SOURCES = ("eager_bags.cu", "eager_forest.cu", "eager_bindings.cpp")
