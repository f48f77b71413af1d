"""The raw repeats of one calibration, and how they combine into its maps.

Every SM's chain and line latencies are measured in `repeats` launches (probes.py); calibration.py keeps them
(Topology.extras) and combines them here, in two steps (pure numpy):
- at_wave_clock(): an L2 hit runs partly in the SM's clock and partly in one of its own (t_ns = FIXED_NS + S / f),
  so an SM whose clock dips below its wave's reads fewer cycles; each SM's cycles are put at its wave's median
  clock (a GPU-wide clock change moves a whole wave, which the next step takes out).
- align_levels(): the GPU's whole L2 latency level steps between discrete states, shifting every SM measuring at
  that moment alike, so a plain median over repeats leaves waves in different states. The level of every
  (repeat, wave) is estimated from the repeats themselves and removed before the median: SMs then compare
  across waves, and two calibrations differ by one constant.

Docs: docs/method.md ("Timing that means what it says").
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# The part of an L2 hit's latency that does not scale with the SM clock, by compute capability.
# 71.0: fitted on recorded H200 repeats whose TPC clocks moved (docs/method.md); elsewhere fit_fixed_ns() fits it.
FIXED_NS = {(9, 0): 71.0}
# Clock deviations below this (GHz) are not used to fit FIXED_NS: the clock reads to ~1e-5 GHz over a pass.
MIN_FIT_CLOCK = 1e-3
MIN_FIT_CORRELATION = 0.8  # a fit on deviations that do not line up is not used

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


def wave_clock(clock, wave: int) -> np.ndarray:
    """(repeats, n_sm): the median SM clock of each SM's wave in each repeat (of the whole repeat for waves
    smaller than MIN_WAVE_FOR_ALIGNMENT, as in serialized mode, where a wave is one SM)."""
    clock = np.asarray(clock, dtype=np.float64)
    n_sm = clock.shape[1]
    waves = np.arange(n_sm) // wave if wave >= MIN_WAVE_FOR_ALIGNMENT else np.zeros(n_sm, dtype=np.int64)
    out = np.empty_like(clock)
    for k in np.unique(waves):
        out[:, waves == k] = np.median(clock[:, waves == k], axis=1, keepdims=True)
    return out


def fit_fixed_ns(cycles, clock, wave: int) -> float | None:
    """FIXED_NS fitted on one calibration's repeats: within each SM, its cycles' deviation across repeats against
    its clock's deviation from its wave's; None when no SM's clock moved by MIN_FIT_CLOCK or the two do not line
    up (correlation below MIN_FIT_CORRELATION)."""
    cycles, clock = np.asarray(cycles, dtype=np.float64), np.asarray(clock, dtype=np.float64)
    x = clock - wave_clock(clock, wave)
    x = x - np.median(x, axis=0)
    y = cycles - np.median(cycles, axis=0)
    y = y - align_levels(cycles, wave)
    if np.abs(x).max() < MIN_FIT_CLOCK:
        return None
    keep = np.abs(y) < 5.0  # a disturbed SM (DRAM, another kernel) is no clock effect
    x, y = x[keep], y[keep]
    if x.std() == 0 or y.std() == 0 or np.corrcoef(x, y)[0, 1] < MIN_FIT_CORRELATION:
        return None
    return float(np.sum(x * y) / np.sum(x * x))


def at_wave_clock(cycles, clock, wave: int, fixed_ns: float) -> np.ndarray:
    """Per-SM cycles (repeats, n_sm, ...) as if each SM had run at its wave's median clock: + fixed_ns x (wave
    clock - own clock) (clock in GHz, so ns x GHz = cycles)."""
    cycles, clock = np.asarray(cycles, dtype=np.float64), np.asarray(clock, dtype=np.float64)
    shift = fixed_ns * (wave_clock(clock, wave) - clock)
    return cycles + shift.reshape(shift.shape + (1,) * (cycles.ndim - 2))


def clock_model(repeats: "Repeats", wave: int, cc) -> tuple[float, str]:
    """(FIXED_NS to use, where it comes from) for a calibration of a GPU of compute capability cc: the
    calibration's own fit where its clocks moved enough, else the measured value for cc, else 0 (no
    correction: nothing is known of that GPU's clock domains)."""
    fitted = fit_fixed_ns(repeats.chain_cycles, repeats.clock_ghz, wave)
    if fitted is not None and 0 <= fitted <= 1e3 / np.median(repeats.clock_ghz):  # at most the whole latency
        return fitted, "fitted on this calibration's repeats"
    if tuple(cc) in FIXED_NS:
        return FIXED_NS[tuple(cc)], f"measured for compute capability {cc[0]}.{cc[1]}"
    return 0.0, "none: no clock model for this GPU and its clocks did not move enough to fit one"


def combine(values, wave: int) -> np.ndarray:
    """The map of per-SM repeats (repeats, n_sm, ...): their median over repeats once aligned (align_levels)."""
    v = np.asarray(values, dtype=np.float64)
    level = align_levels(v, wave)
    return np.median(v - level.reshape(level.shape + (1,) * (v.ndim - 2)), axis=0)
