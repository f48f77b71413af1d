"""calibrate(): measure the per-SM L2 map of a GPU (checked by trust.py), or load it from the cache; and
calibration_for(): the one way every use gets "this device's calibration" (a given one, checked, or calibrate())."""
from __future__ import annotations

import dataclasses
import datetime as _dt
import logging
import time
from collections.abc import Mapping
from contextlib import ExitStack, contextmanager

import numpy as np

from ..device import DeviceInfo, board_serial_hash, device_info, device_uuid, resolve_device
from ..errors import CalibrationDisturbed, CalibrationMismatch, ProbeError, check_choice
from ..files import exclusive
from ..topology import Topology
from ..version import __version__
from . import cache, trust
from .launch import BACKEND_CHOICES, resolve_backend
from .probes import DEFAULT_MODE, MODES, ProbeConfig, measure, wave_size
from .repeats import Repeats, align_levels, at_wave_clock, clock_model, combine, wave_clock

CALIBRATION_LOCK_TIMEOUT_S = 120.0  # another process calibrating the same GPU takes well under this
ATTEMPTS = 3             # measurements before a disturbed calibration is refused
RETRY_BACKOFF_S = 0.2    # times the attempt number: a short burst of other work can pass meanwhile

log = logging.getLogger("torch_l2topo")


@contextmanager
def measuring(index: int):
    """Hold this GPU's measurement lock: probes of two processes on one GPU would disturb each other, so
    calibrate(), the Localizer and partition maps take turns on it. The lock lives in the cache directory, else
    in the temporary directory (a read-only or unusable cache); where neither can hold it, the measurement goes
    ahead unlocked, with a warning."""
    problems = []
    with ExitStack() as held:
        for path in cache.gpu_lock_paths(device_uuid(index)):
            try:
                held.enter_context(exclusive(path, CALIBRATION_LOCK_TIMEOUT_S, "GPU measurement"))
                break
            except OSError as exc:  # the directory cannot be made or written: the next place
                problems.append(f"{exc.filename or path}: {exc.strerror or exc}")
        else:
            log.warning("torch_l2topo: cuda:%d measures without its lock, which no directory could hold (%s): "
                        "another process probing this GPU now would disturb the map", index, "; ".join(problems))
        yield


def calibrate(device=None, *, backend: str = "auto", mode: str = DEFAULT_MODE, force: bool = False,
              use_cache: bool = True, gpc: bool = False, check: bool = True, attempts: int = ATTEMPTS,
              **config) -> Topology:
    """Measure (or load from the cache) the per-SM L2 latency map of a CUDA device.

    device: None (current), an index, "cuda:N" or a torch.device. backend: "auto" (Triton, else the CUDA
    extension), "triton" or "cuda". mode: "waves" (16 SMs at a time on independent rings; within
    0.1 cycle of the reference on the H200, in 0.23 s), "serialized" (one SM at a time; the reference, 2.3 s)
    or "concurrent" (all SMs at once; a few SMs up to 0.3 cycles off). force: measure even if a cached
    calibration exists. use_cache: read and write the cache at all. gpc: also record the GPC of every SM
    from thread-block cluster co-residence (sm_90+, builds the CUDA extension once) as
    topo.extras["gpc_truth"]. config: ProbeConfig fields (chain_bytes, n_lines, line_warm, line_timed,
    repeats, seed, timeout_s, warmup_ms, chain_settle).

    Every measurement checks itself before it is returned or cached (trust.py: the ring stayed L2-resident,
    the repeats agree, the clock held). A disturbed measurement is retried, up to `attempts` in all; then
    check=True raises CalibrationDisturbed saying what disturbed it, and check=False returns the map with
    topo.meta["trust"]["trusted"] False. A disturbed map is never cached. topo.meta["trust"] holds the
    verdict, including notes such as a clock that moved since the GPU's previous calibration.

    Two processes calibrating one GPU at once take turns on a per-GPU lock (measurements would disturb
    each other); the second then finds the first's fresh result in the cache. use_cache=False needs no
    writable cache directory (the lock then lives in the temporary directory), and a cache that cannot be written
    costs a warning, never the measured map.
    """
    check_choice("mode", mode, MODES)
    check_choice("backend", backend, BACKEND_CHOICES)
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ValueError(f"attempts must be a positive integer, got {attempts!r}")
    unknown = set(config) - {f.name for f in dataclasses.fields(ProbeConfig)}
    if unknown:
        raise TypeError(f"calibrate() got unknown options {sorted(unknown)}")
    index = resolve_device(device)
    info = device_info(index)
    cfg = ProbeConfig(**config).validate(info.l2_bytes)
    backend = resolve_backend(backend)
    key = cache.cache_key(info.as_dict(), dataclasses.asdict(cfg), __version__, backend, mode)
    if use_cache and not force:
        hit = cache.load_cached(key)
        if hit is not None and (not gpc or "gpc_truth" in hit.extras):
            return hit
    with measuring(index):
        # another process may have finished while we waited for the lock
        topo = cache.load_cached(key, quiet=True) if use_cache and not force else None
        if topo is None:
            previous = cache.latest_for_gpu(info.uuid) if use_cache else None
            topo = _checked_measure(index, info, cfg, backend, mode, check, attempts, previous)
        topo = _with_gpc(topo, index, gpc)
        if use_cache and topo.meta["trust"]["trusted"]:
            try:
                cache.store(topo, key)
            except OSError as exc:  # a full or read-only cache: the map is good, only not kept
                log.warning("torch_l2topo: cuda:%d: the calibration is returned but not cached (%s: %s)", index,
                            exc.filename or cache.cache_dir(), exc.strerror or exc)
    return topo


def calibration_for(device=None, topology: Topology | None = None, **options) -> Topology:
    """This device's calibration: `topology` when one is given, after check_calibration says it is of this
    device's GPU model and SM count; else calibrate(device, **options) (measured, or loaded from the cache).
    Every use that takes an optional calibration (placement, partition maps, green contexts, the Localizer,
    the geometry suite) gets it here, so all of them refuse another GPU's map the same way."""
    index = resolve_device(device)
    if topology is None:
        return calibrate(index, **options)
    check_calibration(topology, index)
    return topology


def check_calibration(topo: Topology, device) -> None:
    """Raise CalibrationMismatch unless `topo` is a calibration of `device`: its GPU model and SM count, and,
    where both are known, the very GPU (uuid hash).

    device: a CUDA device (index, "cuda:N", torch.device), or a description of one (a device.DeviceInfo or a
    mapping with "name", "sm_count" and optionally "uuid_hash"). A calibration of another model would name the
    wrong SMs (a plan for them, their labels, their pairs); one of another GPU of the same model has another
    map (partition layouts differ between H200s: 66/66 and 64/68 SMs). Either must be a clear error, never a
    wrong answer.
    """
    name, sm_count, uuid_hash = _device_identity(device)
    topo_name = topo.meta.get("device", {}).get("name")
    if topo_name != name or topo.n_sm != sm_count:
        raise CalibrationMismatch(f"the calibration is of {topo_name or 'an unnamed device'} with {topo.n_sm} SMs "
                                  f"but the device is {name} with {sm_count} SMs: calibrate this device "
                                  "(torch_l2topo.calibrate) instead of reusing another GPU's map")
    theirs = topo.meta.get("uuid_hash")
    if uuid_hash and theirs and theirs != uuid_hash:
        raise CalibrationMismatch(f"the calibration is of another {name} (uuid hash {theirs}, this GPU's is "
                                  f"{uuid_hash}): each GPU has its own map; calibrate this device "
                                  "(torch_l2topo.calibrate)")


def _device_identity(device) -> tuple[str, int, str | None]:
    if isinstance(device, DeviceInfo):
        return device.name, device.sm_count, device.uuid_hash
    if isinstance(device, Mapping):
        return str(device["name"]), int(device["sm_count"]), device.get("uuid_hash")
    info = device_info(resolve_device(device))
    return info.name, info.sm_count, info.uuid_hash


def _checked_measure(index: int, info, cfg: ProbeConfig, backend: str, mode: str, check: bool, attempts: int,
                     previous) -> Topology:
    """Measure until a calibration passes its self-checks, `attempts` times at most. A probe that could not
    run (other work held SMs past the watchdog) counts as a disturbed attempt too; with check=False and no
    map measured at all, its error is raised."""
    topo, problem = None, ""
    for attempt in range(1, attempts + 1):
        try:
            measured = _measure(index, info, cfg, backend, mode)
        except ProbeError as exc:  # CalibrationDisturbed is raised below, never here
            problem = str(exc)
        else:
            topo = measured
            verdict = trust.check(Repeats.from_extras(topo.extras), previous)
            topo.meta["trust"] = dict(verdict.to_meta(), attempt=attempt)
            for note in verdict.notes:
                log.warning("torch_l2topo: cuda:%d: %s", index, note)
            if verdict.trusted:
                return topo
            problem = "; ".join(verdict.problems)
        log.warning("torch_l2topo: cuda:%d calibration attempt %d of %d disturbed: %s", index, attempt, attempts,
                    problem)
        time.sleep(RETRY_BACKOFF_S * attempt)  # let a burst of other work pass
    if check or topo is None:
        raise CalibrationDisturbed(
            f"calibrating cuda:{index} was disturbed on all {attempts} attempts; last: {problem}. Calibrate when "
            "the GPU is free, or pass check=False to get the map untrusted (never cached)")
    return topo


def _with_gpc(topo: Topology, index: int, gpc: bool) -> Topology:
    if gpc and "gpc_truth" not in topo.extras:
        from .gpc_probe import gpc_ground_truth

        topo.extras["gpc_truth"] = gpc_ground_truth(index)
    return topo


def _measure(index: int, info, cfg: ProbeConfig, backend: str, mode: str) -> Topology:
    import torch

    device = torch.device("cuda", index)
    t0 = time.perf_counter()
    with torch.cuda.device(index):
        chains, lines = measure(device, info.sm_count, cfg, backend, mode)
    wall = time.perf_counter() - t0
    repeats = Repeats.from_results(chains, lines)
    line_cycles = np.stack([r.cycles for r in lines])
    wave = wave_size(mode, info.sm_count)
    versions = {"torch_l2topo": __version__, "torch": torch.__version__, "cuda": torch.version.cuda,
                "triton": _triton_version()}
    meta = {
        "device": info.as_dict(), "uuid_hash": info.uuid_hash, "serial_hash": board_serial_hash(index),
        "backend": backend, "mode": mode,
        "config": dataclasses.asdict(cfg), "versions": versions,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "wall_s": wall, "probe_s": {"chain": [c.elapsed_s for c in chains], "lines": [r.elapsed_s for r in lines]},
    }
    # Each SM at its wave's clock, then aligned medians over the repeats (repeats.py): a TPC whose clock dipped in
    # one repeat, or one disturbed repeat, does not move the map. The raw repeats stay in extras.
    fixed_ns, source = clock_model(repeats, wave, info.cc)
    chain = at_wave_clock(repeats.chain_cycles, repeats.clock_ghz, wave, fixed_ns)
    line_clock = np.stack([r.sm_clock_ghz for r in lines])
    line_cycles = at_wave_clock(line_cycles, line_clock, wave, fixed_ns)
    meta["clock_correction"] = {"fixed_ns": fixed_ns, "source": source,
                                "max_shift_cycles": float(np.abs(chain - repeats.chain_cycles).max())}
    return Topology(
        chain_cycles=combine(chain, wave), chain_ns=combine(chain / wave_clock(repeats.clock_ghz, wave), wave),
        line_cycles=combine(line_cycles, wave).astype(np.float32), line_addresses=lines[0].line_addresses,
        chain_noise=np.ptp(chain - align_levels(chain, wave), axis=0),
        line_noise=np.median(np.ptp(line_cycles, axis=0), axis=1),
        sm_clock_ghz=line_clock.mean(axis=0), meta=meta, extras=repeats.to_extras())


def _triton_version() -> str | None:
    try:
        import triton

        return triton.__version__
    except ImportError:
        return None
