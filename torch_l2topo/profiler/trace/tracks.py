"""The trace events of the "L2 map": one process per GPU, one track per SM named with its partition and
latency, counters of per-SM latency, the CTAs on their SM's track, and one slice per instrumented launch.

Tracks (threads of the process L2MAP_PID + device) are sorted by partition, then latency (SmMap.order), so
the map reads top to bottom from the fastest SM of partition 0. CTAs resident on one SM at the same time
would overlap on one track, which trace viewers draw wrongly (slices on a track must nest), so an SM gets
further lanes, "SM 43 · p1 · 297.1 cyc ·2", as its CTAs need: tid = sm + lane * LANE_STRIDE. The per-launch
slices sit on their own track above the SMs (tid LAUNCH_TID), named like the kernel, their args the
metrics of metrics.py. Times: trace ns in, Kineto's microseconds out.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from . import jsonrows
from .tracefile import L2MAP_PID

LANE_STRIDE = 1 << 16           # tid = sm + lane * LANE_STRIDE (sm < 65536 on any GPU)
LAUNCH_TID = (1 << 31) - 1      # the per-launch track, sorted first
CTA_CATEGORY = "l2topo.cta"
LAUNCH_CATEGORY = "l2topo.launch"
COUNTER_CATEGORY = "l2topo.latency"
NO_CORRELATION = -(1 << 31)     # launch_event


def pid_of(device: int) -> int:
    return L2MAP_PID + device


def us(ns) -> float:
    return round(float(ns) / 1000.0, 3)


def lanes(sm: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per CTA, the lowest lane of its SM free at its start (greedy in start order; a lane is free once its last
    CTA has ended). Vectorized across SMs: step k places the k-th CTA of every SM at once, against a matrix of
    each SM's lanes and the time each frees up (a plain launch puts 10^2-10^3 CTAs on an SM per cycle)."""
    lane = np.zeros(len(sm), np.int64)
    order = np.lexsort((start, sm))
    s_sorted, st, en = sm[order], start[order], end[order]
    same = s_sorted[1:] == s_sorted[:-1]
    if not (same & (st[1:] < en[:-1])).any():
        return lane  # the common case: one CTA at a time on every SM, all in lane 0
    _, first, counts = np.unique(s_sorted, return_index=True, return_counts=True)
    group = np.repeat(np.arange(len(counts)), counts)      # the SM's row in `free`
    rank = np.arange(len(s_sorted)) - np.repeat(first, counts)  # k: the CTA's place in its SM's start order
    by_rank = np.argsort(rank, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(rank))])
    never = np.iinfo(np.int64).min
    free = np.full((len(counts), 1), never, np.int64)     # per SM and lane: when the lane frees up
    placed = np.empty(len(s_sorted), np.int64)
    for k in range(len(bounds) - 1):
        rows = by_rank[bounds[k]:bounds[k + 1]]
        g = group[rows]
        fits = free[g] <= st[rows][:, None]
        if not fits.any(axis=1).all():  # some SM has every lane busy: one more lane for all
            free = np.concatenate([free, np.full((len(counts), 1), never, np.int64)], axis=1)
            fits = free[g] <= st[rows][:, None]
        chosen = fits.argmax(axis=1)  # lanes beyond an SM's used ones never ran a CTA: the lowest free is right
        free[g, chosen] = en[rows]
        placed[rows] = chosen
    lane[order] = placed
    return lane


def process_events(device: int, title: str, sm_names: dict, sort_rank: dict, lanes_used: dict) -> list:
    """Metadata: the process, its per-launch track and one track per SM lane (sm_names: {sm: name};
    sort_rank: {sm: position}; lanes_used: {sm: lanes})."""
    pid = pid_of(device)
    out = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": title}},
           {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}},
           {"ph": "M", "name": "thread_name", "pid": pid, "tid": LAUNCH_TID,
            "args": {"name": "instrumented launches"}},
           {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": LAUNCH_TID, "args": {"sort_index": -1}}]
    for sm, name in sm_names.items():
        for lane in range(max(lanes_used.get(sm, 1), 1)):
            tid = sm + lane * LANE_STRIDE
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                        "args": {"name": name if lane == 0 else f"{name} ·{lane + 1}"}})
            out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                        "args": {"sort_index": sort_rank[sm] * 64 + lane}})
    return out


def latency_counters(device: int, smmap, t0_ns: int, t1_ns: int) -> list:
    """One counter track per SM holding its chain latency (cycles) from t0 to t1, in SmMap.order."""
    pid = pid_of(device)
    out = []
    for sm in smmap.order().tolist():
        name = f"L2 latency SM {sm} (cyc)"
        value = round(float(smmap.chain_cycles[sm]), 2)
        out += [{"ph": "C", "cat": COUNTER_CATEGORY, "name": name, "pid": pid, "ts": us(t), "args": {"cycles": value}}
                for t in (t0_ns, t1_ns)]
    return out


@dataclass(frozen=True)
class CtaSlices:
    """The CTA slices of one kernel from one source on one GPU, kept as columns (a cycle can hold 10^5 CTAs):
    one slice per CTA on its SM's lane, times in trace ns, launch the kernel event's traceEvents index (the key
    that ties a CTA to its launch slice). dicts() gives them as trace events, json() as the same events'
    JSON text (jsonrows: ~10x faster than json.dumps of the dicts)."""

    device: int
    kernel: str
    source: str
    sm: np.ndarray
    program: np.ndarray
    start: np.ndarray
    end: np.ndarray
    items: np.ndarray
    near: np.ndarray
    lane: np.ndarray
    launch: np.ndarray

    def __len__(self) -> int:
        return len(self.sm)

    def _groups(self) -> list:
        """(rows, with near) in writing order: CTAs whose kernel counted near items carry "near" in their args."""
        has = np.asarray(self.near) >= 0
        return [(rows, flag) for rows, flag in ((np.flatnonzero(has), True), (np.flatnonzero(~has), False))
                if len(rows)]

    def _columns(self, rows) -> dict:
        start, end = np.asarray(self.start)[rows], np.asarray(self.end)[rows]
        return {"tid": np.asarray(self.sm)[rows] + np.asarray(self.lane)[rows] * LANE_STRIDE, "ts": start,
                "dur": np.maximum(end - start, 0), "sm": np.asarray(self.sm)[rows],
                "program": np.asarray(self.program)[rows], "items": np.asarray(self.items)[rows],
                "launch": np.asarray(self.launch)[rows], "near": np.asarray(self.near)[rows]}

    def dicts(self) -> list:
        pid, out = pid_of(self.device), []
        for rows, with_near in self._groups():
            c = {k: (np.round(v / 1000.0, 3) if k in ("ts", "dur") else v).tolist()
                 for k, v in self._columns(rows).items()}
            for i in range(len(rows)):
                args = {"sm": c["sm"][i], "program": c["program"][i], "items": c["items"][i],
                        "launch": c["launch"][i], "source": self.source}
                if with_near:
                    args["near"] = c["near"][i]
                out.append({"ph": "X", "cat": CTA_CATEGORY, "name": self.kernel, "pid": pid, "tid": c["tid"][i],
                            "ts": c["ts"][i], "dur": c["dur"][i], "args": args})
        return out

    def json(self) -> bytes:
        """The events of dicts() as JSON text, comma-separated (the inside of a JSON array)."""
        head = (f'{{"ph":"X","cat":{json.dumps(CTA_CATEGORY)},"name":{json.dumps(self.kernel)},'
                f'"pid":{pid_of(self.device)},"tid":')
        names = ["tid", "ts", "dur", "sm", "program", "items", "launch"]
        middle = [',"ts":', ',"dur":', ',"args":{"sm":', ',"program":', ',"items":', ',"launch":']
        blocks = []
        for rows, with_near in self._groups():
            c = self._columns(rows)
            source = f',"source":{json.dumps(self.source)}'
            texts = [head, *middle] + ([f'{source},"near":', "}}"] if with_near else [source + "}}"])
            cols = [c[k] for k in names] + ([c["near"]] if with_near else [])
            blocks.append(jsonrows.rows(texts, cols, [0, 3, 3] + [0] * (len(cols) - 3)))
        return b",".join(blocks)


def launch_event(device: int, kernel: str, start_ns: int, end_ns: int, args: dict) -> dict:
    """The slice of one instrumented launch. Its "correlation" is NO_CORRELATION, an id no profiler event has,
    so tools that link events by correlation link nothing of ours; it also keeps HolisticTraceAnalysis 0.5's
    correlation columns 32 bits wide: it narrows them to the ids' range (int16 for a short run's small ids)
    and later stores event indices there, which fails (pandas >= 3) once our CTA events push a trace past
    32,767 events."""
    return {"ph": "X", "cat": LAUNCH_CATEGORY, "name": kernel, "pid": pid_of(device), "tid": LAUNCH_TID,
            "ts": us(start_ns), "dur": us(end_ns - start_ns), "args": {**args, "correlation": NO_CORRELATION}}
