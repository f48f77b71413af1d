"""Trace enrichment off the training loop: one worker process per training process, which runs the cycle jobs
(cycle.py) that the background trace handlers export, so a profiled step waits for the profiler's own export
and the recorders' drain, not for the enrichment (0.2-0.3 s for 81,920 CTAs).

The worker is a plain `python -m torch_l2topo.profiler.worker` subprocess, not a multiprocessing child: those
re-import the user's main script, which a training script without a __main__ guard would run again. One serves
the whole process (shared_worker()): it is started by the first background handler and lives until exit, so its
imports (seconds) are paid once and later profiler blocks find it ready.

It runs at the lowest priority from its first instruction on: the parent sets nice 19 and SCHED_IDLE on it as
soon as it exists, so that it only takes CPU time nobody else wants. On the H200 machine (16 vCPUs) a worker
that still ran at nice 0 while importing, next to the 15 BLAS threads a calibration's analysis leaves spinning
in the parent, took the CPU of the training loop: every wake-up cost the loop a scheduler tick, ~5 ms
(benchmarks/results/diagnosis/profiler_handler_spinning_threads_h200.json). A busy child, at either priority,
showed no consistent effect on the parent's own work there (benchmarks/diag_signal_cost.py).

Protocol: the worker writes READY on stdout once its imports are done. The parent hands it a job only then, as a
length-prefixed pickle on its stdin, and never more than IN_PIPE unanswered at a time; the worker answers each job,
in order, with one line RESULT + JSON {"problem", "written", "seconds"}. A job is small: its records stay in the
spool's shared-memory slots (spool.py), whose held drain is launched as the job is handed over. A profile() block
holds its jobs back (hold(max_held)): none goes to the worker until more than max_held wait, so a short block's
enrichment runs once its steps are over, not beside them (docs/profiler.md, After the steps, not beside them, says
what its work beside them cost), unless the cycles are long enough for the worker to keep up (keeps_up: from its
first answer on, the time it took for its last job against the cycle's). The jobs not handed over yet stay with the
parent, which can therefore always take work back without a race: when it has to wait (drain(), or max_pending jobs
in flight) it runs the newest waiting job itself while the worker goes on with the oldest, and a worker that is not
ready yet (still importing at a block's end) leaves every job to the parent. Finished jobs are reported (on_done)
in submission order. A worker that dies leaves its unanswered jobs to the parent (or to its successor): nothing is
lost.
"""
from __future__ import annotations

import json
import os
import pickle
import select
import subprocess
import sys
import time
import warnings
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .cycle import CycleJob, run
from .perprocess import PerProcess
from .spool import launch_drains_for

RESULT = b"l2topo-cycle-done "
READY = b"l2topo-worker-ready"
DEFAULT_MAX_PENDING = 16
IN_PIPE = 2  # jobs the worker holds unanswered: one to work on, the next waiting, so it never idles for a hand-off
KEEP_UP_FACTOR = 2  # the worker keeps up when a cycle lasts this many times its last job (Worker.keeps_up)
_LENGTH = 8  # bytes of a job's length prefix
# The worker is one thread of JSON work: without these, numpy's BLAS would start a thread per core that it never
# uses.
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@dataclass
class _Entry:
    """A submitted job until it is reported: its callback and, once finished, what went wrong (None: nothing)."""

    job: CycleJob
    on_done: Callable
    finished: bool = False
    problem: str | None = None


class Worker:
    """The parent's side. submit(job, on_done) returns at once unless max_pending jobs are in flight; drain() waits
    for every job; close() ends the worker process. on_done(path, problem) is called for each job, in submission
    order, from whichever of these calls finishes it."""

    def __init__(self, max_pending: int = DEFAULT_MAX_PENDING):
        self._proc = None
        self.max_pending = check_max_pending(max_pending)
        self._ready = False
        self._inbox = bytearray()  # what the worker wrote that is not a whole line yet
        self._entries: deque = deque()  # every job not reported yet, in submission order
        self._waiting: deque = deque()  # jobs not handed to the worker yet
        self._handed: deque = deque()   # jobs the worker holds, unanswered (it answers in order)
        self._holds: list = []  # max_held of each hold() not released yet (profile() blocks running)
        self.job_s: float | None = None  # how long the worker process took for its last job (None: none answered)

    def start(self) -> None:
        """Start the worker process now if it is not running (submit does otherwise): its imports take seconds,
        best spent while the first steps run."""
        if self._proc is None or self._proc.poll() is not None:
            self._start()

    def _start(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **ONE_THREAD}
        self._proc = subprocess.Popen([sys.executable, "-m", "torch_l2topo.profiler.worker"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, env=env)
        _run_idle(self._proc.pid)
        self._ready = False
        self._inbox.clear()

    def ready(self) -> bool:
        """Whether the worker has started and imported what it needs (never blocks)."""
        if not self._ready and self._proc is not None:
            self._read(wait=False)
        return self._ready

    def hold(self, max_held: int) -> None:
        """Until release(): jobs stay here while at most max_held wait; beyond that the worker gets the oldest ones
        (and works while the steps go on). Holds nest; the smallest max_held of those in force applies."""
        self._holds.append(check_max_held(max_held))

    def keeps_up(self, period_s: float | None) -> bool:
        """Whether jobs that come every `period_s` seconds (None: not known yet) may go to the worker beside the
        steps, holds or not: it took less than 1 / KEEP_UP_FACTOR of that for its last job, so its work is a small
        share of each cycle and a block's end need not wait for a backlog. With 0.8 s cycles of GPU-bound steps its
        work beside them cost nothing measurable (benchmarks/results/profiler_h100_*.json, overhead_larger_step,
        "concurrent"); with 4 ms cycles it cost several percent, and a job takes 0.2 s there."""
        return self.job_s is not None and period_s is not None and period_s > KEEP_UP_FACTOR * self.job_s

    def release(self) -> None:
        """End the latest hold(); the jobs it kept go to the worker as it can take them (harvest, drain)."""
        if self._holds:
            self._holds.pop()
        self._hand_over()

    def submit(self, job: CycleJob, on_done: Callable, max_pending: int | None = None, beside: bool = False) -> None:
        """Queue `job`; it goes to the worker as soon as the worker can take it. Returns at once unless
        `max_pending` (default: this worker's) jobs are in flight: then it first finishes the oldest work (module
        docstring). Jobs the worker has answered by now are reported first, without waiting for the others.
        beside: the jobs held here (hold()) go to the worker now too (the caller found that it keeps up: keeps_up)."""
        limit = self.max_pending if max_pending is None else check_max_pending(max_pending)
        if not beside and self._holds and not self._handed and len(self._waiting) < min(self._holds) and \
                len(self._entries) < limit and self._proc is not None:
            # held here, and the worker has nothing to answer: nothing to read, hand over or report (the full path
            # took 29-115 us a call at the cycle's edge on an H200 machine, where each Python line is slow:
            # benchmarks/results/diagnosis/profiler_handler_h200_launch_costs.json, Worker.submit)
            entry = _Entry(job, on_done)
            self._entries.append(entry)
            self._waiting.append(entry)
            return
        self.harvest()
        while len(self._entries) >= limit:
            self._progress()
        entry = _Entry(job, on_done)
        self._entries.append(entry)
        self._waiting.append(entry)
        if self._proc is None:  # not poll(): a worker that died is found by harvest (its pipe's end), and
            self._start()       # a poll costs the loop a system call per cycle
        self._hand_over(beside)

    def harvest(self) -> None:
        """Take the answers already written, hand the worker more jobs, report what is finished (never blocks)."""
        if self._proc is not None and (self._handed or not self._ready):  # else nothing to read: no system call
            self._read(wait=False)
        self._hand_over()
        self._report()

    def drain(self) -> None:
        """Wait until every job submitted is finished and reported."""
        while self._entries:
            self._progress()

    def close(self) -> None:
        """drain(), then end the worker process: at the end of its input, or at once if it is still importing
        (it holds no job then)."""
        self.drain()
        if self._proc is not None:
            _end(self._proc, kill=not self.ready())
            self._proc, self._ready = None, False

    def __del__(self):
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()

    # ---- internals -----------------------------------------------------------------------------------------
    def _progress(self) -> None:
        """Finish at least one job, waiting if need be: the newest job not handed over runs here (the worker goes
        on with the oldest), else wait for the worker's next answer."""
        self.harvest()
        if self._waiting:
            entry = self._waiting.pop()
            entry.problem, entry.finished = run(entry.job), True
        elif self._handed:
            self._read(wait=True)
        self._report()

    def _hand_over(self, beside: bool = False) -> None:
        keep = 0 if beside else min(self._holds, default=0)  # jobs that stay here (hold(); submit's beside)
        while len(self._waiting) > keep and len(self._handed) < IN_PIPE and self._proc is not None and self.ready():
            entry = self._waiting.popleft()
            launch_drains_for(entry.job.records)  # else the worker would wait for records this process still holds
            blob = pickle.dumps(entry.job, protocol=pickle.HIGHEST_PROTOCOL)
            try:
                self._proc.stdin.write(len(blob).to_bytes(_LENGTH, "little") + blob)
                self._proc.stdin.flush()
            except (BrokenPipeError, OSError):  # the worker is gone: the job stays here
                self._waiting.appendleft(entry)
                self._lost()
                return
            self._handed.append(entry)

    def _read(self, wait: bool) -> None:
        """Take the worker's lines (READY, answers): those already written, or (wait) at least one more."""
        fd = self._proc.stdout.fileno()
        while True:
            if not wait and not select.select([fd], [], [], 0)[0]:
                return
            data = os.read(fd, 1 << 16)
            if not data:
                self._lost()
                return
            self._inbox += data
            got_line = False
            while (end := self._inbox.find(b"\n")) >= 0:
                line = bytes(self._inbox[:end])
                del self._inbox[:end + 1]
                got_line = True
                if line == READY:
                    self._ready = True
                elif line.startswith(RESULT) and self._handed:
                    self._answered(self._handed.popleft(), json.loads(line[len(RESULT):]))
            if wait and got_line:
                return

    def _answered(self, entry: _Entry, answer: dict) -> None:
        self.job_s = answer.get("seconds", self.job_s)
        if answer["written"]:
            entry.problem, entry.finished = answer["problem"], True
        else:  # the worker failed before writing (the export is still there): the job runs here
            self._waiting.appendleft(entry)

    def _lost(self) -> None:
        """The worker exited: warn (Python shows a warning once per place); the jobs it held run here (or in its
        successor), except those it wrote (run() removes the export last, once the trace is written)."""
        warnings.warn("torch_l2topo's trace worker exited; its remaining traces are enriched in this process",
                      stacklevel=4)
        for entry in reversed(self._handed):
            if Path(entry.job.export).exists():
                self._waiting.appendleft(entry)
            else:
                entry.finished = True
        self._handed.clear()
        _end(self._proc, kill=True)  # it closed its output: it is exiting, if it has not exited yet
        self._proc, self._ready = None, False

    def _report(self) -> None:
        while self._entries and self._entries[0].finished:
            entry = self._entries.popleft()
            entry.on_done(entry.job.path, entry.problem)


def _end(proc, kill: bool) -> None:
    """End the worker process `proc`: killed, or (kill false) at the end of its input; its pipes closed."""
    if kill:
        proc.kill()
    for stream in (proc.stdin, proc.stdout):
        try:
            stream.close()
        except OSError:  # a write the dead worker never took: nothing to flush it to
            pass
    proc.wait()


def check_max_pending(max_pending) -> int:
    if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
        raise ValueError(f"max_pending must be an integer >= 1, got {max_pending!r}")
    return max_pending


def check_max_held(max_held, max_pending: int | None = None) -> int:
    """max_held, if it is an integer >= 0 (and below max_pending, given: more held jobs than that would make the
    loop enrich them itself); else ValueError."""
    top = "" if max_pending is None else f" and below max_pending ({max_pending})"
    if isinstance(max_held, bool) or not isinstance(max_held, int) or max_held < 0 or \
            (max_pending is not None and max_held >= max_pending):
        raise ValueError(f"max_held must be an integer >= 0{top}, got {max_held!r}")
    return max_held


def _run_idle(pid: int) -> None:
    """Give process `pid` the lowest priority (nice 19, SCHED_IDLE where Linux has it): module docstring. Where
    that is not allowed or not there, it runs as it is."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, 19)
        os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        pass


_shared = PerProcess(Worker)


def shared_worker() -> Worker:
    """The process's worker (module docstring; perprocess.py), made on first use."""
    return _shared.get()


def close_shared_worker() -> None:
    """Finish every job of the process's worker and end it (session.py calls it at exit)."""
    _shared.close()


def main() -> None:
    out, jobs = sys.stdout.buffer, sys.stdin.buffer
    out.write(READY + b"\n")
    out.flush()
    while len(head := jobs.read(_LENGTH)) == _LENGTH:
        blob = jobs.read(int.from_bytes(head, "little"))
        started = time.perf_counter()
        try:
            problem, written = run(pickle.loads(blob)), True
        except Exception as exc:  # answered, never raised: the parent runs the job itself (the export stays)
            problem, written = f"{type(exc).__name__}: {exc}", False
        answer = {"problem": problem, "written": written, "seconds": time.perf_counter() - started}
        out.write(RESULT + json.dumps(answer).encode() + b"\n")
        out.flush()


if __name__ == "__main__":
    main()
