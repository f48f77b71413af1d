"""The calibration cache: where calibrations live, what key identifies one, and safe reads and writes.

One file per GPU and probe configuration under $TORCH_L2TOPO_CACHE (default: $XDG_CACHE_HOME/torch_l2topo
or ~/.cache/torch_l2topo). The key holds everything that invalidates a calibration: the GPU's uuid, SM
count, MIG flag, driver, SM clock setting, the package version and the probe configuration. Only
calibrations that passed their self-checks (trust.py) are stored. A file that is corrupt or was
written under another key is reported in one line and replaced, never trusted.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

from ..errors import TopologyFormatError
from ..topology import Topology

log = logging.getLogger("torch_l2topo")


def cache_dir() -> Path:
    root = os.environ.get("TORCH_L2TOPO_CACHE")
    if root:
        return Path(root).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "torch_l2topo"


def cache_key(device: dict, config: dict, package_version: str, backend: str, mode: str) -> dict:
    """The fields that must match for a cached calibration to be reused: a new driver or other clock
    settings (device.sm_clock_limit_mhz) mean a new calibration."""
    return {"uuid": device["uuid"], "sm_count": device["sm_count"], "mig": device["mig"],
            "driver": device["driver"], "sm_clock_limit_mhz": device.get("sm_clock_limit_mhz"),
            "package_version": package_version, "backend": backend, "mode": mode, "config": config}


def key_digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def cache_path(key: dict) -> Path:
    return cache_dir() / f"{_safe(key['uuid'])}-{key_digest(key)}.npz"


def _safe(uuid: str) -> str:
    return "".join(ch if ch.isalnum() or ch == "-" else "_" for ch in uuid)


def gpu_lock_paths(uuid: str) -> list:
    """Where the lock that serializes measurements on one GPU (whatever their configuration) may live, in order:
    the cache directory, then the temporary directory's torch_l2topo-locks (for a cache that cannot be written)."""
    name = f"{_safe(uuid)}.lock"
    return [cache_dir() / name, Path(tempfile.gettempdir()) / "torch_l2topo-locks" / name]


def load_cached(key: dict, quiet: bool = False) -> Topology | None:
    """The cached calibration for `key`, or None (missing, corrupt or mismatched: the latter two logged
    in one line unless `quiet`, for a second look at a file already reported)."""
    path = cache_path(key)
    if not path.exists():
        return None
    try:
        topo = Topology.load(path)
    except TopologyFormatError as exc:
        if not quiet:
            log.warning("torch_l2topo: ignoring corrupt cached calibration (%s); recalibrating", exc)
        return None
    if topo.meta.get("cache_key") != key:
        if not quiet:
            log.warning("torch_l2topo: cached calibration %s was made under another key; recalibrating", path)
        return None
    return topo


def calibration_files(uuid: str) -> list:
    """The cache's calibration files of this GPU, under any key, most recently written first."""
    return sorted(cache_dir().glob(f"{_safe(uuid)}-*.npz"), key=lambda p: p.stat().st_mtime, reverse=True)


def latest_for_gpu(uuid: str) -> Topology | None:
    """The most recently written readable calibration of this GPU, under any key (None if there is none):
    what a new calibration is compared with, to say when the clock or the map moved."""
    for path in calibration_files(uuid):
        try:
            return Topology.load(path)
        except (TopologyFormatError, OSError):
            continue
    return None


def store(topo: Topology, key: dict) -> Path:
    topo.meta["cache_key"] = key
    return topo.save(cache_path(key))
