"""Per-SM and per-line labels: the one source of L2 partition, TPC and GPC labels for every use.

The report, the localizer, fingerprints, placement plans and the profiler all label SMs and lines
through sm_labels(topology); nothing else derives them. It owns:
- the L2 partitions (find_partitions): each SM's near side and each probed line's home, from the SM x line
  matrix, decided only where the contrast stands above the noise;
- TPC labels (SMs 2i and 2i+1 share a TPC on cc 8.x and 9.x parts; structure.find_twins checks it on data);
- GPC labels, where the calibration carries cluster co-residence ground truth (extras["gpc_truth"]);
- per-SM near and far latency, which placement turns into speeds.
Operations on any labeling (relabel, agreement, ARI) live in labelings.py.

Pure numpy/scipy on a Topology, a NucaModel or a matrix with its noise; no GPU.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from ..labelings import best_match_agreement
from .nuca import as_model

# Chance that a map without partitions still gets some SM or line assigned a side: the per-item z
# threshold is Bonferroni-corrected over all SMs and lines for this family-wise rate.
FALSE_ALARM = 1e-3
# The side/home alternation converges in 1-2 sweeps on the H200 data; the bound only guards a cycle.
_MAX_SWEEPS = 20


# ---- L2 partitions ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Partitions:
    """Two L2 partitions: each SM's near side and each line's home, 0/1 (-1: undecided, or none found).

    Partition 0 is the near side of the lowest-numbered decided SM. sm_margin / line_margin: the SM's (line's)
    far - near latency difference over its noise standard error (resolution-based); an item is decided when
    it exceeds z_critical. near_cycles / far_cycles: mean latency of SM -> line pairs on the same / opposite
    partitions (decided items only).
    """

    found: bool
    reason: str
    sm_partition: np.ndarray
    line_partition: np.ndarray
    sm_margin: np.ndarray
    line_margin: np.ndarray
    near_cycles: float
    far_cycles: float
    z_critical: float

    @property
    def gap_cycles(self) -> float:
        return self.far_cycles - self.near_cycles

    @property
    def gap_ratio(self) -> float:
        return self.far_cycles / self.near_cycles if self.found else float("nan")

    @property
    def sm_counts(self) -> tuple[int, int]:
        return int(np.sum(self.sm_partition == 0)), int(np.sum(self.sm_partition == 1))

    @property
    def line_counts(self) -> tuple[int, int]:
        return int(np.sum(self.line_partition == 0)), int(np.sum(self.line_partition == 1))

    def sms(self, partition: int) -> np.ndarray:
        return np.flatnonzero(self.sm_partition == partition)

    def lines(self, partition: int) -> np.ndarray:
        return np.flatnonzero(self.line_partition == partition)

    def near_far_values(self, matrix) -> tuple[np.ndarray, np.ndarray]:
        """The matrix entries of same-partition (near) and cross-partition (far) SM -> line pairs."""
        m = np.asarray(matrix)
        s, ln = self.sm_partition, self.line_partition
        both = (s[:, None] >= 0) & (ln[None, :] >= 0)
        same = s[:, None] == ln[None, :]
        return m[both & same], m[both & ~same]

    def to_frames(self) -> dict:
        import pandas as pd

        return {"sm": pd.DataFrame({"sm": np.arange(len(self.sm_partition)), "partition": self.sm_partition,
                                    "margin": self.sm_margin}),
                "line": pd.DataFrame({"line": np.arange(len(self.line_partition)),
                                      "partition": self.line_partition, "margin": self.line_margin})}


def _no_partitions(n_sm: int, n_lines: int, reason: str, z_crit: float) -> Partitions:
    return Partitions(False, reason, np.full(n_sm, -1), np.full(n_lines, -1), np.full(n_sm, np.nan),
                      np.full(n_lines, np.nan), float("nan"), float("nan"), z_crit)


def find_partitions(data, noise=None) -> Partitions:
    """Split SMs and lines into two L2 partitions: an SM is fast to the lines homed on its side.

    Starts from the sign of the leading interaction term and alternates (a line's home is the SM group that
    sees it faster; an SM's side is the line group it sees faster) until nothing moves. Found only when that
    term stands above the noise and both partitions keep decided SMs and lines.
    """
    model = as_model(data, noise)
    m = model.matrix
    n_sm, n_lines = m.shape
    z_crit = float(stats.norm.isf(FALSE_ALARM / (n_sm + n_lines)))
    if model.significant_rank == 0:
        return _no_partitions(n_sm, n_lines, "no interaction term stands above the noise", z_crit)
    side = model.u[:, 0] > 0
    for _ in range(_MAX_SWEEPS):
        if side.all() or not side.any():
            return _no_partitions(n_sm, n_lines, "every SM falls on one side", z_crit)
        home = m[side].mean(axis=0) < m[~side].mean(axis=0)
        if home.all() or not home.any():
            return _no_partitions(n_sm, n_lines, "every line is homed on one side", z_crit)
        new_side = m[:, home].mean(axis=1) < m[:, ~home].mean(axis=1)
        if np.array_equal(new_side, side):
            break
        side = new_side

    res = model.resolution
    n_home = np.array([np.sum(~home), np.sum(home)])
    n_side = np.array([np.sum(~side), np.sum(side)])
    own = side[:, None] == home[None, :]
    near_of, far_of = np.where(own, m, np.nan), np.where(own, np.nan, m)
    s_own, l_own = side.astype(int), home.astype(int)
    sm_margin = (np.nanmean(far_of, axis=1) - np.nanmean(near_of, axis=1)) \
        / (res * np.sqrt(1 / n_home[s_own] + 1 / n_home[1 - s_own]))
    line_margin = (np.nanmean(far_of, axis=0) - np.nanmean(near_of, axis=0)) \
        / (res * np.sqrt(1 / n_side[l_own] + 1 / n_side[1 - l_own]))
    sm_ok, line_ok = sm_margin > z_crit, line_margin > z_crit
    if not (sm_ok & side).any() or not (sm_ok & ~side).any() or not (line_ok & home).any() \
            or not (line_ok & ~home).any():
        return _no_partitions(n_sm, n_lines, f"one partition has no SM or line whose near-far contrast exceeds "
                              f"{z_crit:.1f} noise standard errors", z_crit)
    first = side[np.flatnonzero(sm_ok)[0]]  # partition 0 is where the lowest decided SM is near
    sm_part = np.where(sm_ok, (side != first).astype(int), -1)
    line_part = np.where(line_ok, (home != first).astype(int), -1)
    both = sm_ok[:, None] & line_ok[None, :]
    near = float(m[both & own].mean())
    far = float(m[both & ~own].mean())
    return Partitions(True, "", sm_part, line_part, sm_margin, line_margin, near, far, z_crit)


def compare_partitions(p: Partitions, q: Partitions) -> dict:
    """How two partition results (same SMs and lines: two calibrations, or two GPUs) agree, after matching
    labels: fraction of SMs and of lines decided in both that sit in the same partition."""
    if not (p.found and q.found):
        return {"sm_agreement": float("nan"), "line_agreement": float("nan")}
    return {"sm_agreement": best_match_agreement(p.sm_partition, q.sm_partition)[0],
            "line_agreement": best_match_agreement(p.line_partition, q.line_partition)[0]}


# ---- the labels of one calibration ---------------------------------------------------------------------
def tpc_labels(n_sm: int) -> np.ndarray:
    """TPC of each SM: SMs 2i and 2i+1 share TPC i on cc 8.x and 9.x parts (an odd last SM is alone)."""
    return np.arange(n_sm, dtype=np.int64) // 2


def partition_gap(line_cycles, parts: Partitions) -> float:
    """Half the far - near contrast of a two-partition map, averaged over both sides (cycles; 0 without
    partitions). For each SM: mean latency to the lines of one home minus the other's; the sign flips with
    the SM's side, so the two sides' means are apart by twice the far - near gap."""
    if not parts.found:
        return 0.0
    lc = np.asarray(line_cycles, dtype=np.float64)
    home, side = parts.line_partition, parts.sm_partition
    contrast = lc[:, home == 1].mean(axis=1) - lc[:, home == 0].mean(axis=1)
    return float(abs(contrast[side == 1].mean() - contrast[side == 0].mean()) / 2)


@dataclass(frozen=True)
class SMLabels:
    """Labels of the SMs and probed lines of one calibration.

    partition: (n_sm,) the L2 partition each SM is near to, 0/1 (-1: undecided). line_partition: (n_lines,)
    the home of each probed line (-1: undecided). tpc: (n_sm,). gpc: (n_sm,) from cluster ground truth, -1
    for SMs it never saw; None when the calibration has none. near_cycles / far_cycles: (n_sm,) each SM's
    mean latency to the decided lines homed in its own / the other partition (NaN for undecided SMs or
    without partitions). gap_cycles: partition_gap. partitions: the full result, with margins.
    """

    partition: np.ndarray
    line_partition: np.ndarray
    tpc: np.ndarray
    gpc: np.ndarray | None
    near_cycles: np.ndarray
    far_cycles: np.ndarray
    gap_cycles: float
    partitions: Partitions

    @property
    def n_sm(self) -> int:
        return len(self.partition)

    def levels(self) -> dict:
        """{level: (n_sm,) labels} for every level that labels every SM (what a classifier can learn)."""
        out = {"tpc": self.tpc}
        if self.partitions.found and (self.partition >= 0).all():
            out["partition"] = self.partition
        if self.gpc is not None and (self.gpc >= 0).all():
            out["gpc"] = self.gpc
        return out


def sm_labels(data, noise=None, gpc_truth=None) -> SMLabels:
    """The labels of a calibration (Topology, NucaModel, or matrix with its noise).

    gpc_truth: (n_sm,) GPC labels; default: a Topology's extras["gpc_truth"] when it has one.
    """
    from ..topology import Topology

    model = as_model(data, noise)
    m = model.matrix
    parts = find_partitions(model)
    if gpc_truth is None and isinstance(data, Topology):
        gpc_truth = data.extras.get("gpc_truth")
    gpc = None
    if gpc_truth is not None:
        gpc = np.asarray(gpc_truth).astype(np.int64)
        if gpc.shape != (model.n_sm,):
            raise ValueError(f"gpc_truth must have shape ({model.n_sm},), got {gpc.shape}")
    near = np.full(model.n_sm, np.nan)
    far = np.full(model.n_sm, np.nan)
    if parts.found:
        home = parts.line_partition
        for sm in np.flatnonzero(parts.sm_partition >= 0):
            own = parts.sm_partition[sm]
            near[sm] = m[sm, home == own].mean()
            far[sm] = m[sm, home == 1 - own].mean()
    return SMLabels(partition=parts.sm_partition, line_partition=parts.line_partition,
                    tpc=tpc_labels(model.n_sm), gpc=gpc, near_cycles=near, far_cycles=far,
                    gap_cycles=partition_gap(m, parts), partitions=parts)



def partition_column(topo) -> np.ndarray:
    """Each SM's L2 partition (0/1, -1 undecided), the "partition" column of Topology.to_frame("sm"). A
    calibration of a single repeat has no repeat noise to tell structure from, so every SM is undecided."""
    if int(topo.meta.get("config", {}).get("repeats", 2)) < 2:
        return np.full(topo.n_sm, -1)
    return sm_labels(topo).partition
