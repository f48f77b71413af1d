"""@sm_aware: launch a kernel built on the placement helpers with the placement chosen by measurement.

Owns the choice of placement per launch. Per workload and device, Placement builds the plan of a policy
(plans.py) from the cached calibration, keeps it in a slots.PlanSlot (fixed addresses, so CUDA graph replays
keep reading it) and launches it in the policy's mode (the kernel's PLACE constexpr) on the grid that mode
needs. Policy "auto" times candidate (policy, CTAs per SM) pairs with CUDA events (choice.py) and keeps the
fastest, never one slower than a plain launch: the right placement depends on the kernel (its occupancy, its
bandwidth), not only on the map. Policy "measured" rebuilds its plan from the per-SM statistics the device
accumulates.

Entry points: sm_aware (SmAwareKernel) for @triton.jit kernels; Placement(policy=...)(launch, n_items=...,
device=...) for any launch, a CUDA kernel on cuda_ext/placement.cuh included: it calls launch(grid, plan,
state, place). Under torch.compile a call is a graph break; sm_aware's docstring gives the whole-graph recipe.
Docs: docs/usage.md ("Placing work").
"""
from __future__ import annotations

import hashlib
import re
import statistics
import time
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import DeviceError, PlacementError, check_choice
from ..layout import PLACE_RECORD
from ..measure.lean_launch import lean
from ..measure.recording import active_recorder
from . import choice
from .choice import Candidate, Decision
from .plans import POLICIES, POLICY_TABLE, SHARE_ORDERS, SpeedModel, Workload, make_plan
from .slots import CAPTURE_MESSAGE, PlanSlot, StatsSnapshot

AUTO = "auto"
POLICY_CHOICES = (*POLICIES, AUTO)
# What "auto" may try; choice.candidates() prunes it per workload (affinity only with item classes).
DEFAULT_CANDIDATES = ("plain", "partition_queues", "affine_weighted", "weighted")
DEFAULT_REFRESH = 16
TRITON_DEFAULT_WARPS = 4  # what Triton launches with when num_warps is not given
HELPERS = ("plan_start", "plan_next", "plan_finish")
PLACE_ARG = "PLACE"
# A GPU spin (~0.25 ms at 2 GHz) before each timed trial launch (see __call__): several times what the host takes
# to queue a partition_queues trial (its cursor reset, then the launch); half of it sometimes fell short.
HOST_GAP_CYCLES = 500_000


def _digest(a) -> str:
    a = np.ascontiguousarray(a)
    return f"{a.dtype.str}{a.shape}:" + hashlib.blake2b(a.tobytes(), digest_size=12).hexdigest()


def _by_value(obj) -> bool:
    """Whether a settled call names this argument by value (None or a number), not by identity."""
    return obj is None or isinstance(obj, (int, float, np.number))


def _ident(obj):
    """How a settled call's key names an argument: a number or None by value, anything else by identity."""
    return obj if _by_value(obj) else id(obj)


class _Settled:
    """A workload whose plan is final, found by identity, not content (hashing item_class costs host time per
    item): the call's key holds the ids of its item_class and loads_per_item arrays, and weak references to them
    say that the very objects are still the ones (a recycled id never matches). Arrays changed in place are not
    seen: pass a new array when the classes change."""

    __slots__ = ("refs", "index", "grid", "slot", "classes")

    def __init__(self, objects: tuple, index: int, grid: int, slot: PlanSlot, classes):
        self.refs = tuple(None if _by_value(obj) else weakref.ref(obj) for obj in objects)
        self.index, self.grid, self.slot, self.classes = index, grid, slot, classes

    def holds(self, item_class, loads_per_item) -> bool:
        a, b = self.refs
        return (a is None or a() is item_class) and (b is None or b() is loads_per_item)


@dataclass(frozen=True)
class WorkloadKey:
    """What identifies a workload's plan: item count, a hash of the item classes, the loads per item (a
    number, or a hash of the per-item array)."""

    n_items: int
    item_class: str | None
    loads_per_item: float | str


def _host_array(a, what: str):
    """A numpy view of a host array, list or tensor; a CUDA tensor is copied (a sync, refused in capture)."""
    if isinstance(a, torch.Tensor):
        if a.is_cuda and torch.cuda.is_current_stream_capturing():
            raise PlacementError(f"{what} is a CUDA tensor: it cannot be read during graph capture; pass a host "
                                 f"array (numpy or CPU tensor)")
        return a.detach().cpu().numpy()
    return np.asarray(a)


def workload_key(n_items: int, item_class=None, loads_per_item=1.0) -> WorkloadKey:
    """The key of a workload. item_class (and per-item loads) are hashed on every call, so a launch with them
    costs host time in proportion to the items (none with item_class=None)."""
    classes = None if item_class is None else _digest(_host_array(item_class, "item_class").astype(np.int8))
    loads = loads_per_item
    if isinstance(loads, (int, float, np.number)):
        loads = float(loads)
    else:
        loads = _digest(_host_array(loads, "loads_per_item").astype(np.float64))
    return WorkloadKey(int(n_items), classes, loads)


@dataclass
class _Entry:
    """Everything about one workload on one device: its plans (one slot per policy) and the choice."""

    workload_args: tuple  # (n_items, item_class, loads_per_item) as given: Workload is built on first use
    index: int            # the CUDA device
    slots: dict = field(default_factory=dict)    # Candidate.plan_key -> PlanSlot
    schedule: list = field(default_factory=list)  # auto: (Candidate, timed) of the next launches
    pending: list = field(default_factory=list)   # auto: (Candidate, spin, start, end events, host ms) not yet read
    timings: dict = field(default_factory=dict)   # auto: ms per launch per Candidate
    suspect: dict = field(default_factory=dict)   # auto: ms of trials whose host queueing outlasted the spin
    host: dict = field(default_factory=dict)      # auto: host ms per clean trial launch per Candidate
    chosen: Candidate | None = None
    trial_launches: int = 0
    launches: dict = field(default_factory=dict)  # launches per policy ("measured" refreshes every `refresh`)
    snapshot: StatsSnapshot | None = None         # measured: statistics on their way to the host
    baseline: dict | None = None                  # measured: statistics at the previous rebuild
    _workload: Workload | None = None

    @property
    def workload(self) -> Workload:
        if self._workload is None:
            n, classes, loads = self.workload_args
            classes = None if classes is None else _host_array(classes, "item_class")
            loads = loads if isinstance(loads, (int, float, np.number)) else _host_array(loads, "loads_per_item")
            self._workload = Workload(n, classes, loads)
        return self._workload


class Placement:
    """The policy machinery for launches of a kernel built on the placement helpers.

    policy: one of plans.POLICIES (POLICY_TABLE says what each is) or "auto". ctas_per_sm: CTAs per SM of a
    persistent policy's grid (default: as many as the kernel holds at once, capped by the items); "plain" and
    "partition_queues" launch one program per item (per chunk). chunk: items a "partition_queues" program claims
    per atomic. max_ctas_per_sm: CTAs of the kernel an SM holds (SmAwareKernel reads the compiled kernel; else
    1). topology: the device's calibration (default: calibrate(device), on first use). tail_fraction,
    share_order: make_plan's (None: its default). k: SMs of "fastest". refresh: launches between "measured"
    rebuilds (eager only). trials, tolerance, candidates: timed launches per "auto" candidate, how much faster
    than plain another must be to be kept, the policies "auto" may try (choice.candidates prunes them).
    decisions: per WorkloadKey, what "auto" did (a choice.Decision: .explain() says it in words).

    Launches of one workload and policy share one state tensor (its cursors): launch them on one stream (eager
    launches and graph replays alike); two at once on two streams would split the items between them.
    """

    def __init__(self, *, policy: str = AUTO, ctas_per_sm: int | None = None, chunk: int = 1,
                 max_ctas_per_sm: int | None = None, topology=None, tail_fraction: float | None = None,
                 share_order: str | None = None, k: int | None = None, refresh: int = DEFAULT_REFRESH,
                 trials: int = choice.DEFAULT_TRIALS, tolerance: float = choice.DEFAULT_TOLERANCE,
                 candidates=DEFAULT_CANDIDATES):
        check_choice("policy", policy, POLICY_CHOICES)
        if share_order is not None:
            check_choice("share_order", share_order, SHARE_ORDERS)
        for name, value in (("ctas_per_sm", ctas_per_sm), ("chunk", chunk), ("max_ctas_per_sm", max_ctas_per_sm),
                            ("refresh", refresh), ("trials", trials)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not 0 <= tolerance < 1:
            raise ValueError(f"tolerance must be in [0, 1), got {tolerance!r}")
        for p in candidates:
            check_choice("candidate policy", p, POLICIES)
        if policy != AUTO and ctas_per_sm is not None and POLICY_TABLE[policy].mode != POLICY_TABLE["dynamic"].mode:
            raise ValueError(f"ctas_per_sm applies to persistent policies only, not {policy!r}: it launches one "
                             f"program per item")
        self.policy, self.ctas_per_sm, self.chunk, self.max_ctas_per_sm = policy, ctas_per_sm, chunk, max_ctas_per_sm
        self.topology, self.k, self.refresh, self.trials = topology, k, refresh, trials
        self.tolerance, self.candidates = tolerance, tuple(candidates)
        options = {"tail_fraction": tail_fraction, "share_order": share_order}
        self.plan_options = {name: value for name, value in options.items() if value is not None}
        self.decisions: dict = {}
        self.record_name: str | None = None  # the kernel name CTA records carry (SmAwareKernel: the Triton name)
        self._entries: dict = {}    # (device index, WorkloadKey) -> _Entry
        self._settled: dict = {}    # (device index, n_items, _ident of the classes and loads) -> _Settled
        self._devices: dict = {}    # device index -> (Topology, SpeedModel)

    # ---- the launch --------------------------------------------------------------------------------------
    def __call__(self, launch, *, n_items: int, item_class=None, loads_per_item=1.0, device=None) -> None:
        """Launch through launch(grid, plan, state, place) on the current stream of `device` (default:
        current)."""
        settled, fast = self._settled_for(device, n_items, item_class, loads_per_item)
        if settled is not None:
            if torch.cuda.current_device() == settled.index:  # entering torch.cuda.device costs host time
                return self._launch_settled(launch, settled)
            with torch.cuda.device(settled.index):
                return self._launch_settled(launch, settled)
        from ..device import resolve_device

        index = resolve_device(device)
        with torch.cuda.device(index):
            key = workload_key(n_items, item_class, loads_per_item)
            if torch.cuda.is_current_stream_capturing():
                # Use the current plan: record no events, allocate nothing, load nothing. Before "auto" has
                # decided, plain (its first trial built it): a graph must not freeze a trial candidate in.
                entry = self._entries.get((index, key))
                cand = None if entry is None else (self._final(entry) or Candidate(choice.PLAIN))
                slot = None if cand is None else entry.slots.get(cand.plan_key)
                if slot is None:
                    raise PlacementError(CAPTURE_MESSAGE)
                self._launch(launch, index, cand, slot, n_items, item_class)
                return
            entry = self._entry(index, key, n_items, item_class, loads_per_item)
            self._read_timings(key, entry, index)
            cand, timed = self._next(entry, index, n_items)
            slot = self._slot(index, entry, cand)
            if cand.policy == "measured":
                self._refresh_measured(entry, slot)
            if timed:
                # Keep the GPU busy while this host queues the launch, so that the events time the kernel and not
                # the host's launch cost (tens of us for a Triton launch: kernels of a few us would all time alike
                # and noise would pick the winner). Whether the spin covered the host is checked when the events
                # are read: the host's queueing time against the spin's own GPU time (_read_timings).
                spin, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
                host0 = time.perf_counter()
                spin.record()
                torch.cuda._sleep(HOST_GAP_CYCLES)
                start.record()
            grid = self._launch(launch, index, cand, slot, n_items, item_class)
            if timed:
                host_ms = (time.perf_counter() - host0) * 1e3
                end.record()
                entry.pending.append((cand, spin, start, end, host_ms))
            if self.policy == AUTO and entry.chosen is None:
                entry.trial_launches += 1
            entry.launches[cand.policy] = entry.launches.get(cand.policy, 0) + 1
            if cand.policy == "measured" and entry.snapshot is None and entry.launches["measured"] % self.refresh == 0:
                entry.snapshot = slot.snapshot()
            if cand == self._final(entry) and cand.policy != "measured":
                # from now on this workload always launches this slot: skip the bookkeeping
                try:
                    self._settled[fast] = _Settled((item_class, loads_per_item), index, grid, slot, item_class)
                except TypeError:  # an argument that cannot be weakly referenced (a list): hashed every call
                    pass

    def _settled_for(self, device, n_items: int, item_class, loads_per_item) -> tuple:
        """(the _Settled of this call's workload or None, the key it is or will be kept under)."""
        index = device.index if isinstance(device, torch.device) else device
        if index is None:
            index = torch.cuda.current_device()
        key = (index, n_items, _ident(item_class), _ident(loads_per_item))
        settled = self._settled.get(key)
        return (settled if settled is not None and settled.holds(item_class, loads_per_item) else None), key

    def _launch_settled(self, launch, settled: _Settled) -> None:
        launch(*self._settled_launch(settled))

    def _settled_launch(self, settled: _Settled) -> tuple:
        """(grid, plan, state, place) of a decided workload's launch, its slot prepared for it."""
        slot = settled.slot
        slot.prepare()
        return settled.grid, slot.plan, slot.state, slot.loaded.mode | self._record_bit(settled.index, slot,
                                                                                         settled.classes)

    def _launch(self, launch, index: int, cand: Candidate, slot: PlanSlot, n_items: int, item_class) -> int:
        grid = cand.grid(self._device(index)[1].n_sm, n_items)
        slot.prepare()
        launch(grid, slot.plan, slot.state, slot.loaded.mode | self._record_bit(index, slot, item_class))
        return grid

    def _record_bit(self, index: int, slot: PlanSlot, item_class) -> int:
        """PLACE_RECORD when profiling records this GPU's CTAs (measure/recording.py) and the kernel has a
        name to record under, with the plan's header pointing at the recorder; else 0 (nothing compiled in).
        A slot first used for recording inside a CUDA graph capture is not recorded there: its header cannot
        be written during capture (launch it once while recording before capturing)."""
        if self.record_name is None:
            return 0
        rec = active_recorder(index)
        if rec is None:
            return 0
        if slot.recorder is None or slot.recorder[0] != id(rec):
            if torch.cuda.is_current_stream_capturing():
                return 0
            classes = None if item_class is None else _host_array(item_class, "item_class")
            slot.attach_recorder(rec, rec.register(self.record_name, classes))
        return PLACE_RECORD

    def _final(self, entry: _Entry) -> Candidate | None:
        """The candidate a workload launches once it is decided (None: "auto" still on trial)."""
        if self.policy == AUTO:
            return entry.chosen
        return self._fixed_candidate(entry)

    def _fixed_candidate(self, entry: _Entry) -> Candidate:
        return self._candidate_of(self.policy, entry.index, entry.workload_args[0])

    def grid(self, device=None, *, policy: str | None = None, n_items: int | None = None) -> int:
        """CTAs of a launch of `policy` (default: the decorator's) on `device` for n_items items."""
        from ..device import resolve_device

        policy = self.policy if policy is None else policy
        check_choice("policy", policy, POLICIES)
        if n_items is None:
            raise ValueError("pass n_items: the grid depends on the item count")
        index = resolve_device(device)
        cand = self._candidate_of(policy, index, n_items)
        return cand.grid(self._device(index)[1].n_sm if cand.ctas_per_sm else 0, n_items)

    @staticmethod
    def place(policy: str) -> int:
        """The PLACE constexpr (layout.PLACE_*) a kernel is launched with under `policy`."""
        check_choice("policy", policy, POLICIES)
        return POLICY_TABLE[policy].mode

    def plan_tensors(self, n_items: int, item_class=None, loads_per_item=1.0, *, policy: str | None = None,
                     device=None):
        """(plan, state) tensors of a fixed policy for this workload, built and loaded now (eagerly): for a
        torch.library.triton_op of your own (sm_aware's docstring). policy: default the decorator's if it is
        fixed, else what "auto" chose for this workload, else "plain"."""
        from ..device import resolve_device

        index = resolve_device(device)
        with torch.cuda.device(index):
            entry = self._entry(index, workload_key(n_items, item_class, loads_per_item), n_items, item_class,
                                loads_per_item)
            if policy is None and self.policy == AUTO:
                cand = entry.chosen or Candidate(choice.PLAIN)
            else:
                cand = self._candidate_of(self.policy if policy is None else policy, index, n_items)
            slot = self._slot(index, entry, cand)
            return slot.plan, slot.state

    def slot(self, n_items: int, item_class=None, loads_per_item=1.0, *, policy: str, device=None) -> PlanSlot:
        """The PlanSlot of `policy` for this workload, if a launch built it (for its stats() and error()): what
        "auto" chose, if of that policy, else the fixed policy's."""
        from ..device import resolve_device

        index = resolve_device(device)
        entry = self._entries.get((index, workload_key(n_items, item_class, loads_per_item)))
        chosen = None if entry is None else entry.chosen
        cand = chosen if chosen is not None and chosen.policy == policy else self._candidate_of(policy, index, n_items)
        key = cand.plan_key
        if entry is None or key not in entry.slots:
            raise PlacementError(f"no plan of policy {policy!r} was built for this workload yet")
        return entry.slots[key]

    def _candidate_of(self, policy: str, index: int, n_items: int) -> Candidate:
        """What a fixed `policy` launches for n_items on GPU `index`: a persistent policy at the decorator's CTAs
        per SM, else as many as the kernel holds and the items fill."""
        check_choice("policy", policy, POLICIES)
        if POLICY_TABLE[policy].mode != POLICY_TABLE["dynamic"].mode:
            return Candidate(policy, chunk=self.chunk if policy == choice.QUEUES else 1)
        n_sm = self._device(index)[1].n_sm
        return Candidate(policy, self.ctas_per_sm or choice.persistent_ctas(self._max_ctas(index), n_items, n_sm))

    def explain(self) -> str:
        """Every "auto" decision so far, in words (which candidates, their medians, the choice and why)."""
        if not self.decisions:
            return "no decision yet: auto decides after its trial launches" if self.policy == AUTO \
                else f"fixed policy {self.policy!r}: {POLICY_TABLE[self.policy].summary}"
        return "\n\n".join(f"workload of {key.n_items} items"
                           + (" with classes" if key.item_class else "") + f": {d.explain()}"
                           for key, d in self.decisions.items())

    # ---- plans -------------------------------------------------------------------------------------------
    def _device(self, index: int):
        if index not in self._devices:
            from ..measure.calibration import calibration_for

            topo = calibration_for(index, self.topology)
            self._devices[index] = (topo, SpeedModel.from_topology(topo))
        return self._devices[index]

    def _max_ctas(self, index: int) -> int | None:
        """CTAs of the kernel (compiled for shares mode) one SM holds: max_ctas_per_sm, else unknown (None)."""
        return self.max_ctas_per_sm

    def _entry(self, index: int, key: WorkloadKey, n_items: int, item_class, loads_per_item) -> _Entry:
        entry = self._entries.get((index, key))
        if entry is None:
            entry = self._entries[(index, key)] = _Entry((n_items, item_class, loads_per_item), index)
        return entry

    def _slot(self, index: int, entry: _Entry, cand: Candidate) -> PlanSlot:
        if cand.plan_key not in entry.slots:
            _, speeds = self._device(index)
            slot = PlanSlot(torch.device("cuda", index), speeds.n_sm)
            k = self.k if POLICY_TABLE[cand.policy].needs_k else None
            grid = cand.grid(speeds.n_sm, entry.workload_args[0]) if cand.ctas_per_sm else None
            # "measured" starts as weighted on the calibration's speeds; _refresh_measured replaces them
            slot.load(make_plan(cand.policy, speeds, entry.workload, k=k, chunk=cand.chunk, grid=grid,
                                **self.plan_options))
            entry.slots[cand.plan_key] = slot
        return entry.slots[cand.plan_key]

    # ---- auto --------------------------------------------------------------------------------------------
    def _next(self, entry: _Entry, index: int, n_items: int) -> tuple[Candidate, bool]:
        """(candidate, timed) of the next launch."""
        if self.policy != AUTO:
            return self._fixed_candidate(entry), False
        if entry.chosen is None and not entry.schedule and not entry.timings:
            cands = choice.candidates(self.candidates, has_classes=entry.workload_args[1] is not None,
                                      n_items=n_items, n_sm=self._device(index)[1].n_sm,
                                      max_ctas_per_sm=self._max_ctas(index), chunk=self.chunk)
            entry.schedule = choice.trial_schedule(cands, self.trials)
            entry.timings = {c: [] for c in cands}
        if entry.schedule:
            return entry.schedule.pop(0)
        # Trials queued, their events not all read yet: plain, which no choice may be slower than.
        return entry.chosen or Candidate(choice.PLAIN), False

    def _read_timings(self, key: WorkloadKey, entry: _Entry, index: int) -> None:
        """Collect the timings of completed trial launches (never waiting), and decide once all are in. A trial
        whose host queueing took longer than its spin ran on the GPU may hold the host's time (the GPU waited
        for the launch inside the timed window): it is kept apart and used only for a candidate without a clean
        one."""
        still = []
        for cand, spin, start, end, host_ms in entry.pending:
            if end.query():
                clean = host_ms < spin.elapsed_time(start)
                (entry.timings if clean else entry.suspect).setdefault(cand, []).append(start.elapsed_time(end))
                if clean:  # a host stall past the spin (a GC, a preemption) says nothing of the launch's cost
                    entry.host.setdefault(cand, []).append(host_ms)
            else:
                still.append((cand, spin, start, end, host_ms))
        entry.pending = still
        if self.policy == AUTO and entry.chosen is None and entry.timings and not entry.schedule \
                and not entry.pending:
            timings = {c: t or entry.suspect.get(c, []) for c, t in entry.timings.items()}
            entry.chosen = choice.choose(timings, self.tolerance, entry.host)
            self.decisions[key] = Decision(entry.chosen, {c: statistics.median(t) for c, t in timings.items() if t},
                                           {c: list(t) for c, t in timings.items()}, entry.trial_launches,
                                           self._max_ctas(index), sum(map(len, entry.suspect.values())),
                                           choice.host_extra(entry.host))

    # ---- measured ----------------------------------------------------------------------------------------
    def _refresh_measured(self, entry: _Entry, slot: PlanSlot) -> None:
        """Rebuild the "measured" plan from the statistics of the launches since the last rebuild, once their
        copy has arrived (polled, never waited for)."""
        if entry.snapshot is None or not entry.snapshot.ready():
            return
        now = entry.snapshot.stats()
        entry.snapshot = None
        before = entry.baseline or {name: np.zeros_like(v) for name, v in now.items()}
        entry.baseline = now
        items, busy = now["items"] - before["items"], now["busy_ns"] - before["busy_ns"]
        if ((items > 0) & (busy > 0)).any():  # SpeedModel.from_measured needs one SM that did measurable work
            plan = make_plan("measured", SpeedModel.from_measured(items, busy), entry.workload, **self.plan_options)
            slot.load(plan)


class SmAwareKernel(Placement):
    """A @triton.jit kernel launched through Placement: kernel(*args, n_items=..., item_class=None,
    loads_per_item=1.0, **kwargs) launches fn[(grid,)](*args, plan, state, PLACE=place, num_warps=...,
    **kwargs) on the current stream of the tensors' device. fn is the kernel itself (for
    torch.library.wrap_triton). The CTAs per SM of persistent candidates come from the kernel compiled in shares
    mode (occupancy.triton_occupancy), read at its first compile."""

    def __init__(self, fn, *, num_warps: int | None = None, **options):
        check_kernel(fn)
        self.fn = fn
        self._lean = lean(fn)  # the compiled kernel launched without Triton's per-launch check of its globals
        self.num_warps = TRITON_DEFAULT_WARPS if num_warps is None else num_warps
        super().__init__(**options)
        self.__name__ = getattr(fn, "__name__", "sm_aware_kernel")
        self.__doc__ = getattr(fn, "__doc__", None)
        self.record_name = self.__name__  # Kineto names a Triton kernel's launches by its function name
        self._occupancy: dict = {}  # device index -> CTAs per SM of the shares-mode kernel
        self._call = None           # (args, kwargs) of the call being launched, for the occupancy compile

    def __call__(self, *args, n_items: int, item_class=None, loads_per_item=1.0, **kwargs) -> None:
        if torch.compiler.is_compiling():  # a graph break: sm_aware's docstring says why and what else works
            return self._outside_graph(*args, n_items=n_items, item_class=item_class,
                                       loads_per_item=loads_per_item, **kwargs)
        return self._eager(args, n_items, item_class, loads_per_item, kwargs)

    def _eager(self, args: tuple, n_items: int, item_class, loads_per_item, kwargs: dict) -> None:
        device = cuda_device_of(args, self.__name__)
        kernel, options = self._lean, {**kwargs, "num_warps": self.num_warps}
        settled, _ = self._settled_for(device, n_items, item_class, loads_per_item)
        if settled is not None and torch.cuda.current_device() == settled.index:
            # a decided workload on the current device: the launch itself, as a bare launch would make it
            grid, plan, state, options[PLACE_ARG] = self._settled_launch(settled)
            kernel[(grid,)](*args, plan, state, **options)
            return

        def launch(grid, plan, state, place):
            options[PLACE_ARG] = place
            kernel[(int(grid),)](*args, plan, state, **options)

        self._call = (args, kwargs)
        try:
            super().__call__(launch, n_items=n_items, item_class=item_class, loads_per_item=loads_per_item,
                             device=device)
        finally:
            self._call = None

    def _traced(self, *args, n_items: int, item_class=None, loads_per_item=1.0, **kwargs) -> None:
        self._eager(args, n_items, item_class, loads_per_item, kwargs)

    # Entered only while torch.compile traces a call (disabled, the call runs eagerly): not on every eager call,
    # where the decorator's own wrapper costs host time.
    _outside_graph = torch.compiler.disable(_traced)

    def occupancy(self, *args, **kwargs) -> int:
        """CTAs of this kernel, compiled in shares mode for these arguments (those of a call, without n_items),
        that one SM holds at once: what bounds a persistent candidate's CTAs per SM. Compiled once per device
        (a Triton warmup, no launch) and kept."""
        device = cuda_device_of(args, self.__name__)
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in self._occupancy:
            from .occupancy import triton_occupancy

            with torch.cuda.device(index):
                plan = torch.zeros(1, dtype=torch.int32, device=device)  # any valid pointers: nothing runs
                state = torch.zeros(1, dtype=torch.int64, device=device)
                compiled = self.fn.warmup(*args, plan, state, grid=(1,), num_warps=self.num_warps, **kwargs,
                                          **{PLACE_ARG: POLICY_TABLE["dynamic"].mode})
                self._occupancy[index] = triton_occupancy(compiled, index)
        return self._occupancy[index]

    def _max_ctas(self, index: int) -> int | None:
        if self.max_ctas_per_sm is not None:
            return self.max_ctas_per_sm
        if self._call is not None:
            args, kwargs = self._call
            return self.occupancy(*args, **kwargs)
        return self._occupancy.get(index)


def cuda_device_of(args, name: str):
    """The CUDA device of a kernel call's tensors; DeviceError when none is on a CUDA GPU."""
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_cuda:
            return a.device
    where = "" if torch.cuda.is_available() else " (no CUDA GPU is available here)"
    raise DeviceError(f"{name} is an @sm_aware kernel: it runs on a CUDA GPU, and none of its tensor "
                      f"arguments is on one{where}")


def check_kernel(fn) -> None:
    """Raise PlacementError unless fn is a @triton.jit function with the parameters plan_ptr, state_ptr and the
    PLACE constexpr in that order (after the call's positional arguments; any parameter after PLACE is passed
    by keyword) and whose source calls plan_start, plan_next and plan_finish: a kernel written without the
    placement helpers gets a clear error, not a wrong result."""
    names, src = getattr(fn, "arg_names", None), getattr(fn, "src", None)
    if names is None or not isinstance(src, str):
        raise PlacementError(f"@sm_aware takes a @triton.jit function (put @sm_aware above @triton.jit); got "
                             f"{type(fn).__name__}")
    name = getattr(fn, "__name__", "the kernel")
    names = list(names)
    at = names.index("plan_ptr") if "plan_ptr" in names else -1
    if at < 0 or names[at:at + 3] != ["plan_ptr", "state_ptr", PLACE_ARG]:
        raise PlacementError(f"{name} must take plan_ptr, state_ptr, {PLACE_ARG}: tl.constexpr, in that order, "
                             f"after its own positional arguments (got {names}): @sm_aware passes the plan tensors "
                             f"and the placement mode there")
    missing = [h for h in HELPERS if not re.search(rf"\b{h}\s*\(", src)]
    if missing:
        raise PlacementError(f"{name} does not call {', '.join(missing)}: an @sm_aware kernel must take its items "
                             f"through the helpers of torch_l2topo.triton_kernels.placement")


def sm_aware(fn=None, *, policy: str = AUTO, ctas_per_sm: int | None = None, num_warps: int | None = None,
             topology=None, tail_fraction: float | None = None, **options):
    """Decorate a @triton.jit kernel built on the placement helpers so that calling it places its items on SMs.

    The kernel takes plan_ptr, state_ptr, PLACE: tl.constexpr after its own positional arguments and calls
    plan_start, plan_next and plan_finish (triton_kernels/placement.py). Usable bare (@sm_aware) or with options
    (@sm_aware(policy="plain")). Call the result as kernel(*args, n_items=..., item_class=None,
    loads_per_item=1.0, **kwargs) on CUDA tensors; kernel.explain() says what "auto" tried and kept.

    Args:
        fn: the @triton.jit function (given when used bare).
        policy: "auto" (time candidates, keep the fastest, never slower than plain) or one of plans.POLICIES.
        ctas_per_sm: CTAs per SM of a persistent policy's grid (default: as many as the compiled kernel holds).
        num_warps: warps per program (default: Triton's, 4).
        topology: the device's calibration (default: torch_l2topo.calibrate(device), on first use).
        tail_fraction: plans.make_plan's share of the items left to the dynamic tail (None: its default).
        **options: Placement's other options (chunk, max_ctas_per_sm, share_order, k, refresh, trials,
            tolerance, candidates).

    Returns:
        An SmAwareKernel; with fn None, the decorator that makes one.

    Raises:
        PlacementError: fn is not a @triton.jit function with those parameters and helper calls; or, when
            called, a launch under CUDA graph capture finds no plan built yet (launch once eagerly first).
        ValueError: an option is out of range or not one of its choices.
        DeviceError: (when called) no tensor argument is on a CUDA GPU.

    torch.compile: a call inside a compiled region is a graph break (torch.compiler.disable), since the policy
    logic is host-side state that a triton_op body cannot hold. To compile the region whole, fix the policy and
    pass the plan tensors to a torch.library.triton_op of your own (tests/test_gpu_placement.py does):

        plan, state = kernel.plan_tensors(n_items=n, policy="weighted")   # eager, outside the region
        grid, place = kernel.grid(policy="weighted", n_items=n), kernel.place("weighted")

        @torch.library.triton_op("mylib::chase", mutates_args={"ends", "state"})  # exactly what the kernel writes
        def chase_op(starts: torch.Tensor, ends: torch.Tensor, n_loads: int, plan: torch.Tensor,
                     state: torch.Tensor, grid: int, place: int) -> None:
            torch.library.wrap_triton(kernel.fn)[(grid,)](starts, ends, n_loads, plan, state, place, num_warps=1)

    A queues-mode policy ("partition_queues") also needs its cursors zeroed before each launch: PlanSlot.prepare,
    a torch op, may stand in the op body too.
    """
    def wrap(f):
        return SmAwareKernel(f, policy=policy, ctas_per_sm=ctas_per_sm, num_warps=num_warps, topology=topology,
                             tail_fraction=tail_fraction, **options)

    return wrap if fn is None else wrap(fn)
