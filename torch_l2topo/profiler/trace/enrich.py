"""Enrich a PyTorch profiler (Kineto) trace with the L2 map and per-CTA timelines: the post-processing step.

enrich() takes a trace as loaded (tracefile.load_trace), the calibration of each GPU (SmMap), the per-CTA
records drained from the recorders and, optionally, Proton's CTAs, and returns a new trace with, per GPU:
- under the top-level key "l2topo": the calibration (devices -> index -> calibration), what was aligned and
  how well (alignment per source: records matched, offset, max misalignment in ns), dropped records, notes,
  and what part of the GPU's kernel time has CTA tracks (coverage.py);
- an "L2 map" process (tracks.py): one track per SM, latency counters, every aligned CTA on its SM's track,
  one slice per instrumented launch whose args are the metrics of metrics.py.
The Kineto events are copied untouched, so tools reading the plain trace (HolisticTraceAnalysis, Perfetto)
see the same kernels. Enriching an enriched trace first strips what the previous run added.
enrich_file() does the same on files, writing atomically and never touching the input when anything fails.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...measure.recording import CtaRecords
from ...version import __version__
from .align import TICK_NS, align
from .coverage import coverage, triton_names
from .kineto import Kernels, device_sm_counts, kernels_by_device, time_range_ns
from .metrics import launch_metrics
from .tracefile import METADATA_KEY, dumps, load_trace, strip, write_trace
from .tracks import CtaSlices, lanes, latency_counters, launch_event, process_events

RECORDER, PROTON = "recorder", "proton"
_COLUMNS = ("group", "sm", "program", "start", "end", "items", "near", "launch", "misalignment")


def _proton_by_device(kernels: dict, proton: CtaRecords) -> dict:
    """{device: Proton's records of the kernels that ran there}: Proton does not say which GPU ran a CTA, so
    each kernel goes to the GPU whose trace has the most launches of that name."""
    parts: dict = {}
    for name in proton.kernel_names():
        counts = {d: len(k.of_name(name)) for d, k in kernels.items()}
        if counts and max(counts.values()) > 0:
            parts.setdefault(max(counts, key=counts.get), []).append(proton.of_kernel(name))
    return {d: CtaRecords.concat(p) for d, p in parts.items()}


def _aligned_columns(kernels: Kernels, sources: list, tick_ns: int) -> tuple:
    """(int64 columns of every CTA that fell inside a kernel event, [(kernel, source)] that column "group"
    indexes, {source: alignment summary}). A launch that our recorder covered keeps only its CTAs (Proton's,
    from scopes in the same kernel, would duplicate them)."""
    parts, groups, summaries = [], [], {}
    for source, recs, quantum in sources:
        if not len(recs):
            continue
        al = align(kernels, recs)
        summaries[source] = {**al.summary(tick_ns + int(np.ceil(quantum))), "quantum_ns": quantum}
        keep = al.kernel >= 0
        tags, tag_index = np.unique(recs.tag[keep], return_inverse=True)
        codes = np.array([len(groups) + i for i in range(len(tags))], np.int64)
        groups += [(recs.names[t], source) for t in tags.tolist()]
        parts.append({"group": codes[tag_index], "sm": recs.sm[keep], "program": recs.program[keep],
                      "start": al.start[keep], "end": al.end[keep], "items": recs.items[keep],
                      "near": recs.near[keep], "launch": al.kernel[keep], "misalignment": al.misalignment_ns[keep]})
    cols = {k: np.concatenate([p[k] for p in parts]) if parts else np.zeros(0, np.int64) for k in _COLUMNS}
    source = np.array([src for _, src in groups] or [""], dtype=object)[cols["group"]]
    duplicate = (source == PROTON) & np.isin(cols["launch"], cols["launch"][source == RECORDER])
    return {k: v[~duplicate] for k, v in cols.items()}, groups, summaries


def _tracks(smmap, n_sm: int, sms_seen) -> tuple:
    """({sm: track name}, {sm: sort rank}) for every SM of the device and any SM id beyond it seen in records."""
    sms = sorted(set(range(n_sm)) | set(sms_seen))
    if smmap is None:
        return {s: f"SM {s}" for s in sms}, {s: s for s in sms}
    rank = {int(s): i for i, s in enumerate(smmap.order())}
    names = {s: smmap.track_name(s) if s < n_sm else f"SM {s}" for s in sms}
    return names, {s: rank.get(s, s) for s in sms}


def _device_events(device: int, kernels: Kernels, smmap, sources: list, trace_range, base_events, tick_ns: int,
                   n_sm: int, triton_kernels=None) -> tuple:
    """(events, CTA slices, metadata) of one GPU: its L2 map process, launch slices and CTAs, and in the metadata
    what part of its kernel time they cover (coverage.py)."""
    c, groups, summaries = _aligned_columns(kernels, sources, tick_ns)
    class_counts = {recs.names[t]: v for _, recs, _ in sources for t, v in recs.class_counts.items()}
    meta = {"calibration": None if smmap is None else smmap.to_json(), "alignment": summaries,
            "dropped": {source: int(recs.dropped) for source, recs, _ in sources}, "class_counts": class_counts,
            **coverage(kernels, np.unique(c["launch"]), triton_kernels)}
    lane = lanes(c["sm"], c["start"], c["end"])
    names, rank = _tracks(smmap, n_sm, c["sm"].tolist())
    lanes_used = {s: int(lane[c["sm"] == s].max()) + 1 for s in np.unique(c["sm"]).tolist()}
    title = f"L2 map · GPU {device}" + (f" · {smmap.device['name']}" if smmap and smmap.device.get("name") else "")
    events = process_events(device, title, names, rank, lanes_used)
    if smmap is not None and trace_range[0] is not None:
        events += latency_counters(device, smmap, *trace_range)
    slices = []
    for g in sorted(np.unique(c["group"]).tolist(), key=groups.__getitem__):
        rows = c["group"] == g
        name, source = groups[g]
        slices.append(CtaSlices(device, name, source, *(c[k][rows] for k in ("sm", "program", "start", "end", "items",
                                                                             "near")),
                                lane[rows], kernels.index[c["launch"][rows]]))
    for k in np.unique(c["launch"]).tolist():
        rows = c["launch"] == k
        name = str(kernels.names[k])
        kineto_args = base_events[kernels.index[k]].get("args") or {}
        args = {"kernel": name, "source": groups[int(c["group"][rows][0])][1], "launch": int(kernels.index[k]),
                "kineto_correlation": kineto_args.get("correlation"),
                "max_misalignment_ns": int(c["misalignment"][rows].max()),
                **launch_metrics(c["sm"][rows], c["start"][rows], c["end"][rows], c["items"][rows], c["near"][rows],
                                 n_sm, int(kernels.end_ns[k] - kernels.start_ns[k]), smmap, class_counts.get(name))}
        events.append(launch_event(device, name, int(kernels.start_ns[k]), int(kernels.end_ns[k]), args))
    return events, slices, meta


def _no_kernels(device: int) -> Kernels:
    empty = np.zeros(0, np.int64)
    return Kernels(device, np.zeros(0, dtype=object), empty, empty, empty, empty)


@dataclass
class Enrichment:
    """What enrichment adds to a trace: events (dicts: the L2 map processes, counters, launch slices), the CTA
    slices (columns) and the metadata; base is the trace without anything of ours."""

    base: dict
    events: list
    slices: list
    meta: dict

    def trace(self) -> dict:
        """The enriched trace as a dict."""
        out = dict(self.base)
        out["traceEvents"] = self.base["traceEvents"] + self.events + [ev for s in self.slices for ev in s.dicts()]
        out[METADATA_KEY] = self.meta
        return out

    def fragments(self) -> list:
        """The added events as JSON text pieces (tracefile.splice's fragments), in trace()'s order."""
        return [dumps(self.events)[1:-1]] + [s.json() for s in self.slices]


def enrichment(trace: dict, *, maps: dict | None = None, records: dict | None = None,
               proton: CtaRecords | None = None, proton_quantum_ns: float = 0.0, tick_ns: int = TICK_NS,
               notes=(), triton_kernels: dict | None = None) -> Enrichment:
    """What enrich() adds to `trace`, not yet joined to it (the writer splices it into the profiler's text)."""
    triton_names(triton_kernels)  # a bad argument fails here, before any work
    base = strip(trace)
    kernels = kernels_by_device(base)
    sm_counts = device_sm_counts(base)
    maps, notes = dict(maps or {}), list(notes)
    sources: dict = {}
    for d, recs in (records or {}).items():
        sources.setdefault(d, []).append((RECORDER, recs, 0.0))
    if proton is not None and len(proton):
        placed = _proton_by_device(kernels, proton)
        for d, recs in placed.items():
            sources.setdefault(d, []).append((PROTON, recs, float(proton_quantum_ns)))
        missing = sorted(set(proton.kernel_names()) - {n for r in placed.values() for n in r.kernel_names()})
        if missing:
            notes.append(f"Proton kernels without a launch in this trace: {', '.join(missing)}")
    for d in list(maps):
        if d in sm_counts and maps[d].n_sm != sm_counts[d]:
            notes.append(f"GPU {d}: the calibration has {maps[d].n_sm} SMs, the trace's device {sm_counts[d]} (MIG, "
                         f"or another GPU): its map is left out")
            del maps[d]
    meta = {"version": __version__, "tick_ns": tick_ns, "devices": {}, "notes": notes}
    if triton_kernels is not None:  # the cycle's Triton kernels as the process knew them (plain ones with why)
        meta["triton_kernels"] = triton_kernels
    events, slices, trace_range = [], [], time_range_ns(base)
    # with the Triton kernels named, every GPU with kernels gets its coverage, CTAs or not
    for d in sorted(set(maps) | set(sources) | (set(kernels) if triton_kernels is not None else set())):
        src = sources.get(d, [])
        seen = [int(r.sm.max()) + 1 for _, r, _ in src if len(r)]
        n_sm = maps[d].n_sm if d in maps else sm_counts.get(d, max(seen, default=1))
        ev, sl, meta["devices"][str(d)] = _device_events(d, kernels.get(d, _no_kernels(d)), maps.get(d), src,
                                                         trace_range, base["traceEvents"], tick_ns, n_sm,
                                                         triton_kernels)
        events += ev
        slices += sl
    return Enrichment(base, events, slices, meta)


def enrich(trace: dict, **options) -> dict:
    """The enriched copy of `trace` (module docstring); `trace` itself is not modified. Options (enrichment's):
    maps: {device: SmMap}; records: {device: CtaRecords}; proton: Proton's CTAs and proton_quantum_ns, the
    quantum of their timestamps (proton_trace.proton_records); tick_ns; notes: lines for the metadata (what
    was skipped and why); triton_kernels: {"instrumented": [names], "plain": [names]}, the Triton kernels the
    process knew in the cycle (coverage.py; None: not known, and only GPUs with a map or records are shown)."""
    return enrichment(trace, **options).trace()


def enrich_file(src, dst=None, **options):
    """Enrich the trace file `src` into `dst` (default: replace `src` once the enriched trace is written; .gz
    names are gzipped). Any error leaves `src` as it was. Returns the destination path."""
    return write_trace(enrich(load_trace(src), **options), dst or src)
