"""The fleet table and its health view on recorded real H200 calibrations, without a process group: what a rank
reports, the pairwise fingerprint distances (against fingerprint.distance), the findings (two ranks on one GPU,
one GPU under two uuids, mixed models, moved maps and clocks, GPUs off their peers), their DCGM-style lines,
identifiers kept out, and a rank's own calibration failing or hanging. tests/test_distributed.py runs the same
across processes."""
import functools
import json
import socket
import time

import numpy as np
import pytest
from recorded import CALIBRATIONS, COLLECTION_MANIFEST, ROOT

from torch_l2topo import CalibrationDisturbed, Topology
from torch_l2topo.device import DeviceInfo
from torch_l2topo.distributed import Fleet, gather_fleet, local_record, pairwise_distances
from torch_l2topo.distributed.health import PEER_LIMITS
from torch_l2topo.identity.evaluation import read_manifest
from torch_l2topo.identity.fingerprint import distance, signature
from torch_l2topo.measure import calibration, trust

# two real H200s (recorded.TEST_GPUS) and a second calibration of the first one, by another process
A, A2, B = "h200-1e5731-cuda-waves", "h200-1e5731-cuda-waves-restart", "h200-d00e55-cuda-waves"


def _topo(stem: str) -> Topology:
    return Topology.load(CALIBRATIONS / f"{stem}.npz")


@functools.lru_cache(maxsize=None)
def _report(stem: str) -> tuple:
    """local_record() of an unmodified recording (reused: the partition analysis takes ~0.1 s per calibration)."""
    return local_record(_topo(stem))


def _fleet(items, identifiers=False) -> Fleet:
    """The fleet of ranks 0, 1, ... reporting these (calibrations, recording names, or (record, vector) reports
    already made): what gather_fleet assembles across a job."""
    records, vectors = [], []
    for rank, item in enumerate(items):
        if isinstance(item, str):
            item = _report(item)
        record, vector = item if isinstance(item, tuple) else local_record(item, identifiers=identifiers)
        records.append(dict(record, rank=rank))
        vectors.append(vector)
    return Fleet.from_records(records, vectors)


def _checks(fleet) -> set:
    return {(f.rank, f.check) for f in fleet.findings}


@pytest.fixture(scope="module")
def held_out() -> list:
    """(calibration, its report) of each of the 7 H200 boards of the sessions the peer limits were not set on (after
    2026-11-30T23:00, one CUDA calibration per board; health.py): a healthy fleet."""
    rows = [r for r in read_manifest(COLLECTION_MANIFEST) if r["session"] >= "2026-11-30T23" and r["backend"] == "cuda"]
    first = {}
    for row in sorted(rows, key=lambda r: r["file"]):
        first.setdefault(row["serial_hash"], row["file"])
    assert len(first) == 7
    topos = [Topology.load(ROOT / f) for f in first.values()]
    return [(t, local_record(t)) for t in topos]


def _planted(held_out, index: int, plant) -> list:
    """The held-out fleet's reports with board `index` changed by plant(its calibration's copy)."""
    topo = Topology.from_bytes(held_out[index][0].to_bytes())
    plant(topo)
    return [local_record(topo) if i == index else report for i, (_, report) in enumerate(held_out)]


# ---- what a rank reports ---------------------------------------------------------------------------------------
def test_a_rank_reports_its_gpu_and_map_summary():
    topo = _topo(A)
    record, vector = local_record(topo)
    assert record["device"] == "NVIDIA H200" and record["sm_count"] == 132 and record["cc"] == "9.0"
    assert record["uuid_hash"] == "1e5731f1cbe2" and record["error"] is None and record["trusted"]
    assert record["chain_median_cycles"] == pytest.approx(np.median(topo.chain_cycles))
    assert 270 < record["chain_median_cycles"] < 350 and 1.9 < record["clock_ghz"] < 2.0  # an H200's L2, at 1.98 GHz
    left, right = map(int, record["layout"].split("+"))
    assert left + right == 132 and left <= right
    assert 25 < record["gap_cycles"] < 40  # the H200's near - far partition gap: 30.7-32.7 cycles measured
    np.testing.assert_array_equal(vector, signature(topo).vector)


def test_the_layout_is_the_gpus_not_the_backends():
    assert local_record(_topo(A))[0]["layout"] == local_record(_topo("h200-1e5731-triton-waves"))[0]["layout"]


def test_a_calibration_without_device_metadata_is_an_error_row():
    topo = _topo(A)
    del topo.meta["device"]
    record, vector = local_record(topo)
    assert vector is None and record["error"].startswith("ValueError: the calibration's meta['device'] lacks")


def test_a_failing_calibration_is_an_error_row(monkeypatch):
    info = DeviceInfo(index=0, name="NVIDIA H200", uuid="GPU-busy", cc=(9, 0), sm_count=132, l2_bytes=60 * 2**20,
                      total_memory=141 * 2**30, driver="580.159.04", mig=False)
    from torch_l2topo.distributed import gather

    def busy(index, **options):
        raise CalibrationDisturbed("calibrating cuda:0 was disturbed on all 3 attempts; last: the ring was evicted")

    monkeypatch.setattr(gather, "resolve_device", lambda device=None: 0)
    monkeypatch.setattr(gather, "device_info", lambda index: info)
    monkeypatch.setattr(calibration, "calibrate", busy)
    record, vector = local_record()
    assert vector is None and record["error"].startswith("CalibrationDisturbed: calibrating cuda:0 was disturbed")
    assert record["uuid_hash"] == info.uuid_hash and record["device_index"] == 0 and "uuid" not in record or \
        record["uuid"] is None


def test_a_hung_calibration_is_given_up_after_the_timeout(monkeypatch):
    from torch_l2topo.distributed import gather

    monkeypatch.setattr(gather, "resolve_device", lambda device=None: 3)
    monkeypatch.setattr(gather, "device_info", lambda index: (_ for _ in ()).throw(RuntimeError("no such device")))
    monkeypatch.setattr(calibration, "calibrate", lambda index, **options: time.sleep(30))
    t0 = time.perf_counter()
    record, vector = local_record(timeout_s=0.3)
    assert time.perf_counter() - t0 < 5
    assert record["error"].startswith("ProbeTimeout: calibrating cuda:3 did not finish within 0.3 s")
    assert vector is None and record["device_index"] == 3 and "device" not in record  # nothing more was readable


def test_no_gpu_is_an_error_row_not_a_crash():
    record, vector = local_record(device="cpu")
    assert vector is None and record["error"].startswith("DeviceError")


@pytest.mark.parametrize("timeout_s", [0, -1.0, float("nan"), float("inf"), True])
def test_timeout_must_be_positive(timeout_s):
    with pytest.raises(ValueError, match="timeout_s must be a positive number of seconds"):
        local_record(_topo(A), timeout_s=timeout_s)


def test_outside_a_process_group_the_fleet_is_this_process():
    fleet = gather_fleet(_topo(A))
    assert list(fleet.table["rank"]) == [0] and fleet.findings == []
    assert fleet.health_lines()[0] == "L2 map health of 1 rank(s) on 1 host(s): Pass (0 fail, 0 warn)"


# ---- distances ---------------------------------------------------------------------------------------------------
def test_pairwise_distances_are_fingerprint_distances(sigs):
    chosen = [sigs[k] for k in sorted(sigs)[:7]]
    got = pairwise_distances([s.vector for s in chosen], 132)
    want = np.array([[distance(a, b) for b in chosen] for a in chosen])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="length 264"):
        pairwise_distances([chosen[0].vector[:100]], 132)


def test_two_h200s_are_told_apart_and_one_gpu_twice_is_not():
    fleet = _fleet([A, B, A2])
    d = fleet.distances.to_numpy()
    assert d[0, 1] > 0.98 and d[1, 2] > 0.98 and d[0, 2] < 0.26  # fingerprint.decide's band
    assert list(fleet.table["nearest_rank"]) == [2, 2, 0]


def test_ranks_on_one_gpu_are_flagged_and_the_others_pass():
    fleet = _fleet([A, B, A2])
    assert _checks(fleet) == {(0, "same GPU"), (2, "same GPU")}
    assert list(fleet.table["findings"]) == ["same GPU", "", "same GPU"]
    lines = fleet.health_lines()
    assert lines[0] == "L2 map health of 3 rank(s) on 1 host(s): Warn (0 fail, 2 warn)"
    assert lines[2].startswith("rank 1 ") and lines[2].endswith("uuid-hash d00e55adfd8e: Pass")
    assert "Warn - same GPU: ranks 0, 2 run on one GPU (uuid-hash 1e5731f1cbe2)" in lines[1]


def test_matching_maps_of_different_boards_are_not_called_one_gpu(held_out):
    # boards 0 and 3 of the held-out sessions have different serials, yet maps 0.16 cycles apart: a fingerprint
    # match is no proof of one GPU, so only a shared uuid is reported as one
    fleet = _fleet([held_out[0][1], held_out[3][1]])
    assert fleet.distances.to_numpy()[0, 1] < 0.26
    assert [f for f in fleet.findings if f.check == "same GPU"] == []


def test_mixed_models_are_flagged_and_never_compared():
    other = _topo(B)
    other.meta["device"] = dict(other.meta["device"], name="NVIDIA H100 80GB HBM3")
    fleet = _fleet([A, other])
    assert np.isnan(fleet.distances.to_numpy()[0, 1])
    (finding,) = fleet.findings
    assert finding.rank is None and finding.check == "mixed models"
    assert "1 x NVIDIA H200 (132 SMs)" in finding.message and "1 x NVIDIA H100 80GB HBM3" in finding.message
    assert fleet.health_lines()[-1].startswith("job: Warn - mixed models: the job mixes GPU models")


# ---- health: moved maps and peers --------------------------------------------------------------------------------
def test_a_map_and_clock_that_moved_since_the_last_calibration_are_listed_with_by_how_much():
    moved = _topo(B)
    figures = {"previous_shift_cycles": trust.PREVIOUS_SHIFT_NOTE + 1.5,
               "previous_clock_ghz": 1.755}  # the previous calibration ran at another clock setting
    moved.meta["trust"] = {"trusted": True, "figures": figures}
    fleet = _fleet([A, moved])
    found = {f.check: f for f in fleet.findings}
    assert set(found) == {"map moved", "clock moved"} and found["map moved"].rank == 1
    assert found["map moved"].amount == pytest.approx(3.5) and "+3.50 cycles" in found["map moved"].message
    assert found["clock moved"].amount == pytest.approx(1.98 - 1.755, abs=0.01)


def test_a_small_shift_is_not_a_finding():
    quiet = _topo(B)
    quiet.meta["trust"] = {"trusted": True, "figures": {"previous_shift_cycles": 0.4, "previous_clock_ghz": 1.98}}
    assert _fleet([A, quiet]).findings == []


def test_a_healthy_fleet_passes_its_peers(held_out):
    # the boards the peer limits were not set on: real healthy H200s must not be reported off their peers
    fleet = _fleet([report for _, report in held_out])
    assert (fleet.table.groupby("layout").size() >= 3).sum() == 2  # two layouts with enough peers for the check
    # what is reported is what their calibrations noted themselves (trust.py's map-moved note), nothing else
    noted = {i for i, (t, _) in enumerate(held_out) if any("map moved" in n for n in t.meta["trust"]["notes"])}
    assert {(f.rank, f.check) for f in fleet.findings} == {(i, "map moved") for i in noted}


@pytest.mark.parametrize("metric, plant, amount", [
    ("chain_median_cycles", lambda t: setattr(t, "chain_cycles", t.chain_cycles + 6.0), 6.0),
    ("chain_median_ns", lambda t: setattr(t, "chain_ns", t.chain_ns * 1.98 / 1.6), 142.6 * (1.98 / 1.6 - 1)),
])
def test_a_gpu_off_its_peers_is_listed_with_by_how_much(held_out, metric, plant, amount):
    layout = _fleet([report for _, report in held_out]).table["layout"]
    target = int(layout[layout == layout.value_counts().idxmax()].index[0])  # a GPU with the most peers
    fleet = _fleet(_planted(held_out, target, plant))
    found = [f for f in fleet.findings if f.check == "peers"]
    assert {f.rank for f in found} == {target}
    (finding,) = [f for f in found if f.message.startswith(PEER_LIMITS[metric][0]) and PEER_LIMITS[metric][1] in
                  f.message.split(",")[0]]
    assert finding.amount == pytest.approx(amount, abs=1.0)
    assert f"Warn - peers: {PEER_LIMITS[metric][0]}" in "\n".join(fleet.health_lines())


def _untrust(topo):
    topo.chain_cycles = topo.chain_cycles + 340.0  # an evicted ring, returned with check=False
    topo.meta["trust"] = {"trusted": False, "problems": ["the ring was not L2-resident"]}


def test_an_untrusted_map_is_listed_and_kept_out_of_the_peers(held_out):
    fleet = _fleet(_planted(held_out, 0, _untrust))
    # listed as untrusted, and not as 340 cycles off its peers: it is no peer (its group has 3 GPUs with it)
    assert {c for c in _checks(fleet) if c[1] != "map moved"} == {(0, "untrusted")}


# ---- identifiers and output --------------------------------------------------------------------------------------
def test_raw_identifiers_only_when_asked_for():
    topo = _topo(A)
    topo.meta["device"] = dict(topo.meta["device"], uuid="GPU-1234-raw")
    hidden = _fleet([topo]).to_json()
    assert "GPU-1234-raw" not in hidden and socket.gethostname() not in hidden
    assert "uuid" not in _fleet([topo]).table
    shown = _fleet([topo], identifiers=True)
    assert shown.table.loc[0, "uuid"] == "GPU-1234-raw" and shown.table.loc[0, "host"] == socket.gethostname()


def test_the_fleet_as_json_and_text():
    fleet = _fleet([A, B])
    doc = json.loads(fleet.to_json())
    assert [row["rank"] for row in doc["table"]] == [0, 1] and doc["ranks"] == [0, 1]
    assert doc["distances"][0][0] == 0 and doc["distances"][0][1] > 0.98 and doc["health"] == fleet.health_lines()
    text = fleet.summary()
    assert "fingerprint distances" in text and "d00e55adfd8e" in text and "Pass" in text


def test_records_and_vectors_must_pair_up():
    record, vector = local_record(_topo(A))
    with pytest.raises(ValueError, match="1 records but 2 signature vectors"):
        Fleet.from_records([dict(record, rank=0)], [vector, vector])


# ---- placement and the calibration it takes ---------------------------------------------------------------------
def test_a_map_of_another_gpu_of_the_same_model_is_refused():
    from torch_l2topo.errors import CalibrationMismatch
    from torch_l2topo.measure.calibration import check_calibration

    mine = DeviceInfo(index=0, name="NVIDIA H200", uuid="GPU-mine", cc=(9, 0), sm_count=132, l2_bytes=60 * 2**20,
                      total_memory=141 * 2**30, driver="580.159.04", mig=False)
    with pytest.raises(CalibrationMismatch, match="another NVIDIA H200"):
        check_calibration(_topo(B), mine)
    # the GPU it was measured on (described by its uuid hash) takes it, as does a description without one
    check_calibration(_topo(B), {"name": "NVIDIA H200", "sm_count": 132, "uuid_hash": _topo(B).meta["uuid_hash"]})
    check_calibration(_topo(B), {"name": "NVIDIA H200", "sm_count": 132})


# ---- the command line, outside torchrun ------------------------------------------------------------------------
def test_the_fleet_command_alone_is_a_fleet_of_one_and_says_so(tmp_path, capsys, monkeypatch):
    from torch_l2topo.cli import main

    monkeypatch.delenv("RANK", raising=False)
    out = tmp_path / "fleet.json"
    assert main(["fleet", "--file", B, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("not under torchrun: the fleet of this process alone")
    assert "uuid-hash d00e55adfd8e: Pass" in text and f"wrote {out}" in text
    assert [row["uuid_hash"] for row in json.loads(out.read_text())["table"]] == ["d00e55adfd8e"]


def test_the_fleet_command_exits_4_when_its_verdict_is_fail(capsys, monkeypatch):
    """No GPU to calibrate: the rank's row is a failed calibration, the verdict Fail, the exit status 4 (a job
    script gates on it as on `dcgmi diag`); a fleet that passes exits 0 (the test above)."""
    import torch

    from torch_l2topo.cli import EXIT_HEALTH_FAIL, main

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["fleet"]) == EXIT_HEALTH_FAIL == 4
    assert "L2 map health of 1 rank(s) on 1 host(s): Fail (1 fail" in capsys.readouterr().out


def test_joining_a_job_whose_other_ranks_never_come_ends_at_the_timeout(capsys, monkeypatch):
    """torchrun's environment for rank 0 of 2, and no rank 1: joining the group waits the calibration timeout plus
    the slack, then one line and exit 2 (not the backend's 10-30 minutes)."""
    import socket
    import time

    from torch_l2topo.cli import main
    from torch_l2topo.distributed import gather

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(gather, "GATHER_SLACK_S", 0.5)
    for key, value in dict(RANK="0", WORLD_SIZE="2", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(port)).items():
        monkeypatch.setenv(key, value)
    t0 = time.perf_counter()
    assert main(["fleet", "--file", B, "--timeout", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("torch_l2topo: error: rank 0 of 2 could not join the job's process group within 1.5 s")
    assert err.count("\n") == 1 and 1.5 <= time.perf_counter() - t0 < 30
