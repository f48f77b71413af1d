"""Where a profiled cycle's extra time goes under torch_l2topo.profile (background worker) against plain
torch.profiler, on the example model (the issue-17 overhead figure's diagnosis).

Runs blocks of CYCLES cycles (wait 1, warmup 1, 5 active steps) of examples/profile_model.py under plain
torch.profiler and torch_l2topo.profile (background worker; the same with the worker beside the steps,
max_held=0; with the profiler's export written beside the traces instead of in shared memory; inline; background
without recording), in rotating
order, and times with wrappers: every step's model call and prof.step() separately (also by the
step's place in its cycle, @0 the wait step .. @6 the last active step, whose prof.step() runs the trace
handler), the profiler's phases (prepare, start and stop of a trace: torch's and ours around them), the
handler as a whole, and inside ours the records' share (spool.take_all), the profiler's export, the hand-off
to the worker (Worker.submit: its harvest of answers and the job's pickle down the worker's pipe) and, where
something waits for the worker, the jobs this process runs itself (Worker._progress); the recorders' start and
reset and the spool's reserve. Microseconds per cycle: the sum of a cycle's calls, averaged over cycles. Also
the process's threads (Python's, and every OS thread with the CPU time it used in each variant's timed blocks:
the diagnosis of issue 17 found 15 BLAS threads spinning next to the loop), its SIGCHLD handler and the
interpreter's GIL switch interval (--switch-interval sets it).

    python benchmarks/diag_profiler_handler.py --device 0 --out benchmarks/results/diagnosis/profiler_handler_h200.json
"""
from __future__ import annotations

import os
import pickle
import signal
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from bench_profiler import ACTIVE, CAPACITY, model_step
from common import calibrated_device, gpu_parser, quantiles, time_each_call, write_result

from torch_l2topo.placement import recording
from torch_l2topo.profiler import session, spool, worker


class _Named:
    """A bucket view whose keys get a prefix (torch.<phase> for torch.profiler.profile's own, torch_l2topo.<phase>
    for ours, which includes torch's)."""

    def __init__(self, bucket, prefix: str):
        self.bucket, self.prefix = bucket, prefix

    def __getitem__(self, key):
        return self.bucket[f"{self.prefix}.{key}"]


def block(step, make, cycles: int, times: dict) -> None:
    sched = torch.profiler.schedule(wait=1, warmup=1, active=ACTIVE, repeat=cycles)
    torch.cuda.synchronize()
    with make(sched) as prof:
        for _ in range(cycles):
            for i in range(2 + ACTIVE):
                t = time.perf_counter()
                step()
                t1 = time.perf_counter()
                prof.step()
                t2 = time.perf_counter()
                times["model_call"].append(t1 - t)
                times["prof_step"].append(t2 - t1)
                times[f"model_call@{i}"].append(t1 - t)
                times[f"prof_step@{i}"].append(t2 - t1)


def task_cpu() -> dict:
    """{OS thread id: (its name, CPU ticks used so far)} of this process (Linux /proc; empty elsewhere)."""
    out = {}
    for task in Path("/proc/self/task").glob("*"):
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            out[task.name] = (name, int(fields[11]) + int(fields[12]))  # utime + stime
        except (OSError, IndexError, ValueError):
            continue
    return out


def thread_cpu_used(before: dict, after: dict, into: dict) -> None:
    """Adds each OS thread's CPU ticks between two task_cpu()s to into["<tid> <name>"]."""
    for tid, (name, ticks) in after.items():
        key = f"{tid} {name}"
        into[key] = into.get(key, 0) + ticks - before.get(tid, (name, 0))[1]


def launch_costs(dev, n: int) -> dict:
    """Host microseconds (quantiles of n calls) of the loop's own CUDA calls, alone: a recorder's reset (one
    zero_ launch), a spool drain (one graph replay and its bookkeeping) and a one-word torch fill for
    comparison, with no profiler and inside torch.profiler's warmup and active steps (CUPTI on)."""
    rec = recording.recorder(dev.index)
    spooled = spool.shared_spool()
    word = torch.zeros(1, dtype=torch.int64, device=dev)
    calls = {"reset": rec.reset, "fill": lambda: word.fill_(3),
             "spool_drain": lambda: spooled.release(spooled.take(rec))}
    out = {}

    def timed(where: str) -> None:
        for name, call in calls.items():
            call()
            t = []
            for _ in range(n):
                a = time.perf_counter()
                call()
                t.append(time.perf_counter() - a)
            torch.cuda.synchronize()
            out[f"{name}@{where}"] = quantiles(np.asarray(t) * 1e6)

    timed("no_profiler")
    sched = torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=1)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts, schedule=sched) as prof:
        timed("profiler_warmup")
        prof.step()
        timed("profiler_active")
        prof.step()
    return out


def cpu_topology() -> dict:
    """The CPUs this process may run on and which of them share a core (Linux sysfs; empty elsewhere)."""
    siblings = set()
    for path in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology/thread_siblings_list"):
        try:
            siblings.add(path.read_text().strip())
        except OSError:
            continue
    return {"affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "thread_siblings": sorted(siblings)}


def process_context(cpu_ticks: dict) -> dict:
    """The process's threads (Python's by name; the OS threads that used CPU in each variant's timed blocks),
    its SIGCHLD handler and the GIL switch interval."""
    return {"python_threads": [t.name for t in threading.enumerate()], "os_threads": len(task_cpu()),
            "os_thread_cpu_ticks": {v: {k: n for k, n in sorted(t.items(), key=lambda kv: -kv[1]) if n > 0}
                                    for v, t in cpu_ticks.items()},
            "clock_ticks_per_s": os.sysconf("SC_CLK_TCK"), "sigchld_handler": repr(signal.getsignal(signal.SIGCHLD)),
            "switch_interval_s": sys.getswitchinterval(), "cpus": cpu_topology()}


def main(argv=None) -> dict:
    parser = gpu_parser(__doc__, reps=6)
    parser.add_argument("--cycles", type=int, default=8)
    parser.add_argument("--switch-interval", type=float, default=None,
                        help="the interpreter's GIL switch interval in seconds (default: leave it, 0.005)")
    args = parser.parse_args(argv)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    dev, _, _ = calibrated_device(args.device, "profiler")
    step, which = model_step(dev)
    work = Path(tempfile.mkdtemp(prefix="l2topo-diag-handler-"))
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    current = {}

    def plain(sched):
        def export(p):
            t = time.perf_counter()
            p.export_chrome_trace(str(work / "plain.json"))
            current["t"]["handler"].append(time.perf_counter() - t)

        return torch.profiler.profile(activities=acts, schedule=sched, on_trace_ready=export)

    def ours(**options):
        return lambda sched: session.profile(work / "ours", activities=acts, schedule=sched, devices=[dev.index],
                                             capacity=CAPACITY, **options)

    def export_beside(sched):  # the export written beside the traces, not in shared memory (before 2026-12-02)
        prof = ours()(sched)
        prof.handler._export_dir = None
        return prof

    variants = {"plain": plain, "background": ours(), "concurrent": ours(max_held=0),
                "background_export_beside": export_beside,
                "inline": ours(background=False), "background_no_record": ours(record=False)}

    class Proxy(dict):  # the wrappers append to whichever variant runs now
        def __getitem__(self, key):
            return current["t"][key]

    proxy = Proxy()
    times = {name: defaultdict(list) for name in variants}
    phases = [(cls, name) for cls in (torch.profiler.profile, session.profile)
              for name in ("prepare_trace", "start_trace", "stop_trace")]
    originals = [(cls, name, time_each_call(cls, name, _Named(proxy, cls.__module__.split(".")[0])))
                 for cls, name in phases]
    parts = [(session.TraceHandler, "__call__"), (session.TraceHandler, "calibrations"),
             (spool.RecordSpool, "take_all"), (spool.RecordSpool, "reserve"), (worker.Worker, "submit"),
             (worker.Worker, "harvest"), (worker.Worker, "_hand_over"), (worker.Worker, "_progress"),
             (torch.profiler.profile, "export_chrome_trace"),
             (recording, "start_recording"), (recording, "reset_dirty"), (tempfile, "mkstemp"), (pickle, "dump"),
             # inside the parts above: where the drain, the reset and the handler's own lines spend their time
             (spool._Slot, "drain"), (spool.RecordSpool, "_take"), (torch.cuda.CUDAGraph, "replay"),
             (recording.CtaRecorder, "reset"), (session.TraceHandler, "_path_of"), (session.TraceHandler, "_done"),
             (worker.Worker, "_read"), (worker.Worker, "_report")]
    originals += [(owner, name, time_each_call(owner, name, proxy)) for owner, name in parts]
    try:
        with torch.no_grad():
            for name, make in variants.items():  # warm
                current["t"] = defaultdict(list)
                block(step, make, args.cycles, current["t"])
            names = list(variants)
            cpu_ticks = {name: {} for name in variants}
            for r in range(args.reps):
                for name in names[r % len(names):] + names[:r % len(names)]:
                    current["t"] = times[name]
                    before = task_cpu()
                    block(step, variants[name], args.cycles, times[name])
                    thread_cpu_used(before, task_cpu(), cpu_ticks[name])
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
    context = process_context(cpu_ticks)
    context["launch_costs_us"] = launch_costs(dev, args.reps * 100)
    print("threads:", context, flush=True)
    n_cycles = args.reps * args.cycles
    figures = {"model": which, "cycles": n_cycles, "process": context,
               "unit": "us_per_cycle: the sum of a cycle's calls, averaged over cycles; per_call: quantiles"}
    for variant, t in times.items():
        row = {}
        for key, values in t.items():
            values = np.asarray(values) * 1e6
            per_cycle = values.sum() / n_cycles
            row[key] = {"us_per_cycle": float(per_cycle), "calls": len(values), "per_call": quantiles(values)}
        figures[variant] = row
    figures["extra_us_per_cycle"] = {
        v: {k: figures[v][k]["us_per_cycle"] - figures["plain"][k]["us_per_cycle"] for k in figures["plain"]
            if k in figures[v]} for v in variants if v != "plain"}
    print({v: {k: round(x["us_per_cycle"], 1) for k, x in figures[v].items()} for v in times}, flush=True)
    print("extra us per cycle:", figures["extra_us_per_cycle"], flush=True)
    path = write_result(args.out, figures, args.device)
    print(f"wrote {path}")
    return figures


if __name__ == "__main__":
    main()
