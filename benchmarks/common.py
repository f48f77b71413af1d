"""What every benchmark records with its figures: device, versions, clocks, date, and its own command.

Results are JSON files under benchmarks/results/, one object per run: {"env": ..., "command": ...,
"figures": ...}, so results from different days and GPUs can be compared.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from torch_l2topo.files import json_default
from torch_l2topo.measure.timing import Measurement


def environment(device_index: int = 0) -> dict:
    import torch

    from torch_l2topo.device import board_serial_hash, device_info
    from torch_l2topo.version import __version__

    info = device_info(device_index)
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"gpu": info.name, "uuid_hash": info.uuid_hash, "serial_hash": board_serial_hash(device_index),
            "cc": list(info.cc), "sm_count": info.sm_count,
            "l2_bytes": info.l2_bytes, "driver": info.driver, "torch": torch.__version__,
            "cuda": torch.version.cuda, "triton": triton_version, "torch_l2topo": __version__,
            "clocks": _smi_clocks(device_index),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}


def cpu_environment() -> dict:
    """The environment of a CPU-only benchmark (analysis of recorded calibrations): versions, CPU, date."""
    import platform

    import scipy

    from torch_l2topo.version import __version__

    return {"python": platform.python_version(), "numpy": np.__version__, "scipy": scipy.__version__,
            "torch_l2topo": __version__, "machine": platform.machine(), "platform": platform.platform(),
            "cpu_count": os.cpu_count(), "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}


def _smi_clocks(index: int) -> dict:
    """SM/memory clocks as nvidia-smi reports them now (best effort; empty if nvidia-smi is missing)."""
    try:
        out = subprocess.run(["nvidia-smi", "-i", str(index), "--query-gpu=clocks.sm,clocks.mem,clocks.max.sm",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
        sm, mem, max_sm = (int(x) for x in out.stdout.strip().split(","))
        return {"sm_mhz": sm, "mem_mhz": mem, "max_sm_mhz": max_sm}
    except Exception:
        return {}


def quantiles(values) -> dict:
    """A result row's {"p20", "p50", "p80", "n"} of any values (times in any unit): timing.Measurement's."""
    return Measurement(values).quantiles()


def time_each_call(owner, name: str, bucket, key: str | None = None):
    """Wrap owner.name so that each call's host time (s) is appended to bucket[key or name]; returns the original
    (to put back with setattr)."""
    original = getattr(owner, name)
    key = key or name

    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            bucket[key].append(time.perf_counter() - t)

    setattr(owner, name, wrapper)
    return original


def bootstrap_ci90(statistic, n: int, resamples: int = 2000) -> list:
    """[5th, 95th] percentile of statistic(picks) over `resamples` resamplings with replacement of n paired
    observations (seeded): picks is a (resamples, n) array of indices, and statistic returns one value per row."""
    picks = np.random.default_rng(0).integers(0, n, size=(resamples, n))
    values = statistic(picks)
    return [float(np.percentile(values, 5)), float(np.percentile(values, 95))]


def command_line() -> str:
    """The command that is running, with CUDA_VISIBLE_DEVICES when set (it says which GPU --device 0 was)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    prefix = f"CUDA_VISIBLE_DEVICES={shlex.quote(visible)} " if visible is not None else ""
    return prefix + "python " + " ".join(shlex.quote(a) for a in sys.argv)


def gpu_parser(doc: str, reps: int) -> argparse.ArgumentParser:
    """The arguments every GPU benchmark takes: --device, --reps, --out (add your own to the parser)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--reps", type=int, default=reps)
    p.add_argument("--out", required=True)
    return p


@contextmanager
def private_cache(name: str):
    """A calibration cache of this block's own (TORCH_L2TOPO_CACHE), removed at its end with the variable restored:
    no cached map of another run is used, and none is left behind."""
    previous = os.environ.get("TORCH_L2TOPO_CACHE")
    with tempfile.TemporaryDirectory(prefix=f"l2topo-{name}-") as cache:
        os.environ["TORCH_L2TOPO_CACHE"] = cache
        try:
            yield Path(cache)
        finally:
            if previous is None:
                os.environ.pop("TORCH_L2TOPO_CACHE")
            else:
                os.environ["TORCH_L2TOPO_CACHE"] = previous


def calibrated_device(index: int, name: str):
    """(torch.device, its calibration, {"uuid_hash", "trust"} for the figures): device `index` made current
    and calibrated into a private cache (so that no cached map of another run is reused)."""
    os.environ.setdefault("TORCH_L2TOPO_CACHE", tempfile.mkdtemp(prefix=f"l2topo-{name}-"))
    import torch

    import torch_l2topo

    dev = torch.device("cuda", index)
    torch.cuda.set_device(dev)
    topo = torch_l2topo.calibrate(dev)
    return dev, topo, {"uuid_hash": topo.meta["uuid_hash"], "trust": topo.meta.get("trust", {}).get("trusted")}


def write_result(path, figures: dict, device_index: int = 0) -> Path:
    """A GPU benchmark's result file: figures with the GPU's environment and the command."""
    return write_json(path, figures, environment(device_index))


def write_json(path, figures: dict, env: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"command": command_line(), "env": env, "figures": figures}
    path.write_text(json.dumps(doc, indent=1, default=json_default) + "\n")
    return path

