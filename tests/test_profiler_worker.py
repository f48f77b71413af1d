"""The trace worker on the CPU (worker.py): jobs wait in this process until the worker process is ready, then go
to it a few at a time and come back in order; whoever waits runs the newest waiting job itself; a worker that is
not ready, fails or dies leaves its jobs to this process, and nothing is lost or written twice; one worker
process serves every profiler block of a process, at the lowest priority."""
import contextlib
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch
from profiler_workers import ACTIVITIES, export, ready_worker, steps

import torch_l2topo
from torch_l2topo.profiler import cycle, session, worker
from torch_l2topo.profiler.cycle import CycleJob
from torch_l2topo.profiler.perprocess import PerProcess
from torch_l2topo.profiler.smmap import SmMap
from torch_l2topo.profiler.tracefile import load_trace
from torch_l2topo.profiler.worker import IN_PIPE, Worker


def _job(tmp_path, name: str, **maps) -> CycleJob:
    return CycleJob(export(tmp_path, f"{name}.export.json"), tmp_path / f"{name}.json", {}, maps, {}, ())


def _not_here(job):
    raise AssertionError(f"{job.path.name} ran in the parent, not in the worker")


def test_a_job_submitted_while_the_worker_starts_waits_here_then_goes_to_it(tmp_path, monkeypatch):
    done = []
    w = Worker()
    w.submit(_job(tmp_path, "t"), lambda path, problem: done.append((path, problem)))
    assert done == [] and len(w._waiting) == 1 and w._proc is not None  # kept here: the worker is importing
    deadline = time.monotonic() + 120
    while not w.ready():
        assert time.monotonic() < deadline, "the worker did not start"
        time.sleep(0.05)
    monkeypatch.setattr(worker, "run", _not_here)
    w.harvest()
    assert not w._waiting and len(w._handed) == 1
    w.close()
    assert done == [(tmp_path / "t.json", None)] and "traceEvents" in load_trace(tmp_path / "t.json")


def _never_ready(self):  # a worker stuck in its imports: it never says READY
    self._proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE)
    self._ready = False


def test_a_block_that_ends_before_the_worker_is_ready_enriches_here_and_keeps_the_worker(tmp_path, monkeypatch):
    monkeypatch.setattr(Worker, "_start", _never_ready)
    done = []
    w = Worker()
    w.submit(_job(tmp_path, "t"), lambda path, problem: done.append((path, problem)))
    importing = w._proc
    t0 = time.monotonic()
    w.drain()  # what a block's end does
    assert time.monotonic() - t0 < 30
    assert done == [(tmp_path / "t.json", None)] and "traceEvents" in load_trace(tmp_path / "t.json")
    assert importing.poll() is None and w._proc is importing  # kept for the next block
    w.close()  # no warning: ending a worker that holds no job is deliberate
    assert importing.poll() is not None


def test_the_worker_writes_what_this_process_would(tmp_path):
    topo = torch_l2topo.load_example()
    done = []
    w = ready_worker(max_pending=1)
    jobs = []
    for i in range(3):  # max_pending 1: every submit after the first waits for the one before
        text = export(tmp_path, f"e{i}.json").read_text()
        (tmp_path / f"copy{i}.json").write_text(text)
        jobs.append(CycleJob(tmp_path / f"e{i}.json", tmp_path / f"bg{i}.json", {}, {0: SmMap.from_topology(topo)},
                             {}, (0,)))
        w.submit(jobs[-1], lambda path, problem: done.append((path, problem)))
        assert len(done) == i  # the submit returned before this job was done
    w.close()
    assert [p for p, _ in done] == [j.path for j in jobs] and all(problem is None for _, problem in done)
    for i, job in enumerate(jobs):  # the same job run here gives the same file
        assert not job.export.exists()
        here = CycleJob(tmp_path / f"copy{i}.json", tmp_path / f"fg{i}.json", {}, job.maps, {}, (0,))
        assert cycle.run(here) is None
        assert load_trace(job.path) == load_trace(here.path) and "l2topo" in load_trace(job.path)


def test_a_job_that_fails_in_the_worker_writes_the_plain_trace(tmp_path):
    done = []
    w = ready_worker()
    job = CycleJob(export(tmp_path), tmp_path / "t.json", {}, {0: "not a calibration"}, {}, (0,))
    plain = load_trace(job.export)
    w.submit(job, lambda path, problem: done.append((path, problem)))
    w.close()
    (path, problem), = done
    assert "could not enrich" in problem and load_trace(path) == plain


def test_whoever_waits_runs_the_newest_waiting_job_and_reports_in_order(tmp_path):
    done = []
    w = ready_worker()
    os.kill(w._proc.pid, signal.SIGSTOP)  # the worker holds its jobs without doing them
    try:
        jobs = [_job(tmp_path, f"j{i}") for i in range(IN_PIPE + 2)]
        for job in jobs:
            w.submit(job, lambda path, problem: done.append((path, problem)))
        assert [e.job for e in w._handed] == jobs[:IN_PIPE] and [e.job for e in w._waiting] == jobs[IN_PIPE:]
        w._progress()
        assert jobs[-1].path.exists() and not jobs[-2].path.exists()  # the newest ran here
        w._progress()
        assert jobs[-2].path.exists() and not any(j.path.exists() for j in jobs[:IN_PIPE])
        assert done == []  # the oldest are not finished: nothing is reported out of order
    finally:
        os.kill(w._proc.pid, signal.SIGCONT)
    w.close()
    assert done == [(j.path, None) for j in jobs]


def test_a_dead_worker_leaves_its_jobs_to_this_process(tmp_path):
    done = []
    w = ready_worker()
    os.kill(w._proc.pid, signal.SIGSTOP)  # stopped: the job cannot run there before the kill
    w.submit(_job(tmp_path, "t"), lambda path, problem: done.append((path, problem)))
    assert len(w._handed) == 1
    w._proc.kill()
    with pytest.warns(UserWarning, match="exited"):
        w.close()
    assert done == [(tmp_path / "t.json", None)] and load_trace(tmp_path / "t.json")["traceEvents"]


def test_jobs_of_a_worker_that_died_run_here_and_later_ones_go_to_its_successor(tmp_path):
    done = []
    w = ready_worker()
    first = w._proc
    os.kill(first.pid, signal.SIGSTOP)
    w.submit(_job(tmp_path, "a"), lambda path, problem: done.append((path, problem)))
    first.kill()
    first.wait()
    with pytest.warns(UserWarning, match="exited"):
        w.submit(_job(tmp_path, "b"), lambda path, problem: done.append((path, problem)))
    assert w._proc is not None and w._proc is not first  # a new worker was started for what comes next
    w.close()
    assert done == [(tmp_path / "a.json", None), (tmp_path / "b.json", None)]
    assert all(load_trace(path)["traceEvents"] for path, _ in done)
    assert not (tmp_path / "a.export.json").exists() and not (tmp_path / "b.export.json").exists()


ORPHAN = """
import os, sys
from pathlib import Path
from torch_l2topo.profiler.cycle import CycleJob
sys.path.insert(0, sys.argv[3])
from profiler_workers import ready_worker
w = ready_worker()
w.submit(CycleJob(Path(sys.argv[1]), Path(sys.argv[2]), {}, {}, {}, ()), lambda path, problem: None)
print(w._proc.pid, flush=True)
os._exit(0)  # a crash: nothing waits for the worker
"""


def test_a_worker_whose_parent_crashed_writes_what_it_holds_and_exits(tmp_path):
    job = export(tmp_path)
    parent = subprocess.run([sys.executable, "-c", ORPHAN, str(job), str(tmp_path / "t.json"),
                             os.path.dirname(__file__)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, timeout=120, check=True)
    pid = int(parent.stdout.split()[-1])
    deadline = time.monotonic() + 60
    exited = False
    try:
        while not (tmp_path / "t.json").exists():
            assert time.monotonic() < deadline, "the orphaned worker never wrote the trace"
            time.sleep(0.1)
        assert load_trace(tmp_path / "t.json")["traceEvents"]
        while True:  # and it exits (its input ended with the parent)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                exited = True
                break
            assert time.monotonic() < deadline, "the orphaned worker did not exit"
            time.sleep(0.1)
    finally:
        if not exited:  # a failed test leaves no worker behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_the_worker_runs_at_the_lowest_priority_from_the_start():
    w = Worker()
    w.start()  # checked before its imports are done: that is when it used to take the training loop's CPU
    try:
        assert os.sched_getscheduler(w._proc.pid) == os.SCHED_IDLE
        assert os.getpriority(os.PRIO_PROCESS, w._proc.pid) == 19
    finally:
        w.close()


def test_profiler_blocks_share_one_worker_process_that_outlives_them(tmp_path, monkeypatch):
    monkeypatch.setattr(worker, "_shared", PerProcess(Worker))  # this test's own process-wide worker
    sched = torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=1)
    pids = []
    for block in range(2):
        with torch_l2topo.profile(tmp_path / str(block), schedule=sched, activities=ACTIVITIES,
                                  topology=None) as prof:
            steps(prof, 2)
            pids.append(prof.handler._worker._proc.pid)
        assert len(prof.written) == 1 and load_trace(prof.written[0])["traceEvents"]
        assert prof.handler._worker._proc.poll() is None  # still there for the next block
    assert pids[0] == pids[1]
    w = worker.shared_worker()
    worker.close_shared_worker()
    assert w._proc is None and worker.shared_worker() is not w


def test_a_hold_keeps_jobs_here_up_to_its_bound_then_the_oldest_go_to_the_worker(tmp_path):
    done = []
    w = ready_worker()
    w.hold(3)
    w.hold(2)  # nested: the smaller bound applies while both are in force
    jobs = [_job(tmp_path, f"j{i}") for i in range(5)]
    for job in jobs[:2]:
        w.submit(job, lambda path, problem: done.append((path, problem)))
    assert not w._handed and [e.job for e in w._waiting] == jobs[:2]
    w.submit(jobs[2], lambda path, problem: done.append((path, problem)))
    assert [e.job for e in w._handed] == jobs[:1] and [e.job for e in w._waiting] == jobs[1:3]
    w.release()  # back to the outer bound, 3: nothing more goes
    w.submit(jobs[3], lambda path, problem: done.append((path, problem)))
    assert [e.job for e in w._waiting] == jobs[1:4]
    w.release()
    assert len(w._handed) == IN_PIPE and w._handed[-1].job in jobs[1:3]
    w.release()  # one more than there were holds: nothing to end
    w.submit(jobs[4], lambda path, problem: done.append((path, problem)))
    w.close()
    assert done == [(j.path, None) for j in jobs]


def test_a_held_job_is_queued_without_a_look_at_the_worker(tmp_path, monkeypatch):
    """While a hold keeps a job here and the worker holds none, submit only queues it (the trace handler runs at the
    cycle's edge, where every line costs); the job is still handed over and reported in order later."""
    done = []
    w = ready_worker()
    w.hold(2)
    jobs = [_job(tmp_path, f"j{i}") for i in range(3)]

    def looked(*args):
        raise AssertionError("submit looked at the worker")

    with monkeypatch.context() as patched:
        for name in ("harvest", "_hand_over", "_report", "_read"):
            patched.setattr(w, name, looked)
        for job in jobs[:2]:
            w.submit(job, lambda path, problem: done.append(path))
    assert [e.job for e in w._waiting] == jobs[:2] and not w._handed
    w.submit(jobs[2], lambda path, problem: done.append(path))  # beyond the hold: the oldest goes
    assert [e.job for e in w._handed] == jobs[:1]
    w.release()
    w.close()
    assert done == [j.path for j in jobs]


@pytest.mark.parametrize("max_held", [8, 0])
def test_a_profile_block_leaves_its_traces_for_its_end_unless_told_otherwise(tmp_path, monkeypatch, max_held):
    monkeypatch.setattr(worker, "_shared", PerProcess(ready_worker))
    sched = torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=3)
    with torch_l2topo.profile(tmp_path, schedule=sched, activities=ACTIVITIES, topology=None,
                              max_held=max_held) as prof:
        steps(prof, 6)  # three cycles, each with its trace handler
        w = prof.handler._worker
        if max_held:
            assert not w._handed and len(w._waiting) == 3 and not prof.written
        else:  # the worker took what it can hold at once (and may have written some by now)
            assert len(w._waiting) <= 3 - IN_PIPE and len(w._waiting) + len(w._handed) + len(prof.written) == 3
    assert len(prof.written) == 3 and all(load_trace(p)["traceEvents"] for p in prof.written)
    assert not w._holds and not w._entries
    worker.close_shared_worker()


def test_options_are_checked():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_pending"):
            Worker(max_pending=bad)
        with pytest.raises(ValueError, match="max_pending"):
            session.TraceHandler("x.json", background=True, max_pending=bad)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="max_held"):
            torch_l2topo.profile("x", max_held=bad)
        with pytest.raises(ValueError, match="max_held"):
            Worker().hold(bad)
    for held, pending in ((4, 4), (worker.DEFAULT_MAX_PENDING, None)):  # as many held as may be pending: refused
        with pytest.raises(ValueError, match="below max_pending"):
            torch_l2topo.profile("x", max_held=held, **({} if pending is None else {"max_pending": pending}))
    assert torch_l2topo.profile("x", max_held=30, max_pending=31).handler.max_pending == 31


def test_traces_are_written_whole_without_waiting_for_the_disk(tmp_path, monkeypatch):
    """write_trace replaces the file atomically but does not fsync (the worker writes while the training loop
    runs: an fsync held up torch.profiler's own export behind the journal); a calibration still syncs."""
    from torch_l2topo import files
    from torch_l2topo.profiler.tracefile import write_trace

    synced = []
    monkeypatch.setattr(files.os, "fsync", lambda fd: synced.append(fd))
    trace = {"schemaVersion": 1, "traceEvents": []}
    write_trace(trace, tmp_path / "t.json")
    assert load_trace(tmp_path / "t.json") == trace and synced == []
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]  # no temporary file left
    torch_l2topo.load_example().save(tmp_path / "cal.npz")
    assert len(synced) == 1


class _Closable:
    def __init__(self):
        self.closed = False

    def close(self):
        self.closed = True


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_process_gets_its_own_and_closes_only_its_own():
    shared = PerProcess(_Closable)
    parents = shared.get()
    assert shared.get() is parents
    pid = os.fork()
    if pid == 0:  # the child: an object of its own, and closing it leaves the parent's alone
        ok = False
        try:
            childs = shared.get()
            shared.close()
            ok = childs is not parents and childs.closed and not parents.closed and shared.existing() is None
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert shared.get() is parents and not parents.closed
    shared.close()
    assert parents.closed


def test_the_worker_reports_each_jobs_time_and_jobs_go_beside_the_steps_once_it_keeps_up(tmp_path):
    """A job submitted beside the steps goes to the worker at once, hold or not; the worker's answer says how long
    the job took it, which is at most the time the parent saw between handing it over and reading the answer."""
    done = []
    w = ready_worker()
    w.hold(8)
    assert not w.keeps_up(1e9)  # no job answered yet
    w.submit(_job(tmp_path, "held"), lambda path, problem: done.append(path))
    assert len(w._waiting) == 1 and not w._handed
    handed = time.perf_counter()
    w.submit(_job(tmp_path, "beside"), lambda path, problem: done.append(path), beside=True)
    assert not w._waiting and len(w._handed) == 2  # the held one went too
    while w._handed:
        w._read(wait=True)
    seen = time.perf_counter() - handed
    w.release()
    w.close()
    assert done == [tmp_path / "held.json", tmp_path / "beside.json"]
    assert 0 < w.job_s <= seen
    assert w.keeps_up(worker.KEEP_UP_FACTOR * w.job_s * 1.01) and not w.keeps_up(worker.KEEP_UP_FACTOR * w.job_s)
    assert not w.keeps_up(None)


def test_the_handler_sends_jobs_beside_the_steps_only_when_its_cycles_are_long_enough(tmp_path, monkeypatch):
    """The handler measures its cycle as the time between its calls and asks the worker whether it keeps up."""
    calls, clock_ns = [], [0]

    class Answering(Worker):  # a worker whose last job took 0.2 s, answering at once
        def submit(self, job, on_done, max_pending=None, beside=False):
            calls.append(beside)
            os.unlink(job.export)
            on_done(job.path, None)

    handler = session.TraceHandler(tmp_path / "traces", topology=None, record=False, background=True)
    handler._worker = Answering()
    handler._worker.job_s = 0.2
    monkeypatch.setattr(session, "time", types.SimpleNamespace(time_ns=lambda: clock_ns[0]))

    text = export(tmp_path).read_text()

    class Prof:
        def export_chrome_trace(self, path):
            Path(path).write_text(text)

    for seconds in (10.0, 11.0, 11.1, 11.5):
        clock_ns[0] = int(seconds * 1e9)
        handler(Prof())
    assert calls == [False, True, False, False]  # no period yet; 1 s > 2 x 0.2 s; 0.1 s; 0.4 s is not more
    assert len(handler.written) == 4
