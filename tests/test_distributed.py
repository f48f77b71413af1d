"""The fleet across a real torch.distributed job on the CPU: two spawned processes in a gloo group, each rank on its
own stand-in GPU with a recorded real H200 map (tests/fleet_job.py runs the ranks and lists the scenarios; this
file checks what they saw): two different H200s told apart, a rank planted on the other's GPU, each rank's
placement on its own map, a busy and a hung rank that give rows with their errors instead of hanging the job, and
the `fleet` command as torchrun starts it."""
import json
import socket
import time

import pytest
from fleet_job import HANG_S, SCENARIOS, STRAGGLER_SLACK_S, STRAGGLER_TIMEOUT_S, TIMEOUT_S, WORLD, run_rank
from recorded import CALIBRATIONS

CLI_RECORDINGS = ("h200-d00e55-cuda-waves", "h200-1e5731-triton-waves")
JOB_TIMEOUT_S = 180  # the job takes ~10 s of CPU; past this (a hang) it is killed and the test fails


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> dict:
    """{(scenario, rank): what the rank wrote} of one run of the job."""
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("fleet-job")
    for rank, stem in enumerate(CLI_RECORDINGS):  # what each rank's `fleet --file` reads
        (out / f"rank{rank}.npz").write_bytes((CALIBRATIONS / f"{stem}.npz").read_bytes())
    with pytest.MonkeyPatch.context() as env:
        # one BLAS thread per rank: the ranks' OpenBLAS thread pools oversubscribe a 2-core machine (one SVD of the
        # partition analysis took 2.4 s instead of 0.01 s)
        env.setenv("OPENBLAS_NUM_THREADS", "1")
        env.setenv("OMP_NUM_THREADS", "1")
        # spawn, never fork: a rank may hold CUDA state on a GPU machine
        ctx = mp.start_processes(run_rank, args=(str(out / "init"), str(out), _free_port(), _free_port()),
                                 nprocs=WORLD, join=False, start_method="spawn")
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"the fleet job did not finish within {JOB_TIMEOUT_S} s")
    found = {(p.stem.split("-rank")[0], int(p.stem.split("-rank")[1])): json.loads(p.read_text())
             for p in out.glob("*-rank*.json")}
    found["cli"] = json.loads((out / "cli.json").read_text())
    found.update({("cli-stdout", r): (out / f"cli-rank{r}.txt").read_text() for r in range(WORLD)})
    found["straggler-stderr"] = (out / "straggler-rank0.txt").read_text()
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rows(doc) -> dict:
    return {row["rank"]: row for row in doc["table"]}


def _uuid_hash(scenario: str, rank: int) -> str:
    return SCENARIOS[scenario][rank].info(rank).uuid_hash


def test_every_rank_gets_the_same_fleet_with_a_row_per_rank(job):
    for scenario in ("pair", "duplicate", "busy", "hung"):
        docs = [dict(job[(scenario, r)], wall_s=None) for r in range(WORLD)]
        assert docs[0] == docs[1], scenario
    rows = _rows(job[("pair", 0)])
    assert sorted(rows) == [0, 1] and [rows[r]["device_index"] for r in (0, 1)] == [0, 1]  # each its current device
    assert [rows[r]["uuid_hash"] for r in (0, 1)] == [_uuid_hash("pair", 0), _uuid_hash("pair", 1)]
    assert all(rows[r]["error"] is None and rows[r]["device"] == "NVIDIA H200" for r in rows)


def test_two_different_h200s_are_told_apart(job):
    doc = job[("pair", 0)]
    # fingerprint.decide's band (tuned on other GPUs than these two): one GPU below 0.26 cycles, two above 0.98
    assert doc["distances"][0][1] > 0.98
    assert doc["findings"] == [] and doc["health"][0].endswith(": Pass (0 fail, 0 warn)")
    assert _rows(doc)[0]["layout"] != _rows(doc)[1]["layout"]  # and their L2 partitions split the SMs differently


def test_a_rank_planted_on_another_ranks_gpu_is_flagged(job):
    doc = job[("duplicate", 0)]
    assert doc["distances"][0][1] < 0.26  # the same GPU's map, as the fingerprints say too
    assert {(f["rank"], f["check"]) for f in doc["findings"]} == {(0, "same GPU"), (1, "same GPU")}
    assert all("ranks 0, 1 run on one GPU" in line for line in doc["health"][1:])


def test_raw_identifiers_stay_out_by_default(job):
    text = json.dumps(list(job.values()))
    assert "GPU-pair-a" not in text and "GPU-dup-a" not in text and socket.gethostname() not in text


def test_each_rank_places_work_on_its_own_map(job):
    for rank in range(WORLD):
        seen = job[("placement", rank)]
        # the placement asked for this rank's device only, and got this rank's GPU's calibration
        assert [c["device"] for c in seen["calls"]] == [rank]
        assert [c["uuid_hash"] for c in seen["calls"]] == [seen["own_uuid_hash"]]
        assert seen["grid"] == 132
    maps = {r: job[("placement", r)]["calls"][0]["chain_median_cycles"] for r in range(WORLD)}
    fleet = _rows(job[("placement", 0)]["fleet"])
    assert all(maps[r] == pytest.approx(fleet[r]["chain_median_cycles"]) for r in range(WORLD))
    assert abs(maps[0] - maps[1]) > 0.1  # the two maps differ: a rank taking the other's would be seen


def test_a_busy_rank_gives_a_row_with_its_error(job):
    doc = job[("busy", 0)]
    rows = _rows(doc)
    assert rows[0]["error"] is None
    assert rows[1]["error"].startswith("CalibrationDisturbed: calibrating cuda:1 was disturbed on all 3 attempts")
    assert rows[1]["uuid_hash"] == _uuid_hash("busy", 1)  # the failed row still says which GPU it was
    assert rows[1]["nearest_distance"] is None and doc["distances"][0][1] is None
    assert [(f["rank"], f["level"], f["check"]) for f in doc["findings"]] == [(1, "Fail", "calibration")]
    assert doc["health"][0].startswith("L2 map health of 2 rank(s) on 1 host(s): Fail (1 fail")


def test_a_hung_rank_gives_a_row_after_the_timeout_not_a_hang(job):
    rows = _rows(job[("hung", 0)])
    assert rows[0]["error"] is None
    assert rows[1]["error"].startswith(f"ProbeTimeout: calibrating cuda:1 did not finish within {TIMEOUT_S:g} s")
    # both ranks waited for the hung one up to the timeout, and not for its measurement (HANG_S). The upper bound
    # is half the hang: "timeout + 15 s" failed once in a full 2-core run (the walls were not printed then)
    walls = [job[("hung", r)]["wall_s"] for r in range(WORLD)]
    assert all(TIMEOUT_S <= w < HANG_S / 2 for w in walls), walls


def test_the_fleet_command_under_torchrun_gathers_every_rank(job):
    assert [job[("cli-status", r)] for r in range(WORLD)] == [0, 0]
    rows = _rows(job["cli"])
    assert [rows[r]["uuid_hash"] for r in range(WORLD)] == ["d00e55adfd8e", "1e5731f1cbe2"]  # each its own --file
    assert job["cli"]["distances"][0][1] > 0.98
    assert "L2 map health of 2 rank(s)" in job[("cli-stdout", 0)] and job[("cli-stdout", 1)] == ""


def test_a_rank_that_never_gathers_ends_the_others_wait_at_the_group_timeout(job):
    """Rank 1 joined but hung before the gather: rank 0's `fleet` ends at the group's timeout (the calibration
    timeout + the slack) with one line, exit 2, instead of waiting for the backend's default (10-30 minutes)."""
    doc, err = job[("straggler", 0)], job["straggler-stderr"]
    last = err.rstrip("\n").splitlines()[-1]  # after the rank's progress lines
    assert doc["status"] == 2 and "Traceback" not in err, err
    assert last.startswith("torch_l2topo: error: rank 0: gathering the fleet failed after") and "Timed out" in last
    assert STRAGGLER_TIMEOUT_S + STRAGGLER_SLACK_S <= doc["wall_s"] < HANG_S / 2, doc
