"""Timing GPU work with CUDA events, and the one way its spread is judged.

Measurement (modelled on torch.utils.benchmark's): the times of one thing, with their median, quantiles, IQR
and a relative spread, and a one-line repr to read at a glance. Interval: two CUDA events around work queued
on a stream, read without blocking (done()) or by waiting (ms()). interleaved(): several launches timed side
by side in rounds, so that drift (clocks; on the H200, L2 latency states lasting milliseconds to seconds)
touches each alike.

The spread is (p80 - p20) / median everywhere: the benchmarks' rows keep p20, p50 and p80, and the geometry
suite calls a layout fix an effect only beyond it. Unlike a standard deviation it ignores the odd slow sample
(a launch that met a clock change) and unlike the range it does not grow with the number of samples.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

SPREAD_QUANTILES = (0.2, 0.8)


@dataclass(frozen=True)
class Measurement:
    """times: one value per sample, in run order (`unit`, "ms" for CUDA events). label: what was timed."""

    times: tuple
    unit: str = "ms"
    label: str = ""

    def __post_init__(self):
        times = tuple(float(t) for t in np.asarray(self.times, dtype=np.float64).ravel())
        if not times:
            raise ValueError(f"a Measurement needs at least one time{' of ' + self.label if self.label else ''}")
        if not all(math.isfinite(t) for t in times):
            raise ValueError(f"times must be finite, got {times}")
        object.__setattr__(self, "times", times)

    @property
    def n(self) -> int:
        return len(self.times)

    @property
    def median(self) -> float:
        return float(np.median(self.times))

    @property
    def mean(self) -> float:
        return float(np.mean(self.times))

    def quantile(self, q: float) -> float:
        """The q-quantile of the times (numpy's linear interpolation), q in [0, 1]."""
        if not 0 <= q <= 1:
            raise ValueError(f"q must be in [0, 1], got {q!r}")
        return float(np.quantile(self.times, q))

    @property
    def iqr(self) -> float:
        """Interquartile range: p75 - p25, in `unit`."""
        return self.quantile(0.75) - self.quantile(0.25)

    @property
    def spread(self) -> float:
        """(p80 - p20) / median: the relative spread every comparison of times in the package uses (0 for a
        single sample; infinite when the median is 0 but the times differ)."""
        lo, hi = (self.quantile(q) for q in SPREAD_QUANTILES)
        if hi == lo:
            return 0.0
        return (hi - lo) / self.median if self.median > 0 else math.inf

    def quantiles(self) -> dict:
        """{"p20", "p50", "p80", "n"}: a benchmark row's figures."""
        lo, hi = (self.quantile(q) for q in SPREAD_QUANTILES)
        return {"p20": lo, "p50": self.median, "p80": hi, "n": self.n}

    def __repr__(self) -> str:
        name = f" {self.label}" if self.label else ""
        return (f"<Measurement{name}: median {_readable(self.median, self.unit)}, IQR {_readable(self.iqr, self.unit)}"
                f" ({_readable(self.quantile(0.25), self.unit)} to {_readable(self.quantile(0.75), self.unit)}), "
                f"spread {100 * self.spread:.1f}%, {self.n} times>")


_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def _readable(value: float, unit: str) -> str:
    """value in `unit` with 3 significant figures, shown in the time unit that keeps it >= 1 (as torch's)."""
    if unit not in _SECONDS:
        return f"{value:.3g} {unit}"
    seconds = value * _SECONDS[unit]
    for name in ("s", "ms", "us", "ns"):
        if abs(seconds) >= _SECONDS[name] or name == "ns":
            return f"{seconds / _SECONDS[name]:.3g} {name}"


class Interval:
    """Two CUDA events around the work queued on a stream (default: the current one) inside the block:

        with Interval() as t:
            launch()
        t.done()   # has the work finished? never blocks
        t.ms()     # the elapsed GPU time in milliseconds, waiting for the work if needed
    """

    def __init__(self, stream=None):
        import torch

        self.stream = stream
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def __enter__(self) -> "Interval":
        self.start.record(self.stream)
        return self

    def __exit__(self, *exc) -> None:
        self.end.record(self.stream)

    def done(self) -> bool:
        return bool(self.end.query())

    def ms(self) -> float:
        self.end.synchronize()
        return float(self.start.elapsed_time(self.end))


def interleaved(launches: Mapping[str, Callable[[], object]], rounds: int, *, warmup: int = 1,
                per_sample: int = 1, alternate: bool = True, wait_each: bool = False) -> dict:
    """{name: Measurement of ms per launch}: `warmup` untimed rounds, then `rounds` timed ones, each running
    every launch once, side by side. A sample: per_sample launches back to back in one Interval, divided by
    per_sample. alternate: every other round runs the launches in reverse order, so that a drift within a
    round favours none. wait_each: wait for each sample before queuing the next; the host's launch time then
    counts once per sample (per_sample > 1 spreads it), where otherwise the host runs ahead and, while the GPU
    is busy, its launch time is hidden."""
    if rounds < 1 or warmup < 0 or per_sample < 1:
        raise ValueError(f"need rounds >= 1, warmup >= 0, per_sample >= 1; got {rounds}, {warmup}, {per_sample}")
    names = list(launches)
    for _ in range(warmup):
        for name in names:
            launches[name]()
    samples = {name: [] for name in names}
    for r in range(rounds):
        for name in (names[::-1] if alternate and r % 2 else names):
            with Interval() as interval:
                for _ in range(per_sample):
                    launches[name]()
            if wait_each:
                interval.ms()
            samples[name].append(interval)
    return {name: Measurement([s.ms() / per_sample for s in got], label=name) for name, got in samples.items()}
