"""Trace enrichment off the training loop: one worker process that runs the cycle jobs (cycle.py) that
torch_l2topo.profile exports, so a profiled step waits for the profiler's own export and the recorders'
drain, not for the enrichment (0.1-0.2 s for 65,536 CTAs).

The worker is a plain `python -m torch_l2topo.profiler.worker` subprocess, not a multiprocessing child: those
re-import the user's main script, which a training script without a __main__ guard would run again.
Protocol: the worker says READY once its imports are done. Jobs submitted before that wait in its stdin pipe
(profile() starts the worker before profiling, so by a cycle's end it is usually ready and no cycle is
enriched inline: on the H200 an inline first cycle cost each 4-cycle block 0.29 s); a block that ends before
the worker is ready does not wait for its imports: the parent stops it and runs the jobs itself. The parent
pickles each job to a file beside its
trace and writes the file's path as one line on the worker's stdin; the worker answers one line on stdout,
RESULT followed by JSON {"job", "problem", "written"}; the parent reads the answers already sent at each
submit, without waiting. A job is small: its records stay in the spool's shared-memory slots (spool.py), not in
the pickle. At most `max_pending` jobs are in flight (each holds its exported trace on disk and its records'
slots in page-locked memory): submitting one more waits for the oldest, so a worker that cannot keep up slows
the loop rather than piling them up. A worker that dies leaves its jobs to the parent, which runs them itself:
nothing is lost.

Paused while the profiler collects: a second process busy with JSON slowed the profiled steps of the example
model by about 3 ms per cycle on the H200 machine (mostly inside torch.profiler's own start and stop), even at
nice 19 under SCHED_IDLE (benchmarks/diag_profiler_handler.py). torch_l2topo.profile therefore stops the worker
(SIGSTOP) when a cycle's warmup starts and lets it go on (SIGCONT) once the cycle's trace is handed over, so it
works during the steps the profiler does not record and after the block. Anything that waits for the worker
lets it go on first. That SIGCONT costs the training loop about 5 ms per call on the H200 machine (20 us on a
2-core development machine), with the worker at nice 19 under SCHED_IDLE and with one BLAS thread alike; why
is not known (docs/profiler.md, Costs). The worker asks the kernel for a SIGCONT if its parent dies
(PR_SET_PDEATHSIG), so a crashed training process never leaves it stopped: it writes what it holds and exits.
Job files go to the spool's directory (shared memory where there is some).
"""
from __future__ import annotations

import json
import os
import pickle
import select
import signal
import subprocess
import sys
import warnings
from collections import deque
from pathlib import Path

from .cycle import CycleJob, run
from .spool import spool_directory

# The worker is one thread of JSON work: without these, numpy's BLAS would start a thread per core (16 on the H200
# machine) that it never uses. (They did not make SIGCONT cheaper there: worker.py's docstring.)
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
RESULT = "l2topo-cycle-done "
READY = "l2topo-worker-ready"
DEFAULT_MAX_PENDING = 16


class Worker:
    """The parent's side: submit(job) returns at once; drain() waits for every job; close() ends the worker.
    Each finished job's (path, problem) goes to on_done, in submission order."""

    def __init__(self, on_done, max_pending: int = DEFAULT_MAX_PENDING):
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending!r}")
        self.on_done, self.max_pending = on_done, max_pending
        self._proc = None
        self._ready = False
        self._paused = False
        self._jobs = 0
        self._pending: deque = deque()  # (job, its pickle file, the worker process it went to)

    def start(self) -> None:
        """Start the worker process now (submit starts it otherwise): its imports take seconds, best spent
        while the first steps run."""
        if self._proc is None or self._proc.poll() is not None:
            self._start()
            self._ready = False

    def _start(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **ONE_THREAD}
        self._proc = subprocess.Popen([sys.executable, "-m", "torch_l2topo.profiler.worker"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True, env=env)

    def ready(self) -> bool:
        """Whether the worker has started and imported what it needs (it says READY once; never blocks)."""
        if self._proc is None or self._proc.poll() is not None:
            self._ready = False
            return False
        while not self._ready and select.select([self._proc.stdout], [], [], 0)[0]:
            line = self._proc.stdout.readline()
            if not line:
                return False
            self._ready = line.strip() == READY
        return self._ready

    def submit(self, job: CycleJob) -> None:
        """Hand `job` to the worker (started now if it is not running; the job waits in its pipe until it is
        ready). Returns at once unless max_pending jobs are in flight. Jobs the worker has answered by now are
        finished first (on_done), without waiting for the others."""
        self.harvest()
        while len(self._pending) >= self.max_pending:
            self._finish_oldest()
        self._jobs += 1
        name = str(spool_directory() / f".l2topo-job.{os.getpid()}.{id(self):x}.{self._jobs}.pkl")
        with open(name, "xb") as f:
            pickle.dump(job, f, protocol=pickle.HIGHEST_PROTOCOL)
        self.start()
        self._pending.append((job, name, self._proc))
        try:
            self._proc.stdin.write(name + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the worker is gone: _finish_oldest runs the job here

    def pause(self) -> None:
        """Stop the worker process until resume() (module docstring); nothing if it is not running."""
        if self._proc is not None and self._proc.returncode is None and not self._paused:
            self._signal(signal.SIGSTOP)
            self._paused = True

    def resume(self) -> None:
        if self._paused:
            self._paused = False
            self._signal(signal.SIGCONT)

    def _signal(self, sig) -> None:
        try:
            os.kill(self._proc.pid, sig)  # not Popen.send_signal: its poll() per call costs the loop
        except ProcessLookupError:  # gone: whoever waits for it finds out
            pass

    def harvest(self) -> None:
        """Finish the jobs the worker has already answered (never blocks: it reads only lines already sent; the
        jobs of a worker that died wait for whoever waits for them)."""
        if not self._pending or self._proc is None or self._proc.poll() is not None:
            return
        while self._pending and (self._ready or self.ready()) and \
                select.select([self._proc.stdout], [], [], 0)[0]:
            self._finish_oldest()

    def _answer(self, proc, name: str) -> dict | None:
        """The worker's answer for job file `name`, or None if that worker exited first (warned once)."""
        while True:
            line = proc.stdout.readline()
            if not line:
                if not getattr(proc, "l2topo_warned", False):
                    proc.l2topo_warned = True
                    warnings.warn("torch_l2topo's trace worker exited; enriching its remaining traces in this "
                                  "process", stacklevel=4)
                if proc is self._proc:
                    self._proc = None
                return None
            if line.startswith(RESULT):
                answer = json.loads(line[len(RESULT):])
                if answer["job"] == name:
                    return answer

    def _finish_oldest(self) -> None:
        self.resume()  # about to wait for it
        job, name, proc = self._pending.popleft()
        answer = self._answer(proc, name)
        if answer is not None and answer["written"]:
            problem = answer["problem"]
        elif answer is None and not Path(job.export).exists():  # written (run removes the export last), unanswered
            problem = None
        else:  # the worker exited or failed before writing: the export is still there
            problem = run(job)
        Path(name).unlink(missing_ok=True)
        self.on_done(job.path, problem)

    def drain(self) -> None:
        self.resume()
        if self._pending and self._proc is not None and self._proc.poll() is None and not self.ready():
            # still importing: stopping it and enriching here is faster than waiting for its imports
            self._proc.l2topo_warned = True  # stopped on purpose: no "worker exited" warning
            self._proc.kill()
            self._proc.wait()
        while self._pending:
            self._finish_oldest()

    def close(self) -> None:
        self.drain()
        if self._proc is not None:
            self._proc.stdin.close()
            self._proc.wait()
            self._proc = None

    def __del__(self):
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()


def _continue_if_orphaned() -> None:
    """Ask Linux for a SIGCONT when the parent dies (prctl PR_SET_PDEATHSIG): a worker stopped by a parent that
    crashed goes on, writes the traces it holds and exits at the end of its input."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGCONT), 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the parent resumes it before it waits, and at exit
        pass


def _yield_the_cpu() -> None:
    """Run at the lowest priority (nice 19, SCHED_IDLE where Linux has it): the training process comes first
    for the CPU. On the H200 machine that alone did not keep a running worker from slowing the profiled steps
    (module docstring): profile() also pauses it."""
    try:
        os.nice(19)
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux, or not allowed: the worker runs as it is
        pass


def main() -> None:
    _continue_if_orphaned()
    _yield_the_cpu()
    print(READY, flush=True)
    for line in sys.stdin:
        name = line.strip()
        try:
            with open(name, "rb") as f:
                job = pickle.load(f)
            problem, written = run(job), True
        except Exception as exc:  # answered, never raised: the parent runs the job itself (the export stays)
            problem, written = f"{type(exc).__name__}: {exc}", False
        print(RESULT + json.dumps({"job": name, "problem": problem, "written": written}), flush=True)


if __name__ == "__main__":
    main()
