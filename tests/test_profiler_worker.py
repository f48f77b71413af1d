"""The trace worker on the CPU (worker.py): jobs wait here until a worker process is ready, then go to the processes
a few at a time and are reported once each, in order; a drain runs the newest waiting jobs here once a job's time
is known, and ends by its deadline; a job that fails, or whose process dies or stalls, leaves its trace as exported
and is never retried; processes serve every profiler block of a process, at the lowest priority, and end with it."""
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
from torch_l2topo.files import host_tag
from torch_l2topo.profiler import session
from torch_l2topo.profiler.runtime import cycle, worker
from torch_l2topo.profiler.runtime.cycle import CycleJob
from torch_l2topo.profiler.runtime.perprocess import PerProcess
from torch_l2topo.profiler.runtime.worker import IN_PIPE, Worker
from torch_l2topo.profiler.trace.smmap import SmMap
from torch_l2topo.profiler.trace.tracefile import METADATA_KEY, load_trace


def _job(tmp_path, name: str, topo=None) -> CycleJob:
    """A job on a real exported trace; with `topo`, enriching it adds the map (so enriched and plain differ)."""
    maps, given = ({0: SmMap.from_topology(topo)}, (0,)) if topo is not None else ({}, ())
    return CycleJob(export(tmp_path, f"{name}.json"), {}, maps, {}, given)


def _collect(done):
    return lambda path, problem: done.append((Path(path).name, problem))


def _handed(w: Worker) -> list:
    return [e.job for p in w._procs for e in p.handed]


def _not_here(job, timeout_s=None):
    raise AssertionError(f"{job.path} ran in the parent, not in a worker process")


def test_a_job_submitted_while_the_worker_starts_waits_here_then_goes_to_it(tmp_path, monkeypatch):
    done = []
    w = Worker(processes=1)
    job = _job(tmp_path, "t", torch_l2topo.load_example())
    assert w.submit(job, _collect(done))
    assert done == [] and len(w._waiting) == 1 and len(w._procs) == 1  # kept here: the process is importing
    deadline = time.monotonic() + 120
    while not w.ready():
        assert time.monotonic() < deadline, "the worker did not start"
        time.sleep(0.05)
    monkeypatch.setattr(worker, "run", _not_here)
    w.harvest()
    assert not w._waiting and _handed(w) == [job]
    w.close()
    assert done == [("t.json", None)] and METADATA_KEY in load_trace(job.path)


def _never_ready(self):  # a worker process stuck in its imports: it never says READY
    self.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE)
    self.ready, self.handed, self._inbox = False, __import__("collections").deque(), bytearray()


def test_a_drain_before_any_process_is_ready_gives_up_at_its_deadline_and_keeps_the_process(tmp_path, monkeypatch):
    monkeypatch.setattr(worker._Process, "__init__", _never_ready)
    done = []
    w = Worker(processes=1)
    job = _job(tmp_path, "t")
    plain = job.path.read_bytes()
    w.submit(job, _collect(done))
    importing = w._procs[0].proc
    t0 = time.monotonic()
    w.drain(1.0)  # no job time known yet: nothing runs here, and nothing can finish in time
    assert 1.0 <= time.monotonic() - t0 < 3
    (name, problem), = done
    assert "gave up" in problem and job.path.read_bytes() == plain
    assert importing.poll() is None and w._procs[0].proc is importing  # kept for the next block
    w.close()
    assert importing.poll() is not None


def test_once_a_jobs_time_is_known_a_drain_runs_the_waiting_jobs_here(tmp_path, monkeypatch):
    monkeypatch.setattr(worker._Process, "__init__", _never_ready)
    done = []
    w = Worker(processes=1)
    w.job_s = 0.01
    job = _job(tmp_path, "t", torch_l2topo.load_example())
    w.submit(job, _collect(done))
    w.drain(30)
    assert done == [("t.json", None)] and METADATA_KEY in load_trace(job.path)
    w.close()


def test_the_worker_writes_what_this_process_would(tmp_path):
    topo = torch_l2topo.load_example()
    done = []
    w = ready_worker(processes=1)
    jobs = [_job(tmp_path, f"bg{i}", topo) for i in range(3)]
    copies = []
    for i, job in enumerate(jobs):
        copies.append(CycleJob(tmp_path / f"fg{i}.json", {}, job.maps, {}, job.given))
        copies[-1].path.write_bytes(job.path.read_bytes())
        assert w.submit(job, _collect(done))
    w.close()
    assert done == [(j.path.name, None) for j in jobs]
    for job, here in zip(jobs, copies):  # the same job run here gives the same file
        assert cycle.run(here) is None
        assert load_trace(job.path) == load_trace(here.path) and METADATA_KEY in load_trace(job.path)


def test_a_job_that_fails_in_the_worker_is_reported_once_and_leaves_the_trace(tmp_path):
    done = []
    w = ready_worker(processes=1)
    job = CycleJob(export(tmp_path), {}, {0: "not a calibration"}, {}, (0,))
    plain = job.path.read_bytes()
    w.submit(job, _collect(done))
    w.drain(30)
    (name, problem), = done
    assert "could not enrich" in problem and job.path.read_bytes() == plain
    assert not w._entries and not w._waiting and not _handed(w)  # not queued again (it used to be, forever)
    w.close()


def test_a_job_that_cannot_be_written_does_not_make_later_drains_spin(tmp_path):
    """The trace's directory is a regular file: the job fails; the drain returns, and so does every later one."""
    (tmp_path / "file").write_text("x")
    done = []
    w = Worker(processes=1)
    w._broken = "no processes in this test"  # every job runs in this process, at its drain
    w.submit(CycleJob(tmp_path / "file" / "out.json"), _collect(done))
    t0 = time.monotonic()
    w.drain(5)
    w.drain(5)
    assert time.monotonic() - t0 < 2 and len(done) == 1 and "could not enrich" in done[0][1]


def test_whoever_waits_runs_the_newest_waiting_job_and_reports_in_order(tmp_path):
    done = []
    w = ready_worker(processes=1)
    w.job_s = 0.01  # known: jobs may run here
    (p,) = w._procs
    os.kill(p.proc.pid, signal.SIGSTOP)  # the process holds its jobs without doing them
    try:
        jobs = [_job(tmp_path, f"j{i}", torch_l2topo.load_example()) for i in range(IN_PIPE + 2)]
        for job in jobs:
            w.submit(job, _collect(done))
        assert _handed(w) == jobs[:IN_PIPE] and [e.job for e in w._waiting] == jobs[IN_PIPE:]
        w.drain(3)  # runs the two waiting jobs here, newest first, then gives up on the stopped process's
    finally:
        with contextlib.suppress(ProcessLookupError):  # killed by the drain, as it should be
            os.kill(p.proc.pid, signal.SIGCONT)
    assert [name for name, _ in done] == [j.path.name for j in jobs]
    assert all("gave up" in problem for _, problem in done[:IN_PIPE]) and [pr for _, pr in done[IN_PIPE:]] == [None] * 2
    assert all(METADATA_KEY in load_trace(j.path) for j in jobs[IN_PIPE:])
    assert p.proc.poll() is not None and not w._procs  # the stopped process was killed and reaped
    w.close()


def test_a_stalled_process_is_killed_at_the_deadline_and_its_temporary_file_removed(tmp_path):
    done = []
    w = ready_worker(processes=1)
    (p,) = w._procs
    job = _job(tmp_path, "t")
    plain = job.path.read_bytes()
    os.kill(p.proc.pid, signal.SIGSTOP)
    w.submit(job, _collect(done))
    tmp = tmp_path / f".t.json.{host_tag()}-{p.proc.pid}-abcd1234.l2topo-tmp"
    tmp.write_bytes(b"half a trace")  # as if it had been writing when it stopped
    t0 = time.monotonic()
    w.drain(1.0)
    assert time.monotonic() - t0 < 3 and p.proc.poll() is not None and not tmp.exists()
    assert "gave up" in done[0][1] and job.path.read_bytes() == plain
    w.close()


def test_a_dead_process_leaves_its_jobs_plain_and_later_ones_go_to_its_successor(tmp_path):
    done = []
    w = ready_worker(processes=1)
    first = w._procs[0].proc
    os.kill(first.pid, signal.SIGSTOP)  # stopped: the job cannot run there before the kill
    a = _job(tmp_path, "a")
    plain = a.path.read_bytes()
    w.submit(a, _collect(done))
    first.kill()
    first.wait()
    b = _job(tmp_path, "b", torch_l2topo.load_example())
    w.submit(b, _collect(done))
    assert len(w._procs) == 1 and w._procs[0].proc is not first  # a new process for what comes next
    w.close(60)
    assert [name for name, _ in done] == ["a.json", "b.json"]
    assert "exited" in done[0][1] and a.path.read_bytes() == plain
    assert done[1][1] is None and METADATA_KEY in load_trace(b.path)


def test_beyond_max_pending_a_job_is_not_queued(tmp_path):
    done = []
    w = Worker(max_pending=2, processes=1)
    w._broken = "no processes in this test"
    assert w.submit(_job(tmp_path, "a"), _collect(done)) and w.submit(_job(tmp_path, "b"), _collect(done))
    assert not w.submit(_job(tmp_path, "c"), _collect(done))
    assert len(w._entries) == 2
    w.close(30)
    assert [name for name, _ in done] == ["a.json", "b.json"]


def test_the_handler_leaves_a_trace_plain_when_the_worker_is_full(tmp_path):
    class Full(Worker):
        def submit(self, job, on_done, max_pending=None, beside=False):
            return False

    handler = session.TraceHandler(tmp_path / "traces", topology=None, record=False, background=True)
    handler._worker = Full()
    text = export(tmp_path).read_text()

    class Prof:
        def export_chrome_trace(self, path):
            Path(path).write_text(text)

    with pytest.warns(UserWarning, match="max_pending"):
        handler(Prof())
    (path,) = handler.written
    assert path.read_text() == text


ORPHAN = """
import os, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
import torch_l2topo
from torch_l2topo.profiler.runtime.cycle import CycleJob
from torch_l2topo.profiler.trace.smmap import SmMap
from profiler_workers import ready_worker
w = ready_worker(processes=1)
w.submit(CycleJob(Path(sys.argv[1]), {}, {0: SmMap.from_topology(torch_l2topo.load_example())}, {}, (0,)),
         lambda path, problem: None)
print(w._procs[0].proc.pid, flush=True)
os._exit(0)  # a crash: nothing waits for the worker
"""


def test_a_worker_whose_parent_crashed_finishes_its_job_quietly_and_exits(tmp_path):
    job = export(tmp_path)
    # run() returns once the parent and the worker have both closed the stderr pipe: the worker has exited
    parent = subprocess.run([sys.executable, "-c", ORPHAN, str(job), os.path.dirname(__file__)],
                            capture_output=True, text=True, timeout=120)
    pid = int(parent.stdout.split()[-1])
    try:
        assert parent.returncode == 0
        assert "Traceback" not in parent.stderr and "BrokenPipe" not in parent.stderr, parent.stderr
        assert METADATA_KEY in load_trace(job)  # it finished the job it held
    finally:  # a failed test leaves no worker behind
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_the_worker_runs_at_the_lowest_priority_from_the_start():
    w = Worker(processes=1)
    w.start()  # checked before its imports are done: that is when it used to take the training loop's CPU
    try:
        pid = w._procs[0].proc.pid
        assert os.sched_getscheduler(pid) == os.SCHED_IDLE and os.getpriority(os.PRIO_PROCESS, pid) == 19
        assert os.getsid(pid) == pid  # a session of its own: a terminal's Ctrl-C does not reach it
    finally:
        w.close()


def test_the_processes_share_the_jobs(tmp_path):
    done = []
    w = ready_worker(processes=2)
    while not all(p.ready for p in w._procs):
        w.ready()
        time.sleep(0.05)
    jobs = [_job(tmp_path, f"j{i}") for i in range(4)]
    for p in w._procs:  # stopped: they hold their jobs unanswered while the distribution is read
        os.kill(p.proc.pid, signal.SIGSTOP)
    try:
        for job in jobs:
            w.submit(job, _collect(done))
        assert all(len(p.handed) == IN_PIPE for p in w._procs)
    finally:
        for p in w._procs:
            os.kill(p.proc.pid, signal.SIGCONT)
    w.close(60)
    assert [name for name, _ in done] == [j.path.name for j in jobs] and all(pr is None for _, pr in done)


def test_default_processes_follow_the_cpus(monkeypatch):
    for cpus, expected in ((1, 1), (2, 1), (3, 1), (8, 4), (16, 8), (128, worker.MAX_PROCESSES)):
        monkeypatch.setattr(worker.os, "sched_getaffinity", lambda pid, n=cpus: set(range(n)), raising=False)
        assert worker.default_processes() == expected


def test_profiler_blocks_share_the_worker_processes_that_outlive_them(tmp_path, monkeypatch):
    monkeypatch.setattr(worker, "_shared", PerProcess(lambda: Worker(processes=1)))
    sched = torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=1)
    pids = []
    for block in range(2):
        with torch_l2topo.profile(tmp_path / str(block), schedule=sched, activities=ACTIVITIES,
                                  topology=None) as prof:
            steps(prof, 2)
            pids.append(prof.handler._worker._procs[0].proc.pid)
        assert len(prof.written) == 1 and load_trace(prof.written[0])["traceEvents"]
        assert prof.handler._worker._procs[0].proc.poll() is None  # still there for the next block
    assert pids[0] == pids[1]
    w = worker.shared_worker()
    worker.close_shared_worker()
    assert not w._procs and worker.shared_worker() is not w


def test_a_hold_keeps_jobs_here_up_to_its_bound_then_the_oldest_go_to_the_worker(tmp_path):
    done = []
    w = ready_worker(processes=1)
    w.hold(3)
    w.hold(2)  # nested: the smaller bound applies while both are in force
    jobs = [_job(tmp_path, f"j{i}") for i in range(5)]
    for job in jobs[:2]:
        w.submit(job, _collect(done))
    assert not _handed(w) and [e.job for e in w._waiting] == jobs[:2]
    w.submit(jobs[2], _collect(done))
    assert _handed(w) == jobs[:1] and [e.job for e in w._waiting] == jobs[1:3]
    w.release()  # back to the outer bound, 3: nothing more goes
    w.submit(jobs[3], _collect(done))
    assert [e.job for e in w._waiting] == jobs[1:4]
    w.release()
    assert len(_handed(w)) == IN_PIPE
    w.release()  # one more than there were holds: nothing to end
    w.submit(jobs[4], _collect(done))
    w.close(60)
    assert done == [(j.path.name, None) for j in jobs]


def test_a_held_job_is_queued_without_a_look_at_the_worker(tmp_path, monkeypatch):
    """While a hold keeps a job here and no process holds one, submit only queues it (the trace handler runs at the
    cycle's edge, where every line costs); the job is still handed over and reported in order later."""
    done = []
    w = ready_worker(processes=1)
    w.hold(2)
    jobs = [_job(tmp_path, f"j{i}") for i in range(3)]

    def looked(*args):
        raise AssertionError("submit looked at the worker")

    with monkeypatch.context() as patched:
        for name in ("harvest", "_hand_over", "_report", "_poll"):
            patched.setattr(w, name, looked)
        for job in jobs[:2]:
            w.submit(job, _collect(done))
    assert [e.job for e in w._waiting] == jobs[:2] and not _handed(w)
    w.submit(jobs[2], _collect(done))  # beyond the hold: the oldest goes
    assert _handed(w) == jobs[:1]
    w.release()
    w.close(60)
    assert [name for name, _ in done] == [j.path.name for j in jobs]


@pytest.mark.parametrize("max_held", [8, 0])
def test_a_profile_block_leaves_its_traces_for_its_end_unless_told_otherwise(tmp_path, monkeypatch, max_held):
    monkeypatch.setattr(worker, "_shared", PerProcess(lambda: ready_worker(processes=1)))
    sched = torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=3)
    with torch_l2topo.profile(tmp_path, schedule=sched, activities=ACTIVITIES, topology=None,
                              max_held=max_held, timeout_s=60) as prof:
        steps(prof, 6)  # three cycles, each with its trace handler
        w = prof.handler._worker
        assert len(prof.written) == 3  # the plain traces are on disk at once
        if max_held:
            assert not _handed(w) and len(w._waiting) == 3
        else:  # the process took what it can hold at once
            assert len(w._waiting) <= 3 - IN_PIPE
    assert all(METADATA_KEY in load_trace(p) for p in prof.written)
    assert not w._holds and not w._entries
    worker.close_shared_worker()


def test_options_are_checked():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_pending"):
            Worker(max_pending=bad)
        with pytest.raises(ValueError, match="processes"):
            Worker(processes=bad)
        with pytest.raises(ValueError, match="max_pending"):
            session.TraceHandler("x.json", background=True, max_pending=bad)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="max_held"):
            torch_l2topo.profile("x", max_held=bad)
        with pytest.raises(ValueError, match="max_held"):
            Worker().hold(bad)
    for bad in (-1, "5", True):
        with pytest.raises(ValueError, match="timeout_s"):
            session.TraceHandler("x.json", timeout_s=bad)
    for held, pending in ((4, 4), (worker.DEFAULT_MAX_PENDING, None)):  # as many held as may be pending: refused
        with pytest.raises(ValueError, match="below max_pending"):
            torch_l2topo.profile("x", max_held=held, **({} if pending is None else {"max_pending": pending}))
    assert torch_l2topo.profile("x", max_held=30, max_pending=31).handler.max_pending == 31


def test_traces_are_written_whole_without_waiting_for_the_disk(tmp_path, monkeypatch):
    """write_trace replaces the file atomically but does not fsync (the worker writes while the training loop
    runs: an fsync held up torch.profiler's own export behind the journal); a calibration still syncs."""
    from torch_l2topo import files
    from torch_l2topo.profiler.trace.tracefile import write_trace

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
    """A job submitted beside the steps goes to the processes at once, hold or not; the answer says how long the
    job took, which is at most the time the parent saw between handing it over and reading the answer."""
    done = []
    w = ready_worker(processes=1)
    w.hold(8)
    assert not w.keeps_up(1e9)  # no job answered yet
    w.submit(_job(tmp_path, "held"), _collect(done))
    assert len(w._waiting) == 1 and not _handed(w)
    handed = time.perf_counter()
    w.submit(_job(tmp_path, "beside"), _collect(done), beside=True)
    assert not w._waiting and len(_handed(w)) == 2  # the held one went too
    while _handed(w):
        w._poll(10)
    seen = time.perf_counter() - handed
    w.release()
    w.close()
    assert [name for name, _ in done] == ["held.json", "beside.json"]
    assert 0 < w.job_s <= seen
    assert w.keeps_up(worker.KEEP_UP_FACTOR * w.job_s * 1.01) and not w.keeps_up(worker.KEEP_UP_FACTOR * w.job_s)
    assert not w.keeps_up(None)


def test_the_handler_sends_jobs_beside_the_steps_only_when_its_cycles_are_long_enough(tmp_path, monkeypatch):
    """The handler measures its cycle as the time between its calls and asks the worker whether it keeps up."""
    calls, clock_ns = [], [0]

    class Answering(Worker):  # a worker whose last job took 0.2 s, answering at once
        def submit(self, job, on_done, max_pending=None, beside=False):
            calls.append(beside)
            on_done(job.path, None)
            return True

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


def test_a_relative_trace_directory_means_where_the_handler_was_made(tmp_path, monkeypatch):
    """The worker processes keep the current directory they started in: a handler made with a relative directory
    hands them absolute paths, so its traces are enriched where they were written."""
    monkeypatch.setattr(worker, "_shared", PerProcess(lambda: ready_worker(processes=1)))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    worker.shared_worker()  # started with the tests' current directory
    monkeypatch.chdir(elsewhere)
    sched = torch.profiler.schedule(wait=0, warmup=0, active=1, repeat=1)
    with torch_l2topo.profile("traces", schedule=sched, activities=ACTIVITIES,
                              topology={0: torch_l2topo.load_example()}) as prof:
        steps(prof, 1)
    (path,) = prof.written
    assert path.is_absolute() and path.parent == elsewhere / "traces" and METADATA_KEY in load_trace(path)
    worker.close_shared_worker()
