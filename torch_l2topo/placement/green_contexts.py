"""Unmodified PyTorch ops on chosen SMs: CUDA green contexts built from the SM groups a calibration ranks best.

Owns the SM groups of a device (how the driver splits its SMs, and which SM ids each group holds), their
ranking from a calibration (choose_groups, pure and CPU-tested), and on_sms(): a context manager that runs the
ops inside it on a stream restricted to the chosen groups. Kernels that can be rewritten should use @sm_aware
instead (per-item placement); this is for the ops that cannot.

Why groups: no CUDA API restricts work to SMs by index. The driver splits a device's SMs into groups of its
granularity (cuDevSmResourceSplitByCount; 8 SMs on Hopper), the same way every time, and a context built from
several groups of one split runs on exactly their SMs. So a %smid census of each group says which SMs it
holds, the calibration ranks the groups, and one context is built from the best (on the H200 every group of 8
lies in one L2 partition). Contexts and their streams are built once per (device, groups) and kept.
Where green contexts are unavailable (no cuda-python: the `green` extra; a driver or device without them; MIG;
no Triton for the census) on_sms() warns once per reason and runs the ops on the current stream. Docs:
docs/usage.md ("Placing work").
"""
from __future__ import annotations

import contextlib
import threading
import warnings
from dataclasses import dataclass

import numpy as np

from ..errors import DeviceError, L2TopoError

CENSUS_PROGRAMS_PER_SM = 32   # census programs per SM of a group: many more than can be resident at once
CENSUS_SPIN_NS = 20_000       # how long each holds its SM, so that the scheduler spreads them over the group


@dataclass(frozen=True)
class SmGroup:
    """One group of the driver's split: its position in the split (the remainder comes last) and SM ids."""

    index: int
    sms: tuple

    def __post_init__(self):
        object.__setattr__(self, "sms", tuple(sorted(int(s) for s in self.sms)))
        if not self.sms:
            raise ValueError(f"SM group {self.index} holds no SM")


@dataclass(frozen=True)
class Selection:
    """What on_sms() runs on: the chosen groups and their SMs, or groups=() and sms=None where it fell back
    to the whole device (reason says why)."""

    groups: tuple
    sms: tuple | None
    stream: object | None
    reason: str | None = None


def choose_groups(groups, sm_latency, n_sm: int, *, partition=None, near: int | None = None) -> tuple:
    """The fewest best-ranked groups that hold at least n_sm SMs, best first.

    sm_latency: (n_sm,) a per-SM latency (the calibration's chain cycles), lower is better. near: a partition
    index; groups with more of their SMs in it (partition: per-SM labels, -1 undecided) rank first, then
    lower mean latency. Raises ValueError for an n_sm no set of groups reaches, or a bad partition index.
    """
    groups = list(groups)
    lat = np.asarray(sm_latency, dtype=np.float64)
    total = sum(len(g.sms) for g in groups)
    if isinstance(n_sm, bool) or not isinstance(n_sm, (int, np.integer)) or not 1 <= n_sm <= total:
        raise ValueError(f"n_sm must be an integer in 1..{total} (the SMs of the groups), got {n_sm!r}")
    if any(s >= lat.size for g in groups for s in g.sms):
        raise ValueError(f"a group holds an SM id beyond the calibration's {lat.size} SMs: wrong device?")
    if near is not None:
        if partition is None:
            raise ValueError("near needs the per-SM partition labels")
        part = np.asarray(partition)
        if near not in set(part[part >= 0].tolist()):
            raise ValueError(f"near must be a partition of the calibration ({sorted(set(part[part >= 0].tolist()))}), "
                             f"got {near!r}")

    def key(g):
        sms = list(g.sms)
        away = 0.0 if near is None else float(np.mean(part[sms] != near))
        return (away, float(lat[sms].mean()), g.index)

    chosen, have = [], 0
    for g in sorted(groups, key=key):
        if have >= n_sm:
            break
        chosen.append(g)
        have += len(g.sms)
    return tuple(chosen)


# ---- the driver side (GPU) ------------------------------------------------------------------------------------
class GreenUnavailable(L2TopoError):
    """Green contexts cannot be used here; the message says why."""


_lock = threading.RLock()
_splits: dict = {}     # device index -> (driver device, [CUdevResource] in split order, [SmGroup])
_contexts: dict = {}   # (device index, group indices) -> torch.cuda.ExternalStream
_selections: dict = {}  # (device index, n_sm, near, id(topology)) -> (topology, Selection): on_sms() per call
_warned: set = set()


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError:
        raise GreenUnavailable("cuda-python is not installed (pip install 'torch-l2topo[green]')") from None
    if not hasattr(driver, "cuGreenCtxCreate"):
        raise GreenUnavailable("this cuda-python has no green context API (needs 12.4 or newer)")
    return driver


def _check(result, what: str):
    """Unpack a cuda-python call's (CUresult, values...) tuple, raising GreenUnavailable on an error."""
    driver = _driver()
    err, *values = result
    if err != driver.CUresult.CUDA_SUCCESS:
        raise GreenUnavailable(f"{what} failed: {err.name if hasattr(err, 'name') else err}")
    return values[0] if len(values) == 1 else values


def _green_stream(index: int, dev, resources) -> object:
    import torch

    driver = _driver()
    desc = _check(driver.cuDevResourceGenerateDesc(resources, len(resources)), "cuDevResourceGenerateDesc")
    ctx = _check(driver.cuGreenCtxCreate(desc, dev, driver.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM),
                 "cuGreenCtxCreate")
    # Non-blocking: a green stream that synchronized with the legacy default stream would serialize with it.
    stream = _check(driver.cuGreenCtxStreamCreate(ctx, driver.CUstream_flags.CU_STREAM_NON_BLOCKING, 0),
                    "cuGreenCtxStreamCreate")
    return torch.cuda.ExternalStream(int(stream), device=torch.device("cuda", index))


def census(stream, n_programs: int, spin_ns: int = CENSUS_SPIN_NS) -> tuple:
    """The sorted set of SM ids that `n_programs` census programs ran on, launched on `stream`."""
    import torch

    from ..measure.launch import launch

    out = torch.full((n_programs,), -1, dtype=torch.int64, device=stream.device)
    caller = torch.cuda.current_stream(stream.device)
    stream.wait_stream(caller)  # `out` was filled on the caller's stream
    with torch.cuda.stream(stream):
        launch("sm_census", "triton", n_programs, out, spin_ns)
    caller.wait_stream(stream)
    ids = out.cpu().numpy()
    if (ids < 0).any():
        raise DeviceError(f"{int((ids < 0).sum())} census programs did not run")
    return tuple(sorted(set(ids.tolist())))


def sm_groups(device=None) -> tuple:
    """The SM groups of the driver's split of `device` (groups of its minimum size, then the remainder), each
    with the SM ids a census found in it. Cached per device. Raises GreenUnavailable where green contexts
    cannot be used, DeviceError when a census does not find as many SMs as the driver says a group holds."""
    import torch

    from ..device import device_info, resolve_device

    index = resolve_device(device)
    with _lock:
        if index in _splits:
            return tuple(_splits[index][2])
        if device_info(index).mig:
            raise GreenUnavailable("green contexts are not used on a MIG instance")
        driver = _driver()
        with torch.cuda.device(index):
            torch.cuda.init()
            dev = _check(driver.cuDeviceGet(index), "cuDeviceGet")
            whole = _check(driver.cuDeviceGetDevResource(dev, driver.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM),
                           "cuDeviceGetDevResource")
            # minCount 1: the driver rounds up to its granularity; as many groups as fit, then the remainder.
            split, n, rest = _check(driver.cuDevSmResourceSplitByCount(whole.sm.smCount, whole, 0, 1),
                                    "cuDevSmResourceSplitByCount")
            resources = list(split[:n]) + ([rest] if rest.sm.smCount else [])
            groups = []
            for i, res in enumerate(resources):
                want = int(res.sm.smCount)
                sms = census(_green_stream(index, dev, [res]), CENSUS_PROGRAMS_PER_SM * want)
                if len(sms) != want:
                    raise DeviceError(f"the census of SM group {i} found {len(sms)} SMs, the driver says {want}")
                groups.append(SmGroup(i, sms))
            _splits[index] = (dev, resources, groups)
        return tuple(groups)


def group_stream(groups, device=None):
    """A stream (torch.cuda.ExternalStream) of one green context holding exactly `groups` (SmGroups of
    sm_groups(device)); built once per set of groups and kept."""
    from ..device import resolve_device

    index = resolve_device(device)
    known = sm_groups(index)
    groups = list(groups)
    if not groups or any(g.index >= len(known) or known[g.index] != g for g in groups):
        raise ValueError("groups must be a non-empty selection of sm_groups(device)")
    ids = tuple(sorted({g.index for g in groups}))
    with _lock:
        if (index, ids) not in _contexts:
            dev, resources, _ = _splits[index]
            _contexts[(index, ids)] = _green_stream(index, dev, [resources[i] for i in ids])
        return _contexts[(index, ids)]


def _warn_once(reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        # 4: past this function, on_sms's generator and contextlib's __enter__, to the caller's `with` line
        warnings.warn(f"torch_l2topo.on_sms: {reason}; the ops run on all SMs", RuntimeWarning, stacklevel=4)


def select(n_sm: int, *, near: int | None = None, topology=None, device=None) -> Selection:
    """The Selection on_sms() would run on (building its context), or a fallback Selection with the reason.
    Remembered per (device, n_sm, near, topology object): choosing anew (labels, ranking) costs host time on
    every call, a remembered one a dictionary lookup. topology=None means calibrate(device) as it was at the
    first call."""
    import torch

    from ..device import resolve_device

    if not torch.cuda.is_available():
        return Selection((), None, None, "no CUDA device")
    index = resolve_device(device)
    key = (index, n_sm, near, id(topology))
    hit = _selections.get(key)
    if hit is not None and hit[0] is topology:  # the topology kept in the value: its id cannot be recycled
        return hit[1]
    sel = _select(index, n_sm, near, topology)
    _selections[key] = (topology, sel)  # a fallback too: what makes green contexts unavailable stays so
    return sel


def _select(index: int, n_sm: int, near: int | None, topology) -> Selection:
    from ..analysis.labels import sm_labels
    from ..measure.calibration import calibration_for

    try:
        groups = sm_groups(index)
    except GreenUnavailable as exc:
        return Selection((), None, None, str(exc))
    topology = calibration_for(index, topology)  # a given one checked: another GPU's ranking would pick wrong SMs
    partition = sm_labels(topology).partition if near is not None else None
    chosen = choose_groups(groups, topology.chain_cycles, n_sm, partition=partition, near=near)
    try:
        stream = group_stream(chosen, index)
    except GreenUnavailable as exc:
        return Selection((), None, None, str(exc))
    return Selection(chosen, tuple(sorted(s for g in chosen for s in g.sms)), stream)


@contextlib.contextmanager
def on_sms(n_sm: int, *, near: int | None = None, topology=None, device=None):
    """Run the ops inside on the best SM groups holding at least n_sm SMs.

        with torch_l2topo.on_sms(32, near=0) as sel:   # the groups that lie in L2 partition 0
            y = torch.index_select(table, 0, rows)     # any op; it runs on sel.sms only

    Best: lowest mean chain latency of the calibration. The green stream waits for the work queued before the
    block, and the caller's stream waits for the block's work after it. Tensors allocated inside belong to the
    green stream, as with any side stream: call t.record_stream(caller_stream) before freeing one the caller
    still uses.

    Args:
        n_sm: SMs wanted, at least 1 and at most the SMs of the device's groups; the fewest best groups that
            hold them are used.
        near: an L2 partition (sm_labels' numbering, as partition_map's homes) whose groups come first; None: any.
        topology: the device's calibration (default: calibrate(device) as it was at the first call).
        device: the CUDA device (default: the current one).

    Returns:
        A context manager yielding the Selection: the chosen groups, their SM ids and the stream. Where green
        contexts are unavailable it warns once per reason and yields sms=None (reason says why): the ops then
        run on all SMs.

    Raises:
        ValueError: n_sm is out of range, or near is not a partition of the calibration.
        DeviceError: `device` is not a CUDA device of this machine.
        CalibrationMismatch: `topology` is another GPU's calibration.
        L2TopoError: calibrate()'s errors, when no topology is given and the device has no cached calibration.
    """
    import torch

    sel = select(n_sm, near=near, topology=topology, device=device)
    if sel.stream is None:
        _warn_once(sel.reason)
        yield sel
        return
    caller = torch.cuda.current_stream(sel.stream.device)
    before, after = _handoff_events(sel.stream)
    before.record(caller)
    sel.stream.wait_event(before)
    try:
        with torch.cuda.stream(sel.stream):
            yield sel
    finally:
        after.record(sel.stream)
        caller.wait_event(after)


_handoffs = threading.local()


def _handoff_events(stream) -> tuple:
    """Two events for the stream hand-offs into and out of `stream`, made once per thread and stream: creating
    them per entry (Stream.wait_stream does) is a large part of entering on_sms(). Re-recording an event is
    safe: a wait takes the event's state when it is queued. Per thread, so that two threads entering one
    selection at once never wait on each other's work."""
    import torch

    events = getattr(_handoffs, "events", None)
    if events is None:
        events = _handoffs.events = {}
    key = stream.cuda_stream
    if key not in events:
        events[key] = (torch.cuda.Event(), torch.cuda.Event())
    return events[key]
