"""How the GPU's %globaltimer relates to the host's clocks over time, and to the Kineto trace's clock (issue 17:
the profiler tells one cycle's CTA records from the next by host time, torch_l2topo/profiler/runtime/clock.py).

1. Every --every seconds for --seconds: a clock link (clock.measure: READINGS launches of a kernel that reads
   %globaltimer, each bracketed by host times) against time.time_ns (CLOCK_REALTIME) and time.monotonic_ns;
   per clock, the interval's width (quantiles), and a straight line through the intervals' midpoints: its
   slope (the drift, ppm) and the largest residual (ns).
2. What measuring a link again costs where profile() does it (session.HeldCycles.windows: in the trace handler,
   the GPU just synchronized, REFRESH_READINGS readings): host microseconds per measurement.
3. Kineto: a torch.profiler cycle of the recorder's demo kernel, its CTA records aligned to the trace's kernel
   events (align.py): the offset Kineto ns - %globaltimer ns, against minus the link to time.time_ns measured
   just before: their sum is how far Kineto's clock is from time.time_ns.

    python benchmarks/diagnose/diag_gpu_clock.py --device 0 --out benchmarks/results/diagnosis/gpu_clock_h100.json
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
from common import gpu_parser, quantiles, write_result

from torch_l2topo.measure import recording
from torch_l2topo.profiler import session
from torch_l2topo.profiler.demo import row_sums
from torch_l2topo.profiler.runtime import clock
from torch_l2topo.profiler.trace import align, kineto
from torch_l2topo.profiler.trace.tracefile import load_trace

CLOCKS = {"time_ns": time.time_ns, "monotonic_ns": time.monotonic_ns}


def drift(dev, seconds: float, every: float) -> dict:
    """Part 1 (module docstring)."""
    samples = {name: [] for name in CLOCKS}
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        for name, host_clock in CLOCKS.items():
            link = clock.link_of(clock.readings(dev.index, host_clock=host_clock))
            samples[name].append((link.host_ns, link.lo_ns, link.hi_ns))
        time.sleep(every)
    out = {}
    for name, rows in samples.items():
        h, lo, hi = (np.array(c, dtype=np.float64) for c in zip(*rows))
        mid = (lo + hi) / 2
        t = (h - h[0]) / 1e9
        slope, icpt = np.polyfit(t, mid - mid[0], 1)
        resid = (mid - mid[0]) - (slope * t + icpt)
        out[name] = {"samples": len(rows), "width_ns": quantiles(hi - lo), "drift_ppm": float(slope / 1e3),
                     "max_abs_residual_ns": float(np.abs(resid).max()), "span_s": float(t[-1]),
                     "offset_first_ns": [int(lo[0]), int(hi[0])], "offset_last_ns": [int(lo[-1]), int(hi[-1])]}
        print(name, out[name], flush=True)
    return out


def refresh_cost(dev, n: int = 50) -> dict:
    """Part 2 (module docstring)."""
    us = []
    for _ in range(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        clock.measure(dev.index, session.REFRESH_READINGS)
        us.append((time.perf_counter() - t) * 1e6)
    out = {"readings": session.REFRESH_READINGS, "host_us": quantiles(us)}
    print("refresh:", out, flush=True)
    return out


def kineto_offset(dev) -> dict:
    """Part 3 (module docstring)."""
    x = torch.randn(65_536, 64, device=dev)
    row_sums(x)  # compiles both variants' first
    with recording.recording([dev.index]):
        row_sums(x)
    torch.cuda.synchronize()
    rec = recording.recorder(dev.index)
    rec.reset()
    link = clock.measure(dev.index)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        with torch.profiler.profile(activities=acts) as prof, recording.recording([dev.index]):
            for _ in range(3):
                row_sums(x)
        prof.export_chrome_trace(str(path))
        trace = load_trace(path)
    records = rec.drain()
    base = int(trace.get("baseTimeNanoseconds", 0))
    found = align.align(kineto.kernels_by_device(trace)[dev.index], records)
    kineto_minus_gpu = found.offset_ns + base  # absolute Kineto ns - %globaltimer ns
    out = {"alignment": found.summary(), "base_time_ns": base, "kineto_minus_globaltimer_ns": kineto_minus_gpu,
           "globaltimer_minus_time_ns": [link.lo_ns, link.hi_ns],
           "kineto_minus_time_ns": [kineto_minus_gpu + link.lo_ns, kineto_minus_gpu + link.hi_ns]}
    print(out, flush=True)
    return out


def main(argv=None) -> dict:
    parser = gpu_parser(__doc__, reps=0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--every", type=float, default=0.25)
    args = parser.parse_args(argv)
    dev = torch.device("cuda", args.device)
    torch.cuda.set_device(dev)
    figures = {"links": drift(dev, args.seconds, args.every), "refresh": refresh_cost(dev),
               "kineto": kineto_offset(dev), "readings_per_link": clock.READINGS}
    write_result(args.out, figures, args.device)
    return figures


if __name__ == "__main__":
    main()
