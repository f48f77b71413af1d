"""Which SMs time which blocks of a partition map (pure numpy): the SM pairs, one SM near each partition,
chosen on the calibration so that the faster SM of a pair names a line's home by the widest margin
(choose_pairs), and the probe plan that gives each pair a contiguous share of the blocks (probe_plan,
timers_of_blocks). partition_decision.py says why blocks are timed in pairs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PAIR_QUANTILE = 2.0    # a pair's calibrated margin: this percentile of its signed differences over the lines


@dataclass(frozen=True, eq=False)
class Pairs:
    """sms: (n_pairs, 2) SM ids, column p near partition p. margin: (n_pairs,) each pair's calibrated margin
    (cycles per load; > 0: the faster SM of the pair names the home of nearly every calibrated line).
    best: the pair with the largest margin of all, which the reprobe uses."""

    sms: np.ndarray
    margin: np.ndarray
    best: tuple[int, int]


def choose_pairs(line_cycles, sm_partition, line_partition, quantile: float = PAIR_QUANTILE) -> Pairs:
    """Pair SMs of partition 0 with SMs of partition 1, one to one, so that in each pair the faster SM names
    the home of the calibrated lines by the widest margin (assignment maximizing the summed margins).
    A pair's margin: the `quantile` percentile over decided lines of (far SM's latency - near SM's latency);
    pairs with margin <= 0 are left out."""
    from scipy.optimize import linear_sum_assignment  # here, not at the top: probe_plan is on every map's path

    lc = np.asarray(line_cycles, dtype=np.float64)
    part, home = np.asarray(sm_partition), np.asarray(line_partition)
    a, b = np.flatnonzero(part == 0), np.flatnonzero(part == 1)
    lines = np.flatnonzero(home >= 0)
    if not (len(a) and len(b) and len(lines)):
        raise ValueError("choose_pairs needs SMs in both partitions and lines with a decided home")
    toward = np.where(home[lines] == 1, 1.0, -1.0)  # + when the line's home is partition 1 (SM b is near)
    signed = (lc[a][:, None, lines] - lc[b][None, :, lines]) * toward
    score = np.percentile(signed, quantile, axis=2)
    rows, cols = linear_sum_assignment(score, maximize=True)
    keep = score[rows, cols] > 0
    if not keep.any():
        raise ValueError("no pair of SMs of opposite partitions tells the calibrated lines' homes apart")
    i, j = np.unravel_index(np.argmax(score), score.shape)
    return Pairs(sms=np.stack([a[rows[keep]], b[cols[keep]]], axis=1), margin=score[rows, cols][keep],
                 best=(int(a[i]), int(b[j])))


def probe_plan(n_blocks: int, pairs: np.ndarray, n_sm: int) -> np.ndarray:
    """(n_sm, 3) int64 (lo, hi, row) for partition_probe_kernel: pair k times blocks lo..hi-1 (a contiguous
    share, sizes within one block of each other), its SM of partition p into row p. Other SMs: lo == hi."""
    pairs = np.asarray(pairs, dtype=np.int64)
    edges = (np.arange(len(pairs) + 1) * n_blocks) // len(pairs)
    plan = np.zeros((n_sm, 3), dtype=np.int64)
    for p in (0, 1):
        plan[pairs[:, p]] = np.stack([edges[:-1], edges[1:], np.full(len(pairs), p)], axis=1)
    return plan


def timers_of_blocks(plan: np.ndarray, n_blocks: int) -> np.ndarray:
    """(n_blocks, 2): the SM that timed each block into row 0 and row 1 of the probe's output."""
    out = np.full((2, n_blocks), -1, dtype=np.int64)
    for sm in np.flatnonzero(plan[:, 1] > plan[:, 0]):
        lo, hi, row = plan[sm]
        out[row, lo:hi] = sm
    return out.T
