"""Self-checks of one calibration: is the map it produced an L2 map of an undisturbed GPU?

A busy GPU can make the probes measure something else without failing (another process's work evicts the
L2-resident ring and the chain probe times DRAM), so calibrate() checks every calibration on its raw repeats
before it returns or caches it, and retries or refuses one that fails (calibration.py). Pure numpy.

The checks, each against a measurement made in the same run:
- residency: each SM's chain latency against the L2 hits its own line probe timed (a line loaded twice, then
  timed: an L2 hit whatever happened to the ring); an evicted ring reads about twice it.
- repeats agree: the chain repeats of each SM lie within REPEAT_PTP_MAX cycles of each other.
- clocks held: the SM clock while probing (clock64 / %globaltimer) is one clock for every SM and repeat.
Against the GPU's previous trusted calibration a moved clock or map is said, not refused (a driver or clock
setting change legitimately moves it). Docs: docs/method.md ("Self-checks before a map is returned or cached").
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .repeats import Repeats

# Thresholds: set on recorded clean calibrations of six H200s, tested on disturbed ones (tests/test_trust.py).
RESIDENT_RATIO_MAX = 1.10   # chain / same-SM line-probe L2 hit; clean <= 1.015, an evicted ring ~2
REPEAT_PTP_MAX = 2.0        # cycles between an SM's chain repeats; clean <= 1.16
CLOCK_SPREAD_MAX = 0.01     # relative range of the SM clock over SMs and repeats; clean <= 0.0043
PREVIOUS_SHIFT_NOTE = 2.0   # cycles: a median chain shift against the previous calibration worth saying

@dataclass(frozen=True)
class Verdict:
    """trusted: every check passed. problems: why not (one line each). notes: what is said without refusing
    (the clock or map moved since the previous calibration). figures: the numbers the checks looked at."""

    trusted: bool
    problems: tuple = ()
    notes: tuple = ()
    figures: dict = field(default_factory=dict)

    def to_meta(self) -> dict:
        return {"trusted": self.trusted, "problems": list(self.problems), "notes": list(self.notes),
                "figures": self.figures}


def check(repeats: Repeats, previous=None) -> Verdict:
    """Run every check on one calibration's repeats; `previous`: the GPU's previous trusted Topology, if any."""
    problems, notes = [], []
    ratio = repeats.chain_cycles / repeats.line_median
    r, sm = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    figures = {"resident_ratio_max": float(ratio.max()), "resident_ratio_median": float(np.median(ratio))}
    if ratio.max() > RESIDENT_RATIO_MAX:
        problems.append(
            f"the ring was not L2-resident: SM {sm} chased at {repeats.chain_cycles[r, sm]:.0f} cycles per load, "
            f"{ratio.max():.2f}x the L2 hits its line probe timed in the same run (another process evicting L2?)")
    ptp = np.ptp(repeats.chain_cycles, axis=0)
    figures["repeat_ptp_max"] = float(ptp.max())
    if ptp.max() > REPEAT_PTP_MAX:
        problems.append(f"the repeats disagree: SM {int(np.argmax(ptp))}'s chain latency moved by {ptp.max():.2f} "
                        f"cycles between repeats (other work on the GPU?)")
    clock = repeats.clock_ghz
    spread = float(np.ptp(clock) / np.median(clock))
    figures.update(clock_ghz_median=float(np.median(clock)), clock_spread=spread)
    if spread > CLOCK_SPREAD_MAX:
        problems.append(f"the SM clock moved while probing: {clock.min():.3f}-{clock.max():.3f} GHz over SMs and "
                        f"repeats (power or thermal limits, or clock changes by another process)")
    if previous is not None and previous.n_sm == repeats.chain_cycles.shape[1]:
        old_clock = float(np.median(previous.sm_clock_ghz))
        shift = float(np.median(np.median(repeats.chain_cycles, axis=0) - previous.chain_cycles))
        figures.update(previous_clock_ghz=old_clock, previous_shift_cycles=shift)
        if abs(figures["clock_ghz_median"] - old_clock) > CLOCK_SPREAD_MAX * old_clock:
            notes.append(f"the SM clock while probing was {figures['clock_ghz_median']:.3f} GHz, the previous "
                         f"calibration's {old_clock:.3f} GHz: latencies in cycles are not comparable across them")
        if abs(shift) > PREVIOUS_SHIFT_NOTE:
            notes.append(f"the chain map moved by {shift:+.1f} cycles (median) since the previous calibration")
    return Verdict(not problems, tuple(problems), tuple(notes), figures)
