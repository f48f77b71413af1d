"""Fleets: the L2 maps of every GPU of a torch.distributed job, gathered into one table with a health view.

    import torch_l2topo.distributed as l2dist
    with l2dist.torchrun_group():          # joins the job torchrun started (or uses the group you initialized)
        fleet = l2dist.gather_fleet()      # every rank calls it; each calibrates its own GPU (or uses the cache)
    print(fleet.table)                     # pandas: rank, host, device, uuid hash, clock, latency, layout, ...
    print("\\n".join(fleet.health_lines()))  # DCGM-style Pass / Warn / Fail lines

gather.py runs the collectives (NCCL or gloo) and the per-rank calibration with its timeout; fleet.py builds
the table and the fingerprint distances; health.py the findings. Imports the root modules, measure/,
analysis/ and identity/.
"""
from .fleet import Fleet, describe, pairwise_distances
from .gather import DEFAULT_TIMEOUT_S, gather_fleet, local_record, torchrun_group
from .health import Finding

__all__ = ["gather_fleet", "torchrun_group", "local_record", "Fleet", "Finding", "describe", "pairwise_distances",
           "DEFAULT_TIMEOUT_S"]
