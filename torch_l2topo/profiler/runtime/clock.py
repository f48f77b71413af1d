"""How a GPU's %globaltimer (the clock of the CTA records) relates to the host's clock (time.time_ns), so that
records can be told apart by the host moments at which profiling cycles start and stop (spool.py) without the
training loop touching the GPU.

A reading: the host notes h0, launches a kernel that reads %globaltimer once (G), waits for it, and notes h1.
The kernel ran between h0 and h1, so the offset (globaltimer - host) lies in [G - h1, G - h0]. The offset is
a property of the two clocks, so the readings of a short burst intersect to an interval narrower than any one of
them. The two clocks drift apart slowly (they are separate oscillators, one of them steered by NTP); a link
allows for DRIFT_PPM per second since it was measured (ClockLink.to_device).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

READINGS = 8          # kernel launches per measurement
DRIFT_PPM = 100.0     # allowed drift between the two clocks since the measurement (align.py allows as much)
RESOLUTION_NS = 1000  # %globaltimer's update step, at worst (32 ns on Hopper, 1 us on some earlier GPUs)


@dataclass(frozen=True)
class ClockLink:
    """globaltimer - host ns lies in [lo_ns, hi_ns], as measured at host time host_ns."""

    lo_ns: int
    hi_ns: int
    host_ns: int

    @property
    def width_ns(self) -> int:
        return self.hi_ns - self.lo_ns

    def to_device(self, host_lo: int, host_hi: int, drift_ppm: float = DRIFT_PPM) -> tuple:
        """(lo, hi): globaltimer ns that contain every moment of the host interval [host_lo, host_hi] (ns)."""
        return (host_lo + self.lo_ns - int(abs(host_lo - self.host_ns) * drift_ppm * 1e-6),
                host_hi + self.hi_ns + int(abs(host_hi - self.host_ns) * drift_ppm * 1e-6))


_words: dict = {}  # device -> the one-word tensor its readings go to (made, and the kernel loaded, once)


def readings(device: int, n: int = READINGS, host_clock=time.time_ns) -> list:
    """n (h0, G, h1) readings on GPU `device` (module docstring), one kernel each; the first measurement on a GPU
    starts with one untimed launch that compiles and loads the kernel (a refresh in the loop skips it)."""
    import torch

    from ...triton_kernels.clock import timer_kernel

    found = []
    with torch.cuda.device(device):
        out = _words.get(device)
        if out is None:
            out = torch.zeros(1, dtype=torch.int64, device=torch.device("cuda", device))
            timer_kernel[(1,)](out, num_warps=1)
            torch.cuda.synchronize()
            _words[device] = out
        for _ in range(n):
            h0 = host_clock()
            timer_kernel[(1,)](out, num_warps=1)
            torch.cuda.synchronize()
            h1 = host_clock()
            found.append((h0, int(out.item()), h1))
    return found


def link_of(found) -> ClockLink:
    """The ClockLink that readings (h0, G, h1) bound: the intersection of their intervals, widened by the timer's
    resolution. Readings that do not intersect (a clock stepped between them) give their union instead: wider,
    still true of each."""
    lows = [g - h1 - RESOLUTION_NS for h0, g, h1 in found]
    highs = [g - h0 + RESOLUTION_NS for h0, g, h1 in found]
    lo, hi = max(lows), min(highs)
    if lo > hi:
        lo, hi = min(lows), max(highs)
    return ClockLink(int(lo), int(hi), int(found[-1][2]))


def measure(device: int, n: int = READINGS) -> ClockLink:
    """GPU `device`'s clock link now, from n readings (each a launch and a wait, tens of microseconds; the first
    measurement in a process also compiles or loads the kernel)."""
    return link_of(readings(device, n))
