"""Trace enrichment off the training loop: worker processes that run the background trace handlers' cycle jobs
(cycle.py), so that a profiled step waits for the profiler's own export and not for the enrichment.

A worker process is `python -m torch_l2topo.profiler.runtime.worker` (not a multiprocessing child: those re-import the
user's main script), in a session of its own (a terminal's Ctrl-C is the parent's to handle) and at the lowest
priority from its start (nice 19, SCHED_IDLE). One Worker per process (shared_worker()) keeps up to `processes`
of them for every profiler block, so their imports are paid once. Protocol: a process writes READY once
imported, is handed at most IN_PIPE jobs at a time (length-prefixed pickles) and answers each in order.

Contract (docs/profiler.md, Safety): every job submitted is reported once, in submission order; its trace is
enriched or left as exported, never lost; a job that failed or whose process died is not retried; every wait
ends by its deadline (drain: the jobs left are given up, the processes holding one killed and their temporary
files removed). hold() keeps a profile() block's jobs here until it ends, unless the cycles are long enough for
the processes to keep up (keeps_up); a drain runs the newest waiting jobs here while the processes take the oldest.
"""
from __future__ import annotations

import json
import math
import os
import pickle
import select
import subprocess
import sys
import time
from collections import deque
from contextlib import suppress
from dataclasses import dataclass
from typing import Callable

from ...files import temp_files_of
from .cycle import CycleJob, run, warn
from .perprocess import PerProcess
from .spool import launch_drains_for

RESULT = b"l2topo-cycle-done "
READY = b"l2topo-worker-ready"
DEFAULT_MAX_PENDING = 16
MAX_PROCESSES = 8     # worker processes at most (default_processes): a block's end shares its jobs among them
DEFAULT_WAIT_S = 5.0  # what a drain allows beyond the enrichment's measured time (default_timeout)
ASSUMED_JOB_S = 1.0   # a job's time before one was measured
END_WAIT_S = 1.0      # how long a process that holds no job may take to exit before it is killed
IN_PIPE = 2  # jobs a process holds unanswered: one to work on, the next waiting, so it never idles for a hand-off
KEEP_UP_FACTOR = 2  # the processes keep up when a cycle lasts this many times their last job (Worker.keeps_up)
_LENGTH = 8  # bytes of a job's length prefix
COMMAND = [sys.executable, "-m", "torch_l2topo.profiler.runtime.worker"]  # a worker process (tests wrap it)
# One thread of JSON work each: without these, numpy's BLAS would start a thread per core that it never uses.
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def default_processes() -> int:
    """Worker processes for this machine: one per two CPUs this process may use, 1 to MAX_PROCESSES (a block's
    end enriches its held cycles at once: 8 of them in one round where the CPUs allow, not two)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(MAX_PROCESSES, cpus // 2))


@dataclass
class _Entry:
    """A submitted job until it is reported: its callback and, once finished, what went wrong (None: nothing)."""

    job: CycleJob
    on_done: Callable
    finished: bool = False
    problem: str | None = None

    def finish(self, problem: str | None) -> None:
        self.finished, self.problem = True, problem


class _Process:
    """One worker process and the jobs it holds unanswered (in the order it answers them)."""

    def __init__(self):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **ONE_THREAD}
        self.proc = subprocess.Popen(COMMAND, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                     start_new_session=True)
        _run_idle(self.proc.pid)
        self.ready = False
        self.handed: deque = deque()
        self._inbox = bytearray()  # what it wrote that is not a whole line yet

    def fileno(self) -> int:
        return self.proc.stdout.fileno()

    def send(self, entry: _Entry) -> bool:
        """Hand it `entry`'s job; False if it is gone."""
        blob = pickle.dumps(entry.job, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self.proc.stdin.write(len(blob).to_bytes(_LENGTH, "little") + blob)
            self.proc.stdin.flush()
        except OSError:  # a broken pipe: it exited
            return False
        self.handed.append(entry)
        return True

    def read(self) -> list | None:
        """[(entry, answer)] for the answers it wrote (call when its output is readable); None once it exited."""
        data = os.read(self.fileno(), 1 << 16)
        if not data:
            return None
        self._inbox += data
        answers = []
        while (end := self._inbox.find(b"\n")) >= 0:
            line = bytes(self._inbox[:end])
            del self._inbox[:end + 1]
            if line == READY:
                self.ready = True
            elif line.startswith(RESULT) and self.handed:
                try:
                    answer = json.loads(line[len(RESULT):])
                except ValueError:
                    answer = {"problem": f"torch_l2topo's trace worker gave an unreadable answer: {line[:80]!r}"}
                answers.append((self.handed.popleft(), answer))
        return answers

    def kill(self) -> None:
        """End it now, and remove the temporary files of the traces it was writing."""
        with suppress(OSError):
            self.proc.kill()
        self._close()
        for entry in self.handed:
            for tmp in temp_files_of(entry.job.path, self.proc.pid):
                tmp.unlink(missing_ok=True)

    def end(self) -> None:
        """End it at the end of its input (call when it holds no job), or kill it after END_WAIT_S."""
        with suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(END_WAIT_S)
        except subprocess.TimeoutExpired:
            self.kill()
        self._close()

    def _close(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            with suppress(OSError):
                stream.close()
        self.proc.wait()


class Worker:
    """The parent's side. submit(job, on_done) queues a job and returns at once (False, nothing queued, when
    max_pending jobs are in flight); drain(timeout_s) waits for every job, boundedly; close() also ends the
    processes. on_done(path, problem) is called once per job, in submission order, by whichever call finishes it."""

    def __init__(self, max_pending: int = DEFAULT_MAX_PENDING, processes: int | None = None):
        self.max_pending = check_max_pending(max_pending)
        self.processes = default_processes() if processes is None else _positive_int(processes, "processes")
        self._procs: list = []
        self._entries: deque = deque()  # every job not reported yet, in submission order
        self._waiting: deque = deque()  # jobs not handed to a process yet
        self._holds: list = []  # max_held of each hold() not released yet (profile() blocks running)
        self._broken: str | None = None  # why no process is started any more (then drains do every job here)
        self.job_s: float | None = None  # how long the last job took (None: none done yet)

    # ---- processes ------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start processes up to `processes` now (submit does otherwise): their imports take seconds, best spent
        while the first steps run."""
        while self._broken is None and len(self._procs) < self.processes:
            try:
                self._procs.append(_Process())
            except OSError as exc:
                self._broken = f"torch_l2topo could not start a trace worker ({exc})"

    def ready(self) -> bool:
        """Whether a process has started and imported what it needs (never blocks)."""
        self._poll(0)
        return any(p.ready for p in self._procs)

    def close(self, timeout_s: float | None = None) -> None:
        """drain(timeout_s), then end the processes."""
        self.drain(timeout_s)
        for p in self._procs:
            p.end()
        self._procs.clear()

    def abandon(self) -> None:
        """Kill the processes now (their temporary files removed), reporting nothing: the process is ending."""
        for p in self._procs:
            p.kill()
        self._procs.clear()

    def __del__(self):
        for p in getattr(self, "_procs", ()):
            with suppress(Exception):
                p.proc.kill()

    # ---- holds ----------------------------------------------------------------------------------------------
    def hold(self, max_held: int) -> None:
        """Until release(): jobs stay here while at most max_held wait; beyond that the processes get the oldest
        (and work while the steps go on). Holds nest; the smallest max_held of those in force applies."""
        self._holds.append(check_max_held(max_held))

    def release(self) -> None:
        """End the latest hold(); the jobs it kept go to the processes as they can take them."""
        if self._holds:
            self._holds.pop()
        self._hand_over()

    def keeps_up(self, period_s: float | None) -> bool:
        """Whether jobs that come every `period_s` seconds (None: not known yet) may go to the processes beside the
        steps, holds or not: the last job took less than 1 / KEEP_UP_FACTOR of that (docs/profiler.md, Costs)."""
        return self.job_s is not None and period_s is not None and period_s > KEEP_UP_FACTOR * self.job_s

    # ---- jobs -----------------------------------------------------------------------------------------------
    def submit(self, job: CycleJob, on_done: Callable, max_pending: int | None = None, beside: bool = False) -> bool:
        """Queue `job` for the processes and return at once; False (not queued) when `max_pending` (default: this
        worker's) jobs are in flight. Jobs already answered are reported first. beside: the jobs held here
        (hold()) go to the processes now too (the caller found that they keep up)."""
        limit = self.max_pending if max_pending is None else check_max_pending(max_pending)
        if not beside and self._holds and len(self._waiting) < min(self._holds) and len(self._entries) < limit \
                and self._procs and not any(p.handed for p in self._procs):
            # held here, and no process has anything to answer: nothing to read, hand over or report (this runs at
            # the cycle's edge, where every line costs the training loop)
            entry = _Entry(job, on_done)
            self._entries.append(entry)
            self._waiting.append(entry)
            return True
        self.harvest()
        if len(self._entries) >= limit:
            return False
        entry = _Entry(job, on_done)
        self._entries.append(entry)
        self._waiting.append(entry)
        if len(self._procs) < self.processes:
            self.start()
        self._hand_over(beside)
        return True

    def harvest(self) -> None:
        """Take the answers already written, hand the processes more jobs, report what is finished (never blocks)."""
        if any(p.handed or not p.ready for p in self._procs):
            self._poll(0)
        self._hand_over()
        self._report()

    def default_timeout(self) -> float:
        """A drain's default bound: DEFAULT_WAIT_S plus the measured job time for the jobs in flight, shared
        among this process and the ready worker processes."""
        share = math.ceil(len(self._entries) / (1 + sum(p.ready for p in self._procs)))
        return DEFAULT_WAIT_S + share * (self.job_s or ASSUMED_JOB_S)

    def drain(self, timeout_s: float | None = None) -> None:
        """Wait until every job is finished and reported, for at most timeout_s (default: default_timeout()).
        Meanwhile this process runs the newest waiting jobs, each only if the last job's time fits before the
        deadline (or no process can run). At the deadline the jobs left are given up: reported with the reason,
        their traces left as exported, the processes holding one killed."""
        if timeout_s is None:
            timeout_s = self.default_timeout()
        deadline = time.monotonic() + timeout_s
        while True:
            self._hand_over(beside=True)
            self.harvest()
            left = deadline - time.monotonic()
            if not self._entries or left <= 0:
                break
            # a job runs here only if its measured time fits before the deadline (or no process can do it)
            if self._waiting and ((self.job_s is not None and self.job_s < left) or not self._procs):
                entry = self._waiting.pop()  # the newest: the processes go on with the oldest
                started = time.perf_counter()
                entry.finish(run(entry.job, left))
                self.job_s = time.perf_counter() - started
            elif any(p.handed or not p.ready for p in self._procs):
                self._poll(left)
            else:  # nothing can finish in time
                break
        self._give_up(timeout_s)

    # ---- internals ------------------------------------------------------------------------------------------
    def _poll(self, timeout_s: float) -> None:
        """Read what the processes wrote, waiting up to timeout_s for something to read."""
        if not self._procs:
            return
        readable, _, _ = select.select(self._procs, [], [], max(timeout_s, 0))
        for p in readable:
            answers = p.read()
            if answers is None:
                self._lost(p)
                continue
            for entry, answer in answers:
                self.job_s = answer.get("seconds", self.job_s)
                entry.finish(answer.get("problem"))

    def _hand_over(self, beside: bool = False) -> None:
        keep = 0 if beside else min(self._holds, default=0)  # jobs that stay here (hold(); submit's beside)
        for p in list(self._procs):
            while len(self._waiting) > keep and p.ready and len(p.handed) < IN_PIPE:
                entry = self._waiting.popleft()
                try:
                    launch_drains_for(entry.job.records)  # else the process would wait for records still held here
                except Exception as exc:  # the records will not come: the trace stays as exported
                    entry.finish(f"torch_l2topo could not copy the CTA records of {entry.job.path} "
                                 f"({type(exc).__name__}: {exc}); it stays as torch.profiler wrote it")
                    continue
                if not p.send(entry):
                    self._waiting.appendleft(entry)
                    self._lost(p)
                    break

    def _lost(self, p: _Process) -> None:
        """Process `p` exited: the jobs it held are given up (not retried: one of them may be why it died)."""
        self._procs.remove(p)
        if not p.ready:
            self._broken = "torch_l2topo's trace worker exited during its start"
        p.kill()
        for entry in p.handed:
            entry.finish(f"torch_l2topo's trace worker exited (code {p.proc.returncode}) before enriching "
                         f"{entry.job.path}; it stays as torch.profiler wrote it")

    def _give_up(self, timeout_s: float) -> None:
        for p in [p for p in self._procs if p.handed]:
            self._procs.remove(p)
            p.kill()
        self._waiting.clear()
        for entry in self._entries:
            if not entry.finished:
                entry.finish(f"torch_l2topo gave up waiting for the enrichment of {entry.job.path} after "
                             f"{timeout_s:.1f} s; it stays as torch.profiler wrote it")
        self._report()

    def _report(self) -> None:
        while self._entries and self._entries[0].finished:
            entry = self._entries.popleft()
            try:
                entry.on_done(entry.job.path, entry.problem)
            except Exception as exc:  # a callback's failure must not stop the others' reports
                warn(f"torch_l2topo: reporting {entry.job.path} failed ({type(exc).__name__}: {exc})")


def check_max_pending(max_pending) -> int:
    return _positive_int(max_pending, "max_pending")


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def check_max_held(max_held, max_pending: int | None = None) -> int:
    """max_held, if it is an integer >= 0 (and below max_pending, given: more held jobs than that would leave
    traces plain); else ValueError."""
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


def existing_worker() -> Worker | None:
    """The process's worker if it was made, else None."""
    return _shared.existing()


def close_shared_worker(timeout_s: float | None = None) -> None:
    """Finish the jobs of the process's worker (Worker.drain's bound) and end its processes."""
    _shared.close(timeout_s)


def main() -> None:
    out, jobs = sys.stdout.buffer, sys.stdin.buffer
    try:
        out.write(READY + b"\n")
        out.flush()
        while len(head := jobs.read(_LENGTH)) == _LENGTH:
            blob = jobs.read(int.from_bytes(head, "little"))
            started = time.perf_counter()
            try:
                job = pickle.loads(blob)
            except Exception as exc:  # a job cut short (its parent died mid-write) or not ours
                problem = f"torch_l2topo's trace worker could not read a job ({type(exc).__name__}: {exc})"
            else:
                problem = run(job)
            answer = {"problem": problem, "seconds": time.perf_counter() - started}
            out.write(RESULT + json.dumps(answer).encode() + b"\n")
            out.flush()
    except BrokenPipeError:  # the parent is gone: nobody to answer, and nothing to print at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    main()
