"""The torch.profiler hook on the CPU: torch_l2topo.profile and trace_handler write one enriched trace per cycle
(named by cycle), a failed enrichment still leaves the profiler's own trace, Proton merges into a written
trace without losing its CTAs, and trace-summary and the timeline figure read an enriched trace back."""
import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from synthetic_traces import (
    KINETO_MINUS_GLOBALTIMER,
    add_kernels,
    cpu_trace,
    ctas_inside,
    kineto_start_ns,
    proton_trace,
)

import torch_l2topo
from torch_l2topo.cli import main as cli
from torch_l2topo.errors import TraceFormatError
from torch_l2topo.profiler import cycle, session
from torch_l2topo.profiler.cycle import CycleJob
from torch_l2topo.profiler.enrich import enrich
from torch_l2topo.profiler.readback import calibrations, launches, recorded_ctas
from torch_l2topo.profiler.smmap import SmMap
from torch_l2topo.profiler.summary import summarize
from torch_l2topo.profiler.timeline import pick_launch, render_timeline, timeline_rows
from torch_l2topo.profiler.tracefile import load_trace, write_trace
from torch_l2topo.profiler.worker import Worker

ACTIVITIES = [torch.profiler.ProfilerActivity.CPU]


def _steps(prof, n):
    model = torch.nn.Linear(16, 16)
    for _ in range(n):
        model(torch.randn(8, 16)).sum()
        prof.step()


def test_profile_writes_one_enriched_trace_per_cycle(tmp_path):
    assert torch_l2topo.profile is session.profile  # the lazy top-level name
    sched = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=2)
    topo = torch_l2topo.load_example()
    with torch_l2topo.profile(tmp_path, schedule=sched, activities=ACTIVITIES, topology={0: topo}) as prof:
        _steps(prof, 8)
    assert len(prof.written) == 2 and [p.name.split(".")[1] for p in prof.written] == ["0", "1"]
    for path in prof.written:
        trace = load_trace(path)
        assert any(ev.get("name", "").startswith("ProfilerStep#") for ev in trace["traceEvents"])
        assert calibrations(trace)[0].n_sm == topo.n_sm
        assert trace["l2topo"]["devices"]["0"]["calibration"]["ids"]["uuid_hash"] == topo.meta["uuid_hash"]


def test_a_file_name_gets_one_file_per_cycle(tmp_path):
    sched = torch.profiler.schedule(wait=0, warmup=0, active=1, repeat=3)
    with torch.profiler.profile(activities=ACTIVITIES, schedule=sched,
                                on_trace_ready=torch_l2topo.profiler.trace_handler(tmp_path / "t.json.gz",
                                                                                   topology=None)) as prof:
        _steps(prof, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.1.json.gz", "t.2.json.gz", "t.json.gz"]
    assert "l2topo" in load_trace(tmp_path / "t.2.json.gz")


def test_a_failed_enrichment_still_writes_the_profilers_trace(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("simulated failure")

    monkeypatch.setattr(cycle, "enrich_with", broken)
    with pytest.warns(UserWarning, match="simulated failure"):
        with torch_l2topo.profile(tmp_path / "t.json", activities=ACTIVITIES, topology=None,
                                  background=False) as prof:
            _steps(prof, 1)
    trace = load_trace(tmp_path / "t.json")
    assert "l2topo" not in trace and any(ev.get("ph") == "X" for ev in trace["traceEvents"])
    assert not list(tmp_path.glob(".l2topo-*"))  # no export or job file left behind


def _export(tmp_path, name="export.json") -> Path:
    with torch.profiler.profile(activities=ACTIVITIES) as prof:
        _steps(prof, 1)
    prof.export_chrome_trace(str(tmp_path / name))
    return tmp_path / name


def _ready_worker(on_done, **options) -> Worker:
    worker = Worker(on_done, **options)
    worker.start()
    deadline = time.monotonic() + 120
    while not worker.ready():
        assert time.monotonic() < deadline, "the worker did not start"
        time.sleep(0.05)
    return worker


def test_a_job_submitted_while_the_worker_starts_waits_for_it(tmp_path):
    done = []
    worker = Worker(lambda path, problem: done.append((path, problem)))
    worker.submit(CycleJob(_export(tmp_path), tmp_path / "t.json", {}, {}, {}, ()))
    assert done == [] and worker._proc is not None  # queued in the starting worker's pipe, not run here
    deadline = time.monotonic() + 120
    while not worker.ready():
        assert time.monotonic() < deadline, "the worker did not start"
        time.sleep(0.05)
    worker.close()
    assert done == [(tmp_path / "t.json", None)] and "traceEvents" in load_trace(tmp_path / "t.json")


def test_a_block_that_ends_before_the_worker_is_ready_enriches_here(tmp_path, monkeypatch):
    def never_ready(self):  # a worker stuck in its imports: it never says READY
        self._proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    monkeypatch.setattr(Worker, "_start", never_ready)
    done = []
    worker = Worker(lambda path, problem: done.append((path, problem)))
    worker.submit(CycleJob(_export(tmp_path), tmp_path / "t.json", {}, {}, {}, ()))
    stuck = worker._proc
    t0 = time.monotonic()
    worker.close()  # no warning: stopping a worker that is not ready is deliberate
    assert time.monotonic() - t0 < 30 and stuck.poll() is not None
    assert done == [(tmp_path / "t.json", None)] and "traceEvents" in load_trace(tmp_path / "t.json")
    assert not list(tmp_path.glob(".l2topo-job*"))


def test_the_worker_writes_what_the_handler_would(tmp_path):
    topo = torch_l2topo.load_example()
    done = []
    worker = _ready_worker(lambda path, problem: done.append((path, problem)), max_pending=1)
    jobs = []
    for i in range(3):  # max_pending 1: every submit after the first waits for the one before
        export = _export(tmp_path, f"e{i}.json")
        text = export.read_text()
        (tmp_path / f"copy{i}.json").write_text(text)
        maps = {0: SmMap.from_topology(topo)}
        jobs.append(CycleJob(export, tmp_path / f"bg{i}.json", {}, maps, {}, (0,)))
        worker.submit(jobs[-1])
        assert len(done) == i  # the submit returned before this job was done
    worker.close()
    assert [p for p, _ in done] == [j.path for j in jobs] and all(problem is None for _, problem in done)
    for i, job in enumerate(jobs):  # the same job run here gives the same file
        assert not job.export.exists()
        here = CycleJob(tmp_path / f"copy{i}.json", tmp_path / f"fg{i}.json", {}, job.maps, {}, (0,))
        assert cycle.run(here) is None
        assert load_trace(job.path) == load_trace(here.path) and "l2topo" in load_trace(job.path)
    assert not list(tmp_path.glob(".l2topo-job*"))


def test_a_job_that_fails_in_the_worker_writes_the_plain_trace(tmp_path):
    done = []
    worker = _ready_worker(lambda path, problem: done.append((path, problem)))
    export = _export(tmp_path)
    plain = load_trace(export)
    worker.submit(CycleJob(export, tmp_path / "t.json", {}, {0: "not a calibration"}, {}, (0,)))
    worker.close()
    (path, problem), = done
    assert "could not enrich" in problem and load_trace(path) == plain


def test_a_dead_worker_leaves_its_jobs_to_this_process(tmp_path):
    done = []
    worker = _ready_worker(lambda path, problem: done.append((path, problem)))
    export = _export(tmp_path)
    worker._proc.send_signal(signal.SIGSTOP)  # paused: the job cannot run there before the kill
    worker.submit(CycleJob(export, tmp_path / "t.json", {}, {}, {}, ()))
    worker._proc.kill()
    with pytest.warns(UserWarning, match="exited"):
        worker.close()
    assert done == [(tmp_path / "t.json", None)] and load_trace(tmp_path / "t.json")["traceEvents"]


def test_a_paused_worker_does_nothing_until_it_goes_on(tmp_path):
    done = []
    worker = _ready_worker(lambda path, problem: done.append((path, problem)))
    worker.pause()
    worker.submit(CycleJob(_export(tmp_path), tmp_path / "t.json", {}, {}, {}, ()))
    time.sleep(1.0)
    worker.harvest()
    assert done == [] and not (tmp_path / "t.json").exists()  # stopped: the job waits
    worker.close()  # lets it go on before waiting
    assert done == [(tmp_path / "t.json", None)] and load_trace(tmp_path / "t.json")["traceEvents"]


def test_profile_pauses_the_worker_while_a_cycle_is_collected(tmp_path):
    sched = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=2)
    model = torch.nn.Linear(16, 16)
    paused = []
    with torch_l2topo.profile(tmp_path, schedule=sched, activities=ACTIVITIES, topology=None) as prof:
        for _ in range(8):
            model(torch.randn(8, 16)).sum()
            prof.step()
            paused.append(prof.handler._worker._paused)
    # prof.step() enters the next step: warmup (paused), active, active, then the trace is handed over and the
    # next wait step runs with the worker going on; twice
    assert paused == [True, True, True, False] * 2
    assert len(prof.written) == 2 and not prof.handler._worker._paused


ORPHAN = """
import os, sys, time
from pathlib import Path
from torch_l2topo.profiler.cycle import CycleJob
from torch_l2topo.profiler.worker import Worker
export, out = Path(sys.argv[1]), Path(sys.argv[2])
worker = Worker(lambda path, problem: None)
worker.start()
while not worker.ready():
    time.sleep(0.05)
worker.pause()
worker.submit(CycleJob(export, out, {}, {}, {}, ()))
print(worker._proc.pid, flush=True)
os._exit(0)  # a crash: nothing resumes the worker, nothing waits for it
"""


def test_a_worker_stopped_by_a_parent_that_crashed_goes_on_and_writes(tmp_path):
    import os

    export = _export(tmp_path)
    parent = subprocess.run([sys.executable, "-c", ORPHAN, str(export), str(tmp_path / "t.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=120, check=True)
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
        if not exited:  # a failed test leaves no stopped worker behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_jobs_of_a_worker_that_died_run_here_and_later_ones_go_to_its_successor(tmp_path):
    done = []
    worker = _ready_worker(lambda path, problem: done.append((path, problem)))
    first = worker._proc
    first.send_signal(signal.SIGSTOP)
    worker.submit(CycleJob(_export(tmp_path, "a.json"), tmp_path / "a.trace.json", {}, {}, {}, ()))
    first.kill()
    first.wait()
    worker.submit(CycleJob(_export(tmp_path, "b.json"), tmp_path / "b.trace.json", {}, {}, {}, ()))
    assert worker._proc is not first  # a new worker took the second job
    with pytest.warns(UserWarning, match="exited"):
        worker.close()
    assert done == [(tmp_path / "a.trace.json", None), (tmp_path / "b.trace.json", None)]
    assert all(load_trace(path)["traceEvents"] for path, _ in done)
    assert not list(tmp_path.glob(".l2topo-job*")) and not (tmp_path / "a.json").exists()


def test_the_lazy_names_are_the_exported_ones():
    import torch_l2topo.profiler as profiler

    assert set(profiler.__all__) == set(profiler._LAZY) and all(getattr(profiler, n) for n in profiler.__all__)


def test_options_are_checked():
    with pytest.raises(ValueError, match="topology"):
        session.TraceHandler("x.json", topology="latest")
    with pytest.raises(TypeError, match="on_trace_ready"):
        torch_l2topo.profile("x", on_trace_ready=print)


def _enriched_with_kernels(tmp_path, topo):
    """A written enriched trace: 3 launches of row_sum_kernel (132 CTAs each) and 2 of other_kernel."""
    trace = cpu_trace(tmp_path)
    k0 = kineto_start_ns(trace)
    trace = add_kernels(trace, 0, [("row_sum_kernel", k0 + i * 80_000, 50_000) for i in range(3)] +
                        [("other_kernel", k0 + 55_000 + i * 80_000, 20_000) for i in range(2)])
    cta_ns = np.full(132, 40_000)
    cta_ns[17] = 47_000  # one slow SM: the tail
    recs = ctas_inside([k0 + i * 80_000 + 2_000 - KINETO_MINUS_GLOBALTIMER for i in range(3)], 132, np.arange(132),
                       cta_ns, 10)
    path = write_trace(enrich(trace, maps={0: SmMap.from_topology(topo)}, records={0: recs}), tmp_path / "t.json")
    return path, k0


def test_merge_proton_keeps_the_recorded_ctas(tmp_path):
    topo = torch_l2topo.load_example()
    path, k0 = _enriched_with_kernels(tmp_path, topo)
    before = recorded_ctas(load_trace(path))[0]
    gt = k0 + 55_000 + 1_000 - KINETO_MINUS_GLOBALTIMER
    proton = tmp_path / "p.chrome_trace"
    proton.write_text(json.dumps(proton_trace("other_kernel", [[(s, s, gt, 9_900) for s in range(8)]], 1.98)))
    torch_l2topo.profiler.merge_proton(path, proton)
    merged = load_trace(path)
    after = recorded_ctas(merged)[0]
    assert len(after) == len(before) and (after.start_ns == before.start_ns).all()
    assert merged["l2topo"]["devices"]["0"]["alignment"]["proton"]["matched"] == 8
    assert {launch["kernel"] for launch in launches(merged)} == {"row_sum_kernel", "other_kernel"}
    bad = tmp_path / "bad.chrome_trace"
    bad.write_text("{not json")
    content = path.read_bytes()
    with pytest.raises(TraceFormatError):
        torch_l2topo.profiler.merge_proton(path, bad)
    assert path.read_bytes() == content


def test_trace_summary_reads_the_launches_back(tmp_path, capsys):
    topo = torch_l2topo.load_example()
    path, _ = _enriched_with_kernels(tmp_path, topo)
    summary = summarize(load_trace(path))
    (row,) = summary["kernels"]
    assert row["kernel"] == "row_sum_kernel" and row["launches"] == 3 and row["ctas"] == 3 * 132
    # CTA j starts 10 j ns in: SM 17 ends at 170 + 47000 ns, the median SM at 10 x 65.5 + 40000 (32 ns ticks)
    assert row["tail_ns"] == pytest.approx(170 + 47_000 - 655 - 40_000, abs=64)
    assert row["busy_ns_max"] == pytest.approx(47_000, abs=64)
    assert summary["devices"]["0"]["alignment"]["recorder"]["outside"] == 0
    assert cli(["trace-summary", str(path)]) == 0
    text = capsys.readouterr().out
    assert "row_sum_kernel [GPU 0]" in text and "NVIDIA H200" in text
    assert cli(["trace-summary", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kernels"][0]["launches"] == 3
    plain = write_trace(cpu_trace(tmp_path), tmp_path / "plain.json")
    assert cli(["trace-summary", str(plain)]) == 2
    assert "not enriched" in capsys.readouterr().err


def test_the_timeline_draws_one_bar_per_cta_in_map_order(tmp_path):
    pytest.importorskip("matplotlib")
    topo = torch_l2topo.load_example()
    path, k0 = _enriched_with_kernels(tmp_path, topo)
    trace = load_trace(path)
    launch = pick_launch(trace)
    rows = timeline_rows(trace, launch)
    assert rows["order"] == SmMap.from_topology(topo).order().tolist()  # the map's order, as enrich() wrote it
    assert sum(len(b) for b in rows["bars"].values()) == 132 and all(len(b) == 1 for b in rows["bars"].values())
    assert rows["bars"][17][0][1] == pytest.approx(47.0, abs=0.064) and rows["bars"][3][0][1] == pytest.approx(40.0,
                                                                                                              abs=0.064)
    out = render_timeline(trace, tmp_path / "timeline.png")
    assert out.stat().st_size > 10_000 and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(TraceFormatError, match="no instrumented launch"):
        pick_launch(trace, kernel="missing_kernel")


def test_raw_inputs_saved_here_enrich_the_same_elsewhere(tmp_path):
    from torch_l2topo.profiler.offline import enrich_raw, save_raw
    from torch_l2topo.profiler.proton_trace import load_proton, proton_records

    topo = torch_l2topo.load_example()
    trace = cpu_trace(tmp_path)
    k0 = kineto_start_ns(trace)
    trace = add_kernels(trace, 0, [("row_sum_kernel", k0, 50_000), ("other_kernel", k0 + 55_000, 20_000)])
    recs = ctas_inside([k0 + 2_000 - KINETO_MINUS_GLOBALTIMER], 132, np.arange(132), np.full(132, 40_000), 10)
    gt = k0 + 56_000 - KINETO_MINUS_GLOBALTIMER
    proton = tmp_path / "p.chrome_trace"
    proton.write_text(json.dumps(proton_trace("other_kernel", [[(s, s, gt, 9_900) for s in range(4)]], 1.98)))
    plain = write_trace(trace, tmp_path / "plain.json")
    smmap = SmMap.from_topology(topo)
    raw = save_raw(tmp_path / "raw", plain, {0: recs}, {0: smmap}, proton, {"what": "a test"})
    p_records, quantum = proton_records(load_proton(proton), smmap.sm_clock_ghz)
    direct = enrich(load_trace(plain), maps={0: smmap}, records={0: recs}, proton=p_records,
                    proton_quantum_ns=quantum)
    assert json.dumps(enrich_raw(raw), sort_keys=True) == json.dumps(direct, sort_keys=True)
    with pytest.raises(TraceFormatError, match="no trace.json.gz"):
        enrich_raw(tmp_path)


def test_trace_summary_draws_the_timeline(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path, _ = _enriched_with_kernels(tmp_path, torch_l2topo.load_example())
    assert cli(["trace-summary", str(path), "--timeline", str(tmp_path / "t.png"), "--kernel", "row_sum_kernel"]) == 0
    assert (tmp_path / "t.png").stat().st_size > 10_000 and "wrote" in capsys.readouterr().out
