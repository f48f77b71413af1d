"""Partition maps of tensors: the L2 partition each block of a CUDA tensor's storage is homed in.

On the H200 a 128-byte line is homed in one of two L2 partitions, the home changing every 256 bytes of
physical address, and an SM reads lines of its own partition ~30 cycles faster. Homes follow physical
addresses, fixed for an allocation's lifetime, so a map is measured once per allocation and cached.

This module owns: partition_map() (measure, classify, cache), the decision (classify_blocks, pure numpy),
the SM pairs that time each block (choose_pairs, probe_plan), the independent serialized check (reprobe,
agreement) and the per-allocation cache (clear_cache). The kernels are triton_kernels/partition_probe.py.

Why pairs: one SM's latency alone does not say a line's home. Within one partition the latency an SM sees
spreads over ~30 cycles with the distance to the line's L2 slice, so near and far overlap: on the bundled
H200 calibration the best per-SM threshold misreads 1.8% of the lines. The difference between two SMs of
opposite partitions cancels most of that spread: with pairs chosen on the calibration (choose_pairs), every
held-out line is read right, with >= 17 cycles to spare. So every block is timed by both SMs of a pair.
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from .errors import ProbeError, check_choice
from .layout import LINE_BYTES, control_words

N_TIMED = 4            # timed loads per block and SM (cost count in triton_kernels/partition_probe.py)
REPROBE_WARM = 2
REPROBE_TIMED = 16
# Spread of one SM's per-load mean for one block between two runs: the line probe's 8-load means move by
# 0.4-0.5 cycles over three repeats on the H200 (bundled calibration, line_noise); 4-load means ~1.4x that.
NOISE_CYCLES = 1.0
UNDECIDED_Z = 4.0      # a block is undecided within UNDECIDED_Z noise units of the decision threshold
# Two latency modes count as structure when their means are at least this fraction of the calibrated
# far - near gap apart: the two halves of one flat mode are ~1.6 noise sd apart, the H200's modes ~28 cycles.
MIN_SEPARATION = 0.5
# With several timings a block, they must mostly point to one partition: 0.84-1.0 per SM pair on the bundled
# H200 calibration (one SM's threshold misreads a few percent of lines), ~0.5 for unrelated timings.
MIN_CONSISTENCY = 0.75
MIN_FIT = 16           # an SM fits its own threshold from at least this many timings, else it uses the pooled one
MAX_FIT = 128          # ... from at most about this many: a stride sample (the fit, not the decision, is sampled;
                       # ~64 timings a mode put a threshold within ~1 cycle, against margins of 17+ on the H200)
POOLED_FIT = 4096      # timings in the pooled fit of the offset between these timings and the calibration
MAX_ITERATIONS = 50    # 2-means on 1-D values converges in 2-5 steps from the calibrated start; this bounds it
PAIR_QUANTILE = 2.0    # a pair's calibrated margin: this percentile of its signed differences over the lines


# ---- the decision (pure numpy) ----------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class BlockClasses:
    """homes: (n_blocks,) int8 0/1, -1 undecided. margin: (n_blocks,) |score| in cycles per load, where the
    score sums each timing's distance from its SM's threshold, signed towards the partition it points to.
    threshold: (n_sm,) each SM's decision threshold in the timings' units (NaN: the SM gives no vote).
    found: the timings show two modes at all; reason says why not."""

    homes: np.ndarray
    margin: np.ndarray
    threshold: np.ndarray
    found: bool
    reason: str


def _two_means(values, groups, n_groups, lo, hi):
    """Per-group 2-means on 1-D values from starts lo < hi: (lower mean, upper mean), NaN where a group
    ends with an empty side."""
    n_all = np.bincount(groups, minlength=n_groups)
    s_all = np.bincount(groups, weights=values, minlength=n_groups)
    lo, hi = lo.astype(np.float64), hi.astype(np.float64)
    before = None
    for _ in range(MAX_ITERATIONS):
        upper = values > np.take((lo + hi) / 2, groups)
        if before is not None and np.array_equal(upper, before):
            break
        n_up = np.bincount(groups, weights=upper, minlength=n_groups)
        s_up = np.bincount(groups, weights=values * upper, minlength=n_groups)
        with np.errstate(invalid="ignore", divide="ignore"):
            lo, hi = (s_all - s_up) / (n_all - n_up), s_up / n_up
        before = upper
    return lo, hi


def classify_blocks(cycles, sm_of_block, sm_partition, near, far, *, noise_cycles: float = NOISE_CYCLES,
                    z: float = UNDECIDED_Z) -> BlockClasses:
    """The home partition of each block from the latencies SMs measured on it.

    cycles, sm_of_block: (n_blocks,) or (n_blocks, k): cycles per load of each timing and the SM that made
    it (NaN: missing). sm_partition: (n_sm,) each SM's partition, 0/1 (-1: no vote). near, far: (n_sm,)
    the SMs' calibrated near/far latencies (labels.sm_labels), which may differ from these timings by a
    per-load constant: each SM's threshold comes from the timings themselves, by 2-means started at its
    calibrated midpoint shifted by the pooled offset. An SM with fewer than MIN_FIT timings in the fit
    sample uses the pooled threshold (its midpoint + offset); one whose own timings show no two modes gives
    no vote. A timing below its SM's threshold votes for that SM's partition; a block is decided when its
    score stands z * noise_cycles * sqrt(votes) away from 0. No structure (no two modes in the pooled
    timings, or blocks with several timings whose votes disagree as often as chance): found=False, all -1.
    """
    c, s = np.asarray(cycles), np.asarray(sm_of_block)
    if c.dtype not in (np.float32, np.float64):
        c = c.astype(np.float64)
    if c.ndim == 1:
        c, s = c[:, None], s[:, None]
    if c.ndim != 2 or s.shape != c.shape:
        raise ValueError(f"cycles and sm_of_block must have one shape (n_blocks[, k]), got {c.shape} and {s.shape}")
    c, s = np.ascontiguousarray(c.T), np.ascontiguousarray(s.T, dtype=np.int64)  # one row per timing slot
    part = np.asarray(sm_partition, dtype=np.int64)
    near, far = np.asarray(near, dtype=np.float64), np.asarray(far, dtype=np.float64)
    n_sm, n_blocks = len(part), c.shape[1]
    if near.shape != (n_sm,) or far.shape != (n_sm,):
        raise ValueError(f"near and far must have shape ({n_sm},), got {near.shape} and {far.shape}")
    if s.size and (s.min() < 0 or s.max() >= n_sm):
        raise ValueError(f"sm_of_block must hold SM ids in 0..{n_sm - 1}")
    mid, gap = (near + far) / 2, far - near
    usable = (part >= 0) & np.isfinite(mid) & (gap > 0)
    threshold = np.full(n_sm, np.nan)

    def undecided(reason):
        return BlockClasses(np.full(n_blocks, -1, np.int8), np.zeros(n_blocks, np.float32), threshold, False, reason)

    # The fit sees a stride sample of about MAX_FIT timings per SM; the decision sees every timing.
    stride = max(1, -(-c.size // (MAX_FIT * max(int(usable.sum()), 1))))
    fc, fs = c[:, ::stride].ravel(), s[:, ::stride].ravel()
    keep = np.isfinite(fc) & usable[fs]
    fc, fs = fc[keep], fs[keep]
    if not len(fc):
        return undecided("no timing comes from an SM with a calibrated partition")
    half = np.median(gap[usable]) / 2
    pooled = slice(None, None, max(1, len(fc) // POOLED_FIT))
    lo, hi = _two_means((fc - mid[fs])[pooled], np.zeros(len(fc[pooled]), np.int64), 1, np.array([-half]),
                        np.array([half]))
    if not hi[0] - lo[0] >= MIN_SEPARATION * 2 * half:
        return undecided(f"no structure: the timings' two best-split modes are {hi[0] - lo[0]:.1f} cycles apart, "
                         f"under {MIN_SEPARATION:g} x the calibrated far - near gap ({2 * half:.1f})")
    threshold[usable] = mid[usable] + (lo[0] + hi[0]) / 2
    own = np.bincount(fs, minlength=n_sm) >= MIN_FIT
    if own.any():
        lo, hi = _two_means(fc, fs, n_sm, threshold - gap / 2, threshold + gap / 2)
        with np.errstate(invalid="ignore"):
            modes = hi - lo >= MIN_SEPARATION * gap
        threshold[own] = np.where(modes, (lo + hi) / 2, np.nan)[own]

    voting = np.isfinite(threshold)
    weight = np.where(voting, 2.0 * part - 1, 0.0)  # a timing below threshold points to its SM's partition
    level = np.where(voting, threshold, 0.0)
    weight, level = weight.astype(c.dtype), level.astype(c.dtype)
    score, votes, for_1 = np.zeros(n_blocks, c.dtype), np.zeros(n_blocks, np.int32), np.zeros(n_blocks, np.int32)
    for cj, sj in zip(c, s):  # a few timing slots: one pass each over 1-D arrays
        w = np.take(weight, sj)
        contrib = np.nan_to_num(w * (np.take(level, sj) - cj), nan=0.0, copy=False)  # NaN: a missing timing
        score += contrib
        votes += (w != 0) & np.isfinite(cj)
        for_1 += contrib > 0
    several = votes >= 2
    if several.any():
        consistent = float(np.mean((for_1[several] == 0) | (for_1[several] == votes[several])))
        if consistent < MIN_CONSISTENCY:
            return undecided(f"no structure: the SMs timing a block point to one partition for only "
                             f"{consistent:.0%} of the blocks (unrelated timings: ~50%)")
    margin = np.abs(score)
    homes = (score > 0).astype(np.int8)
    homes[(votes == 0) | (margin < z * noise_cycles * np.sqrt(votes))] = -1
    return BlockClasses(homes, margin.astype(np.float32), threshold, True, "")


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
    return out.T  # a view: classify_blocks takes it back to (2, n_blocks) without a copy


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
    """The independent check: blocks (n,) probed; cycles (2, n) cycles per load seen by sms[0] (near
    partition 0) and sms[1] (near partition 1); homes (n,) the partition of the SM that saw it faster."""

    blocks: np.ndarray
    cycles: np.ndarray
    homes: np.ndarray
    sms: tuple[int, int]
    elapsed_s: float


@dataclass(frozen=True, eq=False)
class _Setup:
    topology: object
    n_sm: int
    partition: np.ndarray
    near: np.ndarray
    far: np.ndarray
    pairs: Pairs


_SETUPS: dict[tuple, _Setup] = {}


def _setup(index: int, topology, backend: str) -> _Setup:
    """The calibration, SM labels and pairs of cuda:index, once per process (labels take ~0.5 s)."""
    key = (index, None if topology is None else id(topology))
    hit = _SETUPS.get(key)
    if hit is not None and (topology is None or hit.topology is topology):
        return hit
    from .calibration import calibrate
    from .device import device_info
    from .labels import sm_labels

    n_sm = device_info(index).sm_count
    topo = topology if topology is not None else calibrate(index, backend=backend)
    if topo.n_sm != n_sm:
        raise ValueError(f"the calibration covers {topo.n_sm} SMs, cuda:{index} has {n_sm}")
    labels = sm_labels(topo)
    if not labels.partitions.found:
        raise ProbeError(f"the calibration of cuda:{index} shows no two L2 partitions "
                         f"({labels.partitions.reason}): there is nothing to map")
    pairs = choose_pairs(topo.line_cycles, labels.partition, labels.line_partition)
    setup = _Setup(topo, n_sm, labels.partition, labels.near_cycles, labels.far_cycles, pairs)
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


def run_probe(tensor, plan: np.ndarray, n_sm: int, *, block_bytes: int = 256, backend: str = "triton",
              timeout_s: float = 2.0):
    """Launch partition_probe_kernel once over the tensor's storage: (cycles per load (2, n_blocks) float32, NaN
    where nothing was timed; host wall time of the launch and wait). The caller holds the GPU lock."""
    import torch

    from .probes import checked_launches, to_device

    storage = _storage_of(tensor, block_bytes)
    device = tensor.device
    n_blocks = n_blocks_of(storage.nbytes(), block_bytes)
    plan_t = to_device(plan.astype(np.int64).ravel(), device)
    cycles = torch.full((2, n_blocks), -1, dtype=torch.int32, device=device)
    per_sm = 2 * n_blocks // max(int(np.sum(plan[:, 1] > plan[:, 0])), 1) + 1
    elapsed = 0.0
    for elapsed in checked_launches(device, backend, "partition", n_sm, n_sm, timeout_s, per_sm * (1 + N_TIMED), 1,
                                     (storage.data_ptr(), plan_t, cycles, n_blocks, block_bytes, 0, N_TIMED)):
        pass
    c = cycles.cpu().numpy().astype(np.float32)  # exact: sums of N_TIMED clock counts
    c[c < 0] = np.nan
    c /= N_TIMED
    return c, elapsed


def partition_map(tensor, *, topology=None, backend: str = "triton", block_bytes: int = 256,
                  timeout_s: float = 2.0) -> PartitionMap:
    """The L2 partition of every `block_bytes` block of `tensor`'s storage, measured with all SMs at once.

    A non-contiguous tensor or a view maps its whole storage (block i starts at byte i * block_bytes of the
    storage, not of the view). topology: the calibration whose SM labels (partition numbers) and SM pairs
    are used; default calibrate(device), cached per process. backend: "triton" ("auto" means it too: the
    probe is Triton only). The map is cached per storage until the storage is freed or moves (clear_cache()
    forgets them all); a cached map is returned as the same object. Measuring takes the GPU lock, and is
    refused during CUDA graph capture. Raises ProbeError when the timings show no partitions (a broken probe).
    """
    import torch

    from .calibration import measuring

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
    n_blocks = n_blocks_of(storage.nbytes(), block_bytes)
    plan = probe_plan(n_blocks, setup.pairs.sms, setup.n_sm)
    with measuring(index), torch.cuda.device(index):
        cycles, probe_s = run_probe(tensor, plan, setup.n_sm, block_bytes=block_bytes, backend=backend,
                                    timeout_s=timeout_s)
    classes = classify_blocks(cycles.T, timers_of_blocks(plan, n_blocks), setup.partition, setup.near, setup.far)
    if not classes.found:
        raise ProbeError(f"partition map of cuda:{index}: {classes.reason}; the probe measured no partitions")
    pmap = PartitionMap(homes=classes.homes, margin=classes.margin, block_bytes=block_bytes,
                        data_ptr=storage.data_ptr(), nbytes=storage.nbytes(), device_index=index,
                        elapsed_s=time.perf_counter() - t0, probe_s=probe_s)
    _remember(tensor, block_bytes, pmap)
    return pmap


def reprobe(tensor, sample_blocks, *, topology=None, block_bytes: int = 256, n_timed: int = REPROBE_TIMED,
            timeout_s: float = 2.0) -> Reprobe:
    """The independent check of a map: the blocks `sample_blocks` timed by the calibration's best SM pair,
    one SM at a time after warming the clocks, n_timed loads each; a block's home is the partition of the SM
    that saw it faster. Takes the GPU lock."""
    import torch

    from .calibration import measuring
    from .launch import launch_triton
    from .probes import GRID_FACTOR, check_control, host_deadline, to_device, wait_with_deadline, warm_clocks
    from .triton_kernels.partition_probe import partition_reprobe_kernel

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
        warm_clocks(device, 50)
        ctrl = torch.zeros(control_words(setup.n_sm), dtype=torch.int64, device=device)
        cycles = torch.full((2, blocks.size), -1, dtype=torch.int64, device=device)
        launch_triton(partition_reprobe_kernel, GRID_FACTOR * setup.n_sm,
                      (ctrl, storage.data_ptr(), to_device(blocks, device), to_device(rows, device), cycles,
                       blocks.size, block_bytes, 0, REPROBE_WARM, n_timed, setup.n_sm, 1, int(timeout_s * 1e9)),
                      num_warps=1)
        # two SMs measure, one after the other
        wait_with_deadline(device, host_deadline(blocks.size * (REPROBE_WARM + n_timed), 2, 1, timeout_s), "partition check")
        check_control(ctrl.cpu().numpy(), setup.n_sm, timeout_s, "partition check")
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
