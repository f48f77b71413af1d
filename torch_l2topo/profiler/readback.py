"""Reading an enriched trace back: its calibrations, its recorded CTAs and its per-launch metrics.

What trace-summary, the timeline figure and merge_proton() work from. The CTAs come back on the trace's own
clock (their aligned times), so enriching them again keeps them where they were.
"""
from __future__ import annotations

import numpy as np

from ..errors import TraceFormatError
from ..placement.recording import COLUMNS, CtaRecords
from .kineto import to_ns
from .smmap import SmMap
from .tracefile import L2MAP_PID, METADATA_KEY
from .tracks import CTA_CATEGORY, LANE_STRIDE, LAUNCH_CATEGORY, LAUNCH_TID


def require_enriched(trace: dict, source: str) -> dict:
    """The trace's "l2topo" metadata; TraceFormatError for a trace torch_l2topo did not enrich."""
    meta = trace.get(METADATA_KEY)
    if not isinstance(meta, dict) or not isinstance(meta.get("devices"), dict):
        raise TraceFormatError(f"{source} was not enriched by torch_l2topo (no '{METADATA_KEY}' metadata): profile "
                               f"with torch_l2topo.profile or torch_l2topo.profiler.trace_handler")
    return meta


def calibrations(trace: dict) -> dict:
    """{device: SmMap} of the calibrations an enriched trace carries."""
    devices = (trace.get(METADATA_KEY) or {}).get("devices") or {}
    return {int(d): SmMap.from_json(m["calibration"]) for d, m in devices.items() if m.get("calibration")}


def recorded_ctas(trace: dict, source: str = "recorder") -> dict:
    """{device: CtaRecords} of the CTA events of `source` in an enriched trace, on the trace's clock."""
    rows: dict = {}
    for ev in trace["traceEvents"]:
        if ev.get("cat") != CTA_CATEGORY or (ev.get("args") or {}).get("source") != source:
            continue
        a = ev["args"]
        start = to_ns(ev["ts"])
        rows.setdefault(ev["pid"] - L2MAP_PID, []).append(
            (ev["name"], a["sm"], a["program"], start, start + to_ns(ev["dur"]), a["items"], a.get("near", -1)))
    devices = (trace.get(METADATA_KEY) or {}).get("devices") or {}
    out = {}
    for device, r in rows.items():
        meta = devices.get(str(device)) or {}
        names = sorted({row[0] for row in r})
        tag_of = {n: i for i, n in enumerate(names)}
        cols = np.array([(tag_of[row[0]], *row[1:]) for row in r], dtype=np.int64).T
        classes = {tag_of[n]: v for n, v in (meta.get("class_counts") or {}).items() if n in tag_of}
        out[device] = CtaRecords(*cols[:len(COLUMNS)], names={i: n for n, i in tag_of.items()}, class_counts=classes,
                                 dropped=int((meta.get("dropped") or {}).get(source, 0)), device=device)
    return out


def launches(trace: dict) -> list:
    """One dict per instrumented launch: device, kernel, ts_ns, dur_ns and the metric args."""
    return [{"device": ev["pid"] - L2MAP_PID, "kernel": ev["name"], "ts_ns": to_ns(ev["ts"]),
             "dur_ns": to_ns(ev["dur"]), **(ev.get("args") or {})}
            for ev in trace["traceEvents"] if ev.get("cat") == LAUNCH_CATEGORY]


def sm_tracks(trace: dict, device: int) -> tuple:
    """(SM ids in the L2 map's track order, {sm: track name}) of one GPU's L2 map process."""
    pid = L2MAP_PID + device
    names, rank = {}, {}
    for ev in trace["traceEvents"]:
        if ev.get("ph") != "M" or ev.get("pid") != pid or ev.get("tid") in (None, LAUNCH_TID) or \
                ev["tid"] >= LANE_STRIDE:
            continue
        if ev.get("name") == "thread_name":
            names[ev["tid"]] = ev["args"]["name"]
        elif ev.get("name") == "thread_sort_index":
            rank[ev["tid"]] = ev["args"]["sort_index"]
    return sorted(names, key=lambda sm: (rank.get(sm, sm), sm)), names
