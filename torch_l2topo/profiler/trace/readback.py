"""Reading an enriched trace back: its calibrations, its recorded CTAs and its per-launch metrics.

What trace-summary, the timeline figure and merge_proton() work from. The CTAs come back on the trace's own
clock (their aligned times), so enriching them again keeps them where they were. Every reader checks the fields
it uses and raises TraceFormatError naming the file (`source`) and the event or device for a trace damaged by
hand or cut: never a KeyError, and never a summary of a mangled calibration.
"""
from __future__ import annotations

import math

import numpy as np

from ...errors import TraceFormatError
from ...measure.recording import COLUMNS, CtaRecords
from .kineto import to_ns
from .smmap import SmMap
from .tracefile import L2MAP_PID, MAX_DEVICES, METADATA_KEY
from .tracks import CTA_CATEGORY, LANE_STRIDE, LAUNCH_CATEGORY, LAUNCH_TID

# What the readers take from a launch slice's args: counts (integers >= 0), and figures (numbers, or null)
LAUNCH_COUNTS = ("launch", "ctas", "sms_used", "n_sm", "kernel_ns", "tail_ns")
LAUNCH_FIGURES = ("busy_ns_median", "busy_ns_max", "imbalance", "items", "near_share", "blind_near_share",
                  "slow_decile_busy_share", "slow_decile_sm_share", "placement_saving_ns_estimate",
                  "max_misalignment_ns", "ctas_per_sm", "resident_per_sm", "waves", "last_wave_fill",
                  "last_wave_cost_ns", "regrid_saving_ns_estimate", "slow_sm_cost_ns")
CTA_COUNTS = ("sm", "program", "items", "launch")   # a CTA slice's args ("near" too, where present)
ALIGNMENT_COUNTS = ("records", "matched", "launches", "max_misalignment_ns", "outside", "tick_ns")
COVERAGE_FIGURES = ("kernel_gpu_ns", "kernel_launches", "instrumented_gpu_time_ratio", "triton_launch_coverage")


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _device_of(ev: dict, where: str) -> int:
    """The GPU index of one of our events (its pid: L2MAP_PID + index)."""
    pid = ev.get("pid")
    if not _count(pid) or not L2MAP_PID <= pid < L2MAP_PID + MAX_DEVICES:
        raise TraceFormatError(f"{where} has pid {pid!r}, not one of torch_l2topo's GPU processes")
    return pid - L2MAP_PID


def _coverage_ok(m: dict) -> bool:
    """Whether a device's coverage facts (coverage.py; absent in traces enriched before them) are well formed."""
    rows = m.get("uncovered_kernels", [])
    return all(m.get(k) is None or _number(m[k]) for k in COVERAGE_FIGURES) and isinstance(rows, list) and all(
        isinstance(r, dict) and isinstance(r.get("name"), str) and isinstance(r.get("kind"), str)
        and _count(r.get("launches")) and _count(r.get("gpu_ns")) and _number(r.get("share")) for r in rows)


def require_enriched(trace: dict, source: str) -> dict:
    """The trace's "l2topo" metadata, its fields checked; TraceFormatError for a trace torch_l2topo did not enrich
    or whose metadata was damaged."""
    meta = trace.get(METADATA_KEY)
    if not isinstance(meta, dict) or not isinstance(meta.get("devices"), dict):
        raise TraceFormatError(f"{source} was not enriched by torch_l2topo (no '{METADATA_KEY}' metadata): profile "
                               f"with torch_l2topo.profile or torch_l2topo.profiler.trace_handler")
    notes = meta.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise TraceFormatError(f"{source}: {METADATA_KEY}.notes is not a list of strings")
    for d, m in meta["devices"].items():
        where = f"{source}: {METADATA_KEY}.devices[{d!r}]"
        if not d.isdigit() or int(d) >= MAX_DEVICES or not isinstance(m, dict):
            raise TraceFormatError(f"{where} is not a GPU index with an object of its facts")
        alignment, dropped = m.get("alignment", {}), m.get("dropped", {})
        if not isinstance(alignment, dict) or not all(
                isinstance(a, dict) and all(_number(a.get(k)) for k in ALIGNMENT_COUNTS) for a in alignment.values()):
            raise TraceFormatError(f"{where}.alignment lacks numbers of {', '.join(ALIGNMENT_COUNTS)}")
        if not isinstance(dropped, dict) or not all(_count(v) for v in dropped.values()):
            raise TraceFormatError(f"{where}.dropped is not a count per source")
        if not isinstance(m.get("class_counts", {}), dict):
            raise TraceFormatError(f"{where}.class_counts is not an object")
        if not _coverage_ok(m):
            raise TraceFormatError(f"{where} has malformed coverage ({', '.join(COVERAGE_FIGURES)}, "
                                   f"uncovered_kernels)")
    return meta


def calibrations(trace: dict, source: str = "trace") -> dict:
    """{device: SmMap} of the calibrations an enriched trace carries (TraceFormatError for a damaged one)."""
    devices = (trace.get(METADATA_KEY) or {}).get("devices") or {}
    out = {}
    for d, m in devices.items() if isinstance(devices, dict) else ():
        if not isinstance(m, dict) or not m.get("calibration"):
            continue
        try:
            out[int(d)] = SmMap.from_json(m["calibration"])
        except (KeyError, TypeError, ValueError) as exc:
            raise TraceFormatError(f"{source}: the calibration of GPU {d} is malformed "
                                   f"({type(exc).__name__}: {exc})") from None
    return out


def cta_events(trace: dict, source: str = "trace") -> list:
    """Our CTA slices, each one's args checked (integers sm, program, items, launch; near where present)."""
    out = []
    for i, ev in enumerate(trace["traceEvents"]):
        if ev.get("cat") != CTA_CATEGORY:
            continue
        where = f"{source}: traceEvents[{i}] (a CTA slice)"
        a = ev.get("args")
        _device_of(ev, where)
        if not isinstance(a, dict) or not all(_count(a.get(k)) for k in CTA_COUNTS) or \
                not isinstance(a.get("near", 0), int):
            raise TraceFormatError(f"{where} lacks integer args {', '.join(CTA_COUNTS)}")
        out.append(ev)
    return out


def recorded_ctas(trace: dict, source: str = "recorder", path: str = "trace") -> dict:
    """{device: CtaRecords} of the CTA events of `source` in an enriched trace (the file `path`), on the trace's
    clock."""
    rows: dict = {}
    for ev in cta_events(trace, path):
        a = ev["args"]
        if a.get("source") != source:
            continue
        start = to_ns(ev["ts"])
        rows.setdefault(ev["pid"] - L2MAP_PID, []).append(
            (str(ev.get("name")), a["sm"], a["program"], start, start + to_ns(ev["dur"]), a["items"],
             a.get("near", -1)))
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


def launches(trace: dict, source: str = "trace") -> list:
    """One dict per instrumented launch: device, kernel, ts_ns, dur_ns and the metric args (LAUNCH_COUNTS and
    LAUNCH_FIGURES checked)."""
    out = []
    for i, ev in enumerate(trace["traceEvents"]):
        if ev.get("cat") != LAUNCH_CATEGORY:
            continue
        where = f"{source}: traceEvents[{i}] (a launch slice)"
        device, args = _device_of(ev, where), ev.get("args")
        if not isinstance(args, dict) or not isinstance(args.get("kernel", ev.get("name")), str):
            raise TraceFormatError(f"{where} has no kernel name or no args object")
        bad = [k for k in LAUNCH_COUNTS if not _count(args.get(k))] + \
              [k for k in LAUNCH_FIGURES if args.get(k) is not None and not _number(args[k])]
        if bad:
            raise TraceFormatError(f"{where} has no valid {', '.join(bad)}")
        out.append({"device": device, "kernel": ev["name"], "ts_ns": to_ns(ev["ts"]), "dur_ns": to_ns(ev["dur"]),
                    **args})
    return out


def profiler_steps(trace: dict) -> int:
    """How many profiler steps the trace holds: its distinct "ProfilerStep#N" CPU annotations (0: none)."""
    return len({ev.get("name") for ev in trace["traceEvents"] if ev.get("cat") == "user_annotation"
                and str(ev.get("name", "")).startswith("ProfilerStep#")})


def sm_tracks(trace: dict, device: int, source: str = "trace") -> tuple:
    """(SM ids in the L2 map's track order, {sm: track name}) of one GPU's L2 map process."""
    pid = L2MAP_PID + device
    names, rank = {}, {}
    for i, ev in enumerate(trace["traceEvents"]):
        tid = ev.get("tid")
        if ev.get("ph") != "M" or ev.get("pid") != pid or not _count(tid) or tid == LAUNCH_TID or \
                tid >= LANE_STRIDE or ev.get("name") not in ("thread_name", "thread_sort_index"):
            continue
        a = ev.get("args")
        key, kind = ("name", str) if ev["name"] == "thread_name" else ("sort_index", int)
        if not isinstance(a, dict) or not isinstance(a.get(key), kind):
            raise TraceFormatError(f"{source}: traceEvents[{i}] ({ev['name']} of SM {tid}) has no {key}")
        (names if key == "name" else rank)[tid] = a[key]
    return sorted(names, key=lambda sm: (rank.get(sm, sm), sm)), names
