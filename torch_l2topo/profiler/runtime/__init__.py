"""The profiler's processes and hand-offs: one cycle's job (cycle), the trace worker processes (worker), what is
left at exit or a signal (lifecycle), the CTA records' hand-off through shared memory (spool, clock) and the
per-process objects (perprocess). docs/profiler.md, Safety and How it works.
"""
