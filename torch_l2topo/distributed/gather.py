"""gather_fleet(): inside a torch.distributed job, every rank calibrates its own GPU and the job gathers the fleet.

Each rank calibrates the GPU it uses (the current CUDA device, which torchrun scripts set from LOCAL_RANK) or
loads its calibration from the cache (calibrate()), within a timeout, and reports it (fleet.describe()).
A rank whose calibration fails (its GPU is busy: CalibrationDisturbed; no GPU: DeviceError) or does not
finish in time reports the error instead: the job gets a table row saying so, never a hang. The reports
travel with all_gather_object (small dicts), the fingerprint signatures with one all_gather of a fixed-length
float64 tensor (padded to the longest signature of the job; on the current CUDA device under NCCL, on the
CPU otherwise). Works with NCCL and gloo; outside an initialized process group the fleet is this process.

Every rank returns the same Fleet. Raw identifiers (GPU uuid, host name) stay out unless identifiers=True.
"""
from __future__ import annotations

import datetime
import math
import os
import socket
import threading
import time
from contextlib import contextmanager
from typing import Callable

import numpy as np

from ..device import device_info, resolve_device, uuid_hash
from ..errors import FleetError, ProbeTimeout
from ..measure import calibration
from ..topology import Topology
from .fleet import Fleet, describe

# A calibration waits up to calibration.CALIBRATION_LOCK_TIMEOUT_S (120 s) for another process measuring the
# same GPU, then measures for a few seconds (the first one compiles the probes): a rank still calibrating
# after this long is reported as failed, and the job goes on.
DEFAULT_TIMEOUT_S = 180.0
# What a rank waits for the others beyond the calibration timeout, in joining the group and in each collective: the
# ranks' start skew and the gather itself (small dicts and one tensor). A rank that calibrated in no time waits in
# the gather for a rank that gives up at the timeout; without this slack the two deadlines would race.
GATHER_SLACK_S = 30.0


def group_timeout_s(timeout_s: float) -> float:
    """How long joining the group and each collective may wait, for a calibration timeout of timeout_s."""
    _check_timeout(timeout_s)
    return timeout_s + GATHER_SLACK_S


def _check_timeout(timeout_s) -> None:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < math.inf:
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


@contextmanager
def torchrun_group(timeout_s: float = DEFAULT_TIMEOUT_S):
    """The process group of a `torchrun` launch, joined for the duration of the block: yields True in a job, False
    outside one (no RANK and WORLD_SIZE in the environment; nothing is started then). An initialized group is
    used as it is. Otherwise the group is joined from torchrun's environment and left at the end: NCCL with this
    rank's GPU (LOCAL_RANK) made current when every local rank has a GPU of its own, gloo otherwise (on CPUs, or
    with more ranks than GPUs: then ranks share GPUs, which the fleet reports). Joining, and every collective in
    the group, waits at most group_timeout_s(timeout_s): FleetError when a rank does not come."""
    import torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        yield True
        return
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        yield False
        return
    wait_s = group_timeout_s(timeout_s)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    own_gpus = torch.cuda.is_available() and local_world <= torch.cuda.device_count()
    if own_gpus:
        torch.cuda.set_device(local)
    try:
        dist.init_process_group("nccl" if own_gpus else "gloo", timeout=datetime.timedelta(seconds=wait_s))
    except RuntimeError as exc:  # torch.distributed.DistError: the rendezvous timed out or failed
        raise FleetError(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} could not join the job's process "
                         f"group within {wait_s:g} s (did every rank start?): {_first_line(exc)}") from None
    try:
        yield True
    finally:
        dist.destroy_process_group()


def host_label(identifiers: bool = False) -> str:
    """This machine's name, or "host-" and 8 hex of its sha256 (the form the recorded collection uses)."""
    name = socket.gethostname()
    return name if identifiers else "host-" + uuid_hash(name)[:8]


def local_record(topology: Topology | None = None, *, device=None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 identifiers: bool = False, **options) -> tuple[dict, np.ndarray | None]:
    """(this process's report, its signature vector or None): what gather_fleet() sends for this rank.

    topology: report this calibration instead of calibrating. device: the GPU to calibrate (default: the
    current CUDA device). options: calibrate()'s keyword options. Never raises for a failed calibration:
    the report's "error" says what happened, and the device's identity is filled in where it can be read.
    """
    _check_timeout(timeout_s)
    local = os.environ.get("LOCAL_RANK")
    record = {"local_rank": int(local) if local and local.isdigit() else None, "host": host_label(identifiers),
              "device_index": None, "error": None, "signature_length": 0}
    t0 = time.perf_counter()
    topo = topology
    try:
        if topo is None:
            record["device_index"] = index = resolve_device(device)  # in this thread: the current device is per thread
            topo = _calibrate_within(index, timeout_s, options)
        else:
            record["device_index"] = (topo.meta.get("device") or {}).get("index")
        report, vector = describe(topo, identifiers)
    except Exception as exc:  # a failed rank is a row of the table, never a hung or crashed job
        record["error"] = f"{type(exc).__name__}: {exc}"
        record.update(_device_identity(record["device_index"], identifiers))
        vector = None
    else:
        record.update(report)
    record["calibrate_s"] = time.perf_counter() - t0
    return record, vector


def _calibrate_within(index: int, timeout_s: float, options: dict) -> Topology:
    """calibrate(index) in a worker thread, given up on after timeout_s (the thread is left to finish: a
    probe kernel cannot be cancelled, and its watchdogs bound it)."""
    box: dict = {}

    def work():
        try:
            box["topo"] = calibration.calibrate(index, **options)
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=work, name=f"torch_l2topo-calibrate-cuda{index}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise ProbeTimeout(f"calibrating cuda:{index} did not finish within {timeout_s:g} s (another job "
                                 f"holding the GPU or its calibration lock?); it goes on in the background")
    if "error" in box:
        raise box["error"]
    return box["topo"]


def _device_identity(index, identifiers: bool) -> dict:
    """What can be read about a device whose calibration failed (nothing where there is no GPU)."""
    if index is None:
        return {}
    try:
        info = device_info(index)
    except Exception:  # the device itself is the problem: the error column already says so
        return {}
    return {"device": info.name, "sm_count": info.sm_count, "cc": ".".join(map(str, info.cc)),
            "uuid_hash": info.uuid_hash, "uuid": info.uuid if identifiers else None, "driver": info.driver}


def gather_fleet(topology: Topology | None = None, *, group=None, device=None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 identifiers: bool = False, progress: Callable[[str], None] | None = None, **options) -> Fleet:
    """The fleet of the job: every rank of `group` (default: the whole job) calls this; each returns the same Fleet.

    topology: this rank's calibration, if it already has one (else it calibrates `device`, default the current
    CUDA device, or loads it from the cache). timeout_s: how long a rank may calibrate before it reports a
    timeout instead (every rank waits for the slowest, up to this). identifiers: put raw uuids and host names
    in the table. options: calibrate()'s keyword options. progress: called with a line per step on this rank.
    Call torch.cuda.set_device(LOCAL_RANK) first in NCCL jobs: NCCL needs it, and it is the GPU calibrated.
    The collectives wait as long as the group's timeout (torchrun_group(timeout_s) sets group_timeout_s(timeout_s);
    a group you initialized keeps its own): FleetError when a rank never reaches them.
    """
    import torch.distributed as dist

    joined = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if joined else 0
    record, vector = local_record(topology, device=device, timeout_s=timeout_s, identifiers=identifiers, **options)
    record["rank"] = rank
    if progress is not None:
        state = f"failed: {record['error']}" if record["error"] else "calibration ready"
        progress(f"rank {rank}: cuda:{record['device_index']} {state} after {record['calibrate_s']:.2f} s")
    if not joined:
        return Fleet.from_records([record], [vector])
    world = dist.get_world_size(group)
    t0 = time.perf_counter()
    records = [None] * world
    try:
        dist.all_gather_object(records, record, group=group)
        vectors = _gather_vectors(vector, [r["signature_length"] for r in records], group)
    except RuntimeError as exc:  # the group's timeout passed (gloo; NCCL's watchdog) or a rank went away
        raise FleetError(f"rank {rank}: gathering the fleet failed after {time.perf_counter() - t0:.1f} s: a rank "
                         f"did not reach the gather (hung or died elsewhere?): {_first_line(exc)}") from None
    if progress is not None:
        progress(f"rank {rank}: gathered {world} ranks in {time.perf_counter() - t0:.2f} s")
    return Fleet.from_records(records, vectors)


def _gather_vectors(vector, lengths, group) -> list:
    """Every rank's signature vector (None where a rank has none), through one all_gather of a padded tensor."""
    import torch
    import torch.distributed as dist

    width = max(lengths)
    if width == 0:
        return [None] * len(lengths)
    on_gpu = dist.get_backend(group) == "nccl"  # NCCL gathers CUDA tensors only; gloo and the rest CPU ones
    where = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    mine = torch.full((width,), float("nan"), dtype=torch.float64, device=where)
    if vector is not None:
        mine[:len(vector)] = torch.from_numpy(np.asarray(vector, dtype=np.float64)).to(where)
    out = torch.empty(len(lengths) * width, dtype=torch.float64, device=where)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
    gather(out, mine, group=group)
    rows = out.view(len(lengths), width).cpu().numpy()
    return [rows[i, :n].copy() if n else None for i, n in enumerate(lengths)]
