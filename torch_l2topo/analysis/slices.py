"""Line structure: latency-distinguishable slice classes, their stability, and home-partition granularity.

Each 128-byte line lives in one L2 slice; lines of one slice are seen at the same latency by every SM.
Lines are grouped by their NUCA model profile over the SMs (b[line] and the significant interaction
terms, nuca.py): a class holds lines whose profiles all lie within the model's resolution of each other
(complete linkage), so a class count is a lower bound on the slices the probed lines touch (slices at
equal distances from every SM merge). Same input conventions as structure.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import pdist

from ..labelings import adjusted_rand_index, first_seen_labels
from .nuca import as_model


@dataclass(frozen=True)
class SliceClasses:
    """labels: (n_lines,) class per line, 0.. in order of first line. within_max: largest RMS distance
    (cycles) between two lines of one class; between_min: smallest complete-linkage distance between two
    classes (inf with one class). found: more than one class, i.e. the lines are not all alike."""

    labels: np.ndarray
    within_max: float
    between_min: float
    resolution: float

    @property
    def count(self) -> int:
        return int(self.labels.max() + 1)

    @property
    def found(self) -> bool:
        return self.count > 1

    @property
    def sizes(self) -> np.ndarray:
        return np.bincount(self.labels)

    @property
    def margin(self) -> float:
        """Smallest factor by which the classes clear the resolution on either side (inf: exact copies)."""
        with np.errstate(divide="ignore"):
            return float(min(self.resolution / self.within_max, self.between_min / self.resolution))


def slice_classes(data, noise=None) -> SliceClasses:
    """Group lines whose model profiles over the SMs are indistinguishable (see the module docstring)."""
    model = as_model(data, noise)
    res = model.resolution
    z = linkage(pdist(model.line_embedding(with_offset=True)), method="complete")
    heights = z[:, 2]
    labels = first_seen_labels(fcluster(z, res, criterion="distance"))
    inside, outside = heights[heights <= res], heights[heights > res]
    return SliceClasses(labels, float(inside.max()) if inside.size else 0.0,
                        float(outside.min()) if outside.size else float("inf"), res)


@dataclass(frozen=True)
class SliceStability:
    """Slice classes of two calibrations of the same lines: counts and agreement (ARI, 1 = identical)."""

    count_a: int
    count_b: int
    ari: float


def slice_stability(a: SliceClasses, b: SliceClasses) -> SliceStability:
    if a.labels.shape != b.labels.shape:
        raise ValueError(f"the calibrations probed different numbers of lines: {a.labels.size} vs {b.labels.size}")
    return SliceStability(a.count, b.count, adjusted_rand_index(a.labels, b.labels))


@dataclass(frozen=True)
class Granularity:
    """block_bytes: largest aligned power-of-two block (bytes) inside which a line's home partition never
    changes (None: no change over the probed range). changes: home changes between consecutive lines."""

    block_bytes: int | None
    line_bytes: int
    changes: int


def home_granularity(line_partition, line_addresses) -> Granularity:
    """The address granularity of the partition hash, from each line's home (-1 = undecided, skipped)."""
    part, addr = np.asarray(line_partition), np.asarray(line_addresses, dtype=np.int64)
    if part.shape != addr.shape or part.ndim != 1:
        raise ValueError(f"line_partition and line_addresses must be 1-D of one length, got {part.shape} "
                         f"and {addr.shape}")
    keep = part >= 0
    part, addr = part[keep], addr[keep]
    order = np.argsort(addr)
    part, addr = part[order], addr[order]
    steps = np.diff(addr)
    if part.size < 2 or (steps <= 0).any():
        raise ValueError("need at least two decided lines at distinct addresses")
    line = int(steps.min())
    changes = int(np.sum(part[1:] != part[:-1]))
    if changes == 0:
        return Granularity(None, line, 0)
    block = line
    while True:
        # Does any aligned block of twice the size hold lines of both homes?
        ids = addr // (2 * block)
        starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        mixed = np.maximum.reduceat(part, starts) != np.minimum.reduceat(part, starts)
        if mixed.any():
            return Granularity(block, line, changes)
        block *= 2
