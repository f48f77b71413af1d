"""Proton's instrumentation trace read as per-CTA records, for kernels this package does not instrument.

Triton's Proton (`proton.start(name, backend="instrumentation", data="trace")` ... `proton.finalize()`)
writes its own Chrome trace: one "X" event per warp and scope, pid "<kernel> Core<smid> CTA<id> [measure in
clock cycle (assume 1GHz)]", tid "warp <k> (line <l>)". An event's ts is the CTA's %globaltimer start (ns)
plus the warp's clock cycles since the CTA's first event, and dur is cycles, both divided by 1000 as if
cycles were ns at 1 GHz. So a CTA starts at its first event's ts; its length is the cycles from its first
event's start to its last event's end, turned into ns here with the SM's measured clock (SmMap.sm_clock_ghz).
Proton writes each launch's CTAs one after another, every CTA's events together: a CTA seen again after
others marks the next launch of that kernel.

Precision: ts is a double of microseconds; for a %globaltimer counting ns since 1970 that double resolves
only np.spacing(ts) (about 0.25 us), reported as quantum_ns. Older Proton traces without the global time
(CTAs packed at fixed "Kernel Gap" offsets) cannot be placed on a timeline and are refused.
"""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np

from ...errors import TraceFormatError
from ...measure.recording import CtaRecords

CTA_PID = re.compile(r"^(?P<kernel>.+) Core(?P<sm>\d+) CTA(?P<cta>\d+)(?: \[.*\])?$")


def load_proton(path) -> dict:
    """The Proton trace at `path` (JSON, optionally gzipped) as a dict; TraceFormatError when it is not one."""
    path = Path(path)
    raw = path.read_bytes()
    try:
        trace = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceFormatError(f"{path} is not a readable Proton trace ({type(exc).__name__}: {exc})") from None
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise TraceFormatError(f"{path} is not a Chrome trace object with a traceEvents list")
    return trace


def proton_records(trace: dict, clock_ghz: float | np.ndarray = 1.0, source: str = "Proton trace") -> tuple:
    """(CtaRecords, quantum_ns): one record per CTA per launch (program = the CTA id, items = 1, near unknown,
    device None); clock_ghz: the SM clock (a scalar or per SM) that turns cycles into ns."""
    rows = []  # kernel, sm, cta, start_us, end_cycles_us, launch
    launch_of: dict = {}
    seen: dict = {}
    current = None
    for ev in trace["traceEvents"]:
        if not isinstance(ev, dict) or ev.get("ph") != "X" or not isinstance(ev.get("pid"), str):
            continue
        m = CTA_PID.match(ev["pid"])
        if not m or not isinstance(ev.get("ts"), (int, float)) or not isinstance(ev.get("dur"), (int, float)):
            continue
        if "Kernel Gap" in (ev.get("args") or {}):
            raise TraceFormatError(f"{source} was written by a Proton without per-CTA global time (CTAs at fixed "
                                   f"'Kernel Gap' offsets): its CTAs cannot be placed on the trace's timeline")
        kernel, pid = m["kernel"], ev["pid"]
        if pid != current:
            if pid in seen.setdefault(kernel, set()):
                launch_of[kernel] = launch_of.get(kernel, 0) + 1
                seen[kernel] = set()
            seen[kernel].add(pid)
            current = pid
        rows.append((kernel, int(m["sm"]), int(m["cta"]), float(ev["ts"]), float(ev["ts"]) + float(ev["dur"]),
                     launch_of.get(kernel, 0)))
    if not rows:
        raise TraceFormatError(f"{source} holds no Proton CTA events (pid '<kernel> Core<sm> CTA<id>'): not an "
                               f"instrumentation trace, or no instrumented kernel ran")
    kernels = sorted({r[0] for r in rows})
    tag_of = {k: i for i, k in enumerate(kernels)}
    tag, sm, cta, t0, t1, launch = (np.array(c) for c in zip(*rows))
    tag = np.array([tag_of[k] for k in tag], np.int64)
    key = np.stack([tag, launch.astype(np.int64), sm.astype(np.int64), cta.astype(np.int64)], axis=1)
    uniq, inverse = np.unique(key, axis=0, return_inverse=True)
    inverse = inverse.ravel()
    first = np.full(len(uniq), np.inf)
    last = np.full(len(uniq), -np.inf)
    np.minimum.at(first, inverse, t0.astype(float))
    np.maximum.at(last, inverse, t1.astype(float))
    sm_u = uniq[:, 2]
    clock = np.atleast_1d(np.asarray(clock_ghz, float))
    if clock.size == 1:
        ghz = np.full(len(uniq), clock[0])
    else:  # an SM beyond the calibration's (another GPU model): the median clock
        ghz = np.where(sm_u < len(clock), clock[np.minimum(sm_u, len(clock) - 1)], np.median(clock))
    start_ns = np.rint(first * 1000.0).astype(np.int64)
    end_ns = start_ns + np.rint((last - first) * 1000.0 / ghz).astype(np.int64)
    quantum_ns = float(np.spacing(np.abs(np.r_[first, last]).max()) * 1000.0)
    n = len(uniq)
    records = CtaRecords(tag=uniq[:, 0], sm=sm_u, program=uniq[:, 3], start_ns=start_ns, end_ns=end_ns,
                         items=np.ones(n, np.int64), near=np.full(n, -1, np.int64),
                         names={i: k for k, i in tag_of.items()})
    return records, quantum_ns
