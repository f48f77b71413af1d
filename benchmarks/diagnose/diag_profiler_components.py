"""What torch_l2topo.profile adds to a profiled cycle of the example model, measured cycle against adjacent cycle
(issue 17). On the H200 machine the loop's speed drifts by +-25% from one second to the next, so profiler blocks
timed one after another (bench_profiler.py) resolve a 2% difference only over hundreds of rounds; cycles a few
ms apart drift far less.

1. Our loop's own work: torch_l2topo.profile blocks (background worker) in which three of every four cycles are
   plain (no recording; the handler only exports the trace to disk, as plain torch.profiler's on_trace_ready
   does) and the fourth takes turns among ours as it is and ours without one of its parts (KINDS). Each such
   cycle and the one after it (which runs what it deferred: its records' drain) are compared with the two-cycle
   units of plain cycles just before and after (unit_pairs, in benchmarks/profiler_cycles.py). Until 2026-12-02
   08:20 each cycle was compared alone with its plain neighbours, which charged the deferred drain to a plain
   neighbour and read the cost low by twice the drain's (the results of that design say so). The worker's jobs
   wait for the block's end (max_held; until 2026-12-06 it enriched beside every kind of cycle alike), so this
   leaves out what its work costs the loop: that is part 2.
2. The worker's concurrent work: plain torch.profiler blocks while a process doing the worker's job (enrich
   a recorded trace, write it, again and again; nice 19, SCHED_IDLE, as the worker) is continued at the start of
   one cycle and stopped at the start of the next, alternately (one signal every cycle in both kinds); or, with
   --period P, runs for P cycles and is stopped for P, by turns, each phase's median cycle against the next's
   (an effect that takes longer than a cycle to build up or die away is seen whole there).

Each part: per-cycle wall time (from the cycle's first step to the end of the prof.step() that runs its trace
handler), medians and quantiles by kind (part 1: of two-cycle units), the difference per pair (us) and its
ratio to a plain cycle, with a bootstrap 90% interval of the median difference. Several blocks; each block's
first two cycles are left out (compilation, the first cycle's warmup recording). --time-calls adds the host time
of each call the profiler makes to the spool and the recorders in the loop (TIMED_CALLS: us per call, quantiles,
over every block, block 0 included, by the kind of the cycle each ran in; and the garbage collector's pauses).

    python benchmarks/diagnose/diag_profiler_components.py --device 0 \\
        --out benchmarks/results/diagnosis/profiler_components_h200.json
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common and profiler_cycles
from common import calibrated_device, gpu_parser, quantiles, time_each_call, write_result
from profiler_cycles import ACTIVE, CAPACITY, KINDS, SKIP, compare, cycle_times, model_step, ours_against_plain

from torch_l2topo.measure import recording
from torch_l2topo.profiler import session
from torch_l2topo.profiler.runtime import spool
from torch_l2topo.profiler.runtime.worker import _run_idle

SETTLE = 4  # cycles left out at each phase's start in part 2 with phases

BURNER = r"""
import sys
from torch_l2topo.profiler.runtime.cycle import enrich_with
from torch_l2topo.profiler.trace.readback import calibrations, recorded_ctas
from torch_l2topo.profiler.trace.tracefile import dumps, load_trace, parse, splice, strip, write_trace

rich = load_trace(sys.argv[1])
records, maps = recorded_ctas(rich), calibrations(rich)
text = dumps(strip(rich)).decode()
print("ready", flush=True)
while True:  # the worker's job (cycle.run), on the same trace, forever
    trace, end = parse(text, "burner")
    added = enrich_with(trace, maps, {}, (), records)
    write_trace(splice(text, end, added.fragments(), added.meta), sys.argv[2])
"""


def _paired(times: list, first_is_a: bool) -> dict:
    """Kind A against kind B over adjacent cycles (A on even cycles when first_is_a): quantiles by kind, and the
    median difference per pair (us) and ratio, with a bootstrap 90% interval of the median difference."""
    t = np.asarray(times)
    a, b = (t[0::2], t[1::2]) if first_is_a else (t[1::2], t[0::2])
    n = min(len(a), len(b))
    return compare(a[:n], b[:n])


def worker_running_against_stopped(step, work: Path, trace: Path, blocks: int, cycles: int, period: int) -> dict:
    """Part 2 (module docstring): the burner running for `period` cycles, then stopped for as many, by turns. With
    period 1 every cycle starts with a signal and each running cycle is paired with the stopped one after it; with
    longer periods a signal starts each phase, the first SETTLE cycles of a phase are left out (an effect that
    builds up or dies away over milliseconds is then seen whole), and each running phase's median cycle is paired
    with the next stopped phase's."""
    burner = subprocess.Popen([sys.executable, "-c", BURNER, str(trace), str(work / "burner.json")],
                              stdout=subprocess.PIPE, env={**os.environ, "OMP_NUM_THREADS": "1",
                                                           "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    _run_idle(burner.pid)
    burner.stdout.readline()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    sched = torch.profiler.schedule(wait=1, warmup=1, active=ACTIVE, repeat=cycles)
    n = [0]

    def export(p):
        n[0] += 1
        p.export_chrome_trace(str(work / f"plain-{n[0] % 4}.json"))

    def toggle(c):  # running in even phases, stopped in odd ones
        if period == 1 or c % period == 0:
            os.kill(burner.pid, signal.SIGCONT if (c // period) % 2 == 0 else signal.SIGSTOP)

    times, phases = [], []
    try:
        for b in range(blocks):
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=acts, schedule=sched, on_trace_ready=export) as prof:
                t = cycle_times(step, prof, cycles, toggle)
            os.kill(burner.pid, signal.SIGSTOP)
            times += t[SKIP:]
            settle = min(SETTLE, period // 2)
            phases += [float(np.median(t[max(start + settle, SKIP):start + period]))
                       for start in range(0, cycles - period + 1, period)]
            print(f"worker running against stopped: block {b + 1}/{blocks}", flush=True)
    finally:
        burner.kill()
        burner.wait()
    if period == 1:
        return {**_paired(times, first_is_a=SKIP % 2 == 0), "a": "running", "b": "stopped", "period": 1}
    pairs = [(a, b) for a, b in zip(phases[0::2], phases[1::2])]
    a, b = np.array(pairs).T
    return {**compare(a, b), "a": "running (median cycle of a phase)", "b": "stopped (the next phase's)",
            "period": period, "settle_cycles": min(SETTLE, period // 2)}


# (owner, name) of the calls --time-calls times: what ours does in the loop beyond plain torch.profiler, and the
# phases of a cycle around them (the handler whole, the start and stop of a trace: torch's and ours)
TIMED_CALLS = ((spool.RecordSpool, "take_all"), (spool.RecordSpool, "flush"), (spool.RecordSpool, "reserve"),
               (spool._Slot, "__init__"), (spool._Slot, "prepare"), (spool._Slot, "drain"),
               (recording, "start_recording"), (recording, "stop_recording"), (recording, "reset_dirty"),
               (session.TraceHandler, "__call__"), (session.profile, "start_trace"), (session.profile, "stop_trace"))


class CallTimes(dict):
    """{label: [s]}: each call's host time filed under its label, prefixed by the kind of the cycle it ran in once
    `kind` is set ("ours: RecordSpool.take_all"); Python's garbage collections too ("gc generation N")."""

    kind = None

    def __getitem__(self, label):
        return self.setdefault(label if self.kind is None else f"{self.kind}: {label}", [])


def time_calls() -> CallTimes:
    """Wrap TIMED_CALLS, and watch the garbage collector, so that each call's and each collection's host time (s)
    is appended to the returned CallTimes."""
    import gc

    times = CallTimes()
    for owner, name in TIMED_CALLS:
        label = f"{owner.__name__.rsplit('.', 1)[-1]}.{name}"
        times[label] = []
        time_each_call(owner, name, times, label)
    started = []

    def collection(phase, info):
        if phase == "start":
            started[:] = [time.perf_counter()]
        elif started:
            times[f"gc generation {info['generation']}"].append(time.perf_counter() - started[0])

    gc.callbacks.append(collection)
    return times


def main(argv=None) -> dict:
    parser = gpu_parser(__doc__, reps=6)
    parser.add_argument("--cycles", type=int, default=100, help="cycles per block")
    parser.add_argument("--period", type=int, default=1,
                        help="part 2: cycles the worker-like process runs, then as many it is stopped (1: by turns)")
    parser.add_argument("--parts", default="12", help="which parts to run (1, 2 or 12)")
    parser.add_argument("--kinds", default=",".join(KINDS), help="part 1: the kinds compared, comma-separated")
    parser.add_argument("--capacity", type=int, default=CAPACITY,
                        help="records per cycle the recorder holds: each drain copies all of its buffer")
    parser.add_argument("--time-calls", action="store_true",
                        help="also time each call to the spool and the recorders (host us per call)")
    args = parser.parse_args(argv)
    kinds = tuple(args.kinds.split(","))
    if set(kinds) - set(KINDS):
        parser.error(f"unknown kinds {sorted(set(kinds) - set(KINDS))}; known: {', '.join(KINDS)}")
    dev, _, _ = calibrated_device(args.device, "profiler")
    step, which = model_step(dev)
    work = Path(tempfile.mkdtemp(prefix="l2topo-diag-components-"))
    figures = {"model": which, "blocks": args.reps, "cycles_per_block": args.cycles, "skipped_per_block": SKIP,
               "capacity": args.capacity}
    call_s = time_calls() if args.time_calls else None
    with torch.no_grad():
        if "1" in args.parts:
            figures["ours_against_plain"] = ours_against_plain(step, dev, work, args.reps, args.cycles, kinds,
                                                               args.capacity, call_s)
            print("ours against plain:", figures["ours_against_plain"], flush=True)
            trace = sorted((work / "ours").glob("*.json"), key=lambda p: p.stat().st_mtime)[-1]
        else:  # a trace to enrich: one short block of ours
            with session.profile(work / "ours", activities=[torch.profiler.ProfilerActivity.CPU,
                                                            torch.profiler.ProfilerActivity.CUDA],
                                 devices=[dev.index], capacity=args.capacity) as prof:
                step()
            trace = prof.written[0]
        if "2" in args.parts:
            figures["worker_running_against_stopped"] = worker_running_against_stopped(
                step, work, trace, args.reps, args.cycles, args.period)
            print("worker running against stopped:", figures["worker_running_against_stopped"], flush=True)
    if call_s is not None:
        figures["host_us_per_call"] = {label: quantiles(np.array(s) * 1e6) for label, s in call_s.items() if s}
        print("host us per call:", figures["host_us_per_call"], flush=True)
    path = write_result(args.out, figures, args.device)
    print(f"wrote {path}")
    return figures


if __name__ == "__main__":
    main()
