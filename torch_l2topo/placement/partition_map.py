"""Partition maps of tensors: the L2 partition each block of a CUDA tensor's storage is homed in.

On the H200 a 128-byte line is homed in one of two L2 partitions, the home changing every 256 bytes of
physical address, and an SM reads lines of its own partition ~30 cycles faster. Homes follow physical
addresses, fixed for an allocation's lifetime, so a map is measured once per allocation and cached.

This module owns: partition_map() (measure, classify, cache), the decision (classify_blocks: torch ops
where the timings are, any device; block_pairs prepares its per-plan data), the SM pairs that time each block
(choose_pairs, probe_plan), the independent serialized check (reprobe, agreement) and the per-allocation
cache (clear_cache). The kernels are triton_kernels/partition_probe.py.

Why pairs: one SM's latency alone does not say a line's home. Within one partition the latency an SM sees
spreads over ~30 cycles with the distance to the line's L2 slice, so near and far overlap: the best per-SM
threshold misreads 1.8% of the lines of the bundled H200 calibration, and 1.7-2.0% of the blocks (up to 11%
for one SM) in the map probe's recordings of two H200s (benchmarks/results/partition/). The difference d of
two SMs of opposite partitions cancels most of that spread: with pairs chosen on the calibration
(choose_pairs), every held-out calibration line is read right, with >= 17 cycles to spare, and the sign of
d reads every recorded block as the serialized re-probe does (in a tensor's second probe; 98.9% in its
first, whose slow loads triton_kernels/partition_probe.py explains). So every block is timed by both SMs of
a pair, and each pair decides on its own blocks' d (classify_blocks).

What a cold map costs (counted for a 32 MB tensor, 131072 blocks; launches and copies do not grow with it):
the per-GPU setup and, per tensor size, the probe plan with each block's pair id (_plan: one host pass over
the blocks, two pinned copies to the GPU) are made once and kept with the setup, so a cold map of a size seen
before does no host work per block. Under the GPU lock: the probe (the output's fill, the control block's
two, the kernel; the host polls its end, then reads the control block back: 1 copy); 3 launches turn its
clock counts into float64 with NaN for a missing timing, and the timings never leave the GPU. The decision
(_classify) is 38 + 8 k small launches for k 2-means updates (the recordings need 1-3), one read to the host
of a convergence flag per update, 2 reads of per-group numbers (n_pairs + 2 of each: the fit, then the tallies
that say which pairs see two modes), 2 copies of per-group numbers to the GPU, and the result: one copy of 5
bytes a block (margin float32, home int8), which the PartitionMap's numpy arrays view.
"""
from __future__ import annotations

import math
import time
import weakref
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import linear_sum_assignment

from ..errors import ProbeError, check_choice
from ..layout import LINE_BYTES

N_TIMED = 4            # timed loads per block and SM, of which the map keeps the fastest (cost count in
                       # triton_kernels/partition_probe.py)
REPROBE_WARM = 2
REPROBE_TIMED = 16
# Every threshold below was set on GPU 8ddca9f2a663's recording (benchmarks/results/partition/, made by
# benchmarks/record_partition_probe.py) or on the negative fixtures of tests/test_partition_map.py; the
# recording of GPU a5cfa49431b7 is held out to test them.
# Spread (sd) of one block's pair difference d: the MAD of d(run 0) - d(run 1) over every block of
# 8ddca9f2a663 is 1.25 cycles at 2 and 32 MB (4-load means), / 0.6745 / sqrt(2). Not the spread of d
# within one mode: a pair's mode holds sub-modes up to ~30 cycles apart (the line's L2 slice), each ~1 wide.
NOISE_CYCLES = 1.3
UNDECIDED_Z = 4.0      # a block is undecided within UNDECIDED_Z noise units of its pair's threshold (5.2 cycles;
                       # every block of a second probe on 8ddca9f2a663 lies >= 12 cycles from it)
MIN_FIT = 32           # a pair fits its threshold from at least this many blocks; pairs with fewer are fitted
                       # as one pool (each d in units of its pair's calibrated contrast)
MAX_ITERATIONS = 50    # 2-means on 1-D values converges in 2-5 steps from the calibrated start; this bounds it
# A pair (or the pool) sees structure when its two modes are at least MIN_SEPARATION x its calibrated contrast
# apart (8ddca9f2a663: 0.90-1.11; flat fixture, 1-cycle noise: <= 0.07; 10-cycle noise: <= 0.53 at 32
# blocks a pair) and the smaller mode holds at least MIN_BALANCE of its blocks (8ddca9f2a663: >= 0.31 at
# 124 blocks a pair; spike fixture, where 2-means isolates a few slow timings: <= 0.04).
MIN_SEPARATION = 0.5
MIN_BALANCE = 0.1
MIN_PAIRS_OK = 0.5     # ... and most pairs must: else the probe measured no partitions at all
# Unrelated timings (a broken probe) also split in two wide, balanced modes, but with no gap between them:
# ~15% of their blocks lie within CENTRAL_BAND x the half distance between the modes from the threshold,
# against ~1% (the slow-load outliers; none in a second run) on 8ddca9f2a663, where no clean block lies
# closer than 0.37. The map has no structure beyond MAX_CENTRAL such blocks.
CENTRAL_BAND = 0.25
MAX_CENTRAL = 0.05
PAIR_QUANTILE = 2.0    # a pair's calibrated margin: this percentile of its signed differences over the lines


# ---- the decision ----------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class BlockClasses:
    """homes: (n_blocks,) int8 0/1, -1 undecided. margin: (n_blocks,) |d - threshold| in cycles per load, d the
    block's pair difference. pairs: (n_pairs, 2) the SM pairs that timed blocks (column p near partition p);
    threshold: (n_pairs,) each one's decision threshold on d (NaN: its blocks are undecided). found: the
    timings show two modes at all; reason says why not. All numpy, on the host."""

    homes: np.ndarray
    margin: np.ndarray
    pairs: np.ndarray
    threshold: np.ndarray
    found: bool
    reason: str


@dataclass(frozen=True, eq=False)
class BlockPairs:
    """Everything classify_blocks needs besides the timings, prepared once per probe plan, calibration and
    device (block_pairs; partition_map keeps one per tensor size with the per-GPU setup).

    pairs: (n_pairs, 2) the SM pairs that timed blocks (column p near partition p), ordered by (row 0 SM,
    row 1 SM). mid, half: (n_pairs,) host float64, the centre and half width of the pair's calibrated d
    (partition 0 at mid - half, 1 at mid + half); usable: finite mid and half > 0. On `device`: pair (n_blocks,)
    int64, each block's pair, or TRASH = n_pairs + 1 where no usable pair timed it; and per group (n_pairs + 2:
    the pairs, the pool n_pairs, the trash) mid_g and half_g (unusable pairs and the pool: 0 and 1; the trash:
    NaN and 1), ids (0..n_pairs + 1) and fallback (the group of a pair with too few blocks: the pool; the
    trash stays the trash)."""


    pairs: np.ndarray
    mid: np.ndarray
    half: np.ndarray
    usable: np.ndarray
    pair: object
    mid_g: object
    half_g: object
    ids: object
    fallback: object

    @property
    def n_blocks(self) -> int:
        return int(self.pair.shape[0])

    @property
    def device(self):
        return self.pair.device


def _host(a, dtype) -> np.ndarray:
    """A numpy array of `a` (numpy, a list, or a torch tensor on any device)."""
    if hasattr(a, "detach") and hasattr(a, "cpu"):
        a = a.detach().cpu().numpy()
    return np.asarray(a, dtype=dtype)


def _on(a: np.ndarray, device):
    """Host array -> tensor on `device` (CUDA: pinned and non-blocking, as probes.to_device)."""
    import torch

    if device.type == "cuda":
        from ..measure.probes import to_device

        return to_device(a, device)
    return torch.from_numpy(np.ascontiguousarray(a)).to(device)


def block_pairs(timers, near, far, device="cpu") -> BlockPairs:
    """Prepare classify_blocks' per-plan data. timers: (n_blocks, 2) the SMs that timed each block into row 0
    and row 1 (timers_of_blocks; -1: none). near, far: (n_sm,) the SMs' calibrated near/far latencies
    (labels.sm_labels). Host work in O(n_blocks + n_sm^2), then one copy of the pair ids to `device`."""
    import torch

    t = _host(timers, np.int64)
    near, far = _host(near, np.float64), _host(far, np.float64)
    if t.ndim != 2 or t.shape[1] != 2:
        raise ValueError(f"timers must have shape (n_blocks, 2), got {t.shape}")
    if near.ndim != 1 or far.shape != near.shape:
        raise ValueError(f"near and far must have one shape (n_sm,), got {near.shape} and {far.shape}")
    n_sm = len(near)
    if t.size and (t.min() < -1 or t.max() >= n_sm):
        raise ValueError(f"timers must hold SM ids in 0..{n_sm - 1} (-1: none)")
    timed = (t >= 0).all(axis=1)
    key = t[timed, 0] * n_sm + t[timed, 1]  # one pair per distinct (row 0 SM, row 1 SM)
    seen = np.bincount(key, minlength=n_sm * n_sm) > 0
    keys = np.flatnonzero(seen)
    pair_of_key = np.cumsum(seen) - 1
    pairs, n_pairs = np.stack([keys // n_sm, keys % n_sm], axis=1), len(keys)
    # d in units of each pair's calibrated contrast: the calibration puts partition 0 at -1, partition 1 at +1
    mid = (near[pairs[:, 0]] + far[pairs[:, 0]] - near[pairs[:, 1]] - far[pairs[:, 1]]) / 2
    half = (far[pairs[:, 0]] - near[pairs[:, 0]] + far[pairs[:, 1]] - near[pairs[:, 1]]) / 2
    with np.errstate(invalid="ignore"):
        usable = np.isfinite(mid) & (half > 0)
    trash = n_pairs + 1
    pair = np.full(len(t), trash, dtype=np.int64)
    inv = pair_of_key[key]
    pair[timed] = np.where(usable[inv], inv, trash)
    mid_g = np.concatenate([np.where(usable, mid, 0.0), [0.0, np.nan]])  # the trash's NaN marks its blocks
    half_g = np.concatenate([np.where(usable, half, 1.0), [1.0, 1.0]])
    fallback = np.full(n_pairs + 2, n_pairs, dtype=np.int64)
    fallback[trash] = trash
    device = torch.device(device)
    return BlockPairs(pairs=pairs, mid=mid, half=half, usable=usable, pair=_on(pair, device),
                      mid_g=_on(mid_g, device), half_g=_on(half_g, device),
                      ids=_on(np.arange(n_pairs + 2, dtype=np.int64), device), fallback=_on(fallback, device))


def classify_blocks(cycles, timers, near=None, far=None, *, noise_cycles: float = NOISE_CYCLES,
                    z: float = UNDECIDED_Z) -> BlockClasses:
    """The home partition of each block from the latencies the two SMs of a pair measured on it.

    cycles: (2, n_blocks) cycles per load, row p timed by the pair's SM near partition p (NaN: missing); a
    numpy array or a torch tensor on any device, where the work then runs. timers: either (n_blocks, 2) those
    SMs (timers_of_blocks; -1: none) with near, far: (n_sm,) the SMs' calibrated near/far latencies
    (labels.sm_labels), or a BlockPairs prepared from them (block_pairs; then no near, far). Each pair decides
    on d = cycles[0] - cycles[1]: its blocks' d split in two modes, lower for partition 0 (row 0's SM is near
    it). 2-means per pair, started at the calibration's d of a block of each partition, sets its threshold
    midway between the two means: home 0 below it, 1 above, margin = |d - threshold|. Pairs with fewer than
    MIN_FIT blocks are fitted as one pool (d in units of the pair's calibrated contrast); a pool smaller still
    keeps the calibrated thresholds. Undecided (-1): a missing timing, margin under z * noise_cycles, or a
    fitted pair (or pool) whose modes are too close or too unbalanced to be partitions. No structure
    (found=False, all -1): most fitted pairs lack two such modes, or too many blocks fall in the middle of the
    gap between them.

    Per-block work is torch ops where the timings are; the per-pair numbers (n_pairs + 2 of each) cross to
    the host between passes, and the homes and margins come back in one copy at the end.
    """
    import torch

    c = cycles if isinstance(cycles, torch.Tensor) else torch.from_numpy(_host(cycles, np.float64))
    if isinstance(timers, BlockPairs):
        if near is not None or far is not None:
            raise ValueError("a BlockPairs carries its calibration: pass no near, far with it")
        blocks = timers
        if c.ndim != 2 or c.shape[0] != 2 or c.shape[1] != blocks.n_blocks:
            raise ValueError(f"cycles must have shape (2, {blocks.n_blocks}) for these BlockPairs, got "
                             f"{tuple(c.shape)}")
    else:
        if near is None or far is None:
            raise TypeError("classify_blocks needs near and far with timers (or a BlockPairs)")
        t_shape = np.shape(timers)
        if c.ndim != 2 or c.shape[0] != 2 or tuple(t_shape) != (c.shape[1], 2):
            raise ValueError(f"cycles must have shape (2, n_blocks) and timers (n_blocks, 2), got "
                             f"{tuple(c.shape)} and {tuple(t_shape)}")
        blocks = block_pairs(timers, near, far, c.device)
    return _classify(c.to(blocks.device, torch.float64), blocks, noise_cycles, z)


def _classify(c, bp: BlockPairs, noise_cycles: float, z: float) -> BlockClasses:
    """classify_blocks on float64 timings on bp's device: 17 launches before the fit, 3 + 8 per 2-means update
    (with one read of the convergence flag each), 18 after; 2 reads of per-group numbers to the host and 2
    copies back, then one read of the result."""
    import torch

    n_pairs, dev, f64 = len(bp.pairs), bp.device, torch.float64
    n_groups, trash = n_pairs + 2, n_pairs + 1
    homes, margin = np.full(bp.n_blocks, -1, np.int8), np.zeros(bp.n_blocks, np.float32)
    threshold = np.full(n_pairs, np.nan)

    def undecided(reason):
        return BlockClasses(homes, margin, bp.pairs, threshold, False, reason)

    # each block's x: d in its pair's calibrated units (NaN: a missing timing, or no usable pair: mid_g's NaN);
    # such a block goes to the trash group, with x 0
    half_b = bp.half_g.take(bp.pair)
    x = (c[0] - c[1] - bp.mid_g.take(bp.pair)) / half_b
    ok = x.abs() < math.inf  # isfinite, in two launches rather than four
    pv = torch.where(ok, bp.pair, trash)
    x = torch.where(ok, x, 0.0)
    ones_x = torch.stack((torch.ones_like(x), x), dim=1)  # index_add of these: (count, sum) per group
    n_pair = torch.zeros(n_groups, dtype=f64, device=dev).index_add_(0, pv, ones_x[:, 0])
    group_of = torch.where(n_pair >= MIN_FIT, bp.ids, bp.fallback)  # small pairs -> the pool
    group = group_of.take(pv)
    group_hi = group + n_groups  # the upper side of group g sums into slot n_groups + g

    # per-group 2-means from the calibrated starts (-1, +1): both sides' (count, sum) from one index_add
    cut = torch.zeros(n_groups, dtype=f64, device=dev)
    means, before = None, None
    for _ in range(MAX_ITERATIONS):
        upper = x > cut.take(group)
        if before is not None and torch.equal(upper, before):
            break
        sums = torch.zeros(2 * n_groups, 2, dtype=f64, device=dev).index_add_(
            0, torch.where(upper, group_hi, group), ones_x)
        means = (sums[:, 1] / sums[:, 0]).view(2, n_groups)  # rows: lower and upper mean; NaN: an empty side
        cut = means.mean(dim=0)
        before = upper

    # per-group decisions on the host, as numpy
    host = torch.cat((n_pair, means.flatten())).cpu().numpy()
    n_pair_h, lo_fit, hi_fit = host[:n_pairs], host[n_groups:n_groups + n_pairs + 1], host[2 * n_groups:-1]
    group_of_h = np.where(n_pair_h >= MIN_FIT, np.arange(n_pairs), n_pairs)
    count = np.bincount(group_of_h, weights=n_pair_h, minlength=n_pairs + 1)
    if not count.sum():
        return undecided("no block has both timings from a calibrated pair")
    fitted = count >= MIN_FIT
    lo, hi = np.where(fitted, lo_fit, -1.0), np.where(fitted, hi_fit, 1.0)
    cut, spread = (lo + hi) / 2, (hi - lo) / 2
    per_group = np.zeros((2, n_groups))  # the trash: cut 0 (its x), no band
    per_group[0, :-1], per_group[1, :-1] = cut, CENTRAL_BAND * spread
    per_group = _on(per_group, dev)
    cut_b = per_group[0].take(group)
    upper = x > cut_b
    dist = (x - cut_b).abs()
    central_b = dist < per_group[1].take(group)
    tally = torch.zeros(n_groups, 2, dtype=f64, device=dev).index_add_(
        0, group, torch.stack((upper, central_b), dim=1).to(f64)).cpu().numpy()
    n_upper, n_central = tally[:-1, 0], tally[:-1, 1]
    with np.errstate(invalid="ignore"):
        modes = (spread >= MIN_SEPARATION) & (np.minimum(n_upper, count - n_upper) >= MIN_BALANCE * count)
    modes |= ~fitted  # too few blocks to fit: the calibration vouches
    if fitted.any():
        share = float(np.mean(modes[fitted]))
        if share < MIN_PAIRS_OK:
            return undecided(f"no structure: only {share:.0%} of the SM pairs see two balanced modes of timings "
                             f"at least {MIN_SEPARATION:g} x their calibrated contrast apart")
        tested = modes & fitted
        with np.errstate(invalid="ignore"):
            central = float(n_central[tested].sum() / count[tested].sum())
        if central > MAX_CENTRAL:
            return undecided(f"no structure: {central:.1%} of the blocks lie in the middle of the gap between "
                             f"their pair's two modes (over {MAX_CENTRAL:.0%}; unrelated timings: ~15%)")
    decided = bp.usable & modes[group_of_h]
    threshold[decided] = (bp.mid + cut[group_of_h] * bp.half)[decided]

    # every block against its group's threshold; margins and homes come back in one copy
    margin_b = (dist * half_b).to(torch.float32)  # the trash: x 0 at cut 0, margin 0
    # the margin a block of each group needs to be decided: z * noise_cycles (compared in float32, as the
    # margins are kept), or infinite where the group shows no two modes, and in the trash
    needed = np.append(np.where(modes, z * noise_cycles, np.inf), np.inf).astype(np.float32)
    homes_b = torch.where(margin_b >= _on(needed, dev).take(group), upper.to(torch.int8), -1)
    out = torch.cat((margin_b.view(torch.uint8), homes_b.view(torch.uint8))).cpu().numpy()
    n = bp.n_blocks
    return BlockClasses(out[4 * n:].view(np.int8), out[:4 * n].view(np.float32), bp.pairs, threshold, True, "")


# ---- which SMs time which blocks (pure numpy) ------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Pairs:
    """sms: (n_pairs, 2) SM ids, column p near partition p. margin: (n_pairs,) each pair's calibrated margin
    (cycles per load; > 0: the faster SM of the pair names the home of nearly every calibrated line).
    best: the pair with the largest margin of all, which the reprobe uses."""

    sms: np.ndarray
    margin: np.ndarray
    best: tuple[int, int]


def choose_pairs(line_cycles, sm_partition, line_partition, quantile: float = PAIR_QUANTILE) -> Pairs:
    """Pair SMs of partition 0 with SMs of partition 1, one to one, so that in each pair the faster SM names
    the home of the calibrated lines by the widest margin (assignment maximizing the summed margins).
    A pair's margin: the `quantile` percentile over decided lines of (far SM's latency - near SM's latency);
    pairs with margin <= 0 are left out."""
    lc = np.asarray(line_cycles, dtype=np.float64)
    part, home = np.asarray(sm_partition), np.asarray(line_partition)
    a, b = np.flatnonzero(part == 0), np.flatnonzero(part == 1)
    lines = np.flatnonzero(home >= 0)
    if not (len(a) and len(b) and len(lines)):
        raise ValueError("choose_pairs needs SMs in both partitions and lines with a decided home")
    toward = np.where(home[lines] == 1, 1.0, -1.0)  # + when the line's home is partition 1 (SM b is near)
    signed = (lc[a][:, None, lines] - lc[b][None, :, lines]) * toward
    score = np.percentile(signed, quantile, axis=2)
    rows, cols = linear_sum_assignment(score, maximize=True)
    keep = score[rows, cols] > 0
    if not keep.any():
        raise ValueError("no pair of SMs of opposite partitions tells the calibrated lines' homes apart")
    i, j = np.unravel_index(np.argmax(score), score.shape)
    return Pairs(sms=np.stack([a[rows[keep]], b[cols[keep]]], axis=1), margin=score[rows, cols][keep],
                 best=(int(a[i]), int(b[j])))


def probe_plan(n_blocks: int, pairs: np.ndarray, n_sm: int) -> np.ndarray:
    """(n_sm, 3) int64 (lo, hi, row) for partition_probe_kernel: pair k times blocks lo..hi-1 (a contiguous
    share, sizes within one block of each other), its SM of partition p into row p. Other SMs: lo == hi."""
    pairs = np.asarray(pairs, dtype=np.int64)
    edges = (np.arange(len(pairs) + 1) * n_blocks) // len(pairs)
    plan = np.zeros((n_sm, 3), dtype=np.int64)
    for p in (0, 1):
        plan[pairs[:, p]] = np.stack([edges[:-1], edges[1:], np.full(len(pairs), p)], axis=1)
    return plan


def timers_of_blocks(plan: np.ndarray, n_blocks: int) -> np.ndarray:
    """(n_blocks, 2): the SM that timed each block into row 0 and row 1 of the probe's output."""
    out = np.full((2, n_blocks), -1, dtype=np.int64)
    for sm in np.flatnonzero(plan[:, 1] > plan[:, 0]):
        lo, hi, row = plan[sm]
        out[row, lo:hi] = sm
    return out.T


# ---- the cache: one map per allocation -----------------------------------------------------------------
# untyped_storage() returns one Python object per storage for as long as any tensor uses it (torch keeps the
# storage's Python object alive with it; tests/test_partition_map.py checks this), so a weakref.finalize on
# it runs when the allocation is freed and drops the map; the key (device, address, size) also catches a
# storage that was resized in place, and the stored weak reference a new storage at a recycled address.
@dataclass
class _Entry:
    storage: weakref.ref
    pmap: "PartitionMap"
    finalizer: weakref.finalize


_MAPS: dict[tuple, _Entry] = {}


def _key(storage, device, block_bytes: int) -> tuple:
    return (str(device), storage.data_ptr(), storage.nbytes(), int(block_bytes))


def _cached(tensor, block_bytes: int):
    storage = tensor.untyped_storage()
    entry = _MAPS.get(_key(storage, tensor.device, block_bytes))
    return entry.pmap if entry is not None and entry.storage() is storage else None


def _remember(tensor, block_bytes: int, pmap) -> None:
    storage = tensor.untyped_storage()
    for key in [k for k, e in _MAPS.items() if e.storage() is storage and k[3] == block_bytes]:
        _drop(key)  # the same storage under an older address or size
    key = _key(storage, tensor.device, block_bytes)
    _drop(key)
    _MAPS[key] = _Entry(weakref.ref(storage), pmap, weakref.finalize(storage, _forget, key, id(pmap)))


def _forget(key: tuple, pmap_id: int) -> None:
    entry = _MAPS.get(key)
    if entry is not None and id(entry.pmap) == pmap_id:
        del _MAPS[key]


def _drop(key: tuple) -> None:
    entry = _MAPS.pop(key, None)
    if entry is not None:
        entry.finalizer.detach()


def clear_cache(setups: bool = False) -> None:
    """Forget every cached map; setups=True also the per-GPU setup (calibration, SM labels and pairs)."""
    for key in list(_MAPS):
        _drop(key)
    if setups:
        _SETUPS.clear()


# ---- host side of the probes -----------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class PartitionMap:
    """homes: (n_blocks,) int8, the L2 partition of each block_bytes block of the storage (block i starts
    at byte i * block_bytes; partitions numbered as in sm_labels of the calibration; -1: undecided).
    margin: (n_blocks,) cycles per load from the decision threshold (classify_blocks). data_ptr, nbytes,
    device_index: the storage mapped. elapsed_s: wall time of the call that measured it (a cached map keeps
    it); probe_s: of its kernel launch and wait."""

    homes: np.ndarray
    margin: np.ndarray
    block_bytes: int
    data_ptr: int
    nbytes: int
    device_index: int
    elapsed_s: float
    probe_s: float

    @property
    def n_blocks(self) -> int:
        return len(self.homes)

    @property
    def undecided_fraction(self) -> float:
        return float(np.mean(self.homes < 0))

    def blocks(self, partition: int) -> np.ndarray:
        """Indices of the blocks homed in `partition`."""
        return np.flatnonzero(self.homes == partition)


@dataclass(frozen=True, eq=False)
class Reprobe:
    """The independent check: blocks (n,) probed; cycles (2, n) the mean cycles per load (of n_timed) seen by
    sms[0] (near partition 0) and sms[1] (near partition 1); homes (n,) the partition of the SM that saw it
    faster."""

    blocks: np.ndarray
    cycles: np.ndarray
    homes: np.ndarray
    sms: tuple[int, int]
    elapsed_s: float


@dataclass(frozen=True, eq=False)
class _Plan:
    """What the probe plan fixes for tensors of n_blocks blocks on one device, the same for every such tensor:
    the plan (host, and on the device for the kernel), how many SMs time blocks, and the classifier's
    BlockPairs (each block's pair id on the device)."""

    n_blocks: int
    plan: np.ndarray
    plan_t: object
    n_timing: int
    blocks: BlockPairs


PLANS_KEPT = 8  # per setup, the most recently used tensor sizes (a 32 MB tensor's: 1 MB of pair ids on the GPU)


@dataclass(frozen=True, eq=False)
class _Setup:
    topology: object
    n_sm: int
    near: np.ndarray
    far: np.ndarray
    pairs: Pairs
    plans: dict = field(default_factory=dict, repr=False)  # (n_blocks, device) -> _Plan, oldest first


def _plan(setup: _Setup, n_blocks: int, device) -> _Plan:
    """The setup's _Plan for n_blocks blocks on `device`, made on first use (one host pass over the blocks and
    two small pinned copies to the device) and kept with the setup: the same object for every tensor of the
    size, while it is among the PLANS_KEPT sizes used last."""
    key = (int(n_blocks), str(device))
    hit = setup.plans.pop(key, None)
    if hit is None:
        plan = probe_plan(n_blocks, setup.pairs.sms, setup.n_sm)
        hit = _Plan(n_blocks=int(n_blocks), plan=plan, plan_t=_on(plan.ravel(), device),
                    n_timing=int(np.sum(plan[:, 1] > plan[:, 0])),
                    blocks=block_pairs(timers_of_blocks(plan, n_blocks), setup.near, setup.far, device))
        while len(setup.plans) >= PLANS_KEPT:
            del setup.plans[next(iter(setup.plans))]
    setup.plans[key] = hit
    return hit


_SETUPS: dict[tuple, _Setup] = {}


def _setup(index: int, topology, backend: str) -> _Setup:
    """The calibration, SM labels and pairs of cuda:index, once per process (labels take ~0.5 s)."""
    key = (index, None if topology is None else id(topology))
    hit = _SETUPS.get(key)
    if hit is not None and (topology is None or hit.topology is topology):
        return hit
    from ..analysis.labels import sm_labels
    from ..measure.calibration import calibration_for

    topo = calibration_for(index, topology, backend=backend)
    n_sm = topo.n_sm  # the device's: calibration_for checked it
    labels = sm_labels(topo)
    if not labels.partitions.found:
        raise ProbeError(f"the calibration of cuda:{index} shows no two L2 partitions "
                         f"({labels.partitions.reason}): there is nothing to map")
    pairs = choose_pairs(topo.line_cycles, labels.partition, labels.line_partition)
    setup = _Setup(topo, n_sm, labels.near_cycles, labels.far_cycles, pairs)
    _SETUPS[key] = setup
    return setup


def _storage_of(tensor, block_bytes: int):
    """The tensor's storage, checked: a CUDA tensor, not empty, line-aligned; block_bytes a multiple of a line."""
    import torch

    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cuda":
        raise ValueError(f"partition maps are of CUDA tensors; this tensor is on {tensor.device}")
    if isinstance(block_bytes, bool) or not isinstance(block_bytes, int) or block_bytes < LINE_BYTES \
            or block_bytes % LINE_BYTES:
        raise ValueError(f"block_bytes must be a positive multiple of {LINE_BYTES}, got {block_bytes!r}")
    storage = tensor.untyped_storage()
    if tensor.numel() == 0 or storage.nbytes() < 8:
        raise ValueError("the tensor is empty: there is nothing to map")
    if storage.data_ptr() % LINE_BYTES:
        raise ValueError(f"the storage starts at {storage.data_ptr():#x}, not on a {LINE_BYTES}-byte line: "
                         "blocks would straddle lines (allocate with torch; its allocator aligns to 512 bytes)")
    return storage


def n_blocks_of(nbytes: int, block_bytes: int) -> int:
    """Blocks mapped in a storage of `nbytes`: each block whose first 8 bytes (the word the probe loads) lie
    in it; a last block of fewer than 8 bytes is left out."""
    return (nbytes - 8) // block_bytes + 1


def _launch_probe(tensor, plan_t, n_blocks: int, n_timing: int, n_sm: int, block_bytes: int, backend: str,
                  timeout_s: float):
    """partition_probe_kernel once over the tensor's storage: ((2, n_blocks) int32 on the device, the fastest of
    N_TIMED loads of each block in clock counts, -1 where nothing was timed; host wall time of the launch and
    wait). Launches: the output's fill, the control block's two, the kernel; one copy of the control block
    back (probes.checked_launch)."""
    import torch

    from ..measure.probes import checked_launch

    storage = _storage_of(tensor, block_bytes)
    cycles = torch.full((2, n_blocks), -1, dtype=torch.int32, device=tensor.device)
    per_sm = 2 * n_blocks // max(n_timing, 1) + 1
    elapsed = checked_launch(tensor.device, "partition_probe", backend, n_sm, n_sm, timeout_s, per_sm * (1 + N_TIMED),
                             (storage.data_ptr(), plan_t, cycles, n_blocks, block_bytes, 0, N_TIMED))
    return cycles, elapsed


def run_probe(tensor, plan: np.ndarray, n_sm: int, *, block_bytes: int = 256, backend: str = "triton",
              timeout_s: float = 2.0):
    """Launch partition_probe_kernel once over the tensor's storage: (cycles (2, n_blocks) float32 of the fastest
    of N_TIMED loads of each block, row p by the SM of partition p, NaN where nothing was timed; host wall time
    of the launch and wait), on the host. The caller holds the GPU lock. (partition_map keeps the timings on
    the GPU: _probe.)"""
    from ..measure.probes import to_device

    n_blocks = n_blocks_of(_storage_of(tensor, block_bytes).nbytes(), block_bytes)
    plan = np.asarray(plan, dtype=np.int64)
    cycles, elapsed = _launch_probe(tensor, to_device(plan.ravel(), tensor.device), n_blocks,
                                    int(np.sum(plan[:, 1] > plan[:, 0])), n_sm, block_bytes, backend, timeout_s)
    c = cycles.cpu().numpy().astype(np.float32)  # exact: clock counts of one load
    c[c < 0] = np.nan
    return c, elapsed


def _probe(tensor, plan: _Plan, n_sm: int, *, block_bytes: int, backend: str, timeout_s: float):
    """run_probe for partition_map, with the plan's device copy and the timings left on the device: ((2, n_blocks)
    float64 tensor, NaN where nothing was timed; host wall time). Three launches after the probe's."""
    import torch

    cycles, elapsed = _launch_probe(tensor, plan.plan_t, plan.n_blocks, plan.n_timing, n_sm, block_bytes, backend,
                                    timeout_s)
    return cycles.to(torch.float64).masked_fill_(cycles < 0, math.nan), elapsed


def partition_map(tensor, *, topology=None, backend: str = "triton", block_bytes: int = 256,
                  timeout_s: float = 2.0) -> PartitionMap:
    """The L2 partition of every `block_bytes` block of `tensor`'s storage, measured with all SMs at once.

    A non-contiguous tensor or a view maps its whole storage (block i starts at byte i * block_bytes of the
    storage, not of the view). topology: the calibration whose SM labels (partition numbers) and SM pairs
    are used (another GPU's is refused: CalibrationMismatch); default calibrate(device), cached per process.
    backend: "triton" ("auto" means it too: the probe is Triton only). The map is cached per storage until
    the storage is freed or moves (clear_cache() forgets them all); a cached map is returned as the same
    object. Measuring takes the GPU lock, and is refused during CUDA graph capture. Raises ProbeError when the
    timings show no partitions (a broken probe).
    """
    import torch

    from ..measure.calibration import measuring

    t0 = time.perf_counter()
    storage = _storage_of(tensor, block_bytes)
    check_choice("backend", backend, ("auto", "triton"))
    backend = "triton"
    hit = _cached(tensor, block_bytes)
    if hit is not None:
        return hit
    if torch.cuda.is_current_stream_capturing():
        raise ProbeError("partition_map cannot measure during CUDA graph capture: map the tensor before capturing")
    index = tensor.device.index
    setup = _setup(index, topology, backend)
    plan = _plan(setup, n_blocks_of(storage.nbytes(), block_bytes), tensor.device)
    # the classification's kernels run under the lock too: another process's probe must not time beside them
    with measuring(index), torch.cuda.device(index):
        cycles, probe_s = _probe(tensor, plan, setup.n_sm, block_bytes=block_bytes, backend=backend,
                                 timeout_s=timeout_s)
        classes = classify_blocks(cycles, plan.blocks)
    if not classes.found:
        raise ProbeError(f"partition map of cuda:{index}: {classes.reason}; the probe measured no partitions")
    pmap = PartitionMap(homes=classes.homes, margin=classes.margin, block_bytes=block_bytes,
                        data_ptr=storage.data_ptr(), nbytes=storage.nbytes(), device_index=index,
                        elapsed_s=time.perf_counter() - t0, probe_s=probe_s)
    _remember(tensor, block_bytes, pmap)
    return pmap


def reprobe(tensor, sample_blocks, *, topology=None, block_bytes: int = 256, n_timed: int = REPROBE_TIMED,
            timeout_s: float = 2.0, warmup_ms: float = 50.0) -> Reprobe:
    """The independent check of a map: the blocks `sample_blocks` timed by the calibration's best SM pair,
    one SM at a time after warming the clocks for warmup_ms, the mean of n_timed loads each (not the map's
    fastest load: an independent statistic, and one slow load moves a mean of 16 by < half the smallest
    recorded difference); a block's home is the partition of the SM that saw it faster. Takes the GPU lock."""
    import torch

    from ..measure.calibration import measuring
    from ..measure.probes import checked_launch, to_device, warm_clocks

    t0 = time.perf_counter()
    storage = _storage_of(tensor, block_bytes)
    blocks = np.asarray(sample_blocks, dtype=np.int64).ravel()
    n_blocks = n_blocks_of(storage.nbytes(), block_bytes)
    if blocks.size == 0 or blocks.min() < 0 or blocks.max() >= n_blocks:
        raise ValueError(f"sample_blocks must be a non-empty list of block indices in 0..{n_blocks - 1}")
    index, device = tensor.device.index, tensor.device
    setup = _setup(index, topology, "triton")
    rows = np.full(setup.n_sm, -1, dtype=np.int32)
    rows[list(setup.pairs.best)] = [0, 1]
    with measuring(index), torch.cuda.device(index):
        warm_clocks(device, warmup_ms)
        cycles = torch.full((2, blocks.size), -1, dtype=torch.int64, device=device)
        # two SMs measure, one after the other (wave 1)
        checked_launch(device, "partition_reprobe", "triton", setup.n_sm, 1, timeout_s,
                       blocks.size * (REPROBE_WARM + n_timed),
                       (storage.data_ptr(), to_device(blocks, device), to_device(rows, device), cycles, blocks.size,
                        block_bytes, 0, REPROBE_WARM, n_timed), measuring_sms=2)
    c = cycles.cpu().numpy() / n_timed
    homes = np.where(c[0] < c[1], 0, np.where(c[1] < c[0], 1, -1))
    homes[(c < 0).any(axis=0)] = -1
    return Reprobe(blocks=blocks, cycles=c, homes=homes.astype(np.int8), sms=setup.pairs.best,
                   elapsed_s=time.perf_counter() - t0)


def agreement(pmap: PartitionMap, check: Reprobe) -> float:
    """Fraction of the reprobed blocks whose home the map gives the same (undecided in either counts as
    disagreement)."""
    mine = pmap.homes[check.blocks]
    return float(np.mean((mine >= 0) & (mine == check.homes)))
