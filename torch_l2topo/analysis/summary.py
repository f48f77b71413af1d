"""Every analysis of one calibration, run together: the NUCA model, the labels, twins, GPC clusters,
symmetry and slice classes, and how they hold against a second calibration.

analyze() returns plain results (Analysis); report.py renders them and figures.py draws them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..labelings import adjusted_rand_index
from ..topology import Topology
from .labels import Partitions, compare_partitions, sm_labels
from .nuca import NucaModel, fit_nuca
from .slices import Granularity, SliceClasses, SliceStability, home_granularity, slice_classes, slice_stability
from .structure import GpcClusters, GpcComparison, Symmetry, Twins, cluster_gpcs, compare_gpcs, find_twins, sm_symmetry

_PAGE_BYTES = 2 << 20


@dataclass
class Comparison:
    """One calibration against a second one of the same GPU (or another GPU): how the structure holds.
    same_gpu: False when the two name different GPUs (board serial hashes where both have one, else uuid
    hashes), None when that is unknown."""

    name: str
    partitions: dict
    slices: SliceStability | None
    gpc_ari: float
    same_gpu: bool | None = None


@dataclass
class Analysis:
    """Everything analyze() found in one calibration (plain results of nuca, structure and slices)."""

    name: str
    topology: Topology | None
    model: NucaModel
    partitions: Partitions
    twins: Twins
    gpcs: GpcClusters
    gpc_truth: GpcComparison | None
    symmetry: Symmetry
    slices: SliceClasses
    granularity: Granularity | None
    versus: Comparison | None

    def summary(self) -> dict:
        """The headline figures as plain JSON-able values."""
        m, p, g = self.model, self.partitions, self.gpcs
        out = {"name": self.name, "shape": list(m.matrix.shape), "noise_sigma": m.noise_sigma,
               "r2_by_rank": [float(x) for x in m.r2], "residual_over_noise": [float(x) for x in m.residual_over_noise],
               "significant_rank": m.significant_rank,
               "partitions": {"found": p.found, "sm_counts": p.sm_counts, "line_counts": p.line_counts,
                              "near_cycles": p.near_cycles, "far_cycles": p.far_cycles, "gap_cycles": p.gap_cycles,
                              "gap_ratio": p.gap_ratio,
                              "granularity_bytes": self.granularity.block_bytes if self.granularity else None},
               "twins": {"count": self.twins.count, "consecutive_fraction": self.twins.consecutive_fraction,
                         "margin": self.twins.margin},
               "gpc_clusters": {"k": g.k, "gap": g.gap, "sizes": g.sizes().tolist() if g.found else [],
                                "runner_up_k": int(g.levels[1, 0]) if len(g.levels) > 1 else None},
               "symmetry": self.symmetry.verdict(),
               "slices": {"count": self.slices.count, "margin": self.slices.margin}}
        if self.gpc_truth:
            out["gpc_truth"] = {k: getattr(self.gpc_truth, k) for k in ("matched_fraction", "purity", "ari")}
        if self.versus:
            v = self.versus
            out["versus"] = {"name": v.name, "same_gpu": v.same_gpu, **v.partitions, "gpc_ari": v.gpc_ari,
                             "slice_counts": [v.slices.count_a, v.slices.count_b] if v.slices else None,
                             "slice_ari": v.slices.ari if v.slices else None}
        return out


def _name(data) -> str:
    if isinstance(data, Topology):
        return data.source or data.meta.get("source") or data.meta.get("uuid_hash", "calibration")
    return "matrix"


def same_gpu(a, b) -> bool | None:
    """Whether two calibrations come from one GPU by their hashed identifiers: the board serials where both
    carry one, else the uuids; None when either is unknown (a bare matrix, a calibration without hashes)."""
    if not (isinstance(a, Topology) and isinstance(b, Topology)):
        return None
    for key in ("serial_hash", "uuid_hash"):
        x, y = a.meta.get(key), b.meta.get(key)
        if x and y:
            return x == y
    return None


def analyze(data, noise=None, other=None) -> Analysis:
    """Run every analysis on `data` (Topology, or matrix + noise); `other`, a second calibration of the same
    lines, adds how the partitions, GPC clusters and slice classes hold between the two."""
    topo = data if isinstance(data, Topology) else None
    model = fit_nuca(data, noise)
    labels = sm_labels(model, gpc_truth=topo.extras.get("gpc_truth") if topo is not None else None)
    parts, gpcs, slices = labels.partitions, cluster_gpcs(model), slice_classes(model)
    truth = compare_gpcs(gpcs.labels, labels.gpc) if labels.gpc is not None and gpcs.found else None
    granularity = None
    if topo is not None and parts.found:
        granularity = home_granularity(parts.line_partition, topo.line_addresses)
    versus = None
    if other is not None:
        model_b = fit_nuca(other)
        # Slice classes compare line by line when both probed the same offsets within a 2 MiB GPU page: the
        # slice hash reads physical address bits, and a page maps its low 21 bits unchanged (two H200s'
        # buffers at different virtual addresses give identical line homes).
        same_lines = isinstance(other, Topology) and topo is not None \
            and np.array_equal(other.line_addresses % _PAGE_BYTES, topo.line_addresses % _PAGE_BYTES)
        gpcs_b = cluster_gpcs(model_b)
        versus = Comparison(_name(other), compare_partitions(parts, sm_labels(model_b).partitions),
                            slice_stability(slices, slice_classes(model_b)) if same_lines else None,
                            adjusted_rand_index(gpcs.labels, gpcs_b.labels) if gpcs.found and gpcs_b.found
                            else float("nan"), same_gpu(data, other))
    return Analysis(_name(data), topo, model, parts, find_twins(model), gpcs, truth, sm_symmetry(model), slices,
                    granularity, versus)
