"""Traces with known answers for the profiler's CPU tests: a real torch.profiler trace recorded on the CPU, with
GPU kernel events written the way Kineto writes them on a GPU (cat "kernel", pid = device, ts/dur in us)
and per-CTA records placed inside those kernels at a known clock offset, so every aligned time, every busy
time and every tail is known before the code under test runs.
"""
from __future__ import annotations

import json

import numpy as np

from torch_l2topo.measure.recording import CtaRecords

# A %globaltimer reading (ns since 1970) and the offset Kineto's clock sits at from it in these traces.
GLOBALTIMER_T0 = 1_790_000_000_000_000_000
KINETO_MINUS_GLOBALTIMER = -1_784_721_005_612_345_678


def cpu_trace(tmp_path) -> dict:
    """A real Kineto trace of a small CPU model (what torch.profiler exports on this machine)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            model(torch.randn(32, 64)).sum()
    path = tmp_path / "cpu_trace.json"
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text())


def add_kernels(trace: dict, device: int, launches, n_sm: int = 132, stream: int = 7) -> dict:
    """`trace` with GPU kernel events appended: launches = [(name, start_ns, dur_ns)] on the Kineto clock, and
    the device in deviceProperties."""
    events = list(trace["traceEvents"])
    for i, (name, start, dur) in enumerate(launches):
        events.append({"ph": "X", "cat": "kernel", "name": name, "pid": device, "tid": stream,
                       "ts": round(start / 1000, 3), "dur": round(dur / 1000, 3),
                       "args": {"device": device, "stream": stream, "correlation": 1000 * device + i,
                                "grid": [n_sm, 1, 1], "block": [128, 1, 1]}})
    props = [p for p in trace.get("deviceProperties") or [] if p.get("id") != device]
    props.append({"id": device, "name": "NVIDIA H200", "numSms": n_sm, "computeMajor": 9, "computeMinor": 0})
    return {**trace, "traceEvents": events, "deviceProperties": props}


def kineto_start_ns(trace: dict) -> int:
    """A time inside the CPU trace's span, on its clock: where the synthetic kernels go."""
    ts = [ev["ts"] for ev in trace["traceEvents"] if ev.get("ph") == "X"]
    return int(round(min(ts) * 1000))


def ctas_inside(launch_starts_gt, n_ctas, sms, cta_ns, gap_ns, items=None, near=None, tag=0,
                name="row_sum_kernel", device=0) -> CtaRecords:
    """CTA records on the globaltimer clock: launch k's CTAs start at launch_starts_gt[k] + j * gap_ns on SM
    sms[j] and last cta_ns[j] (rounded to 32 ns ticks, as %globaltimer on Hopper)."""
    rows = []
    for start in launch_starts_gt:
        for j in range(n_ctas):
            t0 = (start + j * gap_ns) // 32 * 32
            rows.append((tag, sms[j], j, t0, (t0 + cta_ns[j]) // 32 * 32,
                         1 if items is None else items[j], -1 if near is None else near[j]))
    cols = np.array(rows, dtype=np.int64).T
    return CtaRecords(*cols, names={tag: name}, device=device)


def proton_trace(kernel: str, launches, clock_ghz: float, warps: int = 4) -> dict:
    """A Proton instrumentation trace as Proton writes it: launches = [[(sm, cta, start_globaltimer_ns,
    cycles)]]; each warp's one scope spans the CTA's first cycles up to `cycles` (warp w ends w * 10 cycles
    early), ts = (cycle offset + CTA start ns) / 1000 and dur = cycles / 1000 "at 1 GHz". The CTA then truly
    lasts cycles / clock_ghz ns. Launches are written one after the other, each CTA's warps together."""
    events = []
    for ctas in launches:
        for sm, cta, start, cycles in sorted(ctas):
            for w in range(warps):
                events.append({"cname": "blue", "name": "k", "cat": kernel, "ph": "X",
                               "pid": f"{kernel} Core{sm} CTA{cta} [measure in clock cycle (assume 1GHz)]",
                               "tid": f"warp {w} (line 0)", "ts": start / 1000.0, "dur": (cycles - 10 * w) / 1000.0,
                               "args": {"Unit": "GPU cycle"}})
    return {"displayTimeUnit": "ns", "traceEvents": events}
