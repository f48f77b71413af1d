"""The ranks of the CPU fleet job of tests/test_distributed.py: a gloo process group of two spawned processes, each
rank on its own stand-in GPU (tests/fake_fleet.py), running the scenarios below one after the other in the same
group and writing what it saw to out_dir/<scenario>-rank<r>.json for the test to check.

- pair: the two ranks on two different real H200s.
- duplicate: rank 1 planted on rank 0's GPU (same uuid; another recording of that GPU).
- placement: each rank's Placement calibrates; the device it asked for and the map it got are recorded.
- busy: rank 1's GPU is busy (every measurement disturbed: calibrate() raises CalibrationDisturbed).
- hung: rank 1's calibration hangs (a measurement takes HANG_S; the timeout is TIMEOUT_S).
Then, outside that group, `python -m torch_l2topo fleet` as torchrun starts it (the group joined from the
environment), each rank reading a saved calibration; and once more with rank 1 joining but never gathering
(hung elsewhere): rank 0's gather must end at the group's timeout (STRAGGLER_TIMEOUT_S + the slack set below).
Each scenario's GPUs have their own uuids, so no scenario is served another's cached calibration.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from fake_fleet import FakeGpu, install

WORLD = 2
TIMEOUT_S = 2.0
HANG_S = 60.0
STRAGGLER_TIMEOUT_S, STRAGGLER_SLACK_S = 1.0, 1.0
A, B = "h200-1e5731-cuda-waves", "h200-d00e55-cuda-waves"  # two real H200s (recorded.TEST_GPUS)
SCENARIOS = {
    "pair": {0: FakeGpu(A, "GPU-pair-a"), 1: FakeGpu(B, "GPU-pair-b")},
    "duplicate": {0: FakeGpu(A, "GPU-dup-a"), 1: FakeGpu("h200-1e5731-cuda-waves-restart", "GPU-dup-a")},
    "placement": {0: FakeGpu(A, "GPU-place-a"), 1: FakeGpu(B, "GPU-place-b")},
    "busy": {0: FakeGpu(A, "GPU-busy-a"), 1: FakeGpu(B, "GPU-busy-b", disturbed=True)},
    "hung": {0: FakeGpu(A, "GPU-hung-a"), 1: FakeGpu(B, "GPU-hung-b", measure_s=HANG_S)},
}


def run_rank(rank: int, init_file: str, out_dir: str, port: int, straggler_port: int) -> None:
    """torch.multiprocessing's entry: join a gloo group, run every scenario, leave the group; then the command line
    verb as torchrun would start it (from torchrun's environment variables, on MASTER_PORT `port`), and the
    straggler's job (on `straggler_port`)."""
    import torch.distributed as dist

    os.environ["TORCH_L2TOPO_CACHE"] = str(Path(out_dir) / "cache")  # one host: one cache, one lock per GPU
    os.environ["LOCAL_RANK"] = str(rank)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        for name, gpus in SCENARIOS.items():
            install(setattr, gpus, current=rank)
            doc = placement(rank) if name == "placement" else gathered()
            (Path(out_dir) / f"{name}-rank{rank}.json").write_text(json.dumps(doc, default=str))
    finally:
        dist.destroy_process_group()
    command_line(rank, out_dir, port)
    straggler(rank, out_dir, straggler_port)


def command_line(rank: int, out_dir: str, port: int) -> None:
    """`torchrun --nproc_per_node=2 -m torch_l2topo fleet --file rank{rank}.npz --out cli.json`, each rank reading
    the calibration the test saved for it; stdout to cli-rank<r>.txt."""
    import contextlib

    from torch_l2topo.cli import main

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    out = Path(out_dir)
    with open(out / f"cli-rank{rank}.txt", "w") as f, contextlib.redirect_stdout(f):
        status = main(["fleet", "--file", str(out / "rank{rank}.npz"), "--out", str(out / "cli.json")])
    (out / f"cli-status-rank{rank}.json").write_text(json.dumps(status))


def straggler(rank: int, out_dir: str, port: int) -> None:
    """Rank 0 runs `fleet --timeout STRAGGLER_TIMEOUT_S`; rank 1 joins the group and waits, never gathering, until
    rank 0 has written its exit status and wall time (straggler-rank0.json) and stderr (straggler-rank0.txt)."""
    import contextlib

    from torch_l2topo.cli import main
    from torch_l2topo.distributed import gather

    gather.GATHER_SLACK_S = STRAGGLER_SLACK_S
    os.environ["MASTER_PORT"] = str(port)
    out = Path(out_dir)
    done = out / "straggler-rank0.json"
    if rank == 1:
        with gather.torchrun_group(STRAGGLER_TIMEOUT_S):
            deadline = time.monotonic() + HANG_S
            while not done.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
        return
    t0 = time.perf_counter()
    with open(out / "straggler-rank0.txt", "w") as f, contextlib.redirect_stderr(f):
        status = main(["fleet", "--file", str(out / "rank0.npz"), "--timeout", str(STRAGGLER_TIMEOUT_S)])
    done.write_text(json.dumps({"status": status, "wall_s": time.perf_counter() - t0}))


def gathered() -> dict:
    from torch_l2topo.distributed import gather_fleet

    t0 = time.perf_counter()
    fleet = gather_fleet(timeout_s=TIMEOUT_S)
    return {"wall_s": time.perf_counter() - t0, **fleet.to_dict()}


def placement(rank: int) -> dict:
    """Which map this rank's Placement took: the device it asked calibrate() for and the calibration that came
    back (calibrate() is watched, not replaced); then the fleet of the same GPUs, to compare with."""
    from placement_watch import placement_calibrations

    calls, grid = placement_calibrations()
    return {"calls": calls, "grid": grid, "own_uuid_hash": SCENARIOS["placement"][rank].info(rank).uuid_hash,
            "fleet": gathered()}
