"""Post-processing a real trace recorded on an H200 (benchmarks/record_profiler_trace.py wrote tests/data/profiler/):
valid JSON with the expected tracks and events, every recorded CTA once and inside its own kernel event,
Proton's CTAs too, no raw identifiers, and HolisticTraceAnalysis's kernel breakdown unchanged. The
expectations come from what the recording ran (its manifest), not from the code under test."""
import json
from pathlib import Path

import pytest

from torch_l2topo.profiler.trace.align import TICK_NS
from torch_l2topo.profiler.trace.enrich import enrich
from torch_l2topo.profiler.trace.offline import MANIFEST, enrich_raw, load_raw
from torch_l2topo.profiler.trace.readback import calibrations, launches, recorded_ctas
from torch_l2topo.profiler.trace.summary import summarize
from torch_l2topo.profiler.trace.tracefile import L2MAP_PID, load_trace, strip, write_trace
from torch_l2topo.profiler.trace.tracks import CTA_CATEGORY

DATA = Path(__file__).resolve().parent / "data" / "profiler"
pytestmark = pytest.mark.skipif(not (DATA / MANIFEST).exists(),
                                reason="the H200 fixture is not recorded yet (benchmarks/record_profiler_trace.py)")


@pytest.fixture(scope="module")
def fixture():
    raw = load_raw(DATA)
    manifest = raw["manifest"]
    (smmap,) = raw["smmaps"].values()
    return manifest, raw["trace"], enrich_raw(DATA), smmap


def test_every_recorded_cta_lies_once_inside_its_kernel(fixture):
    manifest, _, out, smmap = fixture
    rec = manifest["recorded"]
    a = out["l2topo"]["devices"][str(manifest["device"])]["alignment"]["recorder"]
    assert a["matched"] == rec["grid"] * rec["launches"] == manifest["records"] and manifest["dropped"] == 0
    assert a["outside"] == 0 and a["max_misalignment_ns"] <= TICK_NS
    ls = [launch for launch in launches(out) if launch["kernel"] == rec["kernel"]]
    assert len(ls) == rec["launches"] and all(launch["items"] == rec["rows"] for launch in ls)
    events = out["traceEvents"]
    for launch in ls:
        ctas = [ev for ev in events if ev.get("cat") == CTA_CATEGORY and ev["args"]["launch"] == launch["launch"]]
        assert sorted(ev["args"]["program"] for ev in ctas) == list(range(rec["grid"]))
        kernel = events[launch["launch"]]
        assert kernel["cat"] == "kernel" and kernel["name"] == rec["kernel"]
        for ev in ctas:
            sm = ev["args"]["sm"]
            assert 0 <= sm < smmap.n_sm and ev["pid"] == L2MAP_PID + manifest["device"]
            assert kernel["ts"] - TICK_NS / 1000 <= ev["ts"] <= ev["ts"] + ev["dur"] <= \
                kernel["ts"] + kernel["dur"] + TICK_NS / 1000
            # row r is homed in partition r % 2 and program p sums rows p, p + grid, ... (grid even): all near
            # the SM's partition, or none
            near = ev["args"]["items"] if ev["args"]["program"] % 2 == smmap.partition[sm] else 0
            assert ev["args"]["near"] == near
        assert launch["blind_near_share"] == pytest.approx(
            ((smmap.partition == 0).mean() + (smmap.partition == 1).mean()) / 2, abs=1e-3)


def test_proton_ctas_lie_inside_their_kernels(fixture):
    manifest, _, out, _ = fixture
    if manifest["proton"]["note"]:
        pytest.skip(f"the recording has no Proton trace: {manifest['proton']['note']}")
    a = out["l2topo"]["devices"][str(manifest["device"])]["alignment"]["proton"]
    assert a["matched"] == manifest["proton"]["ctas"] * manifest["proton"]["launches"]
    assert a["max_misalignment_ns"] <= TICK_NS + a["quantum_ns"]


def test_no_raw_identifiers_and_a_summary(fixture):
    manifest, _, out, _ = fixture
    text = json.dumps(out)
    assert "GPU-" not in text and "MIG-" not in text
    assert summarize(out)["kernels"][0]["ctas"] == manifest["recorded"]["grid"] * manifest["recorded"]["launches"]


def test_hta_breakdown_is_unchanged(fixture, tmp_path):
    hta = pytest.importorskip("hta.trace_analysis", reason="holistictraceanalysis is not installed")
    _, trace, out, _ = fixture
    write_trace(trace, tmp_path / "plain" / "rank0.json")
    write_trace(out, tmp_path / "rich" / "rank0.json")
    plain = hta.TraceAnalysis(trace_dir=str(tmp_path / "plain")).get_gpu_kernel_breakdown(visualize=False)
    rich = hta.TraceAnalysis(trace_dir=str(tmp_path / "rich")).get_gpu_kernel_breakdown(visualize=False)
    _same_breakdown(plain, rich)


def _same_breakdown(plain, rich):
    for a, b in zip(plain, rich):
        assert a.sort_values(list(a.columns)).reset_index(drop=True).equals(
            b.sort_values(list(b.columns)).reset_index(drop=True))


BIG_TRACE = Path(__file__).resolve().parent / "data" / "profiler" / \
    "profiler_h200_75a660730c29_trace.json.gz"


@pytest.mark.skipif(not BIG_TRACE.exists(), reason="the benchmark's trace is not committed")
def test_hta_reads_a_large_enriched_h200_trace(tmp_path):
    """The last trace of bench_profiler on an H200 (65,536 CTAs of the example's gather), stripped and enriched
    again by this code from its own records and calibration: HTA's kernel breakdown equals the stripped trace's.
    HTA 0.5 narrows its correlation columns to the ids' range and then stores event indices there; with pandas
    >= 3 that failed on this trace as the device enriched it (tracks.launch_event says what fixed it)."""
    hta = pytest.importorskip("hta.trace_analysis", reason="holistictraceanalysis is not installed")
    recorded = load_trace(BIG_TRACE)
    plain = strip(recorded)
    rich = enrich(plain, maps=calibrations(recorded), records=recorded_ctas(recorded))
    assert sum(ev.get("cat") == CTA_CATEGORY for ev in rich["traceEvents"]) == 65_536
    assert len(rich["traceEvents"]) > 2 ** 15  # past what an int16 index holds
    write_trace(plain, tmp_path / "plain" / "rank0.json")
    write_trace(rich, tmp_path / "rich" / "rank0.json")
    _same_breakdown(hta.TraceAnalysis(trace_dir=str(tmp_path / "plain")).get_gpu_kernel_breakdown(visualize=False),
                    hta.TraceAnalysis(trace_dir=str(tmp_path / "rich")).get_gpu_kernel_breakdown(visualize=False))
