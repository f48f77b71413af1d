"""The GPU kernels of a Kineto trace, per device, as numpy columns in integer nanoseconds.

Kineto writes ts and dur in microseconds with three decimals; here they become int64 ns (ts * 1000 rounded),
the clock the per-CTA records are aligned to. The device of a kernel is its args["device"] when present, else
its pid (Kineto's GPU lanes use the device index as pid).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KERNEL_CATEGORY = "kernel"


@dataclass(frozen=True)
class Kernels:
    """One device's kernel events in time order: names, start/end ns, stream and the event's index in
    traceEvents."""

    device: int
    names: np.ndarray   # object (str)
    start_ns: np.ndarray
    end_ns: np.ndarray
    stream: np.ndarray
    index: np.ndarray

    def __len__(self) -> int:
        return len(self.names)

    def of_name(self, name: str) -> np.ndarray:
        """Positions (into these columns) of the kernels `name` designates (kernel_matches)."""
        return np.flatnonzero([kernel_matches(n, name) for n in self.names])


def kernel_matches(event_name: str, kernel: str) -> bool:
    """Whether a Kineto kernel name is the kernel `kernel`: Triton kernels appear under their function name;
    CUDA C++ kernels under a demangled signature ("void ns::kernel<...>(...)"), matched on the bare name."""
    if event_name == kernel:
        return True
    at = event_name.find(kernel)
    while at >= 0:
        before = event_name[at - 1] if at else " "
        after = event_name[at + len(kernel):at + len(kernel) + 1]
        if before in " :*&" and after in ("", "<", "("):
            return True
        at = event_name.find(kernel, at + 1)
    return False


def to_ns(us) -> int:
    return int(round(float(us) * 1000.0))


def kernels_by_device(trace: dict) -> dict:
    """{device index: Kernels} of every GPU kernel event in the trace."""
    rows: dict = {}
    for i, ev in enumerate(trace["traceEvents"]):
        if ev.get("ph") != "X" or ev.get("cat") != KERNEL_CATEGORY:
            continue
        args = ev.get("args") or {}
        device = args.get("device", ev.get("pid"))
        if not isinstance(device, int):
            continue
        start = to_ns(ev["ts"])
        rows.setdefault(device, []).append((str(ev.get("name", "")), start, start + to_ns(ev["dur"]),
                                            int(args.get("stream", ev.get("tid", 0)) or 0), i))
    out = {}
    for device, r in sorted(rows.items()):
        r.sort(key=lambda row: (row[1], row[4]))
        names, start, end, stream, index = zip(*r)
        out[device] = Kernels(device, np.array(names, dtype=object), np.array(start, np.int64),
                              np.array(end, np.int64), np.array(stream, np.int64), np.array(index, np.int64))
    return out


def device_sm_counts(trace: dict) -> dict:
    """{device index: SM count} from Kineto's deviceProperties (empty where the trace has none)."""
    out = {}
    for prop in trace.get("deviceProperties") or []:
        if isinstance(prop, dict) and isinstance(prop.get("id"), int) and isinstance(prop.get("numSms"), int):
            out[prop["id"]] = prop["numSms"]
    return out


def time_range_ns(trace: dict) -> tuple:
    """(first ts, last ts + dur) over the trace's timed events, in ns (None, None) for an empty trace."""
    lo, hi = None, None
    for ev in trace["traceEvents"]:
        if ev.get("ph") in ("X", "i", "I", "C", "B", "E") and isinstance(ev.get("ts"), (int, float)):
            t0 = to_ns(ev["ts"])
            t1 = t0 + (to_ns(ev["dur"]) if isinstance(ev.get("dur"), (int, float)) else 0)
            lo = t0 if lo is None else min(lo, t0)
            hi = t1 if hi is None else max(hi, t1)
    return lo, hi
