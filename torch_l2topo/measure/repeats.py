"""The raw repeats of one calibration, and how they combine into its maps.

Every SM's chain and line latencies are measured in `repeats` launches (probes.py); calibration.py keeps
them (Topology.extras) and combines them here. The plain median over repeats is not enough on an H200: the
GPU's whole L2 latency level steps between discrete states (0.3-0.4 and ~1.1 cycles apart, lasting from
tens of ms to seconds; benchmarks/results/noise_h200_*.json), and every SM measuring at that moment shifts
alike (within a wave the shifts agree to 0.02 cycles). A step inside a calibration leaves some waves'
median in one state and others' in another. align_levels() estimates the level of every (repeat, wave) from
the repeats themselves, puts them on one scale, and the maps are the medians after removing it: SMs are then
comparable across waves, and two calibrations differ by one constant (the state each was in).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Alignment needs waves of several SMs: a wave's level is the median over its SMs, and the levels of
# consecutive waves are chained, so single-SM waves (serialized mode) would chain per-SM noise into a drift.
MIN_WAVE_FOR_ALIGNMENT = 8

_EXTRA_KEYS = {"chain_cycles": "repeat_chain_cycles", "chain_ns": "repeat_chain_ns",
               "chain_start_ns": "repeat_chain_start_ns", "line_median": "repeat_line_median"}


@dataclass(frozen=True)
class Repeats:
    """The raw repeats of one calibration, (repeats, n_sm) each: chain cycles and ns per load, when each SM's
    timed pass began (ns, relative to the first), and each SM's median line-probe latency (cycles)."""

    chain_cycles: np.ndarray
    chain_ns: np.ndarray
    chain_start_ns: np.ndarray
    line_median: np.ndarray

    def __post_init__(self):
        shapes = {k: np.shape(getattr(self, k)) for k in _EXTRA_KEYS}
        if len(set(shapes.values())) != 1 or len(shapes["chain_cycles"]) != 2 or 0 in shapes["chain_cycles"]:
            raise ValueError(f"repeats must all have one shape (repeats, n_sm), got {shapes}")
        for k in ("chain_cycles", "chain_ns", "line_median"):
            a = getattr(self, k)
            if not np.all(np.isfinite(a)) or np.any(a <= 0):
                raise ValueError(f"{k} must be finite and positive")

    @property
    def clock_ghz(self) -> np.ndarray:
        return self.chain_cycles / self.chain_ns

    @classmethod
    def from_results(cls, chains, lines) -> "Repeats":
        """From the probes' ChainResult and LineResult lists (one per repeat)."""
        start = np.stack([c.start_ns for c in chains]).astype(np.int64)
        return cls(chain_cycles=np.stack([c.cycles for c in chains]), chain_ns=np.stack([c.ns for c in chains]),
                   chain_start_ns=start - start.min(),
                   line_median=np.stack([np.median(r.cycles, axis=1) for r in lines]))

    def to_extras(self) -> dict:
        return {extra: np.asarray(getattr(self, k)) for k, extra in _EXTRA_KEYS.items()}

    @classmethod
    def from_extras(cls, extras: dict) -> "Repeats | None":
        """The repeats a Topology carries (extras), or None for calibrations made before they were kept."""
        if not all(extra in extras for extra in _EXTRA_KEYS.values()):
            return None
        return cls(**{k: np.asarray(extras[extra]) for k, extra in _EXTRA_KEYS.items()})


def align_levels(values, wave: int) -> np.ndarray:
    """(repeats, n_sm) level of the GPU when each SM measured in each repeat, on one scale whose median is 0.

    values: (repeats, n_sm, ...) per-SM measurements; SMs measure in waves of `wave` consecutive ids, in
    order. Per (repeat, wave): the median over the wave's SMs of their deviation from their median over
    repeats. Consecutive waves are put on one scale by the median over repeats of their level difference
    (a state change between two waves happens in one repeat, not in most). Zeros when waves are smaller than
    MIN_WAVE_FOR_ALIGNMENT or there is one repeat.
    """
    v = np.asarray(values, dtype=np.float64)
    per_sm = v.reshape(v.shape[0], v.shape[1], -1).mean(axis=2)
    n_rep, n_sm = per_sm.shape
    if wave < MIN_WAVE_FOR_ALIGNMENT or n_rep < 2:
        return np.zeros((n_rep, n_sm))
    waves = np.arange(n_sm) // wave
    dev = per_sm - np.median(per_sm, axis=0)
    level = np.stack([[np.median(dev[r, waves == k]) for k in range(waves.max() + 1)] for r in range(n_rep)])
    level[:, 1:] -= np.cumsum(np.median(np.diff(level, axis=1), axis=0))
    level -= np.median(level)
    return level[:, waves]


def combine(values, wave: int) -> np.ndarray:
    """The map of per-SM repeats (repeats, n_sm, ...): their median over repeats once aligned (align_levels)."""
    v = np.asarray(values, dtype=np.float64)
    level = align_levels(v, wave)
    return np.median(v - level.reshape(level.shape + (1,) * (v.ndim - 2)), axis=0)
