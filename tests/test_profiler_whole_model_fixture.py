"""Whole-model profiling on a real trace: one cycle of examples/profile_compiled.py (a torch.compile'd transformer
block, kernels="triton") recorded on H100 4fcaf63f2162 at commit cca05e1 (2026-12-07; tests/data/README.md).
Stripped and enriched again by this code from its own CTA records, the trace must hold every CTA of every
Triton launch once, inside its kernel, and per-cycle coverage equal to what the kernel events themselves say:
the oracles below read only Kineto's kernel events (name, grid, interval), never the code under test."""
import math
from pathlib import Path

import pytest

from torch_l2topo.profiler.trace.enrich import enrich
from torch_l2topo.profiler.trace.readback import calibrations, recorded_ctas
from torch_l2topo.profiler.trace.tracefile import load_trace, strip
from torch_l2topo.profiler.trace.tracks import CTA_CATEGORY

TRACE = Path(__file__).resolve().parent / "data" / "profiler" / "whole_model_h100_4fcaf63f2162_trace.json.gz"


@pytest.fixture(scope="module")
def traces():
    recorded = load_trace(TRACE)
    plain = strip(recorded)
    kernels = recorded["l2topo"]["triton_kernels"]
    rich = enrich(plain, maps=calibrations(recorded), records=recorded_ctas(recorded), triton_kernels=kernels)
    return plain, rich


def _kernels(trace):
    return [ev for ev in trace["traceEvents"] if ev.get("cat") == "kernel"]


def test_every_cta_of_every_triton_launch_is_on_the_tracks_once_and_inside(traces):
    plain, rich = traces
    ctas = [ev for ev in rich["traceEvents"] if ev.get("cat") == CTA_CATEGORY]
    triton = [k for k in _kernels(plain) if k["name"].startswith("triton_")]
    assert len(triton) == 4 and len(ctas) == sum(math.prod(k["args"]["grid"]) for k in triton) == 45_056
    for k in triton:
        mine = [c for c in ctas if c["name"] == k["name"]]
        assert sorted(c["args"]["program"] for c in mine) == list(range(math.prod(k["args"]["grid"])))
        assert all(k["ts"] <= c["ts"] and c["ts"] + c["dur"] <= k["ts"] + k["dur"] for c in mine)


def test_coverage_is_what_the_kernel_events_say(traces):
    plain, rich = traces
    kernels = _kernels(plain)
    total = sum(k["dur"] for k in kernels)
    triton = [k for k in kernels if k["name"].startswith("triton_")]
    (device,) = rich["l2topo"]["devices"].values()
    assert device["triton_launch_coverage"] == 1.0 and device["kernel_launches"] == len(kernels) == 9
    assert device["instrumented_gpu_time_ratio"] == pytest.approx(sum(k["dur"] for k in triton) / total, abs=1e-3)
    uncovered = {u["name"]: u for u in device["uncovered_kernels"]}
    others = {k["name"] for k in kernels if not k["name"].startswith("triton_")}
    assert set(uncovered) == others and all(u["kind"] == "other" for u in uncovered.values())
    for name, u in uncovered.items():
        assert u["launches"] == sum(k["name"] == name for k in kernels)
        assert u["share"] == pytest.approx(sum(k["dur"] for k in kernels if k["name"] == name) / total, abs=1e-3)


def test_a_cycle_without_the_twins_covers_no_triton_launch(traces):
    """The negative case: the same kernel events with the Triton kernels known but no CTA records."""
    plain, _ = traces
    kernels = {"instrumented": [], "plain": {name: "its PTX was not found" for name in
                                             {k["name"] for k in _kernels(plain) if k["name"].startswith("triton_")}}}
    rich = enrich(plain, maps={}, records={}, triton_kernels=kernels)
    assert not any(ev.get("cat") == CTA_CATEGORY for ev in rich["traceEvents"])
    (device,) = rich["l2topo"]["devices"].values()
    assert device["triton_launch_coverage"] == 0.0 and device["instrumented_gpu_time_ratio"] == 0.0
    triton_uncovered = {u["name"] for u in device["uncovered_kernels"] if u["kind"] == "triton"}
    assert triton_uncovered == set(kernels["plain"]) and len(triton_uncovered) == 4
