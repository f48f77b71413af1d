"""A small profiled CPU training job for the profiler's fault tests (test_profiler_faults.py), run as a process of
its own: `python profiler_job.py OUT [--fault NAME] [--cycles N] [--foreground] [--gzip] [--timeout S]
[--signal SIG --signal-after N] [--raise-after N] [--slot] [--warnings-as-errors]`.

It profiles N one-step cycles into OUT with torch_l2topo.profile (the bundled calibration as GPU 0's, so every
trace gets the map), with the fault injected (profiler_faults.py), and records what torch wrote: right after
each export, the trace's sha256 and a copy (OUT.plain/). At the end it prints one JSON line: {"traces": {path:
sha256}, "warnings": [...], "block_end_s": seconds the block's end took, "worker_pids": [...]}. With --signal it
sends itself SIGTERM or SIGINT after that many cycles (the traces recorded so far are printed first, then the
signal ends the job as it would end it); with --raise-after the loop raises RuntimeError("user error").
"""
import argparse
import hashlib
import json
import os
import shutil
import signal
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profiler_faults import FAULT_ENV, apply_fault, export_fault  # noqa: E402

import torch_l2topo  # noqa: E402
from torch_l2topo.profiler.runtime import worker


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--fault", default=None)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--foreground", action="store_true")
    ap.add_argument("--gzip", action="store_true")
    ap.add_argument("--timeout", type=float, default=None)
    ap.add_argument("--max-held", type=int, default=8)
    ap.add_argument("--signal", choices=["TERM", "INT"], default=None)
    ap.add_argument("--signal-after", type=int, default=None)
    ap.add_argument("--raise-after", type=int, default=None)
    ap.add_argument("--slot", action="store_true", help="make a record slot in /dev/shm, as a GPU block would")
    ap.add_argument("--warnings-as-errors", action="store_true", help="as python -W error (pytest's filterwarnings)")
    args = ap.parse_args()

    os.environ[FAULT_ENV] = args.fault or ""
    worker.COMMAND = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fault_worker.py")]
    apply_fault(args.fault)
    plain_dir = args.out.rstrip("/") + ".plain"
    os.makedirs(plain_dir, exist_ok=True)
    traces = {}
    real_export = torch.profiler.profile.export_chrome_trace
    broken_export = export_fault(args.fault, real_export)

    def export(prof, path):  # what torch wrote, recorded as it was (None: nothing)
        traces[path] = None
        broken_export(prof, path)
        if os.path.exists(path):
            with open(path, "rb") as f:
                traces[path] = hashlib.sha256(f.read()).hexdigest()
            shutil.copy(path, os.path.join(plain_dir, os.path.basename(path)))

    torch.profiler.profile.export_chrome_trace = export
    report = {"traces": traces, "warnings": [], "block_end_s": None, "worker_pids": []}

    def say() -> None:
        report["worker_pids"] = sorted({p.proc.pid for p in getattr(worker.existing_worker(), "_procs", [])}
                                       | set(report["worker_pids"]))
        print(json.dumps(report), flush=True)

    if args.slot:  # pageable without CUDA, but a file in /dev/shm like any slot
        from torch_l2topo.profiler.runtime.spool import shared_spool

        shared_spool().reserve(0, 1024, 1)
    model = torch.nn.Linear(16, 16)
    sched = torch.profiler.schedule(wait=0, warmup=0, active=1, repeat=args.cycles)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("error" if args.warnings_as_errors else "always")
        warnings.filterwarnings("ignore", module=r"torch(\.|$)")  # torch's own (warmup, acc_events)
        ended = None
        with torch_l2topo.profile(args.out, schedule=sched, activities=[torch.profiler.ProfilerActivity.CPU],
                                  topology={0: torch_l2topo.load_example()}, background=not args.foreground,
                                  use_gzip=args.gzip, timeout_s=args.timeout, max_held=args.max_held) as prof:
            for step in range(args.cycles):
                model(torch.randn(8, 16)).sum()
                prof.step()
                if args.raise_after is not None and step + 1 == args.raise_after:
                    raise RuntimeError("user error")
                if args.signal and step + 1 == args.signal_after:
                    report["warnings"] = [str(w.message) for w in caught]
                    say()
                    os.kill(os.getpid(), getattr(signal, f"SIG{args.signal}"))
                    time.sleep(0.5)  # the handler runs here (SIGINT: KeyboardInterrupt unwinds the block)
            ended = time.monotonic()
        report["block_end_s"] = time.monotonic() - ended
    report["warnings"] = [str(w.message) for w in caught]
    say()


if __name__ == "__main__":
    main()
