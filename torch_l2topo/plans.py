"""Probe plans built on the host: the random ring of the chain probe and the line set of the line probe.

A plan is a pure function of its parameters (and seed), so a calibration can be reproduced and CI can
check the invariants the kernels rely on: the ring is a single cycle through every line, every SM starts
the chain at a distinct position, and the probed lines are distinct.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .probe_layout import LINE_BYTES


@dataclass(frozen=True)
class ChainPlan:
    successor: np.ndarray   # successor[i] = line that line i points to
    start_line: np.ndarray  # start_line[sm] = line where SM `sm` starts chasing

    @property
    def n_lines(self) -> int:
        return len(self.successor)


def ring_plan(n_lines: int, n_sm: int, seed: int = 0) -> ChainPlan:
    """A random cyclic permutation of `n_lines` lines; SMs start at evenly spaced ring positions.

    Random order defeats the prefetcher and spreads consecutive loads over L2 slices; evenly spaced starts
    let concurrent SMs walk disjoint stretches of the ring.
    """
    if n_lines < 2:
        raise ValueError(f"a ring needs at least 2 lines, got {n_lines}")
    if n_sm < 1:
        raise ValueError(f"need at least one SM, got {n_sm}")
    order = np.random.default_rng(seed).permutation(n_lines)
    successor = np.empty(n_lines, dtype=np.int64)
    successor[order] = np.roll(order, -1)
    start_line = order[(np.arange(n_sm) * n_lines) // n_sm].astype(np.int64)
    return ChainPlan(successor=successor, start_line=start_line)


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
