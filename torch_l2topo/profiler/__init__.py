"""The torch.profiler hook: the L2 map and per-CTA kernel timelines inside a PyTorch profiler trace.

    with torch_l2topo.profile("traces/", schedule=torch.profiler.schedule(wait=1, warmup=1, active=2)) as prof:
        for batch in data:
            model(batch)
            prof.step()

writes one trace per active cycle that Perfetto and chrome://tracing open: the profiler's own events, the
calibration as metadata, an "L2 map" process per GPU (one track per SM by partition and latency, latency
counters), the CTAs of instrumented kernels on their SM's track, and per launch the figures a user acts on
(busy time per SM, tail, imbalance, near share, the slowest decile, a placement estimate).
docs/profiler.md is the guide. Modules: session (profile, trace_handler, merge_proton), spool (records handed to the
worker), clock (the GPU's clock against the host's), worker, cycle, enrich (the post-processing), align, metrics,
tracks, kineto, tracefile, smmap, proton_trace, readback, summary (trace-summary), timeline (the figure), demo (an
instrumented kernel). The recorder itself is in torch_l2topo.placement.recording (placement reads the same records),
its device helpers in triton_kernels/recorder.py and cuda_ext/recorder.cuh.
"""
from __future__ import annotations

import importlib

# name -> module, imported on first access (PEP 562): the background worker (worker.py) imports this package
# and must not pay for torch, which session.py and the recorder need
_LAZY = {"profile": ".session", "trace_handler": ".session", "TraceHandler": ".session", "merge_proton": ".session",
         "held_capacity": ".session",
         "recording": "..placement.recording", "active_recorder": "..placement.recording",
         "CtaRecords": "..placement.recording", "enrich": ".enrich", "enrich_file": ".enrich",
         "summarize": ".summary", "format_summary": ".summary", "render_timeline": ".timeline"}
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
