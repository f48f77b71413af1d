"""calibrate_all(): calibrate every visible GPU (or the ones named) at once, one Topology per device.

Two mechanisms, switchable because which is faster is a measurement on a multi-GPU machine
(benchmarks/bench_fleet.py `calibrate-all`), not a guess:
- "threads" (default): one thread per device calling calibrate(index) on its own current stream; host waits
  release the GIL. Each device's first calibration in a process runs alone: a Triton kernel's first launch on
  a device is not thread-safe (triton-lang/triton#5933). Later ones run concurrently.
- "processes": one spawned process per device (never fork: the parent may hold CUDA state), each sending back
  Topology.to_bytes(). Truly parallel host work, at a Python + torch + CUDA start-up per device.

Each calibration is cached as calibrate() caches it (per GPU uuid, under that GPU's lock), so a second call
is served from the cache. Docs: docs/fleet.md ("calibrate_all(): threads or processes").
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from typing import Callable

from ..device import resolve_device
from ..errors import DeviceError, check_choice
from ..topology import Topology
from . import calibration

MECHANISMS = ("threads", "processes")
# Not yet decided by measurement on two GPUs (docs/fleet.md): threads start no process and share the Triton
# kernels compiled once. benchmarks/bench_fleet.py decides.
DEFAULT_MECHANISM = "threads"

log = logging.getLogger("torch_l2topo")


def calibrate_all(devices=None, *, mechanism: str = DEFAULT_MECHANISM, return_exceptions: bool = False,
                  progress: Callable[[str], None] | None = None, **options) -> dict:
    """Calibrate several CUDA devices concurrently.

    A device whose calibration fails does not stop the others: they finish (and are cached) first, and every
    failure is logged.

    Args:
        devices: None (every visible device) or an iterable of indices, "cuda:N" or torch.device; a device
            named twice is calibrated once.
        mechanism: "threads" or "processes" (module docstring).
        return_exceptions: True puts a failed device's exception in its place in the result; False re-raises
            the failure of the lowest failed index.
        progress: called with one line per finished device.
        **options: calibrate()'s keyword options (backend, mode, force, use_cache, gpc, check, attempts,
            probe config), the same for every device.

    Returns:
        {device index: Topology (or the exception, with return_exceptions=True)}, in index order.

    Raises:
        ValueError: `mechanism` is not one of MECHANISMS.
        DeviceError: no CUDA device is available, a device cannot be resolved, or `devices` is empty.
        Exception: with return_exceptions=False, the failure of the lowest failed index as calibrate() raised
            it (an L2TopoError such as ProbeError or CalibrationDisturbed, usually).
    """
    check_choice("mechanism", mechanism, MECHANISMS)
    indices = visible_devices() if devices is None else list(dict.fromkeys(resolve_device(d) for d in devices))
    if not indices:
        raise DeviceError("calibrate_all() was given no devices")
    run = _in_threads if mechanism == "threads" else _in_processes
    t0 = time.perf_counter()
    results = {}
    for index, outcome in run(indices, options):
        results[index] = outcome
        what = "calibrated" if isinstance(outcome, Topology) else f"failed ({type(outcome).__name__}: {outcome})"
        if progress is not None:
            progress(f"cuda:{index} {what} after {time.perf_counter() - t0:.1f} s ({len(results)} of {len(indices)})")
    failed = {i: r for i, r in results.items() if not isinstance(r, Topology)}
    for index, exc in failed.items():
        log.warning("torch_l2topo: calibrate_all: cuda:%d failed: %s: %s", index, type(exc).__name__, exc)
    if failed and not return_exceptions:
        raise failed[min(failed)]
    return {i: results[i] for i in sorted(results)}


def visible_devices() -> list:
    """The indices of every CUDA device this process sees (DeviceError when there is none)."""
    import torch

    if not torch.cuda.is_available():
        raise DeviceError("no CUDA device is available (torch.cuda.is_available() is False)")
    return list(range(torch.cuda.device_count()))


_first_launch = threading.Lock()  # held by a device's first calibration in this process (module docstring)
_launched: set = set()            # devices calibrated in this process at least once


def _calibrate_in_thread(index: int, options: dict) -> Topology:
    if index in _launched:
        return calibration.calibrate(index, **options)
    with _first_launch:
        topo = calibration.calibrate(index, **options)
        _launched.add(index)
    return topo


def _in_threads(indices, options):
    """(index, Topology or exception) as each device's thread finishes."""
    with ThreadPoolExecutor(max_workers=len(indices), thread_name_prefix="torch_l2topo-calibrate") as pool:
        futures = {pool.submit(_calibrate_in_thread, index, options): index for index in indices}
        for future in as_completed(futures):
            yield futures[future], _outcome(future)


def _in_processes(indices, options):
    """(index, Topology or exception) as each device's spawned process finishes."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")  # never fork: this process may hold CUDA state
    with ProcessPoolExecutor(max_workers=len(indices), mp_context=context) as pool:
        futures = {pool.submit(calibrated_bytes, index, options): index for index in indices}
        for future in as_completed(futures):
            outcome = _outcome(future)
            yield futures[future], Topology.from_bytes(outcome) if isinstance(outcome, bytes) else outcome


def calibrated_bytes(index: int, options: dict) -> bytes:
    """The work of one spawned process: calibrate device `index`, return the saved form."""
    return calibration.calibrate(index, **options).to_bytes()


def _outcome(future):
    try:
        return future.result()
    except Exception as exc:  # a device's failure is its result; the other devices carry on
        return exc
