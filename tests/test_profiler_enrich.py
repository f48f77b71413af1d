"""Enriching a real torch.profiler trace (recorded here on the CPU) with synthetic GPU kernels and CTA records
of known times: the result is a valid Kineto trace with the L2 map, every CTA inside its own kernel, the
profiler's events untouched, no raw identifiers unless asked; bad input is refused with a clear error and
left as it was; Proton's CTAs merge on the same tracks; HolisticTraceAnalysis sees the same kernels."""
import gzip
import json
import re

import numpy as np
import pytest
from synthetic_traces import (
    KINETO_MINUS_GLOBALTIMER,
    add_kernels,
    cpu_trace,
    ctas_inside,
    kineto_start_ns,
    proton_trace,
)

import torch_l2topo
from torch_l2topo.errors import TraceFormatError
from torch_l2topo.profiler.trace.enrich import enrich, enrich_file, enrichment
from torch_l2topo.profiler.trace.proton_trace import proton_records
from torch_l2topo.profiler.trace.smmap import SmMap
from torch_l2topo.profiler.trace.tracefile import L2MAP_PID, load_trace, write_trace
from torch_l2topo.profiler.trace.tracks import CTA_CATEGORY, LANE_STRIDE, LAUNCH_CATEGORY

N_SM = 132
LAUNCH_NS, PERIOD_NS, LEAD_NS, CTA_NS = 50_000, 80_000, 2_000, 40_000


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """(CPU trace with 4 launches of row_sum_kernel and 4 of other_kernel on GPU 0, their Kineto start)."""
    trace = cpu_trace(tmp_path_factory.mktemp("cpu"))
    k0 = kineto_start_ns(trace)
    launches = [("row_sum_kernel", k0 + i * PERIOD_NS, LAUNCH_NS) for i in range(4)]
    launches += [("other_kernel", k0 + 55_000 + i * PERIOD_NS, 20_000) for i in range(4)]
    return add_kernels(trace, 0, launches), k0


@pytest.fixture(scope="module")
def topo():
    return torch_l2topo.load_example()


def _records(k0, n_launches=4, cta_ns=None):
    cta_ns = np.full(N_SM, CTA_NS) if cta_ns is None else cta_ns
    starts = [k0 + i * PERIOD_NS + LEAD_NS - KINETO_MINUS_GLOBALTIMER for i in range(n_launches)]
    return ctas_inside(starts, N_SM, np.arange(N_SM), cta_ns, 10, items=np.full(N_SM, 3), near=np.arange(N_SM) % 4)


def _ours(trace, cat):
    return [ev for ev in trace["traceEvents"] if ev.get("cat") == cat]


def test_the_enriched_trace_carries_the_map_the_ctas_and_the_launch_figures(base, topo, tmp_path):
    trace, k0 = base
    out = enrich(trace, maps={0: SmMap.from_topology(topo)}, records={0: _records(k0)})
    path = write_trace(out, tmp_path / "t.json.gz")
    back = load_trace(path)  # valid (gzipped) JSON that is still a Kineto trace
    assert back["traceEvents"][:len(trace["traceEvents"])] == trace["traceEvents"]  # the profiler's, untouched
    meta = back["l2topo"]["devices"]["0"]
    labels = torch_l2topo.sm_labels(topo)
    assert meta["calibration"]["partition"] == labels.partition.tolist()
    assert meta["calibration"]["chain_cycles"] == topo.chain_cycles.tolist()
    assert meta["calibration"]["measured"] == topo.meta["date"]
    a = meta["alignment"]["recorder"]
    assert a["matched"] == 4 * N_SM and a["max_misalignment_ns"] == 0 and a["outside"] == 0

    pid = L2MAP_PID + 0
    names = {ev["tid"]: ev["args"]["name"] for ev in back["traceEvents"]
             if ev.get("pid") == pid and ev.get("name") == "thread_name"}
    order = {ev["tid"]: ev["args"]["sort_index"] for ev in back["traceEvents"]
             if ev.get("pid") == pid and ev.get("name") == "thread_sort_index"}
    sm_tracks = sorted((order[t], names[t]) for t in names if t < LANE_STRIDE)
    assert len(sm_tracks) == N_SM
    parsed = [re.fullmatch(r"SM (\d+) · p(\d) · ([\d.]+) cyc", n).groups() for _, n in sm_tracks]
    keys = [(int(p), float(c)) for _, p, c in parsed]
    assert keys == sorted(keys)  # by partition, then latency
    sm, p, c = parsed[0]
    assert int(p) == labels.partition[int(sm)] and float(c) == round(topo.chain_cycles[int(sm)], 1)

    counters = {ev["name"]: ev["args"]["cycles"] for ev in back["traceEvents"] if ev.get("ph") == "C"}
    assert len(counters) == N_SM and counters["L2 latency SM 7 (cyc)"] == round(topo.chain_cycles[7], 2)

    kernel_events = back["traceEvents"]
    ctas = _ours(back, CTA_CATEGORY)
    assert len(ctas) == 4 * N_SM
    for ev in ctas:
        k = kernel_events[ev["args"]["launch"]]
        assert k["cat"] == "kernel" and k["name"] == ev["name"] == "row_sum_kernel"
        assert k["ts"] <= ev["ts"] and ev["ts"] + ev["dur"] <= k["ts"] + k["dur"] + 0.032
        assert ev["tid"] % LANE_STRIDE == ev["args"]["sm"] and ev["pid"] == pid
    # the aligned CTAs sit where they were placed: LEAD_NS after their kernel's start (within the fit's slack)
    first = min(ctas, key=lambda e: e["ts"])
    slack = (LAUNCH_NS - (CTA_NS + 131 * 10)) / 2
    assert abs(first["ts"] * 1000 - (k0 + LEAD_NS)) <= slack + 32

    launches = _ours(back, LAUNCH_CATEGORY)
    assert len(launches) == 4 and all(ev["args"]["ctas"] == N_SM for ev in launches)
    assert all(ev["args"]["items"] == 3 * N_SM and ev["args"]["near_share"] == pytest.approx(
        (np.arange(N_SM) % 4).sum() / (3 * N_SM), abs=1e-4) for ev in launches)


def test_identifiers_only_when_opted_in(topo, base):
    trace, k0 = base
    raw = topo.export_copy()
    raw.meta["device"]["uuid"] = "GPU-0a1b2c3d-raw-uuid"
    raw.meta["serial"] = "1650123456789"
    raw.meta["serial_hash"] = "abcdef123456"
    hidden = json.dumps(enrich(trace, maps={0: SmMap.from_topology(raw)}))
    assert "GPU-0a1b2c3d-raw-uuid" not in hidden and "1650123456789" not in hidden
    assert raw.meta["uuid_hash"] in hidden and "abcdef123456" in hidden  # the hashed ids stay
    shown = json.dumps(enrich(trace, maps={0: SmMap.from_topology(raw, include_ids=True)}))
    assert "GPU-0a1b2c3d-raw-uuid" in shown and "1650123456789" in shown


def test_enriching_twice_is_enriching_once(base, topo):
    trace, k0 = base
    opts = dict(maps={0: SmMap.from_topology(topo)}, records={0: _records(k0)})
    once = enrich(trace, **opts)
    assert enrich(once, **opts) == once


def test_a_calibration_of_another_gpu_is_left_out(base, topo):
    trace, _ = base
    small = SmMap(partition=np.zeros(114, int), chain_cycles=np.full(114, 300.0), sm_clock_ghz=np.full(114, 1.7))
    out = enrich(trace, maps={0: small})
    assert "0" not in out["l2topo"]["devices"]  # no map, no records: no L2 map process for that GPU
    assert not any(ev.get("pid") == L2MAP_PID for ev in out["traceEvents"])
    assert any("114 SMs" in n for n in out["l2topo"]["notes"])


@pytest.mark.parametrize("damage, message", [
    (lambda b: b[:len(b) // 2], "truncated"),
    (lambda b: b[:b.index(b"}", len(b) // 2) + 1], "truncated"),  # cut right after an event's closing brace
    (lambda b: b"\x00\x01binary", "not valid JSON|not a JSON"),
    (lambda b: json.dumps([{"ph": "X"}]).encode(), "not a Chrome trace object"),
    (lambda b: json.dumps({"displayTimeUnit": "ns", "traceEvents": []}).encode(), "not a PyTorch profiler"),
    (lambda b: json.dumps({"schemaVersion": 1, "traceEvents": [{"name": "x"}]}).encode(), "not an event"),
    (lambda b: json.dumps({"schemaVersion": 1, "traceEvents": [{"ph": "X", "ts": "7"}]}).encode(), "numeric"),
])
def test_bad_traces_get_a_clear_error_and_stay_untouched(base, tmp_path, damage, message):
    trace, _ = base
    path = tmp_path / "bad.json"
    path.write_bytes(damage(json.dumps(trace).encode()))
    before = path.read_bytes()
    with pytest.raises(TraceFormatError, match=message):
        enrich_file(path)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["bad.json"]


def test_a_truncated_gzip_trace_is_refused(base, tmp_path):
    trace, _ = base
    path = tmp_path / "t.json.gz"
    whole = gzip.compress(json.dumps(trace).encode())
    path.write_bytes(whole[:len(whole) // 2])
    with pytest.raises(TraceFormatError, match="gzip"):
        enrich_file(path, tmp_path / "out.json.gz")
    assert not (tmp_path / "out.json.gz").exists() and path.read_bytes() == whole[:len(whole) // 2]


def test_an_enriched_file_replaces_its_source_only_once_written(base, topo, tmp_path):
    trace, k0 = base
    path = write_trace(trace, tmp_path / "t.json")
    enrich_file(path, maps={0: SmMap.from_topology(topo)}, records={0: _records(k0)})
    assert "l2topo" in load_trace(path) and sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]


CLOCK = 1.98


def _proton(k0, n_launches=2):
    """Proton CTAs of other_kernel, 1 us into each launch, on the globaltimer clock (%globaltimer counts ns since
    1970, so Proton's microsecond doubles resolve about 0.25 us)."""
    launches = []
    for i in range(n_launches):
        gt = k0 + 55_000 + i * PERIOD_NS + 1_000 - KINETO_MINUS_GLOBALTIMER
        launches.append([(sm, sm, gt + 32 * sm, 19_800) for sm in range(0, N_SM, 2)])  # 10 us at 1.98 GHz
    return proton_trace("other_kernel", launches, CLOCK)


def test_proton_ctas_become_records_with_real_durations(base):
    _, k0 = base
    records, quantum = proton_records(_proton(k0), CLOCK)
    assert len(records) == 2 * (N_SM // 2) and records.kernel_names() == ["other_kernel"]
    assert 100 < quantum < 600  # doubles of microseconds since 1970
    # each CTA lasts its warps' longest span: 19800 cycles at 1.98 GHz
    assert np.allclose(records.end_ns - records.start_ns, 10_000, atol=2 * quantum)
    assert sorted(set(records.program.tolist())) == list(range(0, N_SM, 2))


def test_proton_ctas_merge_onto_the_same_sm_tracks(base, topo):
    trace, k0 = base
    records, quantum = proton_records(_proton(k0), CLOCK)
    out = enrich(trace, maps={0: SmMap.from_topology(topo)}, records={0: _records(k0)}, proton=records,
                 proton_quantum_ns=quantum)
    a = out["l2topo"]["devices"]["0"]["alignment"]
    assert a["proton"]["matched"] == 2 * (N_SM // 2) and a["proton"]["outside"] == 0
    assert a["recorder"]["matched"] == 4 * N_SM
    proton_ctas = [ev for ev in _ours(out, CTA_CATEGORY) if ev["args"]["source"] == "proton"]
    assert {ev["name"] for ev in proton_ctas} == {"other_kernel"}
    assert all(ev["tid"] % LANE_STRIDE == ev["args"]["sm"] for ev in proton_ctas)
    assert {ev["name"] for ev in _ours(out, LAUNCH_CATEGORY)} == {"row_sum_kernel", "other_kernel"}


def test_foreign_and_old_proton_traces_are_refused(base):
    _, k0 = base
    old = _proton(k0)
    for ev in old["traceEvents"]:
        ev["args"]["Kernel Gap"] = "10000000cycle(ns)"
    with pytest.raises(TraceFormatError, match="global time"):
        proton_records(old)
    with pytest.raises(TraceFormatError, match="no Proton CTA events"):
        proton_records({"traceEvents": [{"ph": "X", "pid": 3, "ts": 1, "dur": 1}]})


def test_hta_sees_the_same_kernels_in_the_enriched_trace(base, topo, tmp_path):
    hta = pytest.importorskip("hta.trace_analysis", reason="holistictraceanalysis is not installed")
    trace, k0 = base
    plain_dir, rich_dir = tmp_path / "plain", tmp_path / "rich"
    write_trace(trace, plain_dir / "rank0.json")
    records, quantum = proton_records(_proton(k0), CLOCK)
    write_trace(enrich(trace, maps={0: SmMap.from_topology(topo)}, records={0: _records(k0)}, proton=records,
                       proton_quantum_ns=quantum), rich_dir / "rank0.json")
    plain = hta.TraceAnalysis(trace_dir=str(plain_dir)).get_gpu_kernel_breakdown(visualize=False)
    rich = hta.TraceAnalysis(trace_dir=str(rich_dir)).get_gpu_kernel_breakdown(visualize=False)
    assert len(plain[1]) == 2  # row_sum_kernel and other_kernel
    for a, b in zip(plain, rich):
        assert a.sort_values(list(a.columns)).reset_index(drop=True).equals(
            b.sort_values(list(b.columns)).reset_index(drop=True))


def test_splicing_the_additions_into_the_profilers_text_equals_a_full_rewrite(base, topo):
    from torch_l2topo.profiler.trace.tracefile import dumps, parse, splice

    trace, k0 = base
    text = json.dumps(trace, indent=1)  # laid out unlike our compact dumps: the profiler's own text is kept
    parsed, end = parse(text, "t")
    assert parsed == trace
    added = enrichment(parsed, maps={0: SmMap.from_topology(topo)}, records={0: _records(k0)})
    spliced = splice(text, end, added.fragments(), added.meta)
    assert json.loads(spliced) == json.loads(dumps(added.trace())) and spliced.startswith(text[:end - 1].encode())
    empty = json.dumps({**trace, "traceEvents": []})
    e_trace, e_end = parse(empty, "t")
    assert json.loads(splice(empty, e_end, [b'{"ph":"i"}', b""], {"a": 1}))["traceEvents"] == [{"ph": "i"}]
