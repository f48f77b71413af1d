"""One profiled cycle's trace, from the profiler's export to the enriched file: the job that TraceHandler
runs itself, or hands to the background worker (worker.py) so that the training loop does not wait for it.

A CycleJob carries everything the enrichment needs and nothing that needs the GPU: the exported trace's
path, the CTA records already drained (or where the spool puts them: spool.py), and the calibrations already
looked up, so the same job gives the same file wherever it runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .enrich import enrichment
from .kineto import kernels_by_device
from .spool import load_records
from .tracefile import dumps, is_ours, parse, read_text, splice, write_trace


@dataclass
class CycleJob:
    """export: the profiler's exported trace (a temporary file, removed once the job is done); path: where the
    enriched trace goes (each a str or Path); records: {device: CtaRecords or spool.SpooledRecords}; maps:
    {device: SmMap or None}; notes: {device: why it has no map}; given: devices whose calibration the caller gave
    (their map is shown even without kernels)."""

    export: str | Path
    path: str | Path
    records: dict = field(default_factory=dict)
    maps: dict = field(default_factory=dict)
    notes: dict = field(default_factory=dict)
    given: tuple = ()


def enrich_with(trace: dict, maps: dict, notes: dict, given, records: dict, proton=None,
                proton_quantum_ns: float = 0.0):
    """The enrichment of `trace` by the calibrations in `maps`, for the devices it has kernels or records of and
    those `given` (shown even without either), `records` ({device: CtaRecords}) and Proton's CTAs."""
    devices = sorted(set(kernels_by_device(trace)) | set(records) | set(given))
    return enrichment(trace, maps={d: maps[d] for d in devices if maps.get(d) is not None},
                      records={d: r for d, r in records.items() if len(r) or r.dropped}, proton=proton,
                      proton_quantum_ns=proton_quantum_ns, notes=[notes[d] for d in devices if d in notes])


def run(job: CycleJob) -> str | None:
    """Write the enriched trace of `job` to job.path: the profiler's text as it was plus what this package adds
    (tracefile.splice). If enriching fails, write the profiler's trace as it is and return why (None when all
    went well). The export is removed either way, once something is written."""
    path = Path(job.path)
    text = read_text(job.export)
    problem = None
    try:
        trace, end = parse(text, path.name)
        added = enrich_with(trace, job.maps, job.notes, job.given, load_records(job.records))
        if any(is_ours(ev) for ev in trace["traceEvents"]):  # enriched before: rewritten whole
            data = dumps(added.trace())
        else:
            data = splice(text, end, added.fragments(), added.meta)
    except Exception as exc:  # nothing lost: the profiler's own trace is written
        problem = f"torch_l2topo could not enrich {path.name} ({type(exc).__name__}: {exc}); wrote the plain " \
                  f"torch.profiler trace"
        data = text
    write_trace(data, path)
    Path(job.export).unlink(missing_ok=True)
    return problem
