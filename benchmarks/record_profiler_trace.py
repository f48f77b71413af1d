"""Record the profiler's CPU-test fixture on a GPU: a real Kineto trace with recorded CTAs and Proton's CTAs.

One torch.profiler cycle (CPU + CUDA activities) of LAUNCHES steps, each: the recorder's demo kernel
(profiler/demo.row_sums, GRID programs over ROWS rows, rows homed in partition row % 2, SMs labelled by the
calibration), a matmul, and the Proton-scoped copy (profiler/demo.scoped_copy) under a Proton
instrumentation session running alongside. Written to --out (default tests/data/profiler/), all small:

    trace.json.gz        the profiler's own trace, as exported (not enriched)
    records.npz          the CTA records drained from the recorder after the cycle (CtaRecords.to_arrays)
    proton.json.gz       Proton's chrome trace of the same steps (absent if Proton failed: see manifest)
    smmap.json           the GPU's calibration as the trace carries it (hashed ids only)
    manifest.json        what ran (kernel names, grid, launches: the tests' expectations), versions, command

tests/test_profiler_fixture.py enriches these on the CPU. Takes ~30 s on an H200 (calibration, compiles).

    python benchmarks/record_profiler_trace.py --device 0
"""
from __future__ import annotations

import gzip
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from common import calibrated_device, command_line, environment

from torch_l2topo.files import json_default
from torch_l2topo.placement import recording
from torch_l2topo.profiler.demo import KERNEL_NAME, row_sums, scoped_copy
from torch_l2topo.profiler.smmap import SmMap

ROWS, DIM, GRID, LAUNCHES = 16_384, 64, 264, 3
COPY_N, COPY_BLOCK = 1 << 18, 1024
ROOT = Path(__file__).resolve().parents[1]


def _gzip_to(src: Path, dst: Path) -> None:
    dst.write_bytes(gzip.compress(src.read_bytes(), compresslevel=9))


def main(argv=None) -> dict:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--out", default=str(ROOT / "tests" / "data" / "profiler"))
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev, topo, _ = calibrated_device(args.device, "fixture")
    smmap = SmMap.from_topology(topo)  # hashed ids only
    x = torch.randn(ROWS, DIM, device=dev)
    w = torch.randn(DIM, DIM, device=dev)
    v = torch.randn(COPY_N, device=dev)
    classes = (torch.arange(ROWS, device=dev) % 2).to(torch.int32)
    part = torch.as_tensor(smmap.partition, device=dev).to(torch.int32)
    work = Path(tempfile.mkdtemp(prefix="l2topo-fixture-"))
    proton_note = None
    with recording.recording(devices=[args.device]):
        row_sums(x, item_class=classes, sm_partition=part, grid=GRID)  # compile outside the profiled cycle
        scoped_copy(v, COPY_BLOCK)
        torch.cuda.synchronize()
        recording.recorder(args.device).drain()
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            proton = None
            try:
                import triton.profiler as proton

                proton.start(str(work / "proton"), backend="instrumentation", data="trace")
            except Exception as exc:  # recorded in the manifest: the torch trace stands on its own
                proton, proton_note = None, f"Proton did not start: {type(exc).__name__}: {exc}"
            for _ in range(LAUNCHES):
                row_sums(x, item_class=classes, sm_partition=part, grid=GRID)
                x @ w
                scoped_copy(v, COPY_BLOCK)
            torch.cuda.synchronize()
            if proton is not None:
                proton.finalize()
        records = recording.recorder(args.device).drain()
    prof.export_chrome_trace(str(work / "trace.json"))
    _gzip_to(work / "trace.json", out / "trace.json.gz")
    np.savez_compressed(out / "records.npz", **records.to_arrays())
    found = sorted(work.glob("proton*"))
    if found:
        _gzip_to(found[0], out / "proton.json.gz")
    elif proton_note is None:
        proton_note = "Proton wrote no trace"
    (out / "smmap.json").write_text(json.dumps(smmap.to_json()) + "\n")
    manifest = {"command": command_line(), "env": environment(args.device), "device": args.device,
                "recorded": {"kernel": KERNEL_NAME, "grid": GRID, "launches": LAUNCHES, "rows": ROWS,
                             "item_class": "row % 2"},
                "proton": {"kernel": "scoped_copy_kernel", "ctas": COPY_N // COPY_BLOCK, "launches": LAUNCHES,
                           "note": proton_note},
                "records": len(records), "dropped": records.dropped,
                "sizes": {}}
    manifest["sizes"] = {f.name: f.stat().st_size for f in sorted(out.iterdir()) if f.name != "manifest.json"}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, default=json_default) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({k: manifest[k] for k in ("records", "dropped", "sizes", "proton")}, indent=1))
    return manifest


if __name__ == "__main__":
    main()
