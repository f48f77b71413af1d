"""The recorder's host side without a GPU: a buffer laid out by layout.py's REC_* words parses into the right
columns with its dropped count, per-SM statistics equal a plain loop's, records survive a save, and recording
follows torch.profiler's collecting steps exactly."""
import numpy as np
import pytest
import torch

import torch_l2topo
from torch_l2topo import layout
from torch_l2topo.measure import recording
from torch_l2topo.measure.recording import CtaRecords, per_sm_statistics


def _buffer(records, capacity):
    """A recorder buffer as the device leaves it, written word by word from layout.py (the oracle)."""
    words = np.zeros(layout.recorder_words(capacity), np.int64)
    words[layout.REC_CAPACITY] = capacity
    words[layout.REC_CURSOR] = len(records)
    for slot, (tag, sm, prog, t0, t1, items, near) in enumerate(records[:capacity]):
        base = layout.REC_HEADER + slot * layout.REC_WORDS
        for word, value in ((layout.REC_TAG, tag), (layout.REC_SM, sm), (layout.REC_PROGRAM, prog),
                            (layout.REC_START_NS, t0), (layout.REC_END_NS, t1), (layout.REC_ITEMS, items),
                            (layout.REC_NEAR, near)):
            words[base + word] = value
    return words


RECORDS = [(0, 3, 0, 100, 500, 4, 1), (1, 7, 1, 120, 900, 2, -1), (0, 3, 2, 600, 700, 1, 0),
           (0, 1, 3, 100, 300, 5, 5), (1, 0, 4, 50, 60, 1, -1)]


def test_a_device_buffer_parses_into_columns():
    words = _buffer(RECORDS, capacity=8)
    n = len(RECORDS)
    recs = CtaRecords.from_words(words[:layout.REC_HEADER], words[layout.REC_HEADER:layout.REC_HEADER +
                                 n * layout.REC_WORDS], {0: "a", 1: "b"}, device=2)
    assert len(recs) == n and recs.dropped == 0 and recs.device == 2
    assert recs.sm.tolist() == [r[1] for r in RECORDS]
    assert recs.end_ns.tolist() == [r[4] for r in RECORDS]
    assert recs.near.tolist() == [r[6] for r in RECORDS]
    assert recs.kernel_names() == ["a", "b"]
    assert recs.of_kernel("b").program.tolist() == [1, 4]


def test_a_full_buffer_counts_what_it_dropped():
    capacity = 3
    words = _buffer(RECORDS, capacity)
    recs = CtaRecords.from_words(words[:layout.REC_HEADER],
                                 words[layout.REC_HEADER:layout.REC_HEADER + capacity * layout.REC_WORDS],
                                 {0: "a", 1: "b"})
    assert len(recs) == capacity and recs.dropped == len(RECORDS) - capacity
    with pytest.raises(ValueError):  # fewer rows than the cursor says were kept
        CtaRecords.from_words(words[:layout.REC_HEADER], words[layout.REC_HEADER:layout.REC_HEADER + 7], {0: "a"})


def test_an_unregistered_tag_keeps_its_records_under_a_name_that_says_so():
    recs = CtaRecords(*np.array(RECORDS).T, names={0: "a"})
    assert recs.names[1] == "unregistered tag 1" and len(recs.of_kernel("unregistered tag 1")) == 2


def test_per_sm_statistics_equal_a_loop():
    recs = CtaRecords(*np.array(RECORDS).T, names={0: "a", 1: "b"})
    n_sm = 8
    stats = per_sm_statistics(recs, n_sm)
    items, busy, ctas = np.zeros(n_sm, int), np.zeros(n_sm, int), np.zeros(n_sm, int)
    for _, sm, _, t0, t1, n, _ in RECORDS:
        items[sm] += n
        busy[sm] += t1 - t0
        ctas[sm] += 1
    assert stats["items"].tolist() == items.tolist() and stats["busy_ns"].tolist() == busy.tolist()
    assert stats["ctas"].tolist() == ctas.tolist()
    only_a = per_sm_statistics(recs, n_sm, kernel="a")
    assert only_a["ctas"].sum() == 3 and only_a["items"][3] == 5
    assert per_sm_statistics(recs, 2)["ctas"].tolist() == [1, 1]  # SMs beyond n_sm are left out


def test_records_survive_a_save(tmp_path):
    recs = CtaRecords(*np.array(RECORDS).T, names={0: "a", 1: "b"}, class_counts={0: [3, 4, 5]}, dropped=9,
                      device=1)
    np.savez(tmp_path / "r.npz", **recs.to_arrays())
    with np.load(tmp_path / "r.npz") as z:
        back = CtaRecords.from_arrays(z)
    assert back.names == recs.names and back.class_counts == recs.class_counts and back.dropped == 9
    assert back.device == 1 and (back.start_ns == recs.start_ns).all()
    both = CtaRecords.concat([recs, back])
    assert len(both) == 2 * len(recs) and both.dropped == 18


def test_columns_must_agree():
    with pytest.raises(ValueError):
        CtaRecords(np.zeros(2), np.zeros(3), *(np.zeros(2) for _ in range(5)))


def test_recording_follows_the_profilers_collecting_steps(monkeypatch):
    """Off in wait and warmup steps, on in active ones, off again between cycles (what a trace handler asks
    for), and on throughout a recording() block."""
    monkeypatch.setattr(recording._switch, "follow", False)
    monkeypatch.setattr(recording._switch, "depth", 0)
    assert not recording.recording_on()
    recording.follow_profiler()
    seen = []
    sched = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=2)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=sched,
                                on_trace_ready=lambda p: seen.append("ready")) as prof:
        for _ in range(8):
            seen.append(recording.recording_on())
            torch.ones(2).sum()
            prof.step()
    assert seen == [False, False, True, True, "ready", False, False, True, True, "ready"]
    monkeypatch.setattr(recording._switch, "follow", False)
    assert not recording.recording_on()
    with recording.recording(devices=[]):
        assert recording.recording_on()
        with recording.recording(devices=[]):
            pass
        assert recording.recording_on()  # nested blocks count
    assert not recording.recording_on()


def test_register_checks_classes_and_keeps_tags_stable():
    tags = recording.KernelTags()
    assert tags.register("a") == 0 and tags.register("b", np.array([0, 1, 1, 2])) == 1 and tags.register("a") == 0
    assert tags.names == {0: "a", 1: "b"} and tags.class_counts[1] == [1, 2, 1]
    with pytest.raises(ValueError):
        tags.register("c", np.array([0, 3]))
    with pytest.raises(ValueError):
        tags.register("")


def test_a_snapshot_is_copied_once_per_change():
    """What each profiling cycle's job carries: the same copies while nothing registers, new ones after a new name
    or new class counts, never the live dicts."""
    tags = recording.KernelTags()
    tags.register("a")
    first = tags.snapshot()
    assert first == ({0: "a"}, {}) and tags.snapshot()[0] is first[0]
    tags.register("a")  # nothing new
    assert tags.snapshot()[0] is first[0]
    tags.register("a", np.array([0, 0, 1]))
    names, classes = tags.snapshot()
    assert classes == {0: [2, 1, 0]} and first[1] == {} and classes is not tags.class_counts
    tags.register("a", np.array([0, 0, 1]))  # the same counts again
    assert tags.snapshot()[1] is classes
    tags.register("b")
    assert tags.snapshot()[0] == {0: "a", 1: "b"} and names == {0: "a"}


def test_profile_turns_recording_on_for_its_active_steps_only(monkeypatch, tmp_path):
    """torch_l2topo.profile switches recording with one flag (set_profiling) from its first cycle's warmup (the
    kernels compile their recording variant there) and its later cycles' active steps; never in wait steps, and off
    after the block."""
    monkeypatch.setattr(recording._switch, "follow", False)
    monkeypatch.setattr(recording._switch, "depth", 0)
    monkeypatch.setattr(recording._switch, "profiling", False)
    seen = []
    sched = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=2)
    with torch_l2topo.profile(tmp_path, schedule=sched, activities=[torch.profiler.ProfilerActivity.CPU],
                              topology=None, background=False, devices=[0]) as prof:
        prof._devices = [0]  # no GPU here: a device to record on, as start() finds one where CUDA is
        for _ in range(8):
            seen.append(recording.recording_on())
            prof.step()
    assert seen == [False, True, True, True, False, False, True, True]
    assert not recording.recording_on()
