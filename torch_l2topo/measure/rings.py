"""Probe plans built on the host: the random ring of the chain probe and the line set of the line probe.

A plan is a pure function of its parameters (and seed), so a calibration can be reproduced and CI can
check the invariants the kernels rely on: each ring is a single cycle through every line, SMs sharing a
ring start at distinct positions, and the probed lines are distinct.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..layout import LINE_BYTES, LINE_WORDS


@dataclass(frozen=True)
class ChainPlan:
    successor: np.ndarray   # successor[r, i] = line that line i points to in ring r
    start_ring: np.ndarray  # start_ring[sm] = ring that SM `sm` chases
    start_line: np.ndarray  # start_line[sm] = line where SM `sm` starts chasing

    @property
    def n_lines(self) -> int:
        return self.successor.shape[1]

    @property
    def n_rings(self) -> int:
        return self.successor.shape[0]


def ring_plan(n_lines: int, n_sm: int, seed: int = 0, n_rings: int = LINE_WORDS) -> ChainPlan:
    """`n_rings` independent random cyclic permutations of `n_lines` lines; SM s chases ring s % n_rings.

    Random order defeats the prefetcher and spreads consecutive loads over L2 slices. Independent rings
    (one per 8-byte word of a line) mean SMs measuring at the same time follow different orders, so a
    faster SM cannot catch up with a slower one and trail it line by line (which shifts its latency by up
    to 10 cycles on an H200). SMs sharing a ring start at evenly spaced positions on it.
    """
    if n_lines < 2:
        raise ValueError(f"a ring needs at least 2 lines, got {n_lines}")
    if n_sm < 1:
        raise ValueError(f"need at least one SM, got {n_sm}")
    if not 1 <= n_rings <= LINE_WORDS:
        raise ValueError(f"n_rings must be in 1..{LINE_WORDS} (one ring per word of a line), got {n_rings}")
    rng = np.random.default_rng(seed)
    orders = np.stack([rng.permutation(n_lines) for _ in range(n_rings)])
    successor = np.empty((n_rings, n_lines), dtype=np.int64)
    for r, order in enumerate(orders):
        successor[r, order] = np.roll(order, -1)
    sm = np.arange(n_sm)
    start_ring = sm % n_rings
    per_ring = -(-n_sm // n_rings)
    start_line = orders[start_ring, ((sm // n_rings) * n_lines) // per_ring].astype(np.int64)
    return ChainPlan(successor=successor, start_ring=start_ring.astype(np.int64), start_line=start_line)


def cycle_length(successor: np.ndarray, start: int = 0) -> int:
    """Number of steps from `start` back to itself (len(successor) iff the ring is one full cycle)."""
    seen, node = 0, int(start)
    for _ in range(len(successor)):
        node = int(successor[node])
        seen += 1
        if node == start:
            return seen
    return -1


def line_offsets(n_lines: int, first_line: int = 0) -> np.ndarray:
    """Byte offsets of `n_lines` consecutive 128-byte lines, starting at line `first_line`."""
    if n_lines < 1 or first_line < 0:
        raise ValueError(f"need n_lines >= 1 and first_line >= 0, got {n_lines}, {first_line}")
    return (np.arange(n_lines, dtype=np.int64) + first_line) * LINE_BYTES
