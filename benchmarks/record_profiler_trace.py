"""Record the profiler's CPU-test fixture on a GPU: a real Kineto trace with recorded CTAs and Proton's CTAs.

One torch.profiler cycle (CPU + CUDA activities) of LAUNCHES steps, each: the recorder's demo kernel
(profiler/demo.row_sums, GRID programs over ROWS rows, rows homed in partition row % 2, SMs labelled by the
calibration), a matmul, and the Proton-scoped copy (profiler/demo.scoped_copy) under a Proton
instrumentation session running alongside. Saved with profiler/offline.save_raw to --out (default
tests/data/profiler/: trace, records, calibration (hashed ids only), Proton's trace, a manifest saying what
ran: the tests' expectations), a few hundred KB. tests/test_profiler_fixture.py enriches it on the CPU.
--figure PNG also draws the per-SM timeline of one row_sum_kernel launch (the README's figure); with --from
DIR it only draws, from a fixture recorded earlier (no GPU needed).

    python benchmarks/record_profiler_trace.py --device 0 --figure docs/profiler_timeline.png    # ~30 s, H200
    python benchmarks/record_profiler_trace.py --from tests/data/profiler --figure docs/profiler_timeline.png
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

ROWS, DIM, GRID, LAUNCHES = 16_384, 64, 264, 3
COPY_N, COPY_BLOCK = 1 << 18, 1024
ROOT = Path(__file__).resolve().parents[1]


def record(device: int, out: Path, proton_on: bool = True) -> dict:
    import torch
    from common import calibrated_device, command_line, environment

    from torch_l2topo.measure import recording
    from torch_l2topo.profiler.demo import KERNEL_NAME, row_sums, scoped_copy
    from torch_l2topo.profiler.trace.offline import save_raw
    from torch_l2topo.profiler.trace.smmap import SmMap

    dev, topo, _ = calibrated_device(device, "fixture")
    smmap = SmMap.from_topology(topo)  # hashed ids only
    x = torch.randn(ROWS, DIM, device=dev)
    w = torch.randn(DIM, DIM, device=dev)
    v = torch.randn(COPY_N, device=dev)
    classes = (torch.arange(ROWS, device=dev) % 2).to(torch.int32)
    part = torch.as_tensor(smmap.partition, device=dev).to(torch.int32)
    work = Path(tempfile.mkdtemp(prefix="l2topo-fixture-"))
    note = None
    with recording.recording(devices=[device]):
        row_sums(x, item_class=classes, sm_partition=part, grid=GRID)  # compile outside the profiled cycle
        scoped_copy(v, COPY_BLOCK)
        recording.recorder(device).drain()
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            proton = None
            if not proton_on:
                note = "Proton not run (--no-proton): on an H200 with Triton 3.6 a Proton session inside this " \
                       "torch.profiler cycle killed the process (SIGFPE)"
            else:
                try:
                    import triton.profiler as proton

                    proton.start(str(work / "proton"), backend="instrumentation", data="trace")
                except Exception as exc:  # said in the manifest: the torch trace stands on its own
                    proton, note = None, f"Proton did not start: {type(exc).__name__}: {exc}"
            for _ in range(LAUNCHES):
                row_sums(x, item_class=classes, sm_partition=part, grid=GRID)
                x @ w
                scoped_copy(v, COPY_BLOCK)
            torch.cuda.synchronize()
            if proton is not None:
                proton.finalize()
        records = recording.recorder(device).drain()
    prof.export_chrome_trace(str(work / "trace.json"))
    found = sorted(work.glob("proton*"))
    if not found and note is None:
        note = "Proton wrote no trace"
    manifest = {"command": command_line(), "env": environment(device), "device": device,
                "recorded": {"kernel": KERNEL_NAME, "grid": GRID, "launches": LAUNCHES, "rows": ROWS,
                             "item_class": "row % 2"},
                "proton": {"kernel": "scoped_copy_kernel", "ctas": COPY_N // COPY_BLOCK, "launches": LAUNCHES,
                           "note": note},
                "records": len(records), "dropped": records.dropped}
    save_raw(out, work / "trace.json", {device: records}, {device: smmap}, found[0] if found else None, manifest)
    shutil.rmtree(work, ignore_errors=True)
    return manifest


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--out", default=str(ROOT / "tests" / "data" / "profiler"), help="fixture directory to write")
    p.add_argument("--from", dest="from_dir", help="draw from this fixture directory instead of recording")
    p.add_argument("--figure", help="also draw the per-SM timeline of one row_sum_kernel launch into this PNG")
    p.add_argument("--no-proton", action="store_true", help="record without the Proton session")
    args = p.parse_args(argv)
    raw = Path(args.from_dir or args.out)
    if not args.from_dir:
        manifest = record(args.device, raw, proton_on=not args.no_proton)
        sizes = {f.name: f.stat().st_size for f in sorted(raw.iterdir())}
        print(json.dumps({"records": manifest["records"], "dropped": manifest["dropped"],
                          "proton": manifest["proton"]["note"] or "merged", "bytes": sizes}, indent=1))
    if args.figure:
        from torch_l2topo.profiler.trace.offline import enrich_raw
        from torch_l2topo.profiler.trace.timeline import render_timeline

        print(f"wrote {render_timeline(enrich_raw(raw), args.figure, kernel='row_sum_kernel')}")


if __name__ == "__main__":
    main()
