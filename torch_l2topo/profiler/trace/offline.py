"""The profiler's raw inputs saved to a directory and enriched later, elsewhere: on a machine without a GPU,
or in a test (tests/data/profiler/ is such a directory, recorded on an H200 by
benchmarks/record_profiler_trace.py).

    trace.json.gz          the profiler's own trace, as exported
    records-<device>.npz   the CTA records drained from that GPU's recorder (CtaRecords.to_arrays)
    smmap-<device>.json    that GPU's calibration as a trace carries it (SmMap.to_json)
    proton.json.gz         Proton's instrumentation trace of the same steps (optional)
    manifest.json          what the recording says about itself (optional, free-form); its "triton_kernels"
                           ({"instrumented": [...], "plain": [...]}), where present, goes to the enrichment
"""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np

from ...errors import TraceFormatError
from ...files import atomic_write, json_default
from ...measure.recording import CtaRecords
from .enrich import enrich
from .proton_trace import load_proton, proton_records
from .smmap import SmMap
from .tracefile import load_trace

TRACE, PROTON, MANIFEST = "trace.json.gz", "proton.json.gz", "manifest.json"


def _gzipped(path) -> bytes:
    raw = Path(path).read_bytes()
    return raw if raw[:2] == b"\x1f\x8b" else gzip.compress(raw, compresslevel=9)


def save_raw(out_dir, trace_path, records: dict, smmaps: dict, proton_path=None, manifest: dict | None = None) -> Path:
    """Write the raw inputs of one profiling cycle to `out_dir` (module docstring); returns the directory."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    load_trace(trace_path)  # refuse to save what could not be enriched later
    atomic_write(out / TRACE, _gzipped(trace_path))
    for d, recs in records.items():
        with open(out / f"records-{d}.npz", "wb") as f:
            np.savez_compressed(f, **recs.to_arrays())
    for d, m in smmaps.items():
        atomic_write(out / f"smmap-{d}.json", (json.dumps(m.to_json()) + "\n").encode())
    if proton_path is not None:
        atomic_write(out / PROTON, _gzipped(proton_path))
    if manifest is not None:
        atomic_write(out / MANIFEST, (json.dumps(manifest, indent=1, default=json_default) + "\n").encode())
    return out


def load_raw(raw_dir) -> dict:
    """{"trace", "records": {device: CtaRecords}, "smmaps": {device: SmMap}, "proton": CtaRecords or None,
    "quantum_ns", "manifest"} of a directory written by save_raw()."""
    raw = Path(raw_dir)
    if not (raw / TRACE).exists():
        raise TraceFormatError(f"{raw} holds no {TRACE}: not a directory of raw profiler inputs")
    records, smmaps = {}, {}
    for path in raw.iterdir():
        m = re.fullmatch(r"(records|smmap)-(\d+)\.(npz|json)", path.name)
        if m and m[1] == "records":
            with np.load(path) as z:
                records[int(m[2])] = CtaRecords.from_arrays(z)
        elif m:
            smmaps[int(m[2])] = SmMap.from_json(json.loads(path.read_text()))
    proton, quantum = None, 0.0
    if (raw / PROTON).exists():
        clocks = [s.sm_clock_ghz for s in smmaps.values()]
        proton, quantum = proton_records(load_proton(raw / PROTON), clocks[0] if clocks else 1.0, str(raw / PROTON))
    manifest = json.loads((raw / MANIFEST).read_text()) if (raw / MANIFEST).exists() else {}
    return {"trace": load_trace(raw / TRACE), "records": records, "smmaps": smmaps, "proton": proton,
            "quantum_ns": quantum, "manifest": manifest}


def enrich_raw(raw_dir) -> dict:
    """The enriched trace of a directory written by save_raw()."""
    r = load_raw(raw_dir)
    return enrich(r["trace"], maps=r["smmaps"], records=r["records"], proton=r["proton"],
                  proton_quantum_ns=r["quantum_ns"], triton_kernels=r["manifest"].get("triton_kernels"))
