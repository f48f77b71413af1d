"""Placement plans: which SM gets which work items, what that should cost, and the best it could cost.

Owns the host-side model of SM-aware placement; pure numpy/scipy, no GPU. make_plan() decides a policy's
shares, queues and tail (a Plan, stored on the device in layout.py's int32 format; POLICY_TABLE says what each
policy is); predict() simulates the device protocol under a SpeedModel; limit() is the lower bound over all
fractional assignments; gain_fraction() the part of the possible gain a measured run took. Choosing among plans
by timing them ("auto") is the launcher's (sm_aware.py, choice.py).

Shares mode (persistent policies): each CTA reads %smid, takes its items by program id (Plan.n_first), then its
SM's static share (that SM's cursor), the dynamic tail (one global cursor), then steals from the SM with the most
unclaimed items, so no item is lost when an SM is missing, busy or slow. "plain" (direct mode) is a plain
launch, the reference; "partition_queues" (queues mode) claims items homed in the SM's partition first.
Costs: cost[s, c] is one load on SM s of data homed in partition c (2: unknown or mixed); an item of class c
with L loads costs L * cost[s, c]: cycles from a calibration, ns per item from measured statistics. A plan has
one slot per SM of its SpeedModel. Docs: docs/usage.md ("Placing work").
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, replace

import numpy as np
from scipy import sparse
from scipy.optimize import linprog

from ..analysis.labels import sm_labels
from ..errors import check_choice
from ..layout import (
    PLACE_DIRECT,
    PLACE_QUEUES,
    PLACE_SHARES,
    PLAN_CHUNK,
    PLAN_GROUP_QUEUES,
    PLAN_HEADER,
    PLAN_MAGIC,
    PLAN_MAGIC_VALUE,
    PLAN_MAX_QUEUES,
    PLAN_MODE,
    PLAN_N_FIRST,
    PLAN_N_QUEUES,
    PLAN_N_SLOTS,
    PLAN_N_STATIC,
    PLAN_N_TAIL,
)


@dataclass(frozen=True)
class Policy:
    """What a placement policy is. mode: the device helpers' mode its plans run in (layout.PLACE_*).
    affinity: it places items by their home partition, so it is worth trying only when items have classes.
    auto: "auto" may time it. needs_k: it takes the number of SMs k. by_program: it prefers no SM, so its plan
    for a given grid hands each program its first item by program id (make_plan's grid), with no claim."""

    name: str
    mode: int
    affinity: bool
    auto: bool
    needs_k: bool
    summary: str
    by_program: bool = False


POLICY_TABLE = {p.name: p for p in (
    Policy("plain", PLACE_DIRECT, False, True, False,
           "one program per item, placed by the hardware: a plain launch, the reference"),
    Policy("partition_queues", PLACE_QUEUES, True, True, False,
           "one program per item; each claims items homed in its SM's L2 partition first"),
    Policy("dynamic", PLACE_SHARES, False, True, False,
           "persistent grid, one item per program by id, then every item claimed from one queue", True),
    Policy("uniform", PLACE_SHARES, False, True, False,
           "persistent grid, one item per program by id, then equal shares per SM, then stealing", True),
    Policy("weighted", PLACE_SHARES, False, True, False, "persistent grid, shares by each SM's calibrated speed"),
    Policy("fastest", PLACE_SHARES, False, False, True, "persistent grid, shares on the k fastest SMs only"),
    Policy("partition_affine", PLACE_SHARES, True, True, False,
           "persistent grid, items to SMs near their home partition"),
    Policy("affine_weighted", PLACE_SHARES, True, True, False,
           "persistent grid, the limit's LP rounded to whole items"),
    # Its plan changes while it runs, so a few timed launches do not say what it will do (on a gather it won
    # trials by noise and then ran slower than dynamic): never an "auto" candidate.
    Policy("measured", PLACE_SHARES, False, False, False, "persistent grid, shares by the kernel's measured speed"),
)}
POLICIES = tuple(POLICY_TABLE)
SHARE_ORDERS = ("dealt", "blocks")  # make_plan's share_order
# Queues per group (L2 partition) in queues mode: about one per QUEUE_SMS SMs of the group, so that thousands of
# programs starting at once spread their claims over ~16 counters on an H200 instead of hitting two.
QUEUE_SMS = 8
N_CLASSES = 3  # item classes: home partition 0, home partition 1, unknown or mixed home
# The static shares carry the locality and affinity; the tail only has to absorb the model's error (a
# workload's real per-SM speed differs from the calibration's by a few %)
# and the last items' granularity, and each tail claim is a global atomic. 1/32 of the items (~3%) covers
# that while 97% stay where the plan put them; a larger error is still rebalanced by stealing.
DEFAULT_TAIL_FRACTION = 1 / 32
# Below this many SMs a heap drains the tail faster than the vectorized rounds (each round claims at most
# one item per SM).
_ROUNDS_MIN_SMS = 16


def _frozen(a, dtype) -> np.ndarray:
    a = np.array(a, dtype=dtype)
    a.setflags(write=False)
    return a


@dataclass(frozen=True)
class SpeedModel:
    """Per-SM cost of one load by the data's home partition, and each SM's near partition.

    cost: (n_sm, 3) > 0, columns: data homed in partition 0, in partition 1, unknown/mixed home.
    partition: (n_sm,) the partition each SM is near to, 0/1, -1 undecided. source: where it came from.
    """

    cost: np.ndarray
    partition: np.ndarray
    source: str = "unknown"

    def __post_init__(self):
        cost = np.asarray(self.cost, dtype=np.float64)
        if cost.ndim != 2 or cost.shape[0] < 1 or cost.shape[1] != N_CLASSES:
            raise ValueError(f"cost must have shape (n_sm >= 1, {N_CLASSES}), got {cost.shape}")
        if not (np.isfinite(cost).all() and (cost > 0).all()):
            raise ValueError("cost must be finite and > 0 everywhere (NaN, inf or <= 0 found)")
        part = np.asarray(self.partition)
        if part.shape != (cost.shape[0],):
            raise ValueError(f"partition must have shape ({cost.shape[0]},), got {part.shape}")
        if not np.isin(part, (-1, 0, 1)).all():
            raise ValueError("partition values must be 0, 1 or -1 (undecided)")
        object.__setattr__(self, "cost", _frozen(cost, np.float64))
        object.__setattr__(self, "partition", _frozen(part, np.int64))

    @property
    def n_sm(self) -> int:
        return self.cost.shape[0]

    @classmethod
    def from_topology(cls, topo) -> SpeedModel:
        """Near/far cycles per load from a calibration's partitions; the chain map for unknown homes and
        for SMs whose side is undecided (all three columns then)."""
        labels = sm_labels(topo)
        chain = np.asarray(topo.chain_cycles, dtype=np.float64)
        cost = np.repeat(chain[:, None], N_CLASSES, axis=1)
        decided = (labels.partition >= 0) & np.isfinite(labels.near_cycles) & np.isfinite(labels.far_cycles)
        part = np.where(decided, labels.partition, -1)
        sms = np.flatnonzero(decided)
        cost[sms, part[sms]] = labels.near_cycles[sms]
        cost[sms, 1 - part[sms]] = labels.far_cycles[sms]
        return cls(cost, part, f"calibration {topo.meta.get('uuid_hash', 'unknown')}")

    @classmethod
    def from_measured(cls, items, busy_ns, partition=None) -> SpeedModel:
        """The workload's own speed: ns per item on each SM, from items done and ns busy per SM (the
        launcher's accumulated statistics). The same cost in all three columns. SMs that did no items, or
        show no busy time, get the median of the others."""
        items = np.asarray(items, dtype=np.float64)
        busy = np.asarray(busy_ns, dtype=np.float64)
        if items.ndim != 1 or busy.shape != items.shape or items.size == 0:
            raise ValueError(f"items and busy_ns must be 1-D of one length >= 1, got {items.shape} and {busy.shape}")
        if not (np.isfinite(items).all() and np.isfinite(busy).all()) or (items < 0).any() or (busy < 0).any():
            raise ValueError("items and busy_ns must be finite and >= 0")
        if not items.any():
            raise ValueError("no SM did any item: nothing was measured")
        seen = (items > 0) & (busy > 0)
        if not seen.any():
            raise ValueError("no SM shows busy time: nothing was measured")
        per_item = np.full(items.size, np.median(busy[seen] / items[seen]))
        per_item[seen] = busy[seen] / items[seen]
        part = np.full(items.size, -1) if partition is None else partition
        return cls(np.repeat(per_item[:, None], N_CLASSES, axis=1), part, "measured")

    @classmethod
    def uniform(cls, n_sm: int) -> SpeedModel:
        return cls(np.ones((n_sm, N_CLASSES)), np.full(n_sm, -1), "uniform")


@dataclass(frozen=True)
class Workload:
    """n_items work items. item_class: (n_items,) home partition of each item's data (0/1, 2: unknown or
    mixed; None: all 2). loads_per_item: cost units per item, a scalar or (n_items,), > 0."""

    n_items: int
    item_class: np.ndarray | None = None
    loads_per_item: float | np.ndarray = 1.0

    def __post_init__(self):
        if isinstance(self.n_items, bool) or not isinstance(self.n_items, (int, np.integer)) or self.n_items < 0:
            raise ValueError(f"n_items must be an integer >= 0, got {self.n_items!r}")
        object.__setattr__(self, "n_items", int(self.n_items))
        if self.item_class is not None:
            c = np.asarray(self.item_class)
            if c.shape != (self.n_items,) or (c.size and c.dtype.kind not in "iu"):
                raise ValueError(f"item_class must be integers of shape ({self.n_items},), got {c.dtype} {c.shape}")
            if not np.isin(c, (0, 1, 2)).all():
                raise ValueError("item_class values must be 0, 1 (home partition) or 2 (unknown/mixed)")
            object.__setattr__(self, "item_class", _frozen(c, np.int64))
        loads = np.asarray(self.loads_per_item, dtype=np.float64)
        if loads.shape not in ((), (self.n_items,)):
            raise ValueError(f"loads_per_item must be a scalar or of shape ({self.n_items},), got {loads.shape}")
        if not (np.isfinite(loads).all() and (loads > 0).all()):
            raise ValueError("loads_per_item must be finite and > 0")
        object.__setattr__(self, "loads_per_item", float(loads) if loads.ndim == 0 else _frozen(loads, np.float64))

    def classes(self) -> np.ndarray:
        """(n_items,) class of every item."""
        return np.full(self.n_items, 2, dtype=np.int64) if self.item_class is None else self.item_class

    def loads(self) -> np.ndarray:
        """(n_items,) loads of every item."""
        return np.broadcast_to(np.asarray(self.loads_per_item, dtype=np.float64), (self.n_items,))

    def suffix(self, start: int) -> Workload:
        """Items start..n_items-1 as a workload of their own (item start is its item 0)."""
        loads = self.loads_per_item if np.ndim(self.loads_per_item) == 0 else self.loads_per_item[start:]
        return Workload(self.n_items - start, None if self.item_class is None else self.item_class[start:], loads)

    def class_counts(self) -> np.ndarray:
        """(3,) items per class."""
        return np.bincount(self.classes(), minlength=N_CLASSES)

    def class_loads(self) -> np.ndarray:
        """(3,) total loads per class."""
        return np.bincount(self.classes(), weights=self.loads(), minlength=N_CLASSES)

    def item_cost(self, speeds: SpeedModel, sm, items) -> np.ndarray:
        """Cost of item(s) `items` on SM(s) `sm` (broadcast elementwise; never an n_sm x n_items table)."""
        items = np.asarray(items, dtype=np.int64)
        return self.loads()[items] * speeds.cost[sm, self.classes()[items]]

    def mean_item_cost(self, speeds: SpeedModel) -> np.ndarray:
        """(n_sm,) expected cost of one item on each SM over this workload's class mix."""
        return speeds.cost @ self.class_loads() / max(self.n_items, 1)


@dataclass(frozen=True)
class Plan:
    """Where every item goes, in the device helpers' `mode` (layout.PLACE_*).

    shares: SM s's static share is items[offsets[s]:offsets[s+1]] in processing order; tail is handed out
    dynamically in order. queues: queue q holds items[offsets[q]:offsets[q+1]], SM s's programs claim from
    queue home_queue[s] first, then the other queues of its group (queue q is in group q // group_queues),
    then the other group's, `chunk` items per claim. direct: no arrays; program p takes item p of n_items.
    n_first (shares mode): items 0..n_first-1 are in no array; program p takes p, p + grid, ... of them before
    its first claim (the arrays hold items n_first..n_items-1).
    predicted_makespan: predict() under the SpeedModel the plan was built with.
    """

    policy: str
    n_slots: int
    offsets: np.ndarray
    items: np.ndarray
    tail: np.ndarray
    predicted_makespan: float = float("nan")
    mode: int = PLACE_SHARES
    home_queue: np.ndarray | None = None
    group_queues: int = 1
    chunk: int = 1
    n_items: int = -1  # -1: the items the arrays hold, and the n_first before them
    n_first: int = 0

    def __post_init__(self):
        for name in ("offsets", "items", "tail"):
            object.__setattr__(self, name, _frozen(np.asarray(getattr(self, name)).reshape(-1), np.int64))
        if self.mode not in (PLACE_DIRECT, PLACE_SHARES, PLACE_QUEUES):
            raise ValueError(f"unknown plan mode {self.mode!r}")
        if self.n_slots < 1:
            raise ValueError(f"a plan needs n_slots >= 1, got {self.n_slots}")
        o = self.offsets
        if isinstance(self.n_first, bool) or not isinstance(self.n_first, (int, np.integer)) or self.n_first < 0:
            raise ValueError(f"n_first must be an integer >= 0, got {self.n_first!r}")
        if self.n_first and self.mode != PLACE_SHARES:
            raise ValueError("only a shares-mode plan hands items out by program id (n_first)")
        object.__setattr__(self, "n_first", int(self.n_first))
        held = len(self.items) + len(self.tail) + self.n_first
        object.__setattr__(self, "n_items", held if self.n_items < 0 else int(self.n_items))
        if self.mode == PLACE_DIRECT:
            if held:
                raise ValueError("a direct-mode plan holds no items: program p takes item p")
            return
        if self.n_items != held:
            raise ValueError(f"the plan holds {held} items but says {self.n_items}")
        if o.size < 2 or o[0] != 0 or o[-1] != len(self.items) or (np.diff(o) < 0).any():
            raise ValueError(f"offsets must rise monotonically from 0 to {len(self.items)} (the static item count)")
        if self.mode == PLACE_SHARES and len(o) != self.n_slots + 1:
            raise ValueError(f"a shares plan needs n_slots + 1 offsets, got {self.n_slots} and {len(o)}")
        if self.mode == PLACE_QUEUES:
            n_queues = len(o) - 1
            home = np.asarray(self.home_queue)
            if len(self.tail):
                raise ValueError("a queues plan has no tail: every item is in a queue")
            if not 1 <= n_queues <= PLAN_MAX_QUEUES:
                raise ValueError(f"a queues plan needs 1..{PLAN_MAX_QUEUES} queues, got {n_queues}")
            if self.group_queues < 1 or n_queues % self.group_queues:
                raise ValueError(f"{n_queues} queues do not split into groups of {self.group_queues}")
            if home.shape != (self.n_slots,) or (home < 0).any() or (home >= n_queues).any():
                raise ValueError(f"home_queue must give each of {self.n_slots} SM slots a queue in 0..{n_queues - 1}")
            if not 1 <= self.chunk < 2**24:
                raise ValueError(f"chunk must be in 1..{2**24 - 1}, got {self.chunk}")
            object.__setattr__(self, "home_queue", _frozen(home, np.int64))

    @property
    def direct(self) -> bool:
        """True for a plan the device runs in direct mode (program p takes item p): policy "plain"."""
        return self.mode == PLACE_DIRECT

    @property
    def n_queues(self) -> int:
        return len(self.offsets) - 1 if self.mode == PLACE_QUEUES else 0

    def share(self, s: int) -> np.ndarray:
        """Shares mode: SM s's static share. Queues mode: queue s."""
        return self.items[self.offsets[s]:self.offsets[s + 1]]

    def queue_order(self, home: int) -> np.ndarray:
        """Queues mode: the queues a program of home queue `home` tries, in order (as the device does)."""
        j = np.arange(self.n_queues)
        width = self.group_queues
        return ((home // width + j // width) % (self.n_queues // width)) * width + (home % width + j) % width

    def validate(self, n_items: int) -> None:
        """Raise ValueError unless the plan hands every item 0..n_items-1 out exactly once."""
        if self.direct:
            if self.n_items != n_items:
                raise ValueError(f"the direct plan is for {self.n_items} items, not {n_items}")
            return
        ids = np.concatenate([np.arange(self.n_first), self.items, self.tail])
        bad = ids[(ids < 0) | (ids >= n_items)]
        if bad.size:
            raise ValueError(f"plan holds item ids outside 0..{n_items - 1}: {bad[:8].tolist()}")
        seen = np.bincount(ids, minlength=n_items)
        missing, dup = np.flatnonzero(seen == 0), np.flatnonzero(seen > 1)
        if missing.size or dup.size:
            raise ValueError(f"plan must hold each of {n_items} items once: {missing.size} missing "
                             f"{missing[:8].tolist()}, {dup.size} duplicated {dup[:8].tolist()}")

    def to_array(self) -> np.ndarray:
        """The device format (layout.py): header, then the mode's arrays, int32."""
        if self.mode == PLACE_QUEUES:
            body = np.concatenate([self.home_queue, self.offsets, self.items])
        elif self.mode == PLACE_SHARES:
            body = np.concatenate([self.offsets, self.items, self.tail])
        else:
            body = np.zeros(0, dtype=np.int64)
        if max(body.max(initial=0), self.n_first) > np.iinfo(np.int32).max:
            raise ValueError("item ids and offsets must fit int32 for the device plan")
        out = np.zeros(PLAN_HEADER + body.size, dtype=np.int32)
        out[PLAN_N_SLOTS], out[PLAN_MAGIC], out[PLAN_MODE] = self.n_slots, PLAN_MAGIC_VALUE, self.mode
        out[PLAN_N_STATIC], out[PLAN_N_TAIL], out[PLAN_N_FIRST] = len(self.items), len(self.tail), self.n_first
        if self.direct:
            out[PLAN_N_TAIL] = self.n_items  # what the host checks against; the device reads nothing
        out[PLAN_N_QUEUES], out[PLAN_GROUP_QUEUES], out[PLAN_CHUNK] = self.n_queues, self.group_queues, self.chunk
        out[PLAN_HEADER:] = body
        return out

    @classmethod
    def from_array(cls, a, policy: str = "unknown") -> Plan:
        a = np.asarray(a)
        if a.ndim != 1 or a.dtype.kind not in "iu" or a.size < PLAN_HEADER:
            raise ValueError(f"a plan array is 1-D integer of at least {PLAN_HEADER} words, got {a.dtype} {a.shape}")
        if a[PLAN_MAGIC] != PLAN_MAGIC_VALUE:
            raise ValueError(f"bad plan magic {int(a[PLAN_MAGIC]):#x}, expected {PLAN_MAGIC_VALUE:#x}")
        mode = int(a[PLAN_MODE])
        if mode not in (PLACE_DIRECT, PLACE_SHARES, PLACE_QUEUES):
            raise ValueError(f"bad plan mode {mode}")
        n_slots, n_static, n_tail = (int(a[i]) for i in (PLAN_N_SLOTS, PLAN_N_STATIC, PLAN_N_TAIL))
        n_queues, n_first = int(a[PLAN_N_QUEUES]), int(a[PLAN_N_FIRST])
        sizes = {PLACE_DIRECT: 0, PLACE_SHARES: n_slots + 1 + n_static + n_tail,
                 PLACE_QUEUES: n_slots + n_queues + 1 + n_static}[mode]
        if n_slots < 1 or min(n_static, n_tail, n_queues, n_first) < 0 or a.size != PLAN_HEADER + sizes:
            raise ValueError(f"plan header (slots {n_slots}, static {n_static}, tail {n_tail}, queues {n_queues}) "
                             f"does not match its length {a.size}")
        body = a[PLAN_HEADER:]
        if mode == PLACE_DIRECT:
            return cls(policy, n_slots, [0], [], [], mode=mode, n_items=n_tail)
        if mode == PLACE_QUEUES:
            return cls(policy, n_slots, body[n_slots:n_slots + n_queues + 1], body[n_slots + n_queues + 1:], [],
                       mode=mode, home_queue=body[:n_slots], group_queues=int(a[PLAN_GROUP_QUEUES]),
                       chunk=int(a[PLAN_CHUNK]))
        return cls(policy, n_slots, body[:n_slots + 1], body[n_slots + 1:n_slots + 1 + n_static],
                   body[n_slots + 1 + n_static:], n_first=n_first)


# ---- building plans ---------------------------------------------------------------------------------------
def _largest_remainder(total: int, weights) -> np.ndarray:
    """Integer counts proportional to weights (>= 0, not all 0) summing to total; ties go to lower indices."""
    w = np.asarray(weights, dtype=np.float64)
    quota = total * w / w.sum()
    counts = np.floor(quota).astype(np.int64)
    order = np.argsort(-(quota - counts), kind="stable")
    order = order[w[order] > 0]
    counts[order[:total - counts.sum()]] += 1
    return counts


def _solve_lp(speeds: SpeedModel, workload: Workload) -> tuple[float, np.ndarray]:
    """min T s.t. sum_s x[s, c] = load of class c, sum_c cost[s, c] x[s, c] <= T, x >= 0.
    Returns T and x (n_sm, 3) in loads. Solved on loads and costs scaled to ~1 for HiGHS' tolerances."""
    loads = workload.class_loads()
    classes = np.flatnonzero(loads > 0)
    n_sm, k = speeds.n_sm, len(classes)
    scale_l, scale_c = loads.sum(), speeds.cost.mean()
    cost = speeds.cost[:, classes] / scale_c
    var = np.arange(n_sm * k).reshape(n_sm, k)  # x[s, j] is variable var[s, j]; T is the last one
    a_ub = sparse.hstack([sparse.csr_matrix((cost.ravel(), (np.repeat(np.arange(n_sm), k), var.ravel())),
                                            shape=(n_sm, n_sm * k)), -np.ones((n_sm, 1))])
    a_eq = sparse.hstack([sparse.csr_matrix((np.ones(n_sm * k), (np.tile(np.arange(k), n_sm), var.ravel())),
                                            shape=(k, n_sm * k)), np.zeros((k, 1))])
    c = np.zeros(n_sm * k + 1)
    c[-1] = 1.0
    res = linprog(c, A_ub=a_ub, b_ub=np.zeros(n_sm), A_eq=a_eq, b_eq=loads[classes] / scale_l,
                  bounds=(0, None), method="highs")
    if res.status != 0:
        raise RuntimeError(f"the placement LP failed: {res.message}")
    x = np.zeros((n_sm, N_CLASSES))
    x[:, classes] = np.maximum(res.x[:-1].reshape(n_sm, k), 0) * scale_l
    return float(res.x[-1] * scale_l * scale_c), x


def _counts(policy: str, speeds: SpeedModel, workload: Workload, k) -> np.ndarray:
    """(n_sm, 3) items of each class in each SM's share, before the tail is cut off."""
    n_sm, per_class = speeds.n_sm, workload.class_counts()
    out = np.zeros((n_sm, N_CLASSES), dtype=np.int64)
    if policy in ("partition_affine", "affine_weighted"):
        if policy == "affine_weighted":
            weights = _solve_lp(speeds, workload)[1].T
        else:
            weights = [speeds.partition == 0, speeds.partition == 1, np.ones(n_sm)]
        for c in np.flatnonzero(per_class):
            w = weights[c] if np.any(weights[c]) else np.ones(n_sm)  # no SM near c: spread over all
            out[:, c] = _largest_remainder(per_class[c], w)
        return out
    # The other policies ignore the classes: one group of all items, split by SM speed on this workload.
    speed = 1.0 / workload.mean_item_cost(speeds)
    if policy == "uniform":
        speed = np.ones(n_sm)
    elif policy == "fastest":
        slow = np.argsort(-speed, kind="stable")[k:]
        speed[slow] = 0.0
    out[:, 0] = _largest_remainder(workload.n_items, speed)
    return out


def _dealt(counts: np.ndarray) -> np.ndarray:
    """The owners of a group's ids in id order: SM s counts[s] times, its j-th turn at a random point of the
    j-th of counts[s] equal stretches of the ids (seeded: plans are deterministic). Equal counts: each run of
    n_sm ids goes to every SM once, in a random order. So an SM's ids lie about n / counts[s] apart, as when the
    hardware deals a plain launch's programs, without lining up with any period in the ids (dealt in SM
    order, items whose class alternates would give every SM of an even count items of one class only)."""
    counts = np.asarray(counts, dtype=np.int64)
    owners = np.repeat(np.arange(len(counts)), counts)
    turn = np.arange(len(owners)) - np.repeat(np.cumsum(counts) - counts, counts)
    jitter = np.random.default_rng(0).random(len(owners))
    return owners[np.argsort((turn + jitter) / counts[owners], kind="stable")]


def make_plan(policy: str, speeds: SpeedModel, workload: Workload, *, k: int | None = None,
              tail_fraction: float = DEFAULT_TAIL_FRACTION, chunk: int = 1, share_order: str = "dealt",
              grid: int | None = None) -> Plan:
    """A plan of `policy` (POLICY_TABLE) for `workload` on the SMs of `speeds`.

    Static shares: uniform equal counts; weighted counts proportional to each SM's speed on the workload's class
    mix (largest remainder); fastest weighted over the k fastest SMs only (the others drain the tail and steal);
    partition_affine class-p items to the SMs near p (equal counts), class 2 over all; affine_weighted limit()'s
    LP rounded to whole items per (SM, class), spilling far only when a class is overloaded; measured weighted,
    meant for a SpeedModel.from_measured(). Each then moves about tail_fraction of the items from the end of
    each share to the tail; dynamic puts everything there. plain: direct mode, predicted like dynamic (the
    hardware scheduler as a queue without claim cost). partition_queues: queues mode, `chunk` items per claim.
    grid: the CTAs of the launch that will run it (None: no items by program id); by_program policies (uniform,
    dynamic) then hand items 0..min(grid, n)-1 out by program id (Plan.n_first), and any grid does every item once.
    share_order: "dealt" (default) deals each group's ids to its SMs in turns, so one SM's CTAs run ids about
    n_sm apart, as in a plain launch; "blocks": contiguous id blocks, for items sharing data with neighbours.
    """
    check_choice("policy", policy, POLICIES)
    check_choice("share_order", share_order, SHARE_ORDERS)
    if not isinstance(speeds, SpeedModel) or not isinstance(workload, Workload):
        raise TypeError("make_plan takes a SpeedModel and a Workload")
    if POLICY_TABLE[policy].needs_k:
        if k is None or isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= speeds.n_sm:
            raise ValueError(f"policy {policy!r} needs k, the number of SMs, in 1..{speeds.n_sm}; got {k!r}")
    elif k is not None:
        raise ValueError(f"k applies only to policy 'fastest', not {policy!r}")
    if not 0 <= tail_fraction < 1:
        raise ValueError(f"tail_fraction must be in [0, 1), got {tail_fraction!r}")
    if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or not 1 <= chunk < 2**24:
        raise ValueError(f"chunk must be an integer in 1..{2**24 - 1}, got {chunk!r}")
    if grid is not None and (isinstance(grid, bool) or not isinstance(grid, (int, np.integer)) or grid < 1):
        raise ValueError(f"grid must be an integer >= 1 or None, got {grid!r}")
    n, n_sm = workload.n_items, speeds.n_sm
    first = min(int(grid), n) if grid is not None and POLICY_TABLE[policy].by_program else 0
    if first:
        rest = make_plan(policy, speeds, workload.suffix(first), k=k, tail_fraction=tail_fraction, chunk=chunk,
                         share_order=share_order)
        plan = Plan(policy, n_sm, rest.offsets, rest.items + first, rest.tail + first, n_first=first)
        return replace(plan, predicted_makespan=predict(plan, speeds, workload))
    if policy == "plain":
        plan = Plan(policy, n_sm, [0], [], [], mode=PLACE_DIRECT, n_items=n)
        return replace(plan, predicted_makespan=predict(plan, speeds, workload))
    if policy == "partition_queues":
        return queue_plan(speeds, workload, chunk=int(chunk))
    if policy == "dynamic" or n == 0:
        plan = Plan(policy, n_sm, np.zeros(n_sm + 1), np.zeros(0), np.arange(n))
        return replace(plan, predicted_makespan=predict(plan, speeds, workload))

    counts = _counts(policy, speeds, workload, k)
    # Each group's ids, in id order, dealt to its SMs in turn or in SM order (a share of a few contiguous runs).
    groups = [np.arange(n)] if not POLICY_TABLE[policy].affinity \
        else [np.flatnonzero(workload.classes() == c) for c in range(N_CLASSES)]
    owner = np.empty(n, dtype=np.int64)
    for c, ids in enumerate(groups):
        owner[ids] = _dealt(counts[:, c]) if share_order == "dealt" else np.repeat(np.arange(n_sm), counts[:, c])
    items = np.argsort(owner, kind="stable")
    share = np.bincount(owner, minlength=n_sm)
    starts = np.concatenate([[0], np.cumsum(share)])
    # Cut the tail from the end of every share in proportion to it, so the static parts still end together.
    n_tail = int(round(tail_fraction * n))
    cut = _largest_remainder(n_tail, share) if n_tail else np.zeros(n_sm, dtype=np.int64)
    rank = np.arange(n) - starts[owner[items]]
    to_tail = rank >= (share - cut)[owner[items]]
    tail = items[to_tail]
    # Longest items first, so the last dynamic claims are short (a no-op when all loads are equal).
    tail = tail[np.argsort(-workload.loads()[tail], kind="stable")]
    offsets = np.concatenate([[0], np.cumsum(share - cut)])
    plan = Plan(policy, n_sm, offsets, items[~to_tail], tail)
    return replace(plan, predicted_makespan=predict(plan, speeds, workload))


def queue_plan(speeds: SpeedModel, workload: Workload, *, chunk: int = 1) -> Plan:
    """The "partition_queues" plan: per L2 partition (side) about one queue per QUEUE_SMS of its SMs, each SM
    homed in one queue of its side (SMs of an undecided side, or a partition without SMs, go to side 0).

    Which items a side's queues hold is limit()'s LP summed over the side's SMs (affine_weighted's counts): a
    side holds its own partition's items, and the other's or unknown ones only where the sides' SM counts or
    speeds ask for it (an H200 with 64/68 SMs per side and items split 50/50 sends a few items to the far
    side). Those far items come first in their queues: claimed at the start, they do not become the last, slow
    items of the launch (at 4 items per SM on such an H200 the far items claimed last set the makespan). Within
    a side the items are dealt to its queues in proportion to the speed of the SMs homed there, in id order
    after that ordering. Each queue is the device's claim counter: spread over ~16 on an H200."""
    n_sm = speeds.n_sm
    side = np.where(speeds.partition >= 0, speeds.partition, 0)
    sides = [np.flatnonzero(side == g) for g in (0, 1)]
    n_groups = 2 if all(len(s) for s in sides) else 1
    if n_groups == 1:
        sides, side = [np.arange(n_sm)], np.zeros(n_sm, dtype=np.int64)
    width = int(np.clip(round(min(len(s) for s in sides) / QUEUE_SMS), 1, PLAN_MAX_QUEUES // n_groups))
    home = np.empty(n_sm, dtype=np.int64)
    for g, sms in enumerate(sides):
        home[sms] = g * width + np.arange(len(sms)) % width
    n_queues = n_groups * width
    # speed of each queue's SMs on the items of its group (class g: near cost; one group: the mixed column)
    speed = np.bincount(home, weights=1.0 / speeds.cost[np.arange(n_sm), side if n_groups == 2 else 2],
                        minlength=n_queues)
    classes = workload.classes()
    if n_groups == 1:
        # one group: every item, in id order, dealt to the queues by speed
        owner = np.repeat(np.arange(n_queues), _largest_remainder(workload.n_items, speed))
        order = np.arange(workload.n_items)
    else:
        # items of class c per side (the LP's counts summed over the side's SMs), far ones first in each queue
        counts = _counts("affine_weighted", speeds, workload, None)
        per_side = np.stack([counts[s].sum(axis=0) for s in sides])  # (2 sides, 3 classes)
        owner = np.empty(workload.n_items, dtype=np.int64)
        rank = np.empty(workload.n_items, dtype=np.int64)  # 0 far, 1 unknown home, 2 near: the order in a queue
        for c in range(N_CLASSES):
            ids = np.flatnonzero(classes == c)
            split = np.cumsum([0, *per_side[:, c]])
            for g in range(n_groups):
                mine = ids[split[g]:split[g + 1]]
                queues = np.arange(g * width, (g + 1) * width)
                owner[mine] = np.repeat(queues, _largest_remainder(len(mine), speed[queues]))
                rank[mine] = 1 if c == 2 else (2 if c == g else 0)
        order = np.lexsort((np.arange(workload.n_items), rank))
    items = order[np.argsort(owner[order], kind="stable")]
    offsets = np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=n_queues))])
    plan = Plan("partition_queues", n_sm, offsets, items, [], mode=PLACE_QUEUES, home_queue=home,
                group_queues=width, chunk=chunk)
    return replace(plan, predicted_makespan=predict(plan, speeds, workload))


# ---- predicting and bounding makespans ----------------------------------------------------------------------
def _drain_tail(free: np.ndarray, cost: np.ndarray, loads: np.ndarray, cls: np.ndarray, claim: float) -> np.ndarray:
    """List-schedule the tail items (loads, cls in order) on SMs with cost rows `cost`, free from `free`
    (updated in place): the SM free earliest (ties: lowest row) claims the next. Returns items per SM."""
    n_sm, n_tail = len(free), len(loads)
    taken = np.zeros(n_sm, dtype=np.int64)
    if n_sm < _ROUNDS_MIN_SMS:
        heap = [(f, i) for i, f in enumerate(free.tolist())]
        heapq.heapify(heap)
        rows, load_l, cls_l = cost.tolist(), loads.tolist(), cls.tolist()
        for j in range(n_tail):
            t, i = heap[0]
            heapq.heapreplace(heap, (t + (load_l[j] * rows[i][cls_l[j]] + claim), i))
            taken[i] += 1
        for t, i in heap:
            free[i] = t
        return taken
    # Rounds: no SM can claim twice before free.min() + step, so every SM free before then claims exactly
    # one item, in order of free time: one exact, vectorized step of the event simulation.
    step = float((loads * cost.min(axis=0)[cls]).min()) + claim if n_tail else 0.0
    j = 0
    while j < n_tail:
        first = free.argmin()
        ready = free < free[first] + step
        ready[first] = True
        ready = np.flatnonzero(ready)
        ready = ready[np.argsort(free[ready], kind="stable")][:n_tail - j]
        free[ready] += loads[j:j + len(ready)] * cost[ready, cls[j:j + len(ready)]] + claim
        taken[ready] += 1
        j += len(ready)
    return taken


def predict(plan: Plan, speeds: SpeedModel, workload: Workload, *, available=None, claim_cycles: float = 0.0,
            steal: bool = True, return_counts: bool = False):
    """Makespan (cost units) of `plan` by event simulation of the device protocol (module docstring).

    Every SM with available[s] (default: all) runs one CTA; the others never start and their shares are
    stolen. claim_cycles is added to each dynamic claim (tail or steal): the atomic's round trip. Own shares
    are summed in bulk until the first SM finds the tail empty; from then on every claim is an event.
    steal=False models a launcher without stealing, like the static-share chase experiments that measured
    the weighting and affinity cuts (inf if an SM that never runs holds a share). return_counts: also return
    (n_slots,) items done per SM.
    """
    if plan.n_slots != speeds.n_sm:
        raise ValueError(f"plan has {plan.n_slots} SM slots but the SpeedModel {speeds.n_sm} SMs")
    plan.validate(workload.n_items)
    n_sm = speeds.n_sm
    avail = np.ones(n_sm, dtype=bool) if available is None else np.asarray(available, dtype=bool)
    if avail.shape != (n_sm,):
        raise ValueError(f"available must have shape ({n_sm},), got {avail.shape}")
    if not (np.isfinite(claim_cycles) and claim_cycles >= 0):
        raise ValueError(f"claim_cycles must be finite and >= 0, got {claim_cycles!r}")
    done = np.zeros(n_sm, dtype=np.int64)
    if workload.n_items == 0:
        return (0.0, done) if return_counts else 0.0
    if not avail.any():
        raise ValueError("no SM is available: the items would never be done")
    cls, loads, cost = workload.classes(), workload.loads(), speeds.cost
    sms = np.flatnonzero(avail)
    if plan.direct:  # the hardware's queue: item p goes to whichever SM frees first
        free = np.zeros(len(sms))
        done[sms] = _drain_tail(free, cost[sms], loads, cls, 0.0)
        return (float(free.max()), done) if return_counts else float(free.max())
    if plan.mode == PLACE_QUEUES:
        makespan = _drain_queues(plan, sms, cost, loads, cls, float(claim_cycles), done)
        return (makespan, done) if return_counts else makespan
    lo, hi = plan.offsets[:-1], plan.offsets[1:]
    owner = np.repeat(np.arange(n_sm), hi - lo)
    own_cost = loads[plan.items] * cost[owner, cls[plan.items]]
    # Items by program id first: item p on the (p % available)-th available SM (the model's one CTA per SM; the
    # hardware spreads a grid's programs evenly), before that SM's share.
    by_id = np.arange(plan.n_first)
    by_id_sm = sms[by_id % len(sms)]
    begin = np.bincount(by_id_sm, weights=loads[by_id] * cost[by_id_sm, cls[by_id]], minlength=n_sm).astype(float)
    done += np.bincount(by_id_sm, minlength=n_sm)
    ends = [begin[s] + np.cumsum(own_cost[lo[s]:hi[s]]) for s in range(n_sm)]
    free = np.array([ends[s][-1] if len(ends[s]) else begin[s] for s in sms])

    done[sms] += _drain_tail(free, cost[sms], loads[plan.tail], cls[plan.tail], float(claim_cycles))

    # The first SM to find the tail empty starts stealing at (t0, s0); owners have claimed every own item
    # that starts before that event (ties by SM id, as the event order has it).
    t0, s0 = min(zip(free.tolist(), sms.tolist()))
    events, queues = [], []
    for s in range(n_sm):
        claimed = 0
        if avail[s]:
            starts = np.concatenate([[begin[s]], ends[s]])[:-1]
            claimed = int(np.searchsorted(starts, t0, side="right" if s < s0 else "left"))
            at = starts[claimed] if claimed < len(starts) else free[np.searchsorted(sms, s)]
            events.append((float(at), s))
        rest = plan.items[lo[s] + claimed:hi[s]]
        queues.append((loads[rest].tolist(), cls[rest].tolist()))
        done[s] += claimed
    makespan = _claim_rest(events, queues, cost.tolist(), float(claim_cycles), steal, done)
    return (makespan, done) if return_counts else makespan


def _drain_queues(plan: Plan, sms: np.ndarray, cost: np.ndarray, loads: np.ndarray, cls: np.ndarray, claim: float,
                  done: np.ndarray) -> float:
    """Event simulation of queues mode, one program at a time per SM: the SM free earliest (ties: lowest id)
    claims the next `chunk` items of the first queue in its order with items left. Updates done; returns the
    makespan."""
    pos = plan.offsets[:-1].copy()
    end = plan.offsets[1:]
    orders = {s: plan.queue_order(int(plan.home_queue[s])).tolist() for s in sms.tolist()}
    events = [(0.0, s) for s in sms.tolist()]
    heapq.heapify(events)
    makespan, rows, loads_l, cls_l, items = 0.0, cost.tolist(), loads.tolist(), cls.tolist(), plan.items.tolist()
    while events:
        t, s = heapq.heappop(events)
        q = next((q for q in orders[s] if pos[q] < end[q]), None)
        if q is None:
            makespan = max(makespan, t)
            continue
        got = items[pos[q]:min(pos[q] + plan.chunk, end[q])]
        pos[q] += len(got)
        done[s] += len(got)
        heapq.heappush(events, (t + claim + sum(loads_l[i] * rows[s][cls_l[i]] for i in got), s))
    return makespan


def _claim_rest(events: list, queues: list, cost: list, claim: float, steal: bool, done: np.ndarray) -> float:
    """Event simulation from the first steal on. events: (time, sm) when each running SM next claims;
    queues[s]: (loads, classes) of SM s's unclaimed own items in order. Updates done; returns the makespan
    (inf when items stay unclaimed, which only happens without stealing)."""
    heapq.heapify(events)
    pos, left, took = [0] * len(queues), [len(q[0]) for q in queues], [0] * len(queues)
    # Victims by most unclaimed items (ties: lowest SM). Entries only overestimate (left only falls), so
    # a top entry that is current is the true maximum; stale ones are refreshed as they surface.
    victims = [(-n, v) for v, n in enumerate(left)]
    heapq.heapify(victims)
    pop, push, refresh = heapq.heappop, heapq.heappush, heapq.heapreplace
    makespan = 0.0
    while events:
        t, s = pop(events)
        v = s
        if not left[s] and steal:
            n, v = victims[0]
            while -n != left[v]:
                refresh(victims, (-left[v], v))
                n, v = victims[0]
        if not left[v]:
            makespan = max(makespan, t)
            continue
        k = pos[v]
        pos[v] = k + 1
        left[v] -= 1
        took[s] += 1
        loads, classes = queues[v]
        push(events, (t + (loads[k] * cost[s][classes[k]] + (claim if v != s else 0.0)), s))
    done += took
    return float("inf") if any(left) else makespan


def limit(speeds: SpeedModel, workload: Workload) -> float:
    """Lower bound on the makespan over all fractional assignments of each class's loads to SMs (an LP;
    for one class it is total / sum_s 1/cost[s])."""
    if workload.n_items == 0:
        return 0.0
    return _solve_lp(speeds, workload)[0]


def gain_fraction(measured, uniform, limit_value) -> float:
    """Fraction of the possible gain (uniform - limit) that a measured makespan took; NaN when there is none.
    Any unit, as long as all three share it."""
    possible = float(uniform) - float(limit_value)
    return float("nan") if possible == 0 else (float(uniform) - float(measured)) / possible
