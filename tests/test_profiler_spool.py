"""The record spool on the CPU: a cycle's CTA records reach the trace worker through a shared-memory slot and
give the trace the same records would give in memory; the reader waits for the slot's flag and never reads a
slot whose rows have not landed; slots are reused only once released. Here the test writes the rows and the
flag where the GPU's copies would (tests/test_profiler_gpu.py drains real recorders)."""
import shutil
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from profiler_workers import ready_worker

from torch_l2topo.layout import REC_CAPACITY, REC_CURSOR, REC_HEADER, REC_WORDS
from torch_l2topo.measure.recording import COLUMNS, CtaRecords
from torch_l2topo.profiler import session
from torch_l2topo.profiler.runtime import cycle, spool
from torch_l2topo.profiler.runtime.cycle import CycleJob
from torch_l2topo.profiler.runtime.spool import BUFFER_WORD, FLAG_WORD, RecordSpool, SpooledRecords, SpoolError
from torch_l2topo.profiler.trace.offline import load_raw
from torch_l2topo.profiler.trace.tracefile import load_trace, write_trace
from torch_l2topo.profiler.trace.tracks import CTA_CATEGORY

DATA = Path(__file__).resolve().parent / "data" / "profiler"


@pytest.fixture
def unpinned(monkeypatch):
    """Slots without page-locking (no GPU here): the spool's layout and protocol are the same."""
    monkeypatch.setattr(spool, "_register", lambda words: False)


def _words(records: CtaRecords) -> np.ndarray:
    """The rows as the recorder holds them (layout.REC_*), independent of spool.py."""
    from torch_l2topo.measure.recording import _WORD_OF

    table = np.zeros((len(records), REC_WORDS), np.int64)
    for name in COLUMNS:
        table[:, _WORD_OF[name]] = getattr(records, name)
    return table.ravel()


def _spooled(sp: RecordSpool, records: CtaRecords, seq: int, device: int = 0, capacity: int | None = None):
    """(SpooledRecords, slot) for `records` drained from a recorder of `capacity` records (default: just
    enough), the slot taken but nothing landed in it yet."""
    slot = sp._take(device, capacity or len(records))
    return SpooledRecords(slot.path, seq, records.names, records.class_counts, device), slot


def _land(slot, records: CtaRecords, seq: int, capacity: int | None = None) -> None:
    """What the GPU's two copies do: the recorder's buffer (header, then rows), then the drain's number."""
    import torch

    buffer = np.zeros(REC_HEADER + slot.capacity * REC_WORDS, np.int64)
    buffer[REC_CURSOR] = len(records) + records.dropped
    buffer[REC_CAPACITY] = capacity or len(records)
    rows = _words(records)
    buffer[REC_HEADER:REC_HEADER + len(rows)] = rows
    slot.words[BUFFER_WORD:BUFFER_WORD + len(buffer)] = torch.from_numpy(buffer)
    slot.words[FLAG_WORD] = seq


def _records(n: int, seed: int = 0) -> CtaRecords:
    rng = np.random.default_rng(seed)
    start = rng.integers(0, 1 << 40, n)
    return CtaRecords(rng.integers(0, 3, n), rng.integers(0, 132, n), np.arange(n), start,
                      start + rng.integers(1, 10_000, n), rng.integers(1, 9, n), rng.integers(-1, 9, n),
                      names={0: "a", 1: "b", 2: "c"}, class_counts={1: [4, 5, 0]}, dropped=0, device=0)


def _equal(a: CtaRecords, b: CtaRecords) -> bool:
    return all(np.array_equal(getattr(a, c), getattr(b, c)) for c in COLUMNS) and \
        (a.names, a.class_counts, a.dropped, a.device) == (b.names, b.class_counts, b.dropped, b.device)


def test_a_reader_waits_for_the_flag_then_reads_the_rows(tmp_path, unpinned):
    sp = RecordSpool(tmp_path)
    records = _records(5000)
    spooled, slot = _spooled(sp, records, seq=7)
    landed = threading.Timer(0.2, _land, (slot, records, 7))
    landed.start()
    t0 = time.monotonic()
    got = spooled.load(timeout_s=30)
    assert time.monotonic() - t0 >= 0.19  # it waited for the flag, not for a timeout
    assert _equal(got, records)
    sp.close()
    assert not list(tmp_path.iterdir())


def test_only_the_rows_the_header_counts_are_read_and_drops_are_counted(tmp_path, unpinned):
    import dataclasses

    sp = RecordSpool(tmp_path)
    records = _records(50)
    spooled, slot = _spooled(sp, records, seq=1, capacity=64)
    slot.words[:] = 7  # what an earlier, longer drain left in the slot
    _land(slot, records, 1, capacity=64)
    assert _equal(spooled.load(timeout_s=1), records)
    full = dataclasses.replace(_records(64, seed=1), dropped=6)  # 70 CTAs recorded into 64 rows
    spooled, slot = _spooled(sp, full, seq=2, capacity=64)
    _land(slot, full, 2, capacity=64)
    got = spooled.load(timeout_s=1)
    assert len(got) == 64 and got.dropped == 6 and _equal(got, full)
    sp.close()


def test_a_flag_of_another_drain_is_not_taken_for_this_one(tmp_path, unpinned):
    sp = RecordSpool(tmp_path)
    records = _records(100)
    spooled, slot = _spooled(sp, records, seq=3)
    _land(slot, records, 2)  # an earlier drain's number: its rows are not this drain's
    with pytest.raises(SpoolError, match="never arrived"):
        spooled.load(timeout_s=0.05)
    sp.close()


def test_a_job_whose_records_never_arrive_writes_the_plain_trace(tmp_path, unpinned, monkeypatch):
    monkeypatch.setattr(spool, "DEFAULT_LOAD_TIMEOUT_S", 0.05)
    sp = RecordSpool(tmp_path / "spool")
    (tmp_path / "spool").mkdir()
    spooled, _ = _spooled(sp, _records(10), seq=1)
    trace = write_trace(load_raw(DATA)["trace"], tmp_path / "t.json")
    plain = trace.read_bytes()
    problem = cycle.run(CycleJob(trace, {0: spooled}, {}, {}, ()))
    assert "could not enrich" in problem and "never arrived" in problem and trace.read_bytes() == plain
    sp.close()


def test_slots_are_reused_only_once_released(tmp_path, unpinned):
    sp = RecordSpool(tmp_path)
    small = _records(10)
    a, slot_a = _spooled(sp, small, seq=1)
    b, slot_b = _spooled(sp, small, seq=2)
    assert slot_a is not slot_b  # a is busy
    sp.release(a)
    c, slot_c = _spooled(sp, small, seq=3)
    assert slot_c is slot_a and int(slot_c.words[FLAG_WORD]) == -1  # reused, its old flag cleared
    sp.release(b)
    big, slot_big = _spooled(sp, _records(11), seq=4)
    assert slot_big is not slot_b and slot_big.capacity == 11  # b is too small
    other, slot_other = _spooled(sp, small, seq=5, device=1)
    assert slot_other.device == 1 and slot_other is not slot_b  # a slot belongs to one GPU
    assert sp.busy() == 3  # c, big and other; a and b were released
    sp.close()
    assert not list(tmp_path.iterdir())


def test_reserve_makes_free_slots_before_profiling(tmp_path, unpinned):
    sp = RecordSpool(tmp_path)
    sp.reserve(0, 1000, 2)
    assert sp.busy() == 0 and len(sp._slots) == 2
    sp.reserve(0, 1000, 2)
    assert len(sp._slots) == 2  # already there
    sp.close()


def test_reserve_given_the_recorder_captures_each_free_slots_drain_once(tmp_path, monkeypatch):
    """Page-locked slots (as on a GPU): reserve(..., recorder) captures the drain of every free slot that can hold
    the recorder's buffer, and only once; a slot too small for it is left alone (a capture would fail there)."""
    import torch

    captured = []
    monkeypatch.setattr(spool, "_register", lambda words: True)
    monkeypatch.setattr(spool, "_capture", lambda ops, device: captured.append(device) or object())
    recorder = SimpleNamespace(device_index=0, capacity=1000, buffer=torch.zeros(4, dtype=torch.int64))
    sp = RecordSpool(tmp_path)
    sp.reserve(0, 10, 1)  # an earlier, smaller recorder's slot
    sp.reserve(0, 1000, 2, recorder)
    assert len(sp._slots) == 3 and len(captured) == 2
    assert [s.graph is not None for s in sp._slots] == [False, True, True]
    sp.reserve(0, 1000, 2, recorder)
    assert len(sp._slots) == 3 and len(captured) == 2  # nothing new to make or capture
    for slot in sp._slots:
        slot.registered = False  # nothing was page-locked here
    sp.close()


def test_the_worker_writes_from_a_slot_what_records_in_memory_give(tmp_path, unpinned):
    """The H200 fixture's records, spooled: the worker process reads the slot (landed after the job was
    submitted) and writes the same file as the inline job that had the records in memory."""
    raw = load_raw(DATA)
    (device, records), = raw["records"].items()
    for name in ("inline", "spooled"):
        write_trace(raw["trace"], tmp_path / f"{name}.json")
    inline = CycleJob(tmp_path / "inline.json", {device: records}, raw["smmaps"], {}, ())
    assert cycle.run(inline) is None
    sp = RecordSpool(tmp_path / "spool")
    (tmp_path / "spool").mkdir()
    spooled, slot = _spooled(sp, records, seq=1, device=device)
    done = []
    worker = ready_worker(processes=1)
    worker.submit(CycleJob(tmp_path / "spooled.json", {device: spooled}, raw["smmaps"], {}, ()),
                  lambda path, problem: done.append((path, problem)))
    assert not worker._waiting  # handed to the worker process, which waits for the slot
    time.sleep(0.1)
    _land(slot, records, 1)
    worker.close(60)
    assert done == [(tmp_path / "spooled.json", None)]
    written = load_trace(tmp_path / "spooled.json")
    assert written == load_trace(tmp_path / "inline.json")
    assert sum(ev.get("cat") == CTA_CATEGORY for ev in written["traceEvents"]) == len(records) > 0
    sp.close()


def test_the_handler_releases_a_traces_slots_once_it_is_written(tmp_path, unpinned, monkeypatch):
    sp = RecordSpool(tmp_path)
    monkeypatch.setattr(session, "shared_spool", lambda: sp)
    handler = session.TraceHandler(tmp_path / "t.json", topology=None, record=False)
    spooled, _ = _spooled(sp, _records(10), seq=1)
    handler._spooled[str(tmp_path / "t.json")] = {0: spooled}  # the handler keys its traces by path string
    assert sp.busy() == 1
    handler._done(str(tmp_path / "t.json"), None)
    assert sp.busy() == 0
    sp.close()


def test_slots_go_to_shared_memory_where_there_is_some():
    expected = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    if expected is None:
        pytest.skip("no /dev/shm here")
    assert spool.spool_directory() == expected and shutil.disk_usage(expected).total > 0


def test_a_map_pickles_to_the_same_map_and_its_fields_are_pickled_once():
    import pickle

    import torch_l2topo
    from torch_l2topo.profiler.trace.smmap import SmMap

    smmap = SmMap.from_topology(torch_l2topo.load_example())
    first = pickle.dumps(smmap)
    back = pickle.loads(first)
    assert back.to_json() == smmap.to_json() and back is not smmap
    assert pickle.dumps(smmap) == first and smmap.__dict__["_pickled"] in first  # the cached fields, reused


def test_a_slot_that_shared_memory_has_no_room_for_goes_to_the_temporary_directory(tmp_path, unpinned, monkeypatch):
    """Blocks are allocated when a slot is made (a full tmpfs would otherwise kill the process with SIGBUS at the
    GPU's copy): where that fails, the slot is made in the temporary directory instead, with a warning."""
    import errno
    import os
    import tempfile

    allocated = []

    def full_once(fd, offset, length):
        if not allocated:
            allocated.append("refused")
            raise OSError(errno.ENOSPC, "No space left on device")
        allocated.append(length)

    monkeypatch.setattr(spool, "_room_warned", [])
    monkeypatch.setattr(os, "posix_fallocate", full_once, raising=False)
    sp = RecordSpool(tmp_path)
    with pytest.warns(UserWarning, match="no room"):
        sp.reserve(0, 1000, 1)
    (slot,) = sp._slots
    assert Path(slot.path).parent == Path(tempfile.gettempdir()) and not list(tmp_path.iterdir())
    assert allocated[1] == Path(slot.path).stat().st_size >= (1 + 1000 * REC_WORDS) * 8
    sp.close()
    assert not Path(slot.path).exists()


class _FakeRecorder:
    """What RecordSpool.take reads of a CtaRecorder, on the CPU; `held`: the records its GPU buffer holds (what a
    drain of it lands, with capacity rows of room)."""

    def __init__(self, device=0, capacity=10, held=None):
        import torch

        from torch_l2topo.measure.recording import KernelTags

        self.device_index, self.capacity, self.in_graphs = device, capacity, False
        self.buffer = torch.zeros(4, dtype=torch.int64)
        self.held = _records(3) if held is None else held
        self.tags = KernelTags()
        for _, name in sorted(self.held.names.items()):  # the tags the held records carry
            self.tags.register(name)
        self.dirty, self.before_reset = True, None


@pytest.fixture
def launches(monkeypatch):
    """RecordSpool's drain launches, recorded instead of run (no GPU here): (slot, recorder) in launch order; each
    lands the recorder's held records in the slot, numbered as the GPU's counter would (one per launch per
    device)."""
    done, counts = [], {}

    def queue(slot, recorder, counter):
        counts[recorder.device_index] = counts.get(recorder.device_index, 0) + 1
        _land(slot, recorder.held, counts[recorder.device_index], capacity=recorder.capacity)
        done.append((slot, recorder))

    monkeypatch.setattr(RecordSpool, "_queue", staticmethod(queue))
    return done


def test_a_held_drain_launches_once_it_holds_its_cycles(tmp_path, unpinned, launches):
    """Cycles take their share of one drain without a launch until it holds cycles_per_drain of them; they read
    one slot under one number; the next cycle starts a new drain. While the drain is held, the recorder's reset
    or drain would launch it first (before_reset)."""
    sp = RecordSpool(tmp_path)
    rec = _FakeRecorder()
    shares = [sp.take(rec, (0, 1), cycles_per_drain=3) for _ in range(2)]
    assert launches == [] and sp.holds(0) and rec.before_reset is not None and rec.dirty
    shares.append(sp.take(rec, (1, 2), cycles_per_drain=3))
    assert [r for _, r in launches] == [rec] and not sp.holds(0) and rec.before_reset is None and not rec.dirty
    assert len({(s.path, s.seq) for s in shares}) == 1 and shares[0].seq == 1
    assert [s.window for s in shares] == [(0, 1), (0, 1), (1, 2)]
    after = sp.take(rec, None, cycles_per_drain=3)
    assert after.seq == 2 and after.path != shares[0].path and len(launches) == 1  # the first slot is still read
    sp.close()  # launches what is held
    assert len(launches) == 2


def test_each_cycle_reads_only_the_records_inside_its_window(tmp_path, unpinned, launches):
    """Three cycles' CTAs, and CTAs between them (a graph replayed in a wait step, the first warmup), in one drain:
    each cycle's share holds the CTAs that started and ended inside its window, and nothing else."""
    rng = np.random.default_rng(3)
    windows = [(1_000_000, 2_000_000), (3_000_000, 4_000_000), (5_000_000, 6_000_000)]
    start = np.sort(rng.integers(0, 7_000_000, 4000))
    end = start + rng.integers(1, 50_000, 4000)
    n = len(start)
    held = CtaRecords(np.zeros(n, np.int64), rng.integers(0, 132, n), np.arange(n), start, end, np.ones(n, np.int64),
                      np.full(n, -1), names={0: "k"}, device=0)
    sp = RecordSpool(tmp_path)
    rec = _FakeRecorder(capacity=n, held=held)
    shares = [sp.take(rec, w, cycles_per_drain=3) for w in windows]
    for (lo, hi), share in zip(windows, shares):
        got = share.load(timeout_s=1)
        expected = [p for p in range(n) if lo <= start[p] and end[p] <= hi]
        assert got.program.tolist() == expected and len(expected) > 100 and got.dropped == 0
    whole = sp.take(rec, None).load(timeout_s=1)
    assert len(whole) == n
    sp.close()


def test_a_full_buffer_counts_its_drops_in_the_cycles_that_reach_past_its_last_row(tmp_path, unpinned, launches):
    """Rows land in the order CTAs end and a full buffer keeps the first ones: a cycle that ended before the last row
    kept lost nothing; a later one may have lost rows and reports the drain's count."""
    import dataclasses

    kept = dataclasses.replace(_records(64, seed=2), dropped=9)
    last_end = int(kept.end_ns.max())
    sp = RecordSpool(tmp_path)
    rec = _FakeRecorder(capacity=64, held=kept)
    early, late = sp.take(rec, (0, last_end), 2), sp.take(rec, (0, last_end + 1), 2)
    assert early.load(timeout_s=1).dropped == 0 and late.load(timeout_s=1).dropped == 9
    sp.close()


def test_a_held_drain_launches_before_the_recorder_is_reset_or_its_records_are_read_here(tmp_path, unpinned,
                                                                                        launches):
    sp = RecordSpool(tmp_path)
    rec = _FakeRecorder()
    sp.take(rec, None, cycles_per_drain=5)
    rec.before_reset()  # what CtaRecorder.settle calls before a reset or drain
    assert len(launches) == 1 and not sp.holds(0)
    share = sp.take(rec, None, cycles_per_drain=5)
    assert share.load(timeout_s=1).tag.size == 3 and len(launches) == 2  # read here: launched first
    sp.close()


def test_launch_for_launches_only_the_drains_the_records_read(tmp_path, unpinned, launches):
    sp = RecordSpool(tmp_path)
    a, b = _FakeRecorder(0), _FakeRecorder(1)
    first = sp.take(a, None, cycles_per_drain=2)
    other = sp.take(b, None, cycles_per_drain=2)
    sp.launch_for({0: CtaRecords.empty(0)})  # records in memory read no drain
    assert launches == []
    sp.launch_for({0: first})
    assert [r for _, r in launches] == [a] and sp.holds(1)
    sp.launch_for({0: first})  # launched already: nothing more
    assert len(launches) == 1
    sp.release(other)
    assert sp.busy() == 2  # other's drain is still held: its slot stays busy
    sp.close()


def test_a_slot_is_free_once_its_drain_is_launched_and_every_reader_released_it(tmp_path, unpinned, launches):
    sp = RecordSpool(tmp_path)
    rec = _FakeRecorder()
    shares = [sp.take(rec, None, cycles_per_drain=2) for _ in range(2)]
    sp.release(shares[0])
    assert sp.busy() == 1
    sp.release(shares[1])
    assert sp.busy() == 0
    sp.close()


def test_handing_a_job_to_the_worker_launches_its_held_drain(tmp_path, unpinned, launches, monkeypatch):
    """A job in the worker process waits for its slot's flag: the parent launches the held drain the job reads as
    it hands the job over (else the worker would wait until the load times out)."""
    raw = load_raw(DATA)
    (device, records), = raw["records"].items()
    write_trace(raw["trace"], tmp_path / "t.json")
    sp = RecordSpool(tmp_path / "spool")
    (tmp_path / "spool").mkdir()
    monkeypatch.setattr(spool._shared, "existing", lambda: sp)
    share = sp.take(_FakeRecorder(device, capacity=len(records), held=records), None, cycles_per_drain=4)
    assert not launches
    done = []
    worker = ready_worker(processes=1)
    worker.submit(CycleJob(tmp_path / "t.json", {device: share}, raw["smmaps"], {}, ()),
                  lambda path, problem: done.append(problem))
    assert not worker._waiting and len(launches) == 1  # handed over, its drain launched as it was
    worker.close(60)
    assert done == [None]
    assert sum(ev.get("cat") == CTA_CATEGORY for ev in load_trace(tmp_path / "t.json")["traceEvents"]) == len(records)
    sp.close()


def test_a_cycle_start_leaves_alone_a_recorder_whose_records_a_held_drain_has_not_taken(monkeypatch):
    """reset_dirty (when a cycle starts) would wipe the held cycles' records: a recorder with a held drain is left
    as it is (its cycles' windows leave out what it records between them)."""
    from torch_l2topo.measure import recording

    resets = []
    held = SimpleNamespace(dirty=True, before_reset=lambda: None, reset=lambda: resets.append("held"))
    free = SimpleNamespace(dirty=True, before_reset=None, reset=lambda: resets.append("free"))
    clean = SimpleNamespace(dirty=False, before_reset=None, reset=lambda: resets.append("clean"))
    monkeypatch.setattr(recording._switch, "recorders", {0: held, 1: free, 2: clean})
    recording.reset_dirty()
    assert resets == ["free"]
