"""The torch.profiler hook on the CPU: torch_l2topo.profile and trace_handler write one enriched trace per cycle
(named by cycle), a failed enrichment still leaves the profiler's own trace, Proton merges into a written
trace without losing its CTAs, and trace-summary and the timeline figure read an enriched trace back."""
import copy
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from profiler_workers import ACTIVITIES
from profiler_workers import steps as _steps
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
from torch_l2topo.profiler import session
from torch_l2topo.profiler.runtime import cycle
from torch_l2topo.profiler.trace import smmap
from torch_l2topo.profiler.trace.enrich import enrich
from torch_l2topo.profiler.trace.readback import calibrations, launches, recorded_ctas
from torch_l2topo.profiler.trace.smmap import SmMap
from torch_l2topo.profiler.trace.summary import summarize
from torch_l2topo.profiler.trace.timeline import pick_launch, render_timeline, timeline_rows
from torch_l2topo.profiler.trace.tracefile import load_trace, write_trace


def test_profile_writes_one_enriched_trace_per_cycle(tmp_path):
    assert torch_l2topo.profile is session.profile  # the lazy top-level name
    sched = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=2)
    topo = torch_l2topo.load_example()
    with torch_l2topo.profile(tmp_path, schedule=sched, activities=ACTIVITIES, topology={0: topo}) as prof:
        _steps(prof, 8)
    assert len(prof.written) == 2 and [p.name.split(".")[2] for p in prof.written] == ["0", "1"]
    for path in prof.written:
        trace = load_trace(path)
        assert any(ev.get("name", "").startswith("ProfilerStep#") for ev in trace["traceEvents"])
        assert calibrations(trace)[0].n_sm == topo.n_sm
        assert trace["l2topo"]["devices"]["0"]["calibration"]["ids"]["uuid_hash"] == topo.meta["uuid_hash"]


def test_a_later_block_never_writes_over_an_earlier_ones_traces(tmp_path):
    """Each handler names its traces with its own stamp (as torch's handler names them by time): two blocks in one
    process into one directory leave every trace of both."""
    sched = torch.profiler.schedule(wait=0, warmup=0, active=1, repeat=2)
    written = []
    for _ in range(2):
        with torch_l2topo.profile(tmp_path, schedule=sched, activities=ACTIVITIES, topology=None,
                                  background=False) as prof:
            _steps(prof, 2)
        written += prof.written
    assert len(set(written)) == 4 and all(load_trace(p)["traceEvents"] for p in written)
    assert sorted(tmp_path.glob("*.json")) == sorted(written)


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
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]  # nothing else left behind


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
    assert "row_sum_kernel" in text and "NVIDIA H200" in text
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
    from torch_l2topo.profiler.trace.offline import enrich_raw, save_raw
    from torch_l2topo.profiler.trace.proton_trace import load_proton, proton_records

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


def test_each_calibration_is_analysed_once_per_process(tmp_path, monkeypatch):
    """A profiler block after the first reuses the map of the same calibration (its analysis costs milliseconds
    and leaves BLAS threads spinning next to the training loop); a changed calibration gets its own."""
    made = []
    original = SmMap.from_topology
    monkeypatch.setattr(SmMap, "from_topology",
                        classmethod(lambda cls, topo, include_ids=False: made.append(topo) or original(topo,
                                                                                                        include_ids)))
    monkeypatch.setattr(smmap, "_MADE", {})
    topo = torch_l2topo.load_example()
    first = session.TraceHandler(tmp_path, topology={0: topo}).smmap(0)
    assert session.TraceHandler(tmp_path, topology={0: copy.deepcopy(topo)}).smmap(0) is first
    assert len(made) == 1
    assert session.TraceHandler(tmp_path, topology={0: topo}, include_ids=True).smmap(0) is not first
    changed = copy.deepcopy(topo)
    changed.chain_cycles[0] += 1.0
    other = session.TraceHandler(tmp_path, topology={0: changed}).smmap(0)
    assert other is not first and other.chain_cycles[0] == first.chain_cycles[0] + 1.0 and len(made) == 3
    path = topo.save(tmp_path / "cal.npz")
    assert smmap.map_of_file(path) is smmap.map_of_file(path)
    reads = len(made)
    changed.save(path)  # rewritten: read again
    assert smmap.map_of_file(path).chain_cycles[0] == changed.chain_cycles[0] and len(made) == reads + 1


@pytest.mark.parametrize("starts", [True, False], ids=["proton-ran", "proton-failed"])
def test_a_proton_block_leaves_no_directory_behind(tmp_path, monkeypatch, starts):
    """profile(proton=True) keeps Proton's trace in a temporary directory of its own: gone when the block ends,
    whether Proton ran (its trace merged) or could not start (warned, the block runs without it)."""
    import tempfile

    import triton.profiler as proton

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    merged = []

    def start(name, **kwargs):
        if not starts:
            raise RuntimeError("no GPU for Proton")
        Path(name + ".chrome_trace").write_text("{}")

    monkeypatch.setattr(proton, "start", start)
    monkeypatch.setattr(proton, "finalize", lambda: None)
    monkeypatch.setattr(session.TraceHandler, "merge_proton", lambda self, path: merged.append(Path(path).name))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch_l2topo.profile(tmp_path / "t.json", activities=ACTIVITIES, topology=None, proton=True,
                                  background=False) as prof:
            _steps(prof, 1)
    assert merged == (["proton.chrome_trace"] if starts else [])
    assert any("could not start Proton" in str(w.message) for w in caught) == (not starts)
    assert not list((tmp_path / "tmp").glob("l2topo-proton-*"))
