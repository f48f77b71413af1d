"""The L2 geometry suite on a GPU: experiments that measure the curves detectors.py reads, and run_suite().

Each experiment takes a Context (device, SM count, calibration labels) and a time budget, measures with the
kernels of triton_kernels/geometry.py through chases.py (or the package's probes and partition maps; persisting
also through driver.py), and returns a JSON-able dict of raw curves and the detectors' verdicts (summary.py
says them in a few lines). One that runs out of budget stops its sweep early and says so ("truncated").
run_suite(quick) runs them all, one progress line per experiment on stderr.

Experiments: first_touch, stride_sweep, capacity (split by each line's home partition), prefetch, address_bits
(home partition of 128-byte blocks; slice classes), contention, persisting (an L2 access policy window),
conflict_sets and layout_fixes (padding, XOR swizzle, warp-wide bursts, each with and without); each
function's docstring says what it measures. Cold means: after reading a flush buffer of 4x the L2, and in
memory not touched since. Docs: docs/geometry.md.
"""
from __future__ import annotations

import shutil
import sys
import time

import numpy as np

from ..errors import ProbeError
from ..layout import LINE_BYTES, LINE_WORDS
from . import detectors as G
from . import driver
from .chases import (
    LANES,
    Context,
    Flusher,
    cold_buffer,
    make_context,
    ring_through,
    rings,
    run_lanes,
    run_offsets,
    run_ring,
    slice_lines,
    write_ring,
    write_words,
)

MB = 1 << 20
BUDGETS = {  # seconds (quick, full); the whole quick suite must stay under 20 s, the full under 3 minutes
    "setup": (6.0, 10.0), "first_touch": (1.0, 5.0), "stride_sweep": (1.0, 5.0), "capacity": (3.0, 30.0),
    "prefetch": (1.5, 15.0), "address_bits": (2.5, 25.0), "contention": (2.0, 30.0), "persisting": (2.0, 30.0),
    "conflict_sets": (2.0, 20.0), "layout_fixes": (2.0, 20.0),
}
REGION = 1 << 16         # first touch: each pair of loads in its own 64 KB of cold memory


class Budget:
    def __init__(self, seconds: float):
        self.seconds, self.t0 = seconds, time.perf_counter()

    def over(self) -> bool:
        return self.elapsed() > self.seconds

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0


def _progress(msg: str) -> None:
    print(f"[geometry] {msg}", file=sys.stderr, flush=True)


# ---- experiments -----------------------------------------------------------------------------------------
FIRST_TOUCH_K = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 512, 1024, 2048, 4096)
FIRST_TOUCH_BEFORE = (-64, -40, -32, -8)  # from a first load at byte 64 of a line: which earlier bytes came in


def first_touch(ctx: Context, flush: Flusher, budget: Budget, quick: bool) -> dict:
    """Pairs of dependent loads into cold memory: a first load (a DRAM miss) at byte `a` of a region, then
    one at a + k. The second load hits L2 when byte a + k came in with the first. Each (a, k) `reps` times in
    fresh regions, in random order, on SM 0; then the same chain again, warm (every load an L2 hit).
    timing_overhead_cycles: the warm per-load time minus SM 0's chain-probe latency from the calibration (a
    clock read, a store and the loop around each timed load; every latency of this suite includes it)."""
    reps = 4 if quick else 16
    cases = [(0, k) for k in FIRST_TOUCH_K] + [(64, k) for k in FIRST_TOUCH_BEFORE]
    order = np.random.default_rng(1).permutation(np.repeat(np.arange(len(cases)), reps))
    buf = cold_buffer(ctx, (order.size + 1) * REGION)
    base = buf.data_ptr()
    offs = []
    for region, c in enumerate(order):
        a, k = cases[c]
        offs += [region * REGION + 2048 + a, region * REGION + 2048 + a + k]
    offs = np.array([offs])
    flush()
    cold, _ = run_offsets(ctx, base, offs, [0])
    warm, _ = run_offsets(ctx, base, offs, [0])
    second = cold[0, 1::2]
    med = {c: float(np.median(second[order == i])) for i, c in enumerate(cases)}
    after = [med[(0, k)] for k in FIRST_TOUCH_K]
    ext = G.hit_extent(FIRST_TOUCH_K, after)
    return {"k_bytes": list(FIRST_TOUCH_K), "second_load_cycles": after,
            "before_bytes": list(FIRST_TOUCH_BEFORE), "before_cycles": [med[(64, k)] for k in FIRST_TOUCH_BEFORE],
            "first_load_cycles_median": float(np.median(cold[0, 0::2])),
            "warm_cycles_median": float(np.median(warm[0])), "reps": reps,
            "timing_overhead_cycles": float(np.median(warm[0]) - ctx.calibration.chain_cycles[0]),
            "granule_bytes": ext.granule, "hit_cycles": ext.hit, "miss_cycles": ext.miss, "found": ext.found,
            "reason": ext.reason, "driver_max_l2_fetch_granularity":
            driver.context_limit(driver.CU_LIMIT_MAX_L2_FETCH_GRANULARITY)}


STRIDES_SWEEP = (8, 16, 32, 64, 128, 256, 512)  # 8 B at least: each load is one aligned 8-byte word


def stride_sweep(ctx: Context, flush: Flusher, budget: Budget, quick: bool) -> dict:
    """The classic line-size sweep: n dependent loads at stride s through cold memory, mean cycles per load.
    Below the fetch granule some loads hit what an earlier miss brought in; from the granule up every load
    misses."""
    n = 256 if quick else 1024
    region = max(STRIDES_SWEEP) * n + 16 * MB  # apart, so no sweep touches another's lines
    buf = cold_buffer(ctx, region * len(STRIDES_SWEEP))
    flush()
    means, done = [], []
    for i, s in enumerate(STRIDES_SWEEP):
        if budget.over():
            break
        c, _ = run_offsets(ctx, buf.data_ptr(), [i * region + np.arange(n) * s], [0])
        means.append(float(c[0, 1:].mean()))
        done.append(s)
    sat = G.saturation(done, means) if len(done) >= 3 else G.Saturation(None, np.nan, np.nan, "budget")
    return {"strides": done, "mean_cycles": means, "n_loads": n, "line_bytes": sat.at, "found": sat.found,
            "reason": sat.reason, "truncated": len(done) < len(STRIDES_SWEEP)}


def _partition_sms(ctx: Context, per_partition: int) -> dict:
    """{partition: SMs}, evenly spread over the SMs labelled with that partition."""
    out = {}
    for p in (0, 1):
        sms = np.flatnonzero(ctx.sm_partition == p)
        if sms.size:
            out[p] = sms[np.linspace(0, sms.size - 1, min(per_partition, sms.size)).round().astype(int)].tolist()
    return out


def capacity(ctx: Context, flush: Flusher, budget: Budget, quick: bool) -> dict:
    """Footprint sweep: for each footprint F (prefix of one buffer), read it twice with a torch kernel (every
    SM, as a bulk pass: the L2 keeps what it can of it), then SMs of each partition chase n random lines of
    F at once. Each load is split by the home partition of its 256-byte block (partition_map of the buffer):
    near (homed in the SM's partition) or far. Regimes and knees per partition and per home."""
    import torch

    from ..placement.partition.maps import partition_map

    steps = 3 if quick else 4
    top = 512 * MB  # DRAM latency still creeps up at 256 MB (TLB reach): the last regime needs the points above
    footprints = np.unique((2.0 ** (np.arange(np.log2(2 * MB) * steps, np.log2(top) * steps + 1) / steps))
                           .astype(np.int64) // LINE_BYTES * LINE_BYTES)
    n = 512 if quick else 4096
    buf = torch.ones(top // 4, dtype=torch.float32, device=ctx.device)
    homes = partition_map(buf, topology=ctx.calibration).homes  # per 256-byte block
    groups = _partition_sms(ctx, 4)
    sms = [s for p in (0, 1) for s in groups.get(p, [])]
    part_of = ctx.sm_partition[sms]
    rng = np.random.default_rng(2)
    rows = {"footprint": [], "mean": [], "near": [], "far": [], "p0": [], "p1": []}
    for f in footprints:
        if budget.over():
            break
        lines = rng.integers(0, f // LINE_BYTES, size=(len(sms), n))
        offs = lines * LINE_BYTES + 8 * (np.arange(len(sms))[:, None] % LINE_WORDS)
        view = buf[: f // 4]
        view.sum()
        view.sum()
        c, _ = run_offsets(ctx, buf.data_ptr(), offs, sms)
        c = c[:, 1:]
        h = homes[offs[:, 1:] // 256]
        near = (h == part_of[:, None])
        rows["footprint"].append(int(f))
        rows["mean"].append(float(c.mean()))
        rows["near"].append(float(c[near & (h >= 0)].mean()) if (near & (h >= 0)).any() else np.nan)
        rows["far"].append(float(c[~near & (h >= 0)].mean()) if (~near & (h >= 0)).any() else np.nan)
        for p in (0, 1):
            m = part_of == p
            rows[f"p{p}"].append(float(c[m].mean()) if m.any() else np.nan)
    out = {k: v for k, v in rows.items()}
    out.update({"sms": sms, "sm_partition": part_of.tolist(), "n_loads": n,
                "truncated": len(rows["footprint"]) < len(footprints)})
    x = np.array(rows["footprint"], dtype=np.float64)
    if x.size >= 3:  # hit and miss levels: the first point and the largest footprint's
        out["effective_capacity_bytes"] = G.effective_capacity(x, rows["mean"], rows["mean"][0], rows["mean"][-1])
    if not budget.over():
        out["self_warmed"] = _self_warmed(ctx, buf, groups, flush, budget, quick)
    for key in ("mean", "near", "far", "p0", "p1"):
        y = np.array(rows[key])
        if x.size >= 6 and np.all(np.isfinite(y)):
            r = G.find_regimes(x, y)
            out[f"regimes_{key}"] = {"levels": r.levels.tolist(), "spans_bytes": r.spans.tolist(),
                                     "knees": [k.__dict__ for k in r.knees], "found": r.found,
                                     "reason": r.reason, "noise": r.noise}
    return out


# The single-SM sweep's footprints in 60ths of the L2: on the 60 MiB H200 they are the MiB the suite was built
# on (8 to 128 MiB: a quarter of the L2 and below, the knees around half of it, and twice it), on other GPUs the
# same shares of their L2.
SELF_WARMED_60THS = (8, 16, 24, 28, 32, 36, 40, 48, 56, 64, 80, 96, 128)
SELF_WARMED_60THS_QUICK = (16, 32, 48, 64, 96)


def self_warmed_sizes(l2_bytes: int, quick: bool) -> list[int]:
    """The single-SM capacity sweep's footprints (whole MiB, increasing, each at least 1) on a GPU of `l2_bytes`
    of L2 (SELF_WARMED_60THS)."""
    shares = SELF_WARMED_60THS_QUICK if quick else SELF_WARMED_60THS
    return sorted({max(1, round(share * l2_bytes / (60 * MB))) for share in shares})


def _self_warmed(ctx: Context, buf, groups: dict, flush: Flusher, budget: Budget, quick: bool) -> dict:
    """The classic single-SM capacity sweep: one SM of each partition (at once, each on its own ring through
    its own word of every line) chases a random ring over the footprint: a whole pass to fill the L2 as that SM
    sees it, then a timed one. Here only the two chasing SMs ever touch the footprint. The miss level: the
    whole buffer's ring chased cold (after a flush) without a warm pass."""
    import torch

    words = buf.view(torch.int64)
    sms = [g[0] for g in groups.values()]
    sizes = [mb for mb in self_warmed_sizes(ctx.l2_bytes, quick) if mb * MB <= buf.numel() * 4]
    n_all = words.numel() // LINE_WORDS
    start = write_ring(words, n_all, 0, seed=0)
    flush()
    cold = run_ring(ctx, [start], sms[:1], 0, 4096)
    out = {"footprint": [], "cycles": [], "sms": sms, "cold_cycles": float(cold[0, 0] / 4096)}
    for mb in sizes:
        if budget.over():
            break
        n = mb * MB // LINE_BYTES
        starts = [write_ring(words, n, w, seed=mb * 16 + w) for w in range(len(sms))]
        r = run_ring(ctx, starts, sms, n, n)
        if not np.array_equal(r[:, 2], starts):
            raise ProbeError("self-warmed capacity: a chase did not return to its start after a whole pass")
        out["footprint"].append(mb * MB)
        out["cycles"].append((r[:, 0] / n).tolist())
    y = np.array(out["cycles"]).mean(axis=1)
    if y.size >= 3:
        out["effective_capacity_bytes"] = G.effective_capacity(out["footprint"], y, y[0], out["cold_cycles"])
    return out


PREFETCH_STRIDES = (128, 256, 512, 1024, 2048, 4096)
PREFETCH_STRIDES_FULL = (128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
# Galois LFSR feedback masks of maximal length for 2**k - 1 states (tests check each is maximal).
LFSR_TAPS = {8: 0xB8, 9: 0x110, 10: 0x240, 11: 0x500, 12: 0xE08, 13: 0x1C80, 14: 0x3802}


def lfsr_order(n: int) -> np.ndarray:
    """A permutation of 0..n-1 (n a power of two, 2**8..2**14): 0, then a maximal Galois LFSR's states - 1 ...
    the order the write-ups used to defeat a prefetcher, made without a random-number generator."""
    k = int(n).bit_length() - 1
    if n != 1 << k or k not in LFSR_TAPS:
        raise ValueError(f"lfsr_order takes a power of two in 2**8..2**14, got {n}")
    out, state = [0], 1
    for _ in range(n - 1):
        out.append(state)
        state = (state >> 1) ^ (LFSR_TAPS[k] if state & 1 else 0)
    return np.array(out, dtype=np.int64)


def prefetch(ctx: Context, flush: Flusher, budget: Budget, quick: bool) -> dict:
    """n loads at stride s in address order against the same n addresses in LFSR order; cold (fresh memory
    after a flush) and warm (the same chain just before). A prefetcher makes the regular order faster."""
    n = 512 if quick else 1024
    strides = PREFETCH_STRIDES if quick else PREFETCH_STRIDES_FULL
    perm = lfsr_order(n)
    region = max(strides) * n + 16 * MB
    buf = cold_buffer(ctx, 2 * region * len(strides))
    out = {"strides": [], "cold_regular": [], "cold_random": [], "warm_regular": [], "warm_random": [], "n_loads": n}
    flush()
    for i, s in enumerate(strides):
        if budget.over():
            break
        for j, (name, order) in enumerate((("regular", np.arange(n)), ("random", perm))):
            offs = [(2 * i + j) * region + order * s]
            cold, _ = run_offsets(ctx, buf.data_ptr(), offs, [0])
            warm, _ = run_offsets(ctx, buf.data_ptr(), offs, [0])
            out[f"cold_{name}"].append(float(cold[0, 1:].mean()))
            out[f"warm_{name}"].append(float(warm[0, 1:].mean()))
        out["strides"].append(s)
    out["truncated"] = len(out["strides"]) < len(strides)
    if len(out["strides"]) >= 2:
        for t in ("cold", "warm"):
            d = G.find_dips(out["strides"], out[f"{t}_regular"], out[f"{t}_random"])
            out[f"{t}_dips"] = {"strides": d.dips.tolist(), "effect_cycles": d.effect.tolist(),
                                "threshold": d.threshold, "found": d.found, "reason": d.reason}
    return out


def address_bits(ctx: Context, flush: Flusher, budget: Budget, quick: bool) -> dict:
    """Home partition of every 128-byte block of a buffer (partition_map, block_bytes=128): for each address
    bit, how often flipping it changes the home; the XOR model fitted on half the 2 MB pages and scored on the
    other half (each held-out page's constant from 8 of its blocks); the same with 64 KB pages; the page-pattern
    model (pattern_accuracy: 64 anchors a held-out page). Slice classes
    of 512 consecutive lines: how often flipping a bit changes the class."""
    import torch

    from ..placement.partition.maps import partition_map

    size = (16 if quick else 256) * MB
    buf = torch.ones(size // 4, dtype=torch.float32, device=ctx.device)
    pm = partition_map(buf, topology=ctx.calibration, block_bytes=LINE_BYTES)
    addr = buf.data_ptr() + np.arange(pm.n_blocks, dtype=np.int64) * LINE_BYTES
    flips = G.bit_flips(addr, pm.homes, np.arange(7, 26))
    out = {"bytes": size, "undecided_fraction": pm.undecided_fraction, "bits": flips.bits.tolist(),
           "partition_flip": flips.flip.tolist(), "partition_pairs": flips.pairs.tolist(),
           "partition_granularity_bytes": flips.granularity(),
           "model_2MB_pages": G.held_out_accuracy(addr, pm.homes, 21),
           "model_64KB_pages": G.held_out_accuracy(addr, pm.homes, 16),
           "patterns_2MB_pages": G.pattern_accuracy(addr, pm.homes, 21)}
    if not budget.over():
        sl_lines = slice_lines(ctx)
        classes = sl_lines.classes
        sl = G.bit_flips(sl_lines.addresses, classes.labels, np.arange(7, 16))
        out.update({"slice_classes": classes.count, "slice_class_sizes": classes.sizes.tolist(),
                    "slice_bits": sl.bits.tolist(), "slice_flip": sl.flip.tolist(),
                    "slice_granularity_bytes": sl.granularity(), "slice_margin": classes.margin})
    return out


def contention(ctx: Context, flush: Flusher, budget: Budget, quick: bool) -> dict:
    """k SMs x LANES chases over M lines of one slice class ("one") or M lines of M different classes
    ("spread"): latency per load and requests per ns. Then the write-ups' pair detector: two independent
    loads from one SM, to two lines of one class or of two classes, timed together."""
    sl = slice_lines(ctx)
    lines, classes = sl.buffer, sl.classes
    sets = dict(zip(("one", "spread"), sl.sets(8)))
    M = len(sets["one"])
    ks = [1, 4, 16, 64, ctx.n_sm] if quick else [1, 2, 4, 8, 16, 32, 64, 96, ctx.n_sm]
    order = np.random.default_rng(3).permutation(ctx.n_sm)
    n_warm, n_timed = 16, 128 if quick else 512
    out = {"lines_per_set": M, "slice_classes": classes.count, "k": [], "lanes": LANES}
    for name, s in sets.items():
        out[f"{name}_latency_cycles"], out[f"{name}_requests_per_ns"] = [], []
    for k in ks:
        if budget.over():
            break
        for name, s in sets.items():
            at, val, after = rings(s, k, LANES, seed=k)
            write_words(lines, at, val)
            r = run_lanes(ctx, after(0), order[:k], n_warm, n_timed)
            if not np.array_equal(r[:, 4], np.bitwise_xor.reduce(after(n_warm + n_timed), axis=1)):
                raise ProbeError("contention: a chase did not end where its ring says (a load returned wrong data)")
            span = r[:, 3].max() - r[:, 2].min()
            out[f"{name}_latency_cycles"].append(float(np.median(r[:, 0]) / n_timed))
            out[f"{name}_requests_per_ns"].append(float(k * LANES * n_timed / span))
        out["k"].append(k)
    for name in sets:
        if len(out["k"]) >= 3:
            sat = G.saturation(out["k"], out[f"{name}_requests_per_ns"])
            out[f"{name}_saturates_at_k"] = sat.at
            out[f"{name}_saturation_reason"] = sat.reason
    out["pairs"] = _pair_detector(ctx, lines, sl.addresses, classes.labels, 8 if quick else 32)
    out["ncu"] = shutil.which("ncu")
    out["ncu_note"] = ("ncu found: run benchmarks/run_geometry.py --ncu-target under ncu for the counters"
                       if out["ncu"] else "ncu not on this machine: timing only")
    out["truncated"] = len(out["k"]) < len(ks)
    return out


def contention_for_profiler(device=None) -> None:
    """The two contention launches an outside profiler should see, once each with every SM: LANES chases per SM
    over the lines of one slice class, then over lines of distinct classes (lanes_chase_kernel launches 1 and
    2; run under `ncu -k regex:lanes_chase` for the L2 request and sector counters)."""
    import torch

    ctx = make_context(device)
    with torch.cuda.device(ctx.index):
        sl = slice_lines(ctx)
        for s in sl.sets(8):
            at, val, after = rings(s, ctx.n_sm, LANES, seed=0)
            write_words(sl.buffer, at, val)
            run_lanes(ctx, after(0), np.arange(ctx.n_sm), 16, 512)


def _pair_detector(ctx: Context, lines, addr, labels, n_pairs: int) -> dict:
    """One SM, two lanes, each chasing one self-pointing word: lane 0 on line a, lane 1 on line b, so each step
    is two independent loads in flight together. Same class (likely one slice) against different classes."""
    rng = np.random.default_rng(4)
    res = {"same": [], "different": []}
    classes = np.unique(labels)
    for _ in range(n_pairs):
        c = rng.choice(classes[np.bincount(labels)[classes] >= 2])
        a, b = rng.choice(np.flatnonzero(labels == c), 2, replace=False)
        d = rng.choice(np.flatnonzero(labels != c))
        for name, (x, y) in (("same", (a, b)), ("different", (a, d))):
            wa, wb = addr[x], addr[y] + 8  # words 0 and 1: never the same word
            write_words(lines, np.array([wa, wb]), np.array([wa, wb]))
            r = run_lanes(ctx, np.array([[wa, wb]]), [0], 8, 64, lanes=2)
            res[name].append(float(r[0, 0] / 64))
    return {k: {"median_cycles": float(np.median(v)), "values": v} for k, v in res.items()}


# ---- sets and ways: conflict sets at power-of-two strides ----------------------------------------------------
KIB = 1 << 10
CONFLICT_STRIDES = tuple(4 * KIB << i for i in range(14))  # 4 KiB .. 32 MiB
CONFLICT_STRIDES_QUICK = (4 * KIB, 64 * KIB, 1 * MB, 32 * MB)
CONFLICT_N = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)  # 512 x 4 KiB: one 2 MiB page
CONFLICT_N_QUICK = (1, 4, 16, 32, 64)


def _steady_chase(ctx: Context, buf, addrs: np.ndarray) -> float:
    """Cycles per load of SM 0's chase around the ring through `addrs`: 4 passes to warm, then at least 8 passes
    and 512 loads timed (a replacement policy that is not LRU needs a few passes to settle)."""
    n = addrs.size
    n_warm, n_timed = 4 * n, max(8 * n, 512)
    r = run_ring(ctx, [ring_through(buf, addrs)], [0], n_warm, n_timed)
    if r[0, 2] != addrs[(n_warm + n_timed) % n]:
        raise ProbeError("conflict sets: a chase did not end where its ring says (a load returned wrong data)")
    return float(r[0, 0] / n_timed)


def conflict_sets(ctx: Context, flush: Flusher, budget: Budget, quick: bool) -> dict:
    """From SM 0, a dependent chase over n lines at a power-of-two stride s (line i at byte i*s of one buffer,
    the ring in address order), in steady state: cycles per load for every (s, n). With a plainly set-indexed
    L2, lines at a large power-of-two stride share a set and n > ways of them miss; a hashed index keeps them
    hitting. Control: the same n lines each moved by a random whole number of lines within its stride (the same
    pages, so the same TLB reach). References: n = 1 (a hit) and a cold chase through 256 MB (DRAM). The L2 sees
    physical addresses: lines whose span n*s stays within one 2 MiB page keep the power-of-two stride there;
    beyond, they lie on pages whose frames the driver chose."""
    import torch

    strides = CONFLICT_STRIDES_QUICK if quick else CONFLICT_STRIDES
    ns = np.array(CONFLICT_N_QUICK if quick else CONFLICT_N)
    # 16 GiB in the full run (512 lines x 32 MiB), of which only the chased lines are ever touched
    buf = torch.empty(int(ns.max()) * max(strides) // 8, dtype=torch.int64, device=ctx.device)
    base = buf.data_ptr()
    flush()
    cold = run_ring(ctx, [write_ring(buf, 256 * MB // LINE_BYTES, 0, seed=7)], [0], 0, 4096)
    rng = np.random.default_rng(8)
    out = {"strides": [], "n_lines": ns.tolist(), "aligned_cycles": [], "control_cycles": [],
           "miss_cycles": float(cold[0, 0] / 4096)}
    for st in strides:
        if budget.over():
            break
        aligned, control = [], []
        for n in ns:
            at = base + np.arange(n, dtype=np.int64) * st
            aligned.append(_steady_chase(ctx, buf, at))
            control.append(_steady_chase(ctx, buf, at + rng.integers(0, st // LINE_BYTES, n) * LINE_BYTES))
        out["strides"].append(st)
        out["aligned_cycles"].append(aligned)
        out["control_cycles"].append(control)
    out["truncated"] = len(out["strides"]) < len(strides)
    if out["strides"]:
        y = np.array(out["aligned_cycles"])
        out["hit_cycles"] = float(np.median(y[:, 0]))
        d = G.conflict_sets(ns, out["strides"], y, out["hit_cycles"], out["miss_cycles"],
                            control=np.array(out["control_cycles"]))
        out.update(found=d.found, ways=d.ways, miss_fraction=d.excess.tolist(), verdict=d.verdict())
    return out


# ---- layout fixes: the same kernel with and without -----------------------------------------------------------
FIX_COLS = 1024    # structs per row: a 16 KiB row pitch, a power of two
FIX_ROWS = 1024    # rows at most: a 16 MiB table, under the 22.6 MB the H200's all-SM capacity curve stays flat to
FIX_BLOCK_R = 128  # rows per step of a program: 4 warps, one 16-byte load per thread
FIX_L2_SHARE = 3   # the table takes at most a third of the L2 (22.6 MB is 0.36 of the H200's): its reads hit L2


def fix_rows(l2_bytes: int) -> int:
    """Rows of the layout fixes' table on a GPU of `l2_bytes` of L2: FIX_ROWS, halved until the table (padded
    rows) fits in a FIX_L2_SHARE-th of the L2, so the reads stay L2 hits on small-L2 GPUs too (a 6 MB L2 gets
    128 rows); FIX_BLOCK_R at least (one program step)."""
    row_bytes = (FIX_COLS + LINE_BYTES // 16) * 16
    rows = FIX_ROWS
    while rows > FIX_BLOCK_R and rows * row_bytes > l2_bytes // FIX_L2_SHARE:
        rows //= 2
    return rows
BURST_LINES = 8    # lines per SM in the burst fix: one load at a time vs 8 at once


def _effect(times: dict, fixed: str, plain: str) -> dict:
    e = G.fix_effect(times[fixed], times[plain])
    return {"ratio": e.ratio, "spread": e.spread, "verdict": e.verdict, "with": times[fixed],
            "without": times[plain]}


def _column_fixes(ctx: Context, rounds: int, reps: int) -> dict:
    """column_read_kernel over a power-of-two pitch, the pitch padded by one line, and the XOR swizzle (ms)."""
    import torch

    from ..measure.launch import launch_triton
    from ..measure.timing import interleaved
    from ..triton_kernels.geometry import column_read_kernel

    pad = LINE_BYTES // 16  # structs in one line
    n_rows = fix_rows(ctx.l2_bytes)
    table = torch.ones((n_rows * (FIX_COLS + pad) * 4,), dtype=torch.float32, device=ctx.device)
    sums = {}

    def read(name, pitch, swizzle):
        sums[name] = out = torch.zeros(FIX_COLS, dtype=torch.float32, device=ctx.device)
        return lambda: launch_triton(column_read_kernel, FIX_COLS, (table, out, n_rows, pitch, reps), num_warps=4,
                                     constexprs={"COLS": FIX_COLS, "SWIZZLE": swizzle, "BLOCK_R": FIX_BLOCK_R})

    # one warm-up launch each, then alternating rounds; a sample: 4 launches back to back, waited for, so that
    # the host's launch time counts once in 4 (interleaved)
    measured = interleaved({"plain": read("plain", FIX_COLS, False), "padded": read("padded", FIX_COLS + pad, False),
                            "swizzled": read("swizzled", FIX_COLS, True)}, rounds, per_sample=4, wait_each=True)
    times = {name: list(m.times) for name, m in measured.items()}
    for name, out in sums.items():  # every program summed its whole column (of ones)
        if not torch.all(out == n_rows * 4 * reps):
            raise ProbeError(f"layout fixes: a {name} column read summed the wrong number of structs")
    gbs = {k: n_rows * FIX_COLS * 16 * reps / (np.median(v) * 1e6) for k, v in times.items()}
    return {"rows": n_rows, "cols": FIX_COLS, "reps": reps, "pitch_bytes": FIX_COLS * 16,
            "padded_pitch_bytes": (FIX_COLS + pad) * 16, "GB_per_s": gbs, "unit": "ms",
            "padding": _effect(times, "padded", "plain"), "swizzle": _effect(times, "swizzled", "plain")}


def _burst_fix(ctx: Context, rounds: int, steps: int) -> dict:
    """Every SM reads m lines: one lane chasing a ring through them (one load at a time) against m lanes each
    chasing its own ring (a warp-wide burst), the same number of loads; on lines of one slice class
    (conflicting) and on lines of m classes (not). Times: the kernel's globaltimer span (ns), first start to
    last end over all SMs, in alternating rounds."""
    sl = slice_lines(ctx)
    lines = sl.buffer
    sets = dict(zip(("one_class", "spread"), sl.sets(BURST_LINES, power_of_two=True)))
    m = len(sets["one_class"])
    sms = np.arange(ctx.n_sm)
    out = {"lines": m, "steps_per_lane": steps, "unit": "ns"}
    for name, s in sets.items():
        at, val, _ = rings(s, ctx.n_sm, 1, seed=9)  # the rings of every word: the same for any lane count
        write_words(lines, at, val)
        runs = {"one_by_one": (1, m * steps), "burst": (m, steps)}
        plans = {k: (lanes, n, rings(s, ctx.n_sm, lanes, seed=9)[2]) for k, (lanes, n) in runs.items()}
        times = {k: [] for k in runs}
        for i in range(rounds):
            for k in (list(runs) if i % 2 == 0 else list(runs)[::-1]):
                lanes, n, after = plans[k]
                r = run_lanes(ctx, after(0), sms, 16, n, lanes=lanes)
                if not np.array_equal(r[:, 4], np.bitwise_xor.reduce(after(16 + n), axis=1)):
                    raise ProbeError("layout fixes: a chase did not end where its ring says")
                times[k].append(float(r[:, 3].max() - r[:, 2].min()))
        out[name] = _effect(times, "burst", "one_by_one")
    return out


def layout_fixes(ctx: Context, flush: Flusher, budget: Budget, quick: bool) -> dict:
    """The three layout fixes of an Ampere write-up (conflicts cut from 32% to 9% in one case), each the same
    kernel with and without, warm, timed in interleaved rounds: ratio = median time with / without.
    padding: column reads of a table of 16-byte structs (column_read_kernel) with a 16 KiB row pitch against
    the pitch plus one 128-byte line; swizzle: the same reads with struct column c of row r stored at c XOR r;
    bursts: every SM reads 8 lines one load at a time against 8 at once (lanes_chase_kernel), on lines of one
    slice class and, to tell a conflict effect from memory-level parallelism, on lines of 8 classes."""
    rounds = 5 if quick else 15
    out = {"columns": _column_fixes(ctx, rounds, 8 if quick else 32)}  # 32 passes: ~0.25 ms a launch
    if not budget.over():
        out["bursts"] = _burst_fix(ctx, rounds, 32 if quick else 128)
    return out


# ---- persisting L2 through the driver API (driver.py) ------------------------------------------------------


def persisting_sizes(max_persist: int, quick: bool) -> list[int]:
    """Hot-buffer sizes (bytes) for this device's persisting maximum: quick, 8 MB (at most half the maximum);
    full, 4, 16 and 32 MB where under the maximum, then the next multiple of 16 MB over it (the H200's 37.5 MB
    maximum gives 4, 16, 32, 48 MB; a maximum of 30 MB gives 4, 16, 32)."""
    if quick:
        return [min(8 * MB, max_persist // 2 // MB * MB or MB)]
    return [s * MB for s in (4, 16, 32) if s * MB < max_persist] + [(max_persist // (16 * MB) + 1) * 16 * MB]


def persisting(ctx: Context, flush: Flusher, budget: Budget, quick: bool) -> dict:
    """A hot buffer read under an access policy window (hitProp persisting), then a streaming copy of 4x the
    L2 on the same stream, then one SM's chase of random lines of the hot buffer: its latency, the fraction of
    loads under the L2/DRAM midpoint, and the copy's time; against the same without a window."""
    import torch

    max_persist = driver.device_attribute(driver.CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE, ctx.index)
    max_window = driver.device_attribute(driver.CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE, ctx.index)
    sizes = persisting_sizes(max_persist, quick)
    ratios = [1.0] if quick else [0.5, 1.0]
    stream = torch.cuda.Stream(ctx.device)  # a stream of our own: torch's default is the NULL stream
    src = torch.ones(ctx.l2_bytes, dtype=torch.float32, device=ctx.device)  # 4x the L2 in bytes
    dst = torch.empty_like(src)
    hot = torch.ones(max(sizes) // 4, dtype=torch.float32, device=ctx.device)
    n = 512 if quick else 2048
    runs = []
    with torch.cuda.stream(stream):
        refs = _hit_miss_reference(ctx, flush, hot, n)
        try:
            _persisting_runs(ctx, flush, budget, stream, hot, src, dst, sizes, ratios, max_persist, max_window, n,
                             runs)
        finally:
            driver.release_persisting(stream.cuda_stream)
    threshold = (refs["hit_cycles"] + refs["miss_cycles"]) / 2
    for r in runs:
        r["hit_fraction"] = float(np.mean(r.pop("samples") < threshold))
    return {"max_persisting_l2_bytes": max_persist, "max_window_bytes": max_window, "references": refs,
            "hit_threshold_cycles": threshold, "runs": runs}


def _hit_miss_reference(ctx: Context, flush: Flusher, hot, n: int) -> dict:
    """Median latency of a chase over the hot buffer right after a flush (DRAM) and again at once (L2 hits)."""
    offs = np.random.default_rng(6).integers(0, hot.numel() * 4 // LINE_BYTES, size=(1, n)) * LINE_BYTES
    flush()
    cold, _ = run_offsets(ctx, hot.data_ptr(), offs, [0])
    warm, _ = run_offsets(ctx, hot.data_ptr(), offs, [0])
    return {"miss_cycles": float(np.median(cold[0, 1:])), "hit_cycles": float(np.median(warm[0, 1:]))}


def _persisting_runs(ctx, flush, budget, stream, hot, src, dst, sizes, ratios, max_persist, max_window, n,
                     runs) -> None:
    import torch

    from ..measure.timing import Interval

    rng = np.random.default_rng(5)
    for size in sizes:
        for ratio in [0.0] + ratios:
            if budget.over():
                return
            window = ratio > 0
            driver.set_persisting_limit(min(size, max_persist) if window else 0)
            driver.set_access_window(stream.cuda_stream, hot.data_ptr(), min(size, max_window) if window else 0, ratio)
            flush()
            hot[: size // 4].sum()
            with Interval() as copy:
                dst.copy_(src)
            torch.cuda.synchronize(ctx.device)
            offs = rng.integers(0, size // LINE_BYTES, size=(1, n)) * LINE_BYTES
            c, _ = run_offsets(ctx, hot.data_ptr(), offs, [0])
            runs.append({"hot_bytes": size, "hit_ratio": ratio, "window": window,
                         "latency_cycles": float(c[0, 1:].mean()), "samples": c[0, 1:],
                         "stream_copy_ms": copy.ms()})
            driver.reset_persisting()


EXPERIMENTS = {"first_touch": first_touch, "stride_sweep": stride_sweep, "capacity": capacity,
               "prefetch": prefetch, "address_bits": address_bits, "contention": contention,
               "persisting": persisting, "conflict_sets": conflict_sets, "layout_fixes": layout_fixes}


def run_suite(quick: bool = False, device=None, only=None) -> dict:
    """Every experiment (or those named in `only`) within its budget; returns {"experiments": {name: result},
    "times_s": {...}, "quick": quick, "total_s": ...}. An experiment that fails records its error and the suite
    goes on."""
    import torch

    from ..measure.probes import warm_clocks

    t0 = time.perf_counter()
    which = BUDGETS if only is None else {k: BUDGETS[k] for k in ["setup", *only]}
    ctx = make_context(device)
    with torch.cuda.device(ctx.index):
        warm_clocks(ctx.device, 50)
        flush = Flusher(ctx)
        times = {"setup": time.perf_counter() - t0}
        _progress(f"setup {times['setup']:.1f} s: {ctx.n_sm} SMs, L2 {ctx.l2_bytes / MB:.0f} MB, "
                  f"clock {ctx.clock_ghz:.3f} GHz")
        results = {}
        for name in which:
            if name == "setup":
                continue
            budget = Budget(BUDGETS[name][0 if quick else 1])
            try:
                results[name] = EXPERIMENTS[name](ctx, flush, budget, quick)
            except Exception as exc:  # one failed experiment must not lose the others' results
                results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            times[name] = budget.elapsed()
            results[name]["elapsed_s"] = times[name]
            results[name]["budget_s"] = budget.seconds
            _progress(f"{name} {times[name]:.1f} s" + (f" ERROR {results[name]['error']}"
                                                         if "error" in results[name] else ""))
    return {"quick": quick, "device_index": ctx.index, "n_sm": ctx.n_sm, "l2_bytes": ctx.l2_bytes,
            "clock_ghz": ctx.clock_ghz, "experiments": results, "times_s": times,
            "total_s": time.perf_counter() - t0}
