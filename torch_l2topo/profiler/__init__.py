"""The torch.profiler hook: the L2 map and per-CTA kernel timelines inside a PyTorch profiler trace.

    with torch_l2topo.profile("traces/", schedule=torch.profiler.schedule(wait=1, warmup=1, active=2)) as prof:
        for batch in data:
            model(batch)
            prof.step()

writes one trace per active cycle (docs/profiler.md). Modules by role: the session (session: profile,
trace_handler; cycle: one cycle's job; worker, lifecycle: the trace workers and what is left at exit; spool,
clock, perprocess: the CTA records' hand-off), the trace format and its enrichment (tracefile, kineto, enrich,
align, metrics, tracks, jsonrows, smmap, proton_trace, offline), reading it back (readback, summary, timeline),
and demo (an instrumented kernel). The recorder is torch_l2topo.measure.recording.
"""
from __future__ import annotations

import importlib

# name -> module, imported on first access (PEP 562): the trace workers (runtime/worker.py) import this package
# and must not pay for torch, which session.py and the recorder need
_LAZY = {"profile": ".session", "trace_handler": ".session", "TraceHandler": ".session", "merge_proton": ".session",
         "held_capacity": ".session",
         "recording": "..measure.recording", "active_recorder": "..measure.recording",
         "CtaRecords": "..measure.recording", "enrich": ".trace.enrich", "enrich_file": ".trace.enrich",
         "summarize": ".trace.summary", "format_summary": ".trace.summary", "render_timeline": ".trace.timeline"}
__all__ = ["profile", "trace_handler", "TraceHandler", "merge_proton", "held_capacity", "recording", "active_recorder",
           "CtaRecords", "enrich", "enrich_file", "summarize", "format_summary", "render_timeline"]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
