"""Coverage of a cycle's GPU time by the per-SM view, against answers computed by hand or straight from the
trace's kernel events: the instrumented share of kernel time, the Triton launches covered, the uncovered
kernels and their kind; the keyword threaded through enrichment, the cycle's job and the offline inputs;
damaged coverage refused by the readers."""
import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from synthetic_traces import add_kernels

from torch_l2topo.errors import TraceFormatError
from torch_l2topo.profiler.runtime.cycle import CycleJob, run
from torch_l2topo.profiler.trace.coverage import coverage
from torch_l2topo.profiler.trace.enrich import enrich
from torch_l2topo.profiler.trace.kineto import Kernels
from torch_l2topo.profiler.trace.offline import MANIFEST, enrich_raw, load_raw
from torch_l2topo.profiler.trace.summary import summarize
from torch_l2topo.profiler.trace.tracefile import load_trace, write_trace

RAW = Path(__file__).parent / "data" / "profiler"
CUBLAS = "void cutlass::Kernel2<cutlass_80_tensorop_gemm>(Params)"
TRITON = {"instrumented": ["triton_red_fused_0", "triton_poi_fused_1"], "plain": ["triton_per_fused_2"]}


def _kernels(rows) -> Kernels:
    """Kernels of (name, dur_ns) rows, back to back from t = 0."""
    names = np.array([n for n, _ in rows], dtype=object)
    dur = np.array([d for _, d in rows], np.int64)
    start = np.r_[0, np.cumsum(dur)[:-1]]
    return Kernels(0, names, start, start + dur, np.zeros(len(rows), np.int64), np.arange(len(rows)))


# launches 0-2 of the instrumented red kernel (2 got CTAs), the instrumented poi kernel (got none), the plain
# per kernel twice, a cuBLAS gemm and torch's own elementwise kernel
ROWS = [("triton_red_fused_0", 100), ("triton_red_fused_0", 100), ("triton_red_fused_0", 120),
        ("triton_poi_fused_1", 30), ("triton_per_fused_2", 40), ("triton_per_fused_2", 40), (CUBLAS, 500),
        ("void at::native::elementwise_kernel<128, 4>(int)", 70)]
TOTAL = 1000
BARE = {"schemaVersion": 1, "traceEvents": []}  # a Kineto trace with nothing but the kernels added


def test_coverage_by_hand():
    c = coverage(_kernels(ROWS), [0, 1], TRITON)
    assert c["kernel_gpu_ns"] == TOTAL and c["kernel_launches"] == 8
    assert c["instrumented_gpu_time_ratio"] == pytest.approx(200 / TOTAL)
    assert c["triton_launch_coverage"] == pytest.approx(2 / 6, abs=1e-4)  # 6 Triton launches, 2 with CTAs
    expected = [(CUBLAS, 1, 500, "other"), ("triton_red_fused_0", 1, 120, "triton"),
                ("triton_per_fused_2", 2, 80, "triton"), ("void at::native::elementwise_kernel<128, 4>(int)", 1, 70,
                                                           "other"), ("triton_poi_fused_1", 1, 30, "triton")]
    assert [(r["name"], r["launches"], r["gpu_ns"], r["kind"]) for r in c["uncovered_kernels"]] == expected
    assert [r["share"] for r in c["uncovered_kernels"]] == [0.5, 0.12, 0.08, 0.07, 0.03]


def test_coverage_without_the_triton_names_or_triton_launches():
    c = coverage(_kernels(ROWS), [0, 1], None)
    assert c["triton_launch_coverage"] is None and c["instrumented_gpu_time_ratio"] == pytest.approx(0.2)
    assert {r["kind"] for r in c["uncovered_kernels"]} == {"unknown"}
    c = coverage(_kernels([(CUBLAS, 10)]), [], TRITON)  # no Triton launch in the cycle
    assert c["triton_launch_coverage"] is None and c["instrumented_gpu_time_ratio"] == 0.0
    assert c["uncovered_kernels"][0]["kind"] == "other"
    full = coverage(_kernels(ROWS[:3]), [0, 1, 2], TRITON)
    assert full["instrumented_gpu_time_ratio"] == 1.0 and full["triton_launch_coverage"] == 1.0
    assert full["uncovered_kernels"] == []
    none = coverage(_kernels([]), [], TRITON)
    assert none["instrumented_gpu_time_ratio"] is None and none["uncovered_kernels"] == []


@pytest.mark.parametrize("bad, error", [(["triton_red_fused_0"], ValueError), ({"compiled": []}, ValueError),
                                        ({"plain": [3]}, TypeError)])
def test_a_bad_triton_kernels_argument_is_refused(bad, error):
    with pytest.raises(error, match="triton_kernels"):
        coverage(_kernels(ROWS), [], bad)
    with pytest.raises(error, match="triton_kernels"):
        enrich(add_kernels(BARE, 0, [("k", 1000, 100)]), triton_kernels=bad)


def _kernel_ns_by_name(trace) -> dict:
    """Oracle: GPU ns per kernel name, straight from the trace's kernel events (us with 3 decimals)."""
    out: dict = {}
    for ev in trace["traceEvents"]:
        if ev.get("cat") == "kernel":
            out[ev["name"]] = out.get(ev["name"], 0) + round(ev["dur"] * 1000)
    return out


def test_the_recorded_h200_cycle(tmp_path):
    """tests/data/profiler: row_sum_kernel recorded its CTAs, scoped_copy_kernel (Triton) ran plain, and a
    cuBLAS gemm: the instrumented share is row_sum's time over all, and half the Triton launches are covered."""
    raw = tmp_path / "raw"
    shutil.copytree(RAW, raw)
    names = {"instrumented": ["row_sum_kernel"], "plain": ["scoped_copy_kernel"]}
    manifest = json.loads((raw / MANIFEST).read_text())
    (raw / MANIFEST).write_text(json.dumps({**manifest, "triton_kernels": names}))
    ns = _kernel_ns_by_name(load_raw(raw)["trace"])
    gemm = next(n for n in ns if "gemm" in n)
    m = enrich_raw(raw)["l2topo"]["devices"]["0"]
    assert m["kernel_gpu_ns"] == sum(ns.values())
    assert m["instrumented_gpu_time_ratio"] == pytest.approx(ns["row_sum_kernel"] / sum(ns.values()), abs=1e-4)
    assert m["triton_launch_coverage"] == 0.5  # 3 row_sum launches of 6 Triton launches
    assert [(r["name"], r["kind"], r["launches"], r["gpu_ns"]) for r in m["uncovered_kernels"]] == \
        [(gemm, "other", 3, ns[gemm]), ("scoped_copy_kernel", "triton", 3, ns["scoped_copy_kernel"])]
    plain = enrich_raw(RAW)["l2topo"]["devices"]["0"]  # the manifest as recorded: no Triton names
    assert plain["triton_launch_coverage"] is None and plain["instrumented_gpu_time_ratio"] == \
        m["instrumented_gpu_time_ratio"]


def test_with_the_triton_names_every_gpu_with_kernels_gets_its_coverage(tmp_path):
    trace = add_kernels(add_kernels(BARE, 0, [("triton_per_fused_2", 1000, 400)]), 1,
                        [(CUBLAS, 1000, 300)])
    assert enrich(trace)["l2topo"]["devices"] == {}  # no map, no records: nothing shown, as before
    devices = enrich(trace, triton_kernels=TRITON)["l2topo"]["devices"]
    assert devices["0"]["instrumented_gpu_time_ratio"] == 0.0 and devices["0"]["triton_launch_coverage"] == 0.0
    assert devices["1"]["uncovered_kernels"] == [{"name": CUBLAS, "launches": 1, "gpu_ns": 300, "share": 1.0,
                                                  "kind": "other"}]
    path = write_trace(trace, tmp_path / "t.json")  # the cycle's job hands the names on
    assert run(CycleJob(path, given=(0,), triton_kernels=TRITON)) is None
    assert load_trace(path)["l2topo"]["devices"]["0"]["triton_launch_coverage"] == 0.0
    assert run(CycleJob(write_trace(trace, tmp_path / "u.json"), given=(0,))) is None  # absent: as before
    assert load_trace(tmp_path / "u.json")["l2topo"]["devices"] == {}


@pytest.mark.parametrize("damage", [{"uncovered_kernels": "all"}, {"instrumented_gpu_time_ratio": "most"},
                                    {"uncovered_kernels": [{"name": "k", "launches": -1, "gpu_ns": 1,
                                                            "share": 0.1, "kind": "other"}]}])
def test_damaged_coverage_is_refused(damage):
    trace = enrich(add_kernels(BARE, 0, [(CUBLAS, 1000, 300)]), triton_kernels=TRITON)
    summarize(trace)
    trace["l2topo"]["devices"]["0"].update(damage)
    with pytest.raises(TraceFormatError, match="coverage"):
        summarize(json.loads(gzip.decompress(gzip.compress(json.dumps(trace).encode()))), "damaged.json")


# ---- trace-summary: the coverage line, the per-kernel wave table, the ranking ------------------------------------
def _launch(kernel, **figures):
    return {"device": 0, "kernel": kernel, "ctas": 264, "sms_used": 132, "n_sm": 132, "kernel_ns": 1000,
            "tail_ns": 100, **figures}


def test_kernels_rank_by_the_larger_saving_per_step():
    from torch_l2topo.profiler.trace.summary import kernel_rows, ranking

    launches = [_launch("a", placement_saving_ns_estimate=100, regrid_saving_ns_estimate=50),
                _launch("a", placement_saving_ns_estimate=300, regrid_saving_ns_estimate=50),
                _launch("b", regrid_saving_ns_estimate=500), _launch("c")]
    ranked = ranking(kernel_rows(launches), steps=2)
    assert [(r["kernel"], r["placement_ns_per_step_estimate"], r["regrid_ns_per_step_estimate"]) for r in ranked] == \
        [("b", None, 250), ("a", 200, 50)]  # c has no estimate: not ranked
    assert ranking(kernel_rows(launches), steps=0)[0]["regrid_ns_per_step_estimate"] == 500  # no steps: the trace


def test_the_summary_of_the_recorded_cycle_fits_100_columns_and_says_what_is_covered(tmp_path):
    from torch_l2topo.profiler.trace.summary import format_summary

    r = load_raw(RAW)
    ns = _kernel_ns_by_name(r["trace"])
    trace = enrich(r["trace"], maps=r["smmaps"], records=r["records"],
                   triton_kernels={"instrumented": ["row_sum_kernel"], "plain": ["scoped_copy_kernel"]})
    summary = summarize(trace)
    text = format_summary(summary)
    assert max(len(line) for line in text.splitlines()) <= 100
    share = round(100 * ns["row_sum_kernel"] / sum(ns.values()))
    assert f"per-SM view covers {share}% of GPU time" in text and "Triton launches covered 50%" in text
    uncovered = [line.split() for line in text.splitlines() if line.startswith("    ")]
    assert [(u[1], u[-1]) for u in uncovered] == [("other", "sm80_xmma_gemm_f32f32_f32f32_f3…"),
                                                 ("triton", "scoped_copy_kernel")]
    (row,) = summary["kernels"]
    assert row["gpu_ns"] == ns["row_sum_kernel"] and row["ctas_per_launch"] == 264
    assert "estimates, not measurements" in text and summary["ranking"][0]["kernel"] == "row_sum_kernel"


def test_long_kernel_names_still_fit_100_columns():
    from torch_l2topo.profiler.trace.summary import NAME_WIDTH, format_summary, kernel_rows, ranking

    name = "triton_per_fused__native_layer_norm_add_mul_view_transpose_clone_" * 2
    rows = kernel_rows([_launch(name, busy_ns_median=123_456, busy_ns_max=1_234_567, tail_ns=99_999,
                                imbalance=1.2345, waves=12, last_wave_fill=0.0303, last_wave_cost_ns=45_678,
                                placement_saving_ns_estimate=12_345, regrid_saving_ns_estimate=23_456)])
    cov = {"kernel_gpu_ns": 10**9, "kernel_launches": 12345, "instrumented_gpu_time_ratio": 0.5,
           "triton_launch_coverage": 0.97,
           "uncovered_kernels": [{"name": name, "launches": 99999, "gpu_ns": 1, "share": 0.5, "kind": "triton"}] * 7}
    summary = {"devices": {"0": {"device": "NVIDIA H200", "sms": 0, "alignment": {}, "dropped": {},
                                 "coverage": cov}},
               "steps": 3, "kernels": rows, "ranking": ranking(rows, 3), "notes": []}
    text = format_summary(summary)
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "(top 5 of 7)" in text and text.count(name[:NAME_WIDTH - 1] + "…") == 3 + 5


def test_the_profiler_page_shows_what_trace_summary_prints_on_the_recorded_cycle():
    from torch_l2topo.profiler.trace.summary import format_summary

    page = (Path(__file__).parents[1] / "docs" / "profiler.md").read_text()
    start = page.index("```text\nGPU 0:") + len("```text\n")
    r = load_raw(RAW)
    trace = enrich(r["trace"], maps=r["smmaps"], records=r["records"],
                   triton_kernels={"instrumented": ["row_sum_kernel"], "plain": ["scoped_copy_kernel"]})
    assert page[start:page.index("```", start)].rstrip("\n") == format_summary(summarize(trace))
