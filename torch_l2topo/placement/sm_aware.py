"""@sm_aware: launch a persistent kernel with an SM-aware work plan, the plan's policy chosen by measurement.

Owns the choice of plan per launch: per workload and device it builds the plan of a policy (plans.py) from
the cached calibration, keeps it in a launcher.PlanSlot (fixed addresses, so CUDA graph replays keep
reading it), and for policy "auto" times candidate policies with CUDA events and keeps the fastest, for
"measured" rebuilds the plan from the per-SM statistics the device accumulates.

    @sm_aware(policy="auto")
    @triton.jit
    def gather_rows(x_ptr, idx_ptr, out_ptr, dim, plan_ptr, state_ptr, BLOCK: tl.constexpr):
        ...the loop of triton_kernels/placement.py's docstring...

    gather_rows(x, idx, out, dim, BLOCK=64, n_items=n_rows)   # one item per row here
    gather_rows.decisions                                      # what "auto" chose, and the timings

Placement is the same machinery for any launch (a CUDA kernel built on cuda_ext/placement.cuh included):
Placement(policy=...)(launch, n_items=..., device=...) calls launch(grid, plan, state).

Why measure: the right placement depends on the kernel, not only on the map. On the H200 a latency-bound
chase over lines homed in the SM's own L2 partition ran 6.8% faster, but an embedding-bag-like gather at 64
warps/SM ran about 55% slower when every SM read only its own partition's rows (affinity halves the usable
L2 bandwidth). So "auto" starts from plain dynamic scheduling, tries the candidates, and keeps another policy
only when it beats dynamic by more than `tolerance`: the default is never slower than a plain launch.

torch.compile: the policy logic is host-side Python with state (CUDA events, plan rebuilds, statistics
read-back), which a triton_op body cannot hold (it may only call PyTorch ops and wrapped Triton kernels, and
it is traced once). So a call of an @sm_aware kernel inside a compiled region is a graph break
(torch.compiler.disable): the code before and after it is compiled, the launch runs eagerly with every policy
working as outside. To keep the region whole, fix the policy and pass the plan tensors in as inputs of your
own torch.library.triton_op:

    gather_rows_jit = gather_rows.fn                          # the @triton.jit function itself
    plan, state = gather_rows.plan_tensors(n_items=n_rows, policy="weighted")  # eager, outside the region
    grid = gather_rows.grid(policy="weighted", n_items=n_rows)

    @torch.library.triton_op("mylib::gather_rows", mutates_args={"out", "state"})  # exactly what the kernel writes
    def gather_rows_op(x: torch.Tensor, idx: torch.Tensor, out: torch.Tensor, dim: int, plan: torch.Tensor,
                       state: torch.Tensor, grid: int) -> None:
        torch.library.wrap_triton(gather_rows_jit)[(grid,)](x, idx, out, dim, plan, state, BLOCK=64, num_warps=4)

    torch.compile(lambda x, idx, out: gather_rows_op(x, idx, out, dim, plan, state, grid), fullgraph=True)

The state is written (cursors, statistics), the plan only read. Inductor's own analysis of which tensors a
user kernel writes stops at inline asm (%globaltimer) and then treats every tensor argument as written (it
logs a warning; the result is still correct). tests/test_gpu_placement.py runs both ways with the checksum
kernel, the op under the aot_eager and inductor backends.
"""
from __future__ import annotations

import hashlib
import re
import statistics
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import PlacementError, check_choice
from .plans import DIRECT_POLICIES, POLICIES, SpeedModel, Workload, make_plan
from .slots import CAPTURE_MESSAGE, PlanSlot, StatsSnapshot

AUTO = "auto"
POLICY_CHOICES = (*POLICIES, AUTO)
# "measured" is no candidate: its plan changes while it runs, so a few timed launches do not say what it
# will do (on the H200 gather it won trials by noise and then ran 40% slower than dynamic).
# "plain" (one program per item, placed by the hardware) is one: a persistent grid pays one atomic claim per
# item, which on short items (the H200 gather: 0.063 ms plain, 0.106 ms at best persistent) costs more than
# placement gains. With it, "auto" is never slower than a plain launch of the same kernel.
DEFAULT_CANDIDATES = ("dynamic", "uniform", "weighted", "partition_affine", "affine_weighted", "plain")
AFFINITY_POLICIES = ("partition_affine", "affine_weighted")
# Loads in flight per SM (resident warps x independent loads per warp) from which affinity is not tried.
# Measured on the H200 before this package: affinity helps a latency-bound SM (one chain per SM: 6.8% faster),
# still helps a little at 16 warps/SM (-1 to -2%), and costs bandwidth at 64 warps/SM (~55% slower). Only the
# last point is skipped: "auto" would reject affinity there anyway, skipping saves its trial launches.
HIGH_PARALLELISM = 64
DEFAULT_TRIALS = 5
DEFAULT_TOLERANCE = 0.01
DEFAULT_REFRESH = 16
TRITON_DEFAULT_WARPS = 4  # what Triton launches with when num_warps is not given
HELPERS = ("plan_start", "plan_next", "plan_finish")


def choose_policy(timings: dict, tolerance: float = DEFAULT_TOLERANCE) -> str:
    """The policy with the lowest median time, unless "dynamic" was timed and the winner does not beat it
    clearly: by more than `tolerance` (a fraction) in median, and with its upper quartile below dynamic's
    median (short kernels time noisily: one lucky trial must not decide). Then "dynamic". Candidates without
    timings are ignored."""
    medians = {p: statistics.median(t) for p, t in timings.items() if len(t)}
    if not medians:
        raise ValueError("choose_policy needs at least one candidate with timings")
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance!r}")
    best = min(medians, key=medians.get)
    if "dynamic" in medians and best != "dynamic":
        upper = float(np.quantile(timings[best], 0.75))
        if medians[best] >= medians["dynamic"] * (1 - tolerance) or upper >= medians["dynamic"]:
            return "dynamic"
    return best


def candidate_policies(candidates, has_classes: bool, parallelism: float | None) -> tuple:
    """The candidates "auto" times for one workload: affinity policies only when items have classes
    (item_class given) and the kernel keeps few loads in flight per SM (parallelism < HIGH_PARALLELISM or
    unknown). "dynamic" is always timed first: it is the reference the others must beat."""
    for p in candidates:
        check_choice("candidate policy", p, POLICIES)
    skip_affinity = not has_classes or (parallelism is not None and parallelism >= HIGH_PARALLELISM)
    rest = [p for p in candidates if p != "dynamic" and not (skip_affinity and p in AFFINITY_POLICIES)]
    return ("dynamic", *dict.fromkeys(rest))


def trial_schedule(candidates, trials: int) -> list:
    """(policy, timed) of the launches "auto" spends on trials: one untimed round over the candidates first
    (it compiles the kernel and loads every plan: on the H200 the first launches of a plan ran up to 40%
    slower than later ones), then `trials` timed rounds: interleaving spreads clock and cache drift over all
    candidates alike."""
    return [(p, False) for p in candidates] + [(p, True) for _ in range(trials) for p in candidates]


def _digest(a) -> str:
    a = np.ascontiguousarray(a)
    return f"{a.dtype.str}{a.shape}:" + hashlib.blake2b(a.tobytes(), digest_size=12).hexdigest()


def _fast_key(device, n_items, item_class, loads_per_item):
    """(key, objects, weak refs) naming a call's workload by identity, not content, or None where an argument
    cannot be weakly referenced (a list). Hashing item_class costs ~2 ms per million items; once a workload's
    plan is final, a call with the very same array objects (checked through the weak refs, so a recycled id
    never matches) reuses it. Arrays changed in place are not seen: pass a new array when the classes change."""
    objects, refs, ident = (item_class, loads_per_item), [], []
    for obj in objects:
        if obj is None or isinstance(obj, (int, float, np.number)):
            refs.append(None)
            ident.append(obj)
        else:
            try:
                refs.append(weakref.ref(obj))
            except TypeError:
                return None
            ident.append(id(obj))
    index = device.index if isinstance(device, torch.device) else device
    if index is None:
        index = torch.cuda.current_device()
    return (index, int(n_items), *ident), objects, tuple(refs)


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
    """The key of a workload. item_class (and per-item loads) are hashed on every call, about 2 ms of host
    time per million items: a launch costs that much more than with item_class=None."""
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
    slots: dict = field(default_factory=dict)
    schedule: list = field(default_factory=list)  # auto: policies of the next launches, timed
    pending: list = field(default_factory=list)   # auto: (policy, start event, end event) not yet read
    timings: dict = field(default_factory=dict)   # auto: ms per launch per candidate
    chosen: str | None = None
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
    """The policy machinery for launches of a persistent kernel built on the placement helpers.

    policy: one of plans.POLICIES, or "auto". ctas_per_sm: CTAs per SM of the grid (ctas_per_sm x n_sm;
    policy "plain" launches one CTA per item instead).
    occupancy: resident warps per SM, mlp: independent loads in flight per warp (both for "auto": their
    product at or above HIGH_PARALLELISM skips the affinity candidates). topology: a calibration of the
    device (default: torch_l2topo.calibrate(device), on first use). tail_fraction: plans.make_plan's (None:
    its default). k: SMs of policy "fastest". refresh: launches between plan rebuilds of "measured" (eager
    only). trials: timed launches per "auto" candidate. tolerance: how much faster than "dynamic" another
    policy must be for "auto" to keep it. candidates: the policies "auto" may try.

    decisions: per WorkloadKey, what "auto" chose: {"policy", "medians" (ms), "timings" (ms per launch)}.

    Launches of one workload and policy share one state tensor (its cursors): they must not overlap. Launch
    them on one stream (eager launches and graph replays alike); two at once on two streams would split
    the items between them.
    """

    def __init__(self, *, policy: str = AUTO, ctas_per_sm: int = 1, occupancy: float | None = None,
                 mlp: float | None = None, topology=None, tail_fraction: float | None = None, k: int | None = None,
                 refresh: int = DEFAULT_REFRESH, trials: int = DEFAULT_TRIALS, tolerance: float = DEFAULT_TOLERANCE,
                 candidates=DEFAULT_CANDIDATES):
        check_choice("policy", policy, POLICY_CHOICES)
        for name, value in (("ctas_per_sm", ctas_per_sm), ("refresh", refresh), ("trials", trials)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not 0 <= tolerance < 1:
            raise ValueError(f"tolerance must be in [0, 1), got {tolerance!r}")
        for p in candidates:
            check_choice("candidate policy", p, POLICIES)
        self.policy, self.ctas_per_sm, self.occupancy, self.mlp = policy, ctas_per_sm, occupancy, mlp
        self.topology, self.k, self.refresh, self.trials = topology, k, refresh, trials
        self.tolerance, self.candidates = tolerance, tuple(candidates)
        self.plan_options = {} if tail_fraction is None else {"tail_fraction": tail_fraction}
        self.decisions: dict = {}
        self._entries: dict = {}    # (device index, WorkloadKey) -> _Entry
        self._settled: dict = {}    # fast key -> (weak refs, device index, grid, slot) once a workload's plan is final
        self._devices: dict = {}    # device index -> (Topology, SpeedModel)

    # ---- the launch --------------------------------------------------------------------------------------
    def __call__(self, launch, *, n_items: int, item_class=None, loads_per_item=1.0, device=None) -> None:
        """Launch through launch(grid, plan, state) on the current stream of `device` (default: current)."""
        from ..device import resolve_device

        fast = _fast_key(device, n_items, item_class, loads_per_item)
        settled = self._settled.get(fast[0]) if fast else None
        if settled is not None and all(r is None or r() is obj for r, obj in zip(settled[0], fast[1])):
            _, index, grid, slot = settled
            if index == torch.cuda.current_device():
                launch(grid, slot.plan, slot.state)
            else:
                with torch.cuda.device(index):
                    launch(grid, slot.plan, slot.state)
            return
        index = resolve_device(device)
        with torch.cuda.device(index):
            key = workload_key(n_items, item_class, loads_per_item)
            if torch.cuda.is_current_stream_capturing():
                # Use the current plan: record no events, allocate nothing, load nothing.
                entry = self._entries.get((index, key))
                slot = None if entry is None else entry.slots.get(self._capture_policy(entry))
                if slot is None:
                    raise PlacementError(CAPTURE_MESSAGE)
                launch(self._grid(index, slot.loaded.direct, n_items), slot.plan, slot.state)
                return
            entry = self._entry(index, key, n_items, item_class, loads_per_item)
            self._read_timings(key, entry)
            policy, timed = self._next_policy(entry)
            slot = self._slot(index, entry, policy)
            if policy == "measured":
                self._refresh_measured(entry, slot)
            if timed:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            grid = self._grid(index, slot.loaded.direct, n_items)
            launch(grid, slot.plan, slot.state)
            if timed:
                end.record()
                entry.pending.append((policy, start, end))
            entry.launches[policy] = entry.launches.get(policy, 0) + 1
            if policy == "measured" and entry.snapshot is None and entry.launches[policy] % self.refresh == 0:
                entry.snapshot = slot.snapshot()
            final = policy == (self.policy if self.policy != AUTO else entry.chosen) and policy != "measured"
            if fast and final:  # from now on this workload always launches this slot: skip the bookkeeping
                self._settled[fast[0]] = (fast[2], index, grid, slot)

    def grid(self, device=None, *, policy: str | None = None, n_items: int | None = None) -> int:
        """CTAs of a launch of `policy` (default: the decorator's) on `device`: ctas_per_sm x its SM count, or
        n_items (at least 1) for policy "plain"."""
        from ..device import resolve_device

        policy = self.policy if policy is None else policy
        direct = policy in DIRECT_POLICIES
        if direct and n_items is None:
            raise ValueError(f"the grid of policy {policy!r} is one CTA per item: pass n_items")
        return self._grid(None if direct else resolve_device(device), direct, n_items)

    def _grid(self, index: int | None, direct: bool, n_items: int | None) -> int:
        return max(int(n_items), 1) if direct else self.ctas_per_sm * self._device(index)[0].n_sm

    def plan_tensors(self, n_items: int, item_class=None, loads_per_item=1.0, *, policy: str | None = None,
                     device=None):
        """(plan, state) tensors of a fixed policy for this workload, built and loaded now (eagerly): for a
        torch.library.triton_op of your own (module docstring). policy: default the decorator's if it is
        fixed, else what "auto" chose for this workload, else "dynamic"."""
        from ..device import resolve_device

        index = resolve_device(device)
        with torch.cuda.device(index):
            entry = self._entry(index, workload_key(n_items, item_class, loads_per_item), n_items, item_class,
                                loads_per_item)
            if policy is None:
                policy = self.policy if self.policy != AUTO else (entry.chosen or "dynamic")
            check_choice("policy", policy, POLICIES)
            slot = self._slot(index, entry, policy)
            return slot.plan, slot.state

    def slot(self, n_items: int, item_class=None, loads_per_item=1.0, *, policy: str, device=None) -> PlanSlot:
        """The PlanSlot of `policy` for this workload, if a launch built it (for its stats() and error())."""
        from ..device import resolve_device

        entry = self._entries.get((resolve_device(device), workload_key(n_items, item_class, loads_per_item)))
        if entry is None or policy not in entry.slots:
            raise PlacementError(f"no plan of policy {policy!r} was built for this workload yet")
        return entry.slots[policy]

    # ---- plans -------------------------------------------------------------------------------------------
    def _device(self, index: int):
        if index not in self._devices:
            from ..measure.calibration import calibration_for

            topo = calibration_for(index, self.topology)
            self._devices[index] = (topo, SpeedModel.from_topology(topo))
        return self._devices[index]

    def _parallelism(self) -> float | None:
        if self.occupancy is None:
            return None
        return self.occupancy * (1.0 if self.mlp is None else self.mlp)

    def _entry(self, index: int, key: WorkloadKey, n_items: int, item_class, loads_per_item) -> _Entry:
        entry = self._entries.get((index, key))
        if entry is None:
            entry = self._entries[(index, key)] = _Entry((n_items, item_class, loads_per_item))
            if self.policy == AUTO:
                tried = candidate_policies(self.candidates, item_class is not None, self._parallelism())
                entry.schedule = trial_schedule(tried, self.trials)
                entry.timings = {p: [] for p in tried}
        return entry

    def _slot(self, index: int, entry: _Entry, policy: str) -> PlanSlot:
        if policy not in entry.slots:
            _, speeds = self._device(index)
            slot = PlanSlot(torch.device("cuda", index), speeds.n_sm)
            k = self.k if policy == "fastest" else None
            # "measured" starts as weighted on the calibration's speeds; _refresh_measured replaces them
            slot.load(make_plan(policy, speeds, entry.workload, k=k, **self.plan_options))
            entry.slots[policy] = slot
        return entry.slots[policy]

    # ---- auto --------------------------------------------------------------------------------------------
    def _capture_policy(self, entry: _Entry) -> str:
        """The policy a captured launch uses: the fixed one, else what "auto" chose, else "dynamic" (built
        by the first eager launch): a graph must not freeze a trial candidate in."""
        if self.policy != AUTO:
            return self.policy
        return entry.chosen or "dynamic"

    def _next_policy(self, entry: _Entry) -> tuple[str, bool]:
        """(policy, timed) of the next launch."""
        if self.policy != AUTO:
            return self.policy, False
        if entry.schedule:
            return entry.schedule.pop(0)
        # Trials queued, their events not all read yet: dynamic, the policy that is never worse than plain.
        return entry.chosen or "dynamic", False

    def _read_timings(self, key: WorkloadKey, entry: _Entry) -> None:
        """Collect the timings of completed trial launches (never waiting), and decide once all are in."""
        still = []
        for policy, start, end in entry.pending:
            if end.query():
                entry.timings[policy].append(start.elapsed_time(end))
            else:
                still.append((policy, start, end))
        entry.pending = still
        if self.policy == AUTO and entry.chosen is None and not entry.schedule and not entry.pending:
            entry.chosen = choose_policy(entry.timings, self.tolerance)
            self.decisions[key] = {"policy": entry.chosen,
                                   "medians": {p: statistics.median(t) for p, t in entry.timings.items()},
                                   "timings": {p: list(t) for p, t in entry.timings.items()}}

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
    loads_per_item=1.0, **kwargs) launches fn[(grid,)](*args, plan, state, num_warps=..., **kwargs) on the
    current stream of the tensors' device. fn is the kernel itself (for torch.library.wrap_triton)."""

    def __init__(self, fn, *, num_warps: int | None = None, occupancy: float | None = None, ctas_per_sm: int = 1,
                 **options):
        check_kernel(fn)
        self.fn = fn
        self.num_warps = TRITON_DEFAULT_WARPS if num_warps is None else num_warps
        if occupancy is None:  # a persistent grid is resident at once: its warps are the SM's occupancy
            occupancy = ctas_per_sm * self.num_warps
        super().__init__(occupancy=occupancy, ctas_per_sm=ctas_per_sm, **options)
        self.__name__ = getattr(fn, "__name__", "sm_aware_kernel")
        self.__doc__ = getattr(fn, "__doc__", None)

    @torch.compiler.disable  # a graph break inside torch.compile: the module docstring says why and what else works
    def __call__(self, *args, n_items: int, item_class=None, loads_per_item=1.0, **kwargs) -> None:
        from ..measure.launch import launch_triton

        device = next((a.device for a in args if isinstance(a, torch.Tensor) and a.is_cuda), None)

        def launch(grid, plan, state):
            launch_triton(self.fn, grid, (*args, plan, state), self.num_warps, kwargs)

        super().__call__(launch, n_items=n_items, item_class=item_class, loads_per_item=loads_per_item,
                         device=device)


def check_kernel(fn) -> None:
    """Raise PlacementError unless fn is a @triton.jit function whose last two parameters are plan_ptr and
    state_ptr and whose source calls plan_start, plan_next and plan_finish: a kernel written without the
    placement helpers gets a clear error, not a wrong result."""
    names, src = getattr(fn, "arg_names", None), getattr(fn, "src", None)
    if names is None or not isinstance(src, str):
        raise PlacementError(f"@sm_aware takes a @triton.jit function (put @sm_aware above @triton.jit); got "
                             f"{type(fn).__name__}")
    name = getattr(fn, "__name__", "the kernel")
    if list(names[-2:]) != ["plan_ptr", "state_ptr"]:
        raise PlacementError(f"{name}'s last two parameters must be plan_ptr, state_ptr (got {list(names)}): "
                             f"@sm_aware passes the plan tensors there")
    missing = [h for h in HELPERS if not re.search(rf"\b{h}\s*\(", src)]
    if missing:
        raise PlacementError(f"{name} does not call {', '.join(missing)}: an @sm_aware kernel must take its items "
                             f"through the helpers of torch_l2topo.triton_kernels.placement")


def sm_aware(fn=None, *, policy: str = AUTO, ctas_per_sm: int = 1, num_warps: int | None = None,
             occupancy: float | None = None, topology=None, tail_fraction: float | None = None, **options):
    """Decorate a @triton.jit kernel built on the placement helpers (its last two parameters plan_ptr,
    state_ptr) so that calling it launches a persistent grid with an SM-aware plan; see SmAwareKernel and
    Placement for the options (mlp, k, refresh, trials, tolerance, candidates) and the module docstring for
    torch.compile. Usable bare (@sm_aware) or with options (@sm_aware(policy="dynamic")).

    occupancy: resident warps per SM (default: ctas_per_sm x num_warps, a persistent grid being resident at
    once). num_warps: default Triton's, 4.
    """
    def wrap(f):
        return SmAwareKernel(f, policy=policy, ctas_per_sm=ctas_per_sm, num_warps=num_warps, occupancy=occupancy,
                             topology=topology, tail_fraction=tail_fraction, **options)

    return wrap if fn is None else wrap(fn)
