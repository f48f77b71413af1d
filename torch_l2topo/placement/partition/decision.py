"""The decision of a partition map: each block's home partition from the latencies the two SMs of a pair
measured on it (classify_blocks), and the per-plan data it needs besides the timings (block_pairs).

Why pairs: one SM's latency alone does not say a line's home. Within one partition the latency an SM sees
spreads with the distance to the line's L2 slice, so near and far overlap and the best per-SM threshold
misreads a few percent of the lines. The difference d of two SMs of opposite partitions cancels most of that
spread: with pairs chosen on the calibration (partition_pairs.choose_pairs), every held-out calibration line is
read right with cycles to spare, and the sign of d reads the recorded blocks as the serialized re-probe does.
So every block is timed by both SMs of a pair, and each pair decides on its own blocks' d.

The work is torch ops where the timings are (any device: the GPU in partition_map, the host in the tests and
the offline analysis of recordings); _classify's docstring counts its launches. Docs: docs/results.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ...measure.probes import to_device

# Every threshold below was set on GPU 8ddca9f2a663's recording (made by
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


def block_pairs(timers, near, far, device="cpu") -> BlockPairs:
    """Prepare classify_blocks' per-plan data. timers: (n_blocks, 2) the SMs that timed each block into row 0
    and row 1 (timers_of_blocks; -1: none). near, far: (n_sm,) the SMs' calibrated near/far latencies
    (labels.sm_labels). Host work in O(n_blocks + n_sm^2), then one copy of the pair ids to `device`."""
    t = _host(timers, np.int64)
    if t.ndim != 2 or t.shape[1] != 2:
        raise ValueError(f"timers must have shape (n_blocks, 2), got {t.shape}")
    runs = np.arange(len(t))
    return _pairs_of_runs(t, np.ones(len(t), dtype=np.int64), near, far, device, runs)


def block_pairs_of_plan(plan, n_blocks: int, near, far, device="cpu") -> BlockPairs:
    """block_pairs(timers_of_blocks(plan, n_blocks), near, far, device), the same BlockPairs, built from the
    probe plan's contiguous runs of blocks (one per timing SM pair) in O(n_sm^2) host work: the pair id of every
    block is expanded on `device` (repeat_interleave), so a tensor size seen for the first time costs no host
    pass over its blocks and no copy of a per-block array (a 32 MB tensor has 131,072 blocks)."""
    plan = _host(plan, np.int64)
    runs = {}  # first block -> [end, SM timing into row 0, SM timing into row 1]
    for sm in np.flatnonzero(plan[:, 1] > plan[:, 0]):
        lo, hi, row = (int(v) for v in plan[sm])
        runs.setdefault(lo, [hi, -1, -1])[1 + row] = int(sm)
    timers, counts, at = [], [], 0
    for lo in sorted(runs):  # in block order, with the blocks between runs as untimed runs
        hi, sm0, sm1 = runs[lo]
        if lo > at:
            timers.append((-1, -1))
            counts.append(lo - at)
        timers.append((sm0, sm1))
        counts.append(hi - lo)
        at = hi
    if at < n_blocks:
        timers.append((-1, -1))
        counts.append(n_blocks - at)
    return _pairs_of_runs(np.array(timers, dtype=np.int64).reshape(-1, 2), counts, near, far, device, None)


def block_pairs_expanded(template: BlockPairs, n_blocks: int) -> BlockPairs:
    """block_pairs_of_plan(probe_plan(n_blocks, ...), n_blocks, ...) from `template`, the same call's result for
    template.n_blocks = P blocks (one block per SM pair: run k is block k), for any n_blocks >= P. probe_plan
    gives pair k the blocks floor(k n / P) .. floor((k + 1) n / P) - 1, all non-empty when n >= P, so block b is
    in run floor(((b + 1) P - 1) / n) and every other field is the template's. The per-size cost is a few
    launches on the device: no host pass and no copy."""
    import torch

    runs = template.n_blocks
    if n_blocks < runs:
        raise ValueError(f"an expansion needs at least one block per run: {n_blocks} blocks, {runs} runs")
    run = (torch.arange(1, n_blocks + 1, dtype=torch.int64, device=template.device) * runs - 1) // n_blocks
    return replace(template, pair=template.pair[run])


def _pairs_of_runs(t, counts, near, far, device, block_runs) -> BlockPairs:
    """BlockPairs of blocks given as runs: run r holds counts[r] consecutive blocks timed by the SMs t[r]."""
    import torch

    near, far = _host(near, np.float64), _host(far, np.float64)
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
    run_pair = np.full(len(t), trash, dtype=np.int64)
    inv = pair_of_key[key]
    run_pair[timed] = np.where(usable[inv], inv, trash)
    mid_g = np.concatenate([np.where(usable, mid, 0.0), [0.0, np.nan]])  # the trash's NaN marks its blocks
    half_g = np.concatenate([np.where(usable, half, 1.0), [1.0, 1.0]])
    fallback = np.full(n_pairs + 2, n_pairs, dtype=np.int64)
    fallback[trash] = trash
    device = torch.device(device)
    if block_runs is not None:  # one run per block: the per-block array itself
        pair = to_device(run_pair, device)
    else:
        # output_size: the length is known here, so torch need not read the counts back (a sync)
        pair = torch.repeat_interleave(to_device(run_pair, device), to_device(np.asarray(counts, np.int64), device),
                                       output_size=int(np.sum(counts)))
    return BlockPairs(pairs=pairs, mid=mid, half=half, usable=usable, pair=pair,
                      mid_g=to_device(mid_g, device), half_g=to_device(half_g, device),
                      ids=to_device(np.arange(n_pairs + 2, dtype=np.int64), device),
                      fallback=to_device(fallback, device))


def classify_blocks(cycles, timers, near=None, far=None, *, noise_cycles: float = NOISE_CYCLES,
                    z: float = UNDECIDED_Z) -> BlockClasses:
    """The home partition of each block from the latencies the two SMs of a pair measured on it.

    cycles: (2, n_blocks) cycles per load, row p timed by the pair's SM near partition p (NaN: missing); numpy or
    a torch tensor on any device, where the work then runs (per-pair numbers cross to the host between passes;
    homes and margins come back in one copy). timers: (n_blocks, 2) those SMs (timers_of_blocks; -1: none) with
    near, far: (n_sm,) the SMs' calibrated near/far latencies (labels.sm_labels); or a BlockPairs (block_pairs)
    and no near, far. Each pair decides on d = cycles[0] - cycles[1], lower for partition 0: 2-means per pair,
    started at the calibration's d of a block of each partition, sets its threshold midway between the two
    means (home 0 below, 1 above, margin = |d - threshold|). Pairs with fewer than MIN_FIT blocks are fitted as
    one pool (d in units of the pair's calibrated contrast); a pool smaller still keeps the calibrated
    thresholds. Undecided (-1): a missing timing, margin under z * noise_cycles, or a fitted pair (or pool)
    whose modes are too close or too unbalanced. No structure (found=False, all -1): most fitted pairs lack two
    such modes, or too many blocks fall in the middle of the gap between them.
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
    per_group = to_device(per_group, dev)
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
    homes_b = torch.where(margin_b >= to_device(needed, dev).take(group), upper.to(torch.int8), -1)
    out = torch.cat((margin_b.view(torch.uint8), homes_b.view(torch.uint8))).cpu().numpy()
    n = bp.n_blocks
    return BlockClasses(out[4 * n:].view(np.int8), out[:4 * n].view(np.float32), bp.pairs, threshold, True, "")
