"""The profiler on a GPU: the recorder writes exactly one record per program and nothing when off (no recording
instruction compiled in), a full buffer counts its drops, torch_l2topo.profile writes one enriched trace per
cycle with every CTA once on its SM inside its own kernel (eager and CUDA graph replays, two cycles), several
GPUs in one process, Proton's CTAs merge, and the example model (an @sm_aware op, contract v2) end to end."""
import numpy as np
import pytest
import torch

import torch_l2topo
from torch_l2topo import layout
from torch_l2topo.measure import recording
from torch_l2topo.profiler import session
from torch_l2topo.profiler.demo import KERNEL_NAME, row_sums, scoped_copy
from torch_l2topo.profiler.runtime import clock
from torch_l2topo.profiler.trace.align import TICK_NS
from torch_l2topo.profiler.trace.readback import launches
from torch_l2topo.profiler.trace.tracefile import load_trace
from torch_l2topo.profiler.trace.tracks import CTA_CATEGORY

pytestmark = pytest.mark.gpu
ROWS, DIM, GRID = 20_000, 48, 264
CONTRACT_V2 = hasattr(layout, "PLACE_RECORD")  # @sm_aware kernels take PLACE (issue 16)


@pytest.fixture(scope="module", autouse=True)
def held_recorder():
    """GPU 0's recorder made first, with room for the cycles profile() holds in one drain (a recorder keeps the
    capacity it was made with; a smaller one makes profile() drain more often, with a warning)."""
    recording.recorder(0, session.held_capacity())


def _n_sm(device=0):
    return torch.cuda.get_device_properties(device).multi_processor_count


def _expected_items(grid, n_rows):
    return np.array([len(range(p, n_rows, grid)) for p in range(grid)])


def test_the_recorder_holds_one_record_per_program():
    x = torch.randn(ROWS, DIM, device="cuda")
    with recording.recording(devices=[0]):
        rec = recording.active_recorder(0)
        rec.drain()
        out = row_sums(x, grid=GRID)
        records = rec.drain()
    torch.testing.assert_close(out, x.sum(dim=1), rtol=1e-5, atol=1e-4)
    assert records.kernel_names() == [KERNEL_NAME] and records.dropped == 0
    order = np.argsort(records.program)
    assert records.program[order].tolist() == list(range(GRID))
    assert records.items[order].tolist() == _expected_items(GRID, ROWS).tolist()
    assert ((records.sm >= 0) & (records.sm < _n_sm())).all()
    span = records.end_ns - records.start_ns
    assert (span >= 0).all() and (span < 1e9).all()
    assert records.end_ns.max() - records.start_ns.min() < 1e9  # one launch, well under a second


def test_near_counts_follow_the_partition_of_the_sm():
    x = torch.randn(ROWS, DIM, device="cuda")
    classes = torch.zeros(ROWS, dtype=torch.int32, device="cuda")  # every row homed in partition 0
    part = torch.arange(_n_sm(), device="cuda", dtype=torch.int32) % 2  # even SMs near partition 0
    with recording.recording(devices=[0]):
        rec = recording.active_recorder(0)
        rec.drain()
        row_sums(x, item_class=classes, sm_partition=part, grid=GRID)
        records = rec.drain()
    near_expected = np.where(records.sm % 2 == 0, records.items, 0)
    assert records.near.tolist() == near_expected.tolist()


def test_recording_off_writes_nothing_and_compiles_nothing():
    from torch_l2topo.triton_kernels.recorder_demo import row_sum_kernel

    x = torch.randn(ROWS, DIM, device="cuda")
    rec = recording.recorder(0)
    rec.drain()
    out = torch.empty(ROWS, device="cuda")
    idle = torch.zeros(1, dtype=torch.int64, device="cuda")
    cls = torch.zeros(ROWS, dtype=torch.int32, device="cuda")
    part = torch.zeros(_n_sm(), dtype=torch.int32, device="cuda")
    compiled = row_sum_kernel[(GRID,)](x, out, ROWS, DIM, cls, part, idle, 0, RECORD=False, BLOCK=64)
    assert not any(n in compiled.asm["ptx"] for n in ("%globaltimer", "%smid", "atom."))
    assert recording.active_recorder(0) is None  # recording is off outside profiling
    row_sums(x, out=out)
    assert len(rec.drain()) == 0 and idle.item() == 0
    torch.testing.assert_close(out, x.sum(dim=1), rtol=1e-5, atol=1e-4)


def test_the_spool_hands_over_each_drain_and_no_more():
    """Two launches, each drained into a slot right after it (nothing synchronized in between): each slot holds
    exactly its launch's programs, the slots (in /dev/shm, the default) are page-locked, and an empty drain
    loads empty; a slot released and taken again (its drain graph replayed) holds its new launch's programs."""
    from torch_l2topo.profiler.runtime.spool import RecordSpool

    x = torch.randn(ROWS, DIM, device="cuda")
    sp = RecordSpool()
    with recording.recording(devices=[0]):
        rec = recording.active_recorder(0)
        rec.drain()
        row_sums(x, grid=GRID)
        first = sp.take(rec)
        row_sums(x, grid=GRID // 2)
        second = sp.take(rec)
        empty = sp.take(rec)
    got = [s.load(timeout_s=30) for s in (first, second, empty)]
    assert all(slot.graph is not None for slot in sp._slots)  # each drain one graph launch
    sp.release(first)  # its slot is free again: the next drain replays that slot's graph
    with recording.recording(devices=[0]):
        row_sums(x, grid=GRID // 4)
        again = sp.take(rec)
    assert again.path == first.path and len(sp._slots) == 3
    got.append(again.load(timeout_s=30))
    assert sorted(got[3].program.tolist()) == list(range(GRID // 4))
    for records, grid in zip(got[:2], (GRID, GRID // 2)):
        order = np.argsort(records.program)
        assert records.program[order].tolist() == list(range(grid)) and records.dropped == 0
        assert records.items[order].tolist() == _expected_items(grid, ROWS).tolist()
        assert records.kernel_names() == [KERNEL_NAME]
    assert got[0].end_ns.max() <= got[1].start_ns.min()  # the second launch ran after the first
    assert len(got[2]) == 0 and all(slot.registered for slot in sp._slots)
    sp.close()


def test_a_full_buffer_counts_its_drops():
    small = recording.CtaRecorder(0, capacity=100)
    from torch_l2topo.triton_kernels.recorder_demo import row_sum_kernel

    x = torch.randn(ROWS, DIM, device="cuda")
    tag = small.register(KERNEL_NAME)
    row_sum_kernel[(GRID,)](x, torch.empty(ROWS, device="cuda"), ROWS, DIM,
                            torch.zeros(ROWS, dtype=torch.int32, device="cuda"),
                            torch.zeros(_n_sm(), dtype=torch.int32, device="cuda"), small.buffer, tag, RECORD=True,
                            BLOCK=64)
    records = small.drain()
    assert len(records) == 100 and records.dropped == GRID - 100
    assert len(set(records.program.tolist())) == 100


def _check_trace(path, launches_per_cycle, grid):
    """Every CTA of every launch once, on an SM of the device, inside its own kernel event."""
    trace = load_trace(path)
    meta = trace["l2topo"]["devices"]["0"]
    a = meta["alignment"]["recorder"]
    assert a["matched"] == launches_per_cycle * grid and a["launches"] == launches_per_cycle
    assert a["records"] == a["matched"]  # nothing from outside the cycle's active steps (a warmup, a replay)
    assert a["outside"] == 0 and a["max_misalignment_ns"] <= TICK_NS
    ls = [launch for launch in launches(trace) if launch["kernel"] == KERNEL_NAME]
    assert len(ls) == launches_per_cycle
    events = trace["traceEvents"]
    for launch in ls:
        ctas = [ev for ev in events if ev.get("cat") == CTA_CATEGORY and ev["args"]["launch"] == launch["launch"]]
        assert sorted(ev["args"]["program"] for ev in ctas) == list(range(grid))
        kernel = events[launch["launch"]]
        for ev in ctas:
            assert 0 <= ev["args"]["sm"] < _n_sm()
            assert kernel["ts"] - TICK_NS / 1000 <= ev["ts"]
            assert ev["ts"] + ev["dur"] <= kernel["ts"] + kernel["dur"] + TICK_NS / 1000
    return trace


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "cuda-graph"])
def test_profile_two_cycles_every_cta_inside_its_kernel(tmp_path, graph):
    torch_l2topo.calibrate(0)  # cached after the first call: the traces get the L2 map
    x = torch.randn(ROWS, DIM, device="cuda")
    out = torch.empty(ROWS, device="cuda")
    w = torch.randn(DIM, DIM, device="cuda")

    def step():
        row_sums(x, grid=GRID, out=out)
        x @ w

    recording.recorder(0).in_graphs = False  # no graph of an earlier test replays here
    if graph:
        with recording.recording(devices=[0]):  # captured while recording: replays record
            step()  # compiles the recording variant outside the capture
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                step()
        step = g.replay
    sched = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=3)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    resets = []
    reset = recording.CtaRecorder.reset

    def counted(self):
        resets.append(self.device_index)
        reset(self)

    recording.CtaRecorder.reset = counted
    try:
        with torch_l2topo.profile(tmp_path, schedule=sched, activities=acts) as prof:
            for _ in range(12):
                step()
                prof.step()
    finally:
        recording.CtaRecorder.reset = reset
    # a recorder is reset when a cycle starts only if something recorded since its last drain and no held drain
    # still has to take it: the first cycle's warmup (or graph replays) once; then one drain holds the 3 cycles,
    # each trace reads its window of it, and the graph's replays in the wait and warmup steps fall outside them
    assert len(resets) == 1
    assert len(prof.written) == 3
    for path in prof.written:
        trace = _check_trace(path, launches_per_cycle=2, grid=GRID)
        assert trace["l2topo"]["devices"]["0"]["calibration"]["device"]["sm_count"] == _n_sm()
    torch.testing.assert_close(out, x.sum(dim=1), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("wait", [0, 1], ids=["back-to-back", "one-wait-step"])
@pytest.mark.parametrize("max_held", [8, 1], ids=["one-drain", "drains-of-two-cycles"])
def test_each_cycle_reads_its_own_records_from_a_drain_that_holds_several(tmp_path, wait, max_held):
    """profile() drains the records once for up to max_held + 1 cycles, launched when the held jobs go to the
    worker, and each cycle's job reads the CTAs of its own window (spool.py, Held drains): with cycles back to back
    (no wait, no warmup) or a wait step between, each trace holds exactly its own cycle's launches; and the block's
    5 cycles take one drain (max_held 8), or three (max_held 1: drains of two cycles, the last one of one)."""
    from torch_l2topo.profiler.runtime.spool import shared_spool

    x = torch.randn(ROWS, DIM, device="cuda")
    recording.recorder(0).in_graphs = False  # no graph of an earlier test replays here
    sched = torch.profiler.schedule(wait=wait, warmup=0, active=2, repeat=5)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    drains = shared_spool()._drains.get(0, 0)
    with torch_l2topo.profile(tmp_path, schedule=sched, activities=acts, max_held=max_held) as prof:
        for _ in range(5 * (wait + 2)):
            row_sums(x, grid=GRID)
            prof.step()
    assert prof.handler.held.per_drain == {0: max_held + 1} and len(prof.written) == 5
    assert shared_spool()._drains[0] - drains == (1 if max_held == 8 else 3)
    for path in prof.written:
        _check_trace(path, launches_per_cycle=2, grid=GRID)


def test_the_clock_link_holds_every_cta_of_a_launch_between_the_host_times_around_it():
    """The physical bound the windows rest on (clock.py): a kernel launched after host time h0 and finished before
    h1 ran, CTA by CTA, inside the link's image of [h0, h1], without any drift allowance; and a link measured now
    is narrow (launch to wait, tens of microseconds)."""
    x = torch.randn(ROWS, DIM, device="cuda")
    row_sums(x, grid=GRID)  # compiled, both variants, before the timed launch
    link = clock.measure(0)
    assert 0 <= link.width_ns < 500_000
    with recording.recording(devices=[0]):
        rec = recording.active_recorder(0)
        rec.drain()
        torch.cuda.synchronize()
        h0 = clock.time.time_ns()
        row_sums(x, grid=GRID)
        torch.cuda.synchronize()
        h1 = clock.time.time_ns()
        records = rec.drain()
    lo, hi = link.to_device(h0, h1, drift_ppm=0)
    assert len(records) == GRID
    assert lo <= records.start_ns.min() and records.end_ns.max() <= hi


def test_a_block_page_locks_its_slots_before_its_steps(tmp_path, monkeypatch):
    """profile() makes two spool slots (the held drain's and the next one's), with their drain graphs, when the block
    starts: a block of max_held + 1 cycles makes and captures none in its loop (a slot page-locks megabytes,
    milliseconds; a capture takes about half of one)."""
    from torch_l2topo.profiler.runtime import spool
    from torch_l2topo.profiler.runtime.perprocess import PerProcess

    monkeypatch.setattr(spool, "_shared", PerProcess(spool.RecordSpool))  # a spool with no slot yet
    made, make = [], spool._Slot.__init__
    x = torch.randn(ROWS, DIM, device="cuda")
    recording.recorder(0).in_graphs = False
    sched = torch.profiler.schedule(wait=0, warmup=0, active=1, repeat=4)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch_l2topo.profile(tmp_path, schedule=sched, activities=acts, max_held=3) as prof:
        slots = len(spool.shared_spool()._slots)
        captured = all(slot.graph is not None for slot in spool.shared_spool()._slots)
        monkeypatch.setattr(spool._Slot, "__init__", lambda slot, *a: (made.append(a), make(slot, *a))[1])
        monkeypatch.setattr(spool, "_capture", lambda *a: made.append("capture"))
        for _ in range(4):
            row_sums(x, grid=GRID)
            prof.step()
    spool.close_shared_spool()
    assert slots == 2 and captured
    assert made == [] and len(prof.written) == 4
    for path in prof.written:
        _check_trace(path, launches_per_cycle=1, grid=GRID)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus_in_one_process(tmp_path):
    xs = [torch.randn(ROWS, DIM, device=f"cuda:{d}") for d in (0, 1)]
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch_l2topo.profile(tmp_path / "t.json", activities=acts, devices=[0, 1]) as prof:
        for x in xs:
            row_sums(x, grid=GRID)
    trace = load_trace(prof.written[0])
    for d in ("0", "1"):
        a = trace["l2topo"]["devices"][d]["alignment"]["recorder"]
        assert a["matched"] == GRID and a["outside"] == 0


def test_proton_ctas_merge_into_the_trace(tmp_path):
    pytest.importorskip("triton.profiler")
    x = torch.randn(1 << 20, device="cuda")
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch_l2topo.profile(tmp_path / "t.json", activities=acts, proton=True) as prof:
        for _ in range(2):
            y = scoped_copy(x)
    torch.testing.assert_close(y, x)
    trace = load_trace(prof.written[0])
    a = trace["l2topo"]["devices"]["0"]["alignment"]["proton"]
    n_ctas = (1 << 20) // 1024
    assert a["matched"] == 2 * n_ctas
    assert a["max_misalignment_ns"] <= TICK_NS + a["quantum_ns"]


@pytest.mark.skipif(not CONTRACT_V2, reason="@sm_aware kernels take PLACE once placement contract v2 (issue 16) lands")
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "cuda-graph"])
def test_the_example_model_end_to_end(tmp_path, graph):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "profile_model", Path(__file__).resolve().parents[1] / "examples" / "profile_model.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    torch_l2topo.calibrate(0)
    written = example.run(tmp_path, cycles=2, graph=graph)
    assert len(written) == 2
    for path in written:
        trace = load_trace(path)
        ls = [launch for launch in launches(trace) if launch["kernel"] == "gather_rows"]
        assert len(ls) == 2 and all(launch["items"] == example.BATCH for launch in ls)
        a = trace["l2topo"]["devices"]["0"]["alignment"]["recorder"]
        assert a["outside"] == 0 and a["max_misalignment_ns"] <= TICK_NS


@pytest.mark.skipif(not CONTRACT_V2, reason="@sm_aware kernels take PLACE once placement contract v2 (issue 16) lands")
def test_a_compiled_model_calling_an_sm_aware_op_is_recorded(tmp_path):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "profile_model", Path(__file__).resolve().parents[1] / "examples" / "profile_model.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    model = example.Model(example.gather_op()).cuda()
    compiled = torch.compile(model)
    idx = torch.randint(0, example.N_ROWS, (example.BATCH,), device="cuda")
    compiled(idx)  # compile outside the profiler
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch_l2topo.profile(tmp_path / "t.json", activities=acts) as prof:
        torch.testing.assert_close(compiled(idx), model(idx))
    ls = [launch for launch in launches(load_trace(prof.written[0])) if launch["kernel"] == "gather_rows"]
    assert len(ls) == 2 and all(launch["items"] == example.BATCH for launch in ls)
