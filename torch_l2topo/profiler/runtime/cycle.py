"""One profiled cycle's enrichment: the job that TraceHandler runs itself, or hands to a trace worker process
(worker.py) so that the training loop does not wait for it.

A CycleJob carries everything the enrichment needs and nothing that needs the GPU: the path of the cycle's
trace, which the profiler has already exported there (the plain trace), the CTA records already drained (or
where the spool puts them: spool.py), and the calibrations already looked up, so the same job gives the same
file wherever it runs. run() replaces the plain trace with its enriched version atomically, or leaves it as it
is and says why: it never raises for anything the trace, the records or the disk do (docs/profiler.md, Safety).
"""
from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from ..trace.enrich import enrichment
from ..trace.kineto import kernels_by_device
from ..trace.tracefile import dumps, is_ours, parse, read_text, splice, write_trace
from .spool import load_records


@dataclass
class CycleJob:
    """path: the cycle's trace as the profiler exported it, replaced by the enriched trace; records: {device:
    CtaRecords or spool.SpooledRecords}; maps: {device: SmMap or None}; notes: {device, or None for the whole
    trace: why there is no map}; given: devices whose calibration the caller gave (their map is shown even
    without kernels); triton_kernels: {"instrumented": [names], "plain": [names]}, the Triton kernels the process
    knew in the cycle (None: not known; trace/coverage.py)."""

    path: str | Path
    records: dict = field(default_factory=dict)
    maps: dict = field(default_factory=dict)
    notes: dict = field(default_factory=dict)
    given: tuple = ()
    triton_kernels: dict | None = None


def enrich_with(trace: dict, maps: dict, notes: dict, given, records: dict, proton=None,
                proton_quantum_ns: float = 0.0, triton_kernels: dict | None = None):
    """The enrichment of `trace` by the calibrations in `maps`, for the devices it has kernels or records of and
    those `given` (shown even without either), `records` ({device: CtaRecords}), Proton's CTAs and the Triton
    kernels the process knew (CycleJob)."""
    devices = sorted(set(kernels_by_device(trace)) | set(records) | set(given))
    return enrichment(trace, maps={d: maps[d] for d in devices if maps.get(d) is not None},
                      records={d: r for d, r in records.items() if len(r) or r.dropped}, proton=proton,
                      proton_quantum_ns=proton_quantum_ns, triton_kernels=triton_kernels,
                      notes=[notes[d] for d in (None, *devices) if d in notes])


def run(job: CycleJob, timeout_s: float | None = None) -> str | None:
    """Replace the plain trace at job.path by its enriched version (the profiler's text as it was plus what this
    package adds: tracefile.splice), atomically. None when that is done; otherwise the trace is left as it was
    and the reason comes back, one line naming the trace. timeout_s bounds the wait for spooled records."""
    path = Path(job.path)
    try:
        text = read_text(path)
        trace, end = parse(text, path.name)
        added = enrich_with(trace, job.maps, job.notes, job.given, load_records(job.records, timeout_s),
                            triton_kernels=job.triton_kernels)
        if end < 0 or any(is_ours(ev) for ev in trace["traceEvents"]):  # enriched before, or not spliceable
            data = dumps(added.trace())
        else:
            data = splice(text, end, added.fragments(), added.meta)
        write_trace(data, path)
    except Exception as exc:  # whatever went wrong: the plain trace stays and the job goes on
        return f"torch_l2topo could not enrich {path} ({type(exc).__name__}: {exc}); it stays as torch.profiler " \
               f"wrote it"
    return None


def warn(message: str) -> None:
    """Warn about a problem the job goes on after: a warning attributed to the caller's module, or where warnings
    are errors (-W error) a line on stderr; never an exception into the training loop."""
    try:
        warnings.warn(message, stacklevel=2)
    except Exception:
        print(f"torch_l2topo warning: {message}", file=sys.stderr)
