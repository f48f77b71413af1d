"""GPC ground truth from thread-block cluster co-residence (sm_90+), via the CUDA extension.

The CTAs of one cluster always run in one GPC. Launching clusters of a few sizes repeatedly, one CTA per SM
(forced through shared memory), and joining every pair of SM ids that shared a cluster (union-find) yields
the GPC partition of the SMs. An SM that never hosted a cluster CTA stays unlabelled (-1).
"""
from __future__ import annotations

import numpy as np

from ..errors import DeviceError
from ..labelings import first_seen_labels
from .launch import launch

# The scheduler packs clusters into a GPC in a fixed order, so sizes 2, 4 and 8 alone only ever join
# aligned blocks of 8 SMs (seen on the H200); odd sizes straddle those blocks. 8 is the portable maximum;
# 16 (sm_90, non-portable) spans a whole GPC of 16 or more SMs where one is free.
CLUSTER_SIZES = (2, 3, 4, 5, 6, 7, 8)
LARGE_CLUSTER_SIZES = (16,)
HOLD_NS = 20_000           # each CTA keeps its SM this long, so one launch's clusters spread over all GPCs


def union_clusters(n_sm: int, launches: list[tuple[np.ndarray, int]]) -> np.ndarray:
    """GPC label per SM from (smid per CTA, cluster size) records; labels are 0..k-1 in order of first SM.

    SMs that never appear are -1. Pure function of the records, so it is tested on CPU.
    """
    parent = np.arange(n_sm)

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    seen = np.zeros(n_sm, dtype=bool)
    for smids, cluster in launches:
        smids = np.asarray(smids, dtype=np.int64)
        if smids.size % cluster:
            raise ValueError(f"{smids.size} CTA records do not split into clusters of {cluster}")
        if smids.size and (smids.min() < 0 or smids.max() >= n_sm):
            raise ValueError(f"SM ids out of range 0..{n_sm - 1}")
        seen[smids] = True
        for group in smids.reshape(-1, cluster):
            root = find(int(group[0]))
            for sm in group[1:]:
                parent[find(int(sm))] = root
    labels = np.full(n_sm, -1, dtype=np.int64)
    roots = np.array([find(sm) for sm in np.flatnonzero(seen)], dtype=np.int64)
    labels[seen] = first_seen_labels(roots)
    return labels


def gpc_ground_truth(device, rounds: int = 3) -> np.ndarray:
    """Measure the GPC label of every SM of `device` (sm_90+): `rounds` launches of each cluster size."""
    import torch

    props = torch.cuda.get_device_properties(device)
    if (props.major, props.minor) < (9, 0):
        raise DeviceError(f"{props.name} has compute capability {props.major}.{props.minor}: thread-block "
                          "clusters (and so the GPC ground truth) need 9.0 or newer")
    n_sm = props.multi_processor_count
    # Over half an SM's shared memory per CTA: one CTA per SM, so a cluster of C spans C distinct SMs.
    smem = getattr(props, "shared_memory_per_block_optin", 0)
    if smem * 2 <= getattr(props, "shared_memory_per_multiprocessor", 2 * smem + 1):
        raise DeviceError("cannot size the cluster probe's shared memory to one CTA per SM with this torch "
                          "(device properties lack the shared-memory limits)")
    launches = []
    for _ in range(rounds):
        for cluster in CLUSTER_SIZES + LARGE_CLUSTER_SIZES:
            # four waves' worth of clusters: see cluster_probe.cu for why placement then mixes
            grid = 4 * (n_sm // cluster) * cluster
            out = torch.full((grid,), -1, dtype=torch.int64, device=device)
            try:
                launch("cluster_probe", "cuda", grid, out, cluster, smem, HOLD_NS)
            except RuntimeError:
                if cluster in CLUSTER_SIZES:
                    raise
                continue  # a non-portable size this GPU cannot schedule: the portable sizes still count
            launches.append((out.cpu().numpy(), cluster))
    return union_clusters(n_sm, launches)
