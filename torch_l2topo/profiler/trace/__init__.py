"""The trace format and its enrichment, pure numpy and JSON (no GPU, no processes): reading and writing Kineto
traces (tracefile, kineto), what enriches them (enrich, align, metrics, tracks, jsonrows, smmap, proton_trace,
offline), and reading an enriched trace back (readback, summary, timeline). docs/profiler.md, How it works.
"""
