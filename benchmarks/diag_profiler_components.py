"""What torch_l2topo.profile adds to a profiled cycle of the example model, measured cycle against adjacent cycle
(issue 17). On the H200 machine the loop's speed drifts by +-25% from one second to the next, so profiler blocks
timed one after another (bench_profiler.py) resolve a 2% difference only over hundreds of rounds; cycles a few
ms apart drift far less.

1. Our loop's own work: torch_l2topo.profile blocks (background worker) in which three of every four cycles are
   plain (no recording; the handler only exports the trace to disk, as plain torch.profiler's on_trace_ready
   does) and the fourth takes turns among ours as it is and ours without one of its parts (KINDS). Each such
   cycle and the one after it (which runs what it deferred: its records' drain) are compared with the two-cycle
   units of plain cycles just before and after (unit_pairs). Until 2026-12-02 08:20 each cycle was compared
   alone with its plain neighbours, which charged the deferred drain to a plain neighbour and read the cost low
   by twice the drain's (the results of that design say so). The worker's jobs wait for the block's end
   (max_held; until 2026-12-06 it enriched beside every kind of cycle alike), so this leaves out what its work
   costs the loop: that is part 2.
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

    python benchmarks/diag_profiler_components.py --device 0 \\
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
from bench_profiler import ACTIVE, CAPACITY, model_step
from common import bootstrap_ci90, calibrated_device, gpu_parser, quantiles, time_each_call, write_result

from torch_l2topo.placement import recording
from torch_l2topo.profiler import session, spool
from torch_l2topo.profiler.spool import shared_spool
from torch_l2topo.profiler.worker import _run_idle

SKIP = 2  # cycles left out at each block's start
SETTLE = 4  # cycles left out at each phase's start in part 2 with phases

BURNER = r"""
import sys
from torch_l2topo.profiler.cycle import enrich_with
from torch_l2topo.profiler.readback import calibrations, recorded_ctas
from torch_l2topo.profiler.tracefile import dumps, load_trace, parse, splice, strip, write_trace

rich = load_trace(sys.argv[1])
records, maps = recorded_ctas(rich), calibrations(rich)
text = dumps(strip(rich)).decode()
print("ready", flush=True)
while True:  # the worker's job (cycle.run), on the same trace, forever
    trace, end = parse(text, "burner")
    added = enrich_with(trace, maps, {}, (), records)
    write_trace(splice(text, end, added.fragments(), added.meta), sys.argv[2])
"""


def _cycles(step, prof, n: int, at_cycle_start=None) -> list:
    """Wall seconds of each of n cycles (wait 1, warmup 1, ACTIVE active steps) of `prof`, already entered."""
    stamps = []
    for c in range(n):
        if at_cycle_start is not None:
            at_cycle_start(c)
        stamps.append(time.perf_counter())
        for _ in range(2 + ACTIVE):
            step()
            prof.step()
    stamps.append(time.perf_counter())
    return np.diff(stamps).tolist()


def _paired(times: list, first_is_a: bool) -> dict:
    """Kind A against kind B over adjacent cycles (A on even cycles when first_is_a): quantiles by kind, and the
    median difference per pair (us) and ratio, with a bootstrap 90% interval of the median difference."""
    t = np.asarray(times)
    a, b = (t[0::2], t[1::2]) if first_is_a else (t[1::2], t[0::2])
    n = min(len(a), len(b))
    return _compared(a[:n], b[:n])


def _compared(a: np.ndarray, b: np.ndarray, cycles_per_unit: int = 1) -> dict:
    """a against b, pair by pair (each a unit of cycles_per_unit cycles): quantiles, the median and the mean
    difference (us) with bootstrap 90% intervals, and each over the median plain cycle (b / cycles_per_unit). The
    mean counts a cost that only some units pay (a drain held for several cycles) at its share; the median leaves
    it out."""
    diff = (a - b) * 1e6
    plain_us = np.median(b) / cycles_per_unit * 1e6
    return {"a_s": quantiles(a), "b_s": quantiles(b), "pairs": len(diff), "cycles_per_unit": cycles_per_unit,
            "diff_us": {**quantiles(diff), "p50_ci90": bootstrap_ci90(lambda p: np.median(diff[p], axis=1),
                                                                     len(diff)),
                        "mean": float(diff.mean()),
                        "mean_ci90": bootstrap_ci90(lambda p: diff[p].mean(axis=1), len(diff))},
            "diff_over_b_median": float(np.median(diff) / plain_us),
            "mean_diff_over_b_median": float(diff.mean() / plain_us),
            "ratio_of_medians": float(np.median(a) / np.median(b))}


GROUP = 4  # a compared cycle, then three plain ones (unit_pairs)


def kind_sequence(compared) -> list:
    """The kinds of a block's cycles, repeating: each compared kind, then three plain cycles (unit_pairs)."""
    return [k for kind in compared for k in (kind, *["plain"] * (GROUP - 1))]


def unit_pairs(times, kinds: list, skip: int) -> dict:
    """{kind: [(unit, control)]} from one block's cycle times (kinds: kind_sequence's, by cycle). A unit is a
    compared cycle plus the one after it, so that what the compared cycle leaves to its next step (its deferred
    drain) counts against it; its control is the mean of the two-cycle units of clean plain cycles just before
    and just after it (each preceded by a plain cycle). Cycles before `skip` are left out."""
    out = {}
    for c in range(max(skip, 2), len(times) - 3):
        kind = kinds[c % len(kinds)]
        if kind != "plain":
            control = (times[c - 2] + times[c - 1] + times[c + 2] + times[c + 3]) / 2
            out.setdefault(kind, []).append((times[c] + times[c + 1], control))
    return out


# What a cycle of each kind does beyond plain torch.profiler's (plain: no recording, the handler only exports to
# disk). Three of every four cycles are plain (kind_sequence); unit_pairs compares the others with them.
KINDS = {
    "ours": "torch_l2topo.profile as it is",
    "ours_draining_every_cycle": "its records drained in its trace handler (with those of earlier cycles the drain "
                                 "held), as before a drain held several cycles",
    "ours_without_drain": "no records drained (the recorder marked clean by hand, so no later cycle resets it)",
    "ours_without_hand_off": "the job is not handed to the worker (its export deleted, its slots released at once)",
    "ours_without_recording": "nothing recorded; the (empty) drain, the export to shared memory and the hand-off",
    "plain_with_a_cuda_op": "plain, plus one small CUDA operation (a one-word fill) after the export in its handler",
}


class _NoHandOff:
    """Stands in for the worker: the job is dropped (export deleted) and reported done at once."""

    def keeps_up(self, period_s) -> bool:
        return False

    def submit(self, job, on_done, max_pending=None, beside=False):
        os.unlink(job.export)
        on_done(job.path, None)


class Alternating(session.profile):
    """torch_l2topo.profile whose cycles take turns: kinds[c % len(kinds)] is cycle c's kind (KINDS, or "plain")."""

    def __init__(self, plain_dir: Path, kinds: list, **options):
        super().__init__(**options)
        self.plain_dir, self.kinds, self.cycle = plain_dir, kinds, 0
        self.word = torch.zeros(1, device="cuda")
        self.on_trace_ready = self._handle

    def _kind(self) -> str:
        return self.kinds[self.cycle % len(self.kinds)]

    def _handle(self, prof) -> None:
        kind = self._kind()
        if kind.startswith("plain"):
            prof.export_chrome_trace(str(self.plain_dir / f"plain-{self.cycle % 4}.json"))
            if kind == "plain_with_a_cuda_op":
                self.word.fill_(1.0)
        elif kind == "ours_without_drain":
            self.handler._cuda = False  # records = {}
            self.handler(prof)
            self.handler._cuda = None
            for r in recording.recorders().values():
                r.dirty = False
        elif kind == "ours_draining_every_cycle":
            held, self.handler.held.per_drain = self.handler.held.per_drain, {}  # one cycle a drain
            self.handler(prof)
            self.handler.held.per_drain = held
        elif kind == "ours_without_hand_off":
            real, self.handler._worker = self.handler._worker, _NoHandOff()
            self.handler(prof)
            self.handler._worker = real
        else:
            self.handler(prof)
        self.cycle += 1

    def _start_recording(self) -> None:
        if self._kind() in ("ours", "ours_draining_every_cycle", "ours_without_drain", "ours_without_hand_off"):
            super()._start_recording()


def ours_against_plain(step, dev, work: Path, blocks: int, cycles: int, compared=tuple(KINDS),
                       capacity: int = CAPACITY, call_times=None) -> dict:
    """Part 1 (module docstring) for the kinds `compared`: per kind, its two-cycle units against the plain ones
    around them (unit_pairs), and how long each block's end waited for its traces."""
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    sched = torch.profiler.schedule(wait=1, warmup=1, active=ACTIVE, repeat=cycles)
    (work / "plain").mkdir(parents=True, exist_ok=True)
    kinds = kind_sequence(compared)
    recorder = recording.recorder(dev.index, session.held_capacity(capacity), at_least=capacity)
    per_drain = max(recorder.capacity // capacity, 1)  # our cycles a drain holds (spool.py, Held drains)
    # no slot is page-locked in the loop: one for each drain of the block's jobs (held to its end), one more
    shared_spool().reserve(dev.index, recorder.capacity, -(-(cycles // GROUP) // per_drain) + 1, recorder)
    by_kind = {k: [] for k in compared}
    exits = []
    for b in range(blocks + 1):  # block 0 warms up (compilation, the worker's imports)
        # every job held for the block's end: nothing of the worker's lands between cycles (part 2 measures what its
        # work beside the steps costs), and none runs in the loop
        prof = Alternating(work / "plain", kinds, path_or_dir=work / "ours", activities=acts, schedule=sched,
                           devices=[dev.index], capacity=capacity, max_held=cycles, max_pending=cycles + 1)
        torch.cuda.synchronize()
        with prof:
            t = _cycles(step, prof, cycles, None if call_times is None else
                        lambda c: setattr(call_times, "kind", kinds[c % len(kinds)]))
            t_end = time.perf_counter()
        exits.append(time.perf_counter() - t_end)
        if b:
            for kind, pairs in unit_pairs(t, kinds, SKIP).items():
                by_kind[kind] += pairs
        print(f"ours against plain: block {b}/{blocks}", flush=True)
    out = {"what": {k: KINDS[k] for k in compared}, "exit_s": quantiles(exits[1:])}
    for kind, pairs in by_kind.items():
        a, b = np.array(pairs).T
        out[kind] = _compared(a, b, cycles_per_unit=2)
    return out


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
                t = _cycles(step, prof, cycles, toggle)
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
    return {**_compared(a, b), "a": "running (median cycle of a phase)", "b": "stopped (the next phase's)",
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
