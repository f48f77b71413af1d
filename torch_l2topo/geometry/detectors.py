"""L2 geometry detectors: what the geometry suite's curves say, decided in pure numpy (no GPU).

Each detector takes a measured curve (or labels of addresses) and returns a small frozen result with `found`
and, when nothing is found, a `reason`. A flat or noisy curve is "not found", never a structure: every threshold
is a multiple of the curve's own noise or a fraction of its level, whichever is larger. The experiments that
produce the curves live in suite.py (docs/geometry.md). Detectors: find_regimes, first_rise and
effective_capacity (plateaus, knees, capacity); hit_extent and two_levels (the fetch granule); saturation (line
size, slice contention); find_dips (prefetching strides); bit_flips, xor_model and pattern_accuracy (how a
label follows address bits); conflict_sets (set-indexed or hashed); fix_effect (did a layout fix change a
kernel's time beyond its own spread).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..measure.timing import Measurement

# A step must clear Z_STEP noise sd and REL_STEP of the level, whichever is larger. REL_STEP: the smallest
# real step we look for on the H200 is near -> far partition, ~30 of ~270 cycles (11%); 3% keeps a margin.
Z_STEP = 4.0
REL_STEP = 0.03
MIN_POINTS = 3     # a plateau (a regime) spans at least this many points of the curve


def _curve(x, y, name: str = "curve"):
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.ndim != 1 or y.shape != x.shape:
        raise ValueError(f"{name}: x and y must be 1-D of one length, got {x.shape} and {y.shape}")
    if x.size < 2 or not np.all(np.isfinite(x)) or not np.all(np.isfinite(y)):
        raise ValueError(f"{name}: need at least 2 finite points")
    if np.any(np.diff(x) <= 0):
        raise ValueError(f"{name}: x must be strictly increasing")
    return x, y


def noise_sd(y) -> float:
    """Robust sd of a curve's point noise: MAD of second differences / sqrt(6). Second differences leave out
    a smooth trend (a ramp towards DRAM) and turn a step into two outliers the median ignores."""
    d = np.diff(np.asarray(y, dtype=np.float64), n=2)
    return float(1.4826 * np.median(np.abs(d - np.median(d))) / np.sqrt(6)) if d.size else 0.0


def _min_step(level: float, sd: float) -> float:
    return max(Z_STEP * sd, REL_STEP * abs(level))


# ---- footprint sweeps: plateaus and knees --------------------------------------------------------------
@dataclass(frozen=True)
class Knee:
    """Between two regimes: `onset` the last x of the lower plateau, `end` the first x of the upper one, `mid`
    the x where the curve crosses halfway between their levels (interpolated in log x)."""

    onset: float
    mid: float
    end: float
    low: float
    high: float


@dataclass(frozen=True)
class Regimes:
    """Plateaus of a curve in x order: levels (mean y), spans (first x, last x); knees between consecutive
    plateaus. found: at least two plateaus."""

    levels: np.ndarray
    spans: np.ndarray
    knees: list = field(default_factory=list)
    noise: float = 0.0
    reason: str = ""

    @property
    def found(self) -> bool:
        return len(self.knees) > 0


def _segments(y: np.ndarray, penalty: float) -> list[tuple[int, int]]:
    """Optimal piecewise-constant segmentation: minimise SSE + penalty per segment (O(n^2) dynamic program)."""
    n = y.size
    c1 = np.concatenate([[0.0], np.cumsum(y)])
    c2 = np.concatenate([[0.0], np.cumsum(y * y)])

    def sse(i, j):
        s = c1[j] - c1[i]
        return c2[j] - c2[i] - s * s / (j - i)

    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    prev = np.zeros(n + 1, dtype=np.int64)
    for j in range(1, n + 1):
        for i in range(j):
            c = best[i] + sse(i, j) + penalty
            if c < best[j]:
                best[j], prev[j] = c, i
    cuts, j = [], n
    while j > 0:
        cuts.append((int(prev[j]), j))
        j = prev[j]
    return cuts[::-1]


def find_regimes(x, y, noise: float | None = None, min_points: int = MIN_POINTS) -> Regimes:
    """The latency regimes of a footprint sweep (x: footprint, increasing; y: latency) and the knees between.

    The curve is cut into constant pieces (penalised least squares: a cut must pay 2 ln(n) noise variances);
    neighbouring pieces closer than the minimum step (Z_STEP noise sd or REL_STEP of the level) are merged;
    pieces of at least `min_points` points whose values stay within a step of each other are plateaus, the
    rest transitions. noise: the sd of one point (default: estimated from the curve itself).
    """
    x, y = _curve(x, y, "find_regimes")
    sd = noise_sd(y) if noise is None else float(noise)
    floor = REL_STEP * np.median(np.abs(y)) / Z_STEP  # a noiseless curve still needs a finite penalty
    sd_eff = max(sd, floor / 4)
    segs = _segments(y, 2 * np.log(y.size) * sd_eff ** 2)
    merged = True
    while merged and len(segs) > 1:
        means = np.array([y[i:j].mean() for i, j in segs])
        gaps = np.abs(np.diff(means))
        k = int(np.argmin(gaps))
        merged = gaps[k] < _min_step(max(means[k], means[k + 1]), sd_eff)
        if merged:
            segs[k:k + 2] = [(segs[k][0], segs[k + 1][1])]
    plateaus = [(i, j) for i, j in segs
                if j - i >= min_points and np.ptp(y[i:j]) < 2 * _min_step(y[i:j].mean(), sd_eff)]
    levels = np.array([y[i:j].mean() for i, j in plateaus])
    spans = np.array([(x[i], x[j - 1]) for i, j in plateaus]).reshape(-1, 2)
    knees = []
    lx = np.log(x)
    for (i0, j0), (i1, _), lo, hi in zip(plateaus, plateaus[1:], levels, levels[1:]):
        half = (lo + hi) / 2
        k = next((k for k in range(j0 - 1, i1) if (y[k + 1] - half) * np.sign(hi - lo) >= 0), i1 - 1)
        t = np.clip((half - y[k]) / (y[k + 1] - y[k]), 0, 1) if y[k + 1] != y[k] else 0.5
        knees.append(Knee(onset=float(x[j0 - 1]), mid=float(np.exp(lx[k] + t * (lx[k + 1] - lx[k]))),
                          end=float(x[i1]), low=float(lo), high=float(hi)))
    reason = "" if knees else (f"{len(plateaus)} plateau(s): no step larger than the noise "
                               f"(sd {sd:.2f}) and {REL_STEP:.0%} of the level")
    return Regimes(levels=levels, spans=spans, knees=knees, noise=sd, reason=reason)


@dataclass(frozen=True)
class Rise:
    """flat_until: the last x of the curve's first plateau; rises_at: the next x, where the curve has left it by
    more than the minimum step; level: the plateau's level (median of its first MIN_POINTS points)."""

    flat_until: float | None
    rises_at: float | None
    level: float
    reason: str = ""

    @property
    def found(self) -> bool:
        return self.rises_at is not None


def first_rise(x, y, noise: float | None = None, min_points: int = MIN_POINTS) -> Rise:
    """Where a curve first leaves its starting plateau for good (a capacity knee's onset, also where no second
    plateau follows: a ramp towards DRAM). The plateau: the first min_points points and every later one within
    the minimum step (Z_STEP noise sd, REL_STEP of the level) of their median; found when a later point, and
    every point after it, lies above that band."""
    x, y = _curve(x, y, "first_rise")
    if x.size <= min_points:
        raise ValueError(f"first_rise needs more than {min_points} points")
    level = float(np.median(y[:min_points]))
    sd = noise_sd(y) if noise is None else float(noise)
    above = y > level + _min_step(level, sd)
    inside = np.flatnonzero(~above)
    if inside.size == 0 or inside[-1] + 1 >= x.size:
        return Rise(None, None, level, "no rise beyond the noise and the relative step")
    k = int(inside[-1]) + 1  # first point of the final run above the band
    if k < min_points:
        return Rise(None, None, level, "the curve starts above its plateau")
    if np.any(y[min_points:k] > level + _min_step(level, sd)):
        return Rise(None, None, level, "the curve leaves its plateau and comes back")
    return Rise(float(x[k - 1]), float(x[k]), level)


def effective_capacity(x, y, hit: float, miss: float, lo: float = 0.1, hi: float = 0.9) -> float | None:
    """The L2 capacity a footprint sweep implies: at footprint F with latency y, a fraction
    h = (miss - y) / (miss - hit) of the loads hit, and a cache of C bytes keeping a random C of F gives h = C / F.
    The median of F * h over the points with h in (lo, hi) (where the estimate is informative); None without
    such points or without a hit/miss contrast."""
    x, y = _curve(x, y, "effective_capacity")
    if not miss - hit > 0:
        return None
    h = (miss - y) / (miss - hit)
    use = (h > lo) & (h < hi)
    return float(np.median(x[use] * h[use])) if use.any() else None


# ---- first touch: the fetch granule ------------------------------------------------------------------
@dataclass(frozen=True)
class HitExtent:
    """granule: the smallest offset from a missed byte whose load missed too (the bytes [0, granule) came in
    with the first load); hit / miss: the two latency levels. found: two levels apart and cleanly ordered."""

    granule: int | None
    hit: float
    miss: float
    reason: str = ""

    @property
    def found(self) -> bool:
        return self.granule is not None


def two_levels(values):
    """1-D 2-means started at the extremes: (low mean, high mean, mask of the values in the high group)."""
    y = np.asarray(values, dtype=np.float64)
    lo, hi = y.min(), y.max()
    high = y > (lo + hi) / 2
    for _ in range(50):
        if high.all() or not high.any():
            break
        lo, hi = y[~high].mean(), y[high].mean()
        new = y > (lo + hi) / 2
        if np.array_equal(new, high):
            break
        high = new
    return lo, hi, high


def hit_extent(offsets, latency, min_gap: float | None = None) -> HitExtent:
    """First touch: latency of a second load at `offsets` bytes after a load that missed L2. Offsets inside the
    granule the miss fetched hit L2, the others miss again. min_gap: how far apart hit and miss must be
    (default: 20% of the hit level; on the H200 an L2 hit is ~270-300 cycles, DRAM 600+)."""
    x, y = _curve(offsets, latency, "hit_extent")
    lo, hi, high = two_levels(y)
    gap = 0.2 * lo if min_gap is None else min_gap
    # DRAM latency varies by hundreds of cycles from load to load (banks, rows), so the test is a clean
    # separation of the two groups, not a multiple of their spread
    if not high.any() or high.all() or hi - lo < gap or y[high].min() - y[~high].max() < gap / 2:
        return HitExtent(None, float(lo), float(hi), f"no two latency levels {gap:.0f} cycles apart")
    first_miss = int(np.argmax(high))
    if not high[first_miss:].all():
        return HitExtent(None, float(lo), float(hi), "hits and misses interleave: no single granule")
    if first_miss == 0:
        return HitExtent(None, float(lo), float(hi), "every offset missed: the granule is below the smallest offset")
    return HitExtent(int(x[first_miss]), float(lo), float(hi))


# ---- saturation: where a rising curve levels off -----------------------------------------------------
@dataclass(frozen=True)
class Saturation:
    """at: the smallest x from which the curve stays within `tolerance` of its top level; low/top: the first
    point and the top level (the mean of the last `min_points` points)."""

    at: float | None
    low: float
    top: float
    reason: str = ""

    @property
    def found(self) -> bool:
        return self.at is not None


def saturation(x, y, min_points: int = 2, rel_tol: float = 0.1, noise: float | None = None) -> Saturation:
    """Where a curve that rises from its first point levels off: the smallest x from which every point lies
    within rel_tol of the rise (or 2 noise sd) below the top level. Not found: no rise beyond the minimum
    step, or the curve never settles (the top is its last point alone)."""
    x, y = _curve(x, y, "saturation")
    sd = noise_sd(y) if noise is None else float(noise)
    top = float(y[-min_points:].mean())
    low = float(y[0])
    if top - low < _min_step(low, sd):
        return Saturation(None, low, top, f"no rise above the noise (sd {sd:.2f}) and {REL_STEP:.0%} of the level")
    tol = max(rel_tol * (top - low), 2 * sd)
    inside = np.abs(y - top) <= tol
    k = y.size
    while k > 0 and inside[k - 1]:
        k -= 1
    if y.size - k < min_points:
        return Saturation(None, low, top, "the curve is still rising at its last points")
    return Saturation(float(x[k]), low, top)


# ---- prefetching: regular strides against a random order ---------------------------------------------
@dataclass(frozen=True)
class Dips:
    """Per stride: effect = random - regular latency (positive: the regular order is faster); threshold: the
    effect a dip must exceed; dips: the strides past it."""

    strides: np.ndarray
    effect: np.ndarray
    threshold: float
    dips: np.ndarray
    reason: str = ""

    @property
    def found(self) -> bool:
        return self.dips.size > 0


def find_dips(strides, regular, random, noise: float | None = None, rel: float = 0.1) -> Dips:
    """Strides at which a regular-stride chase is faster than a random order over the same addresses by more
    than `rel` of the random latency and Z_STEP noise sd (noise: sd of one point; default the spread of the
    random curve, which has no reason to vary with the stride). A prefetcher shows as such dips."""
    s, reg = _curve(strides, regular, "find_dips")
    _, rnd = _curve(strides, random, "find_dips")
    sd = noise_sd(rnd) if noise is None else float(noise)
    effect = rnd - reg
    threshold = max(Z_STEP * sd, rel * float(np.median(rnd)))
    dips = s[effect > threshold]
    reason = "" if dips.size else f"no stride faster than random by more than {threshold:.1f} cycles"
    return Dips(strides=s, effect=effect, threshold=threshold, dips=dips, reason=reason)


# ---- address bits: granularity and the XOR model ---------------------------------------------------------
@dataclass(frozen=True)
class BitFlips:
    """bits: address bits tested; flip: fraction of address pairs differing only in that bit whose labels
    differ (NaN: no such pair); pairs: how many pairs each fraction rests on."""

    bits: np.ndarray
    flip: np.ndarray
    pairs: np.ndarray

    def granularity(self, threshold: float = 0.25) -> int | None:
        """Bytes over which the label stays put: 2**(lowest bit whose flip changes the label in more than
        `threshold` of pairs); None when no bit does."""
        hit = np.flatnonzero(np.nan_to_num(self.flip) > threshold)
        return int(2 ** self.bits[hit[0]]) if hit.size else None


def bit_flips(addresses, labels, bits) -> BitFlips:
    """For each bit b: of the labelled addresses a whose partner a ^ 2**b is labelled too, the fraction
    whose labels differ. Labels < 0 are undecided and skipped."""
    a = np.asarray(addresses, dtype=np.int64)
    lab = np.asarray(labels)
    if a.shape != lab.shape or a.ndim != 1:
        raise ValueError(f"addresses and labels must be 1-D of one length, got {a.shape} and {lab.shape}")
    ok = lab >= 0
    a, lab = a[ok], lab[ok]
    order = np.argsort(a)
    a, lab = a[order], lab[order]
    bits = np.asarray(bits, dtype=np.int64)
    flip, pairs = np.full(bits.size, np.nan), np.zeros(bits.size, dtype=np.int64)
    if a.size == 0:
        return BitFlips(bits=bits, flip=flip, pairs=pairs)
    for i, b in enumerate(bits):
        partner = a ^ (np.int64(1) << b)
        j = np.searchsorted(a, partner).clip(0, a.size - 1)
        has = (a[j] == partner) & (a < partner)  # each pair once
        pairs[i] = int(np.sum(has))
        if pairs[i]:
            flip[i] = float(np.mean(lab[has] != lab[j[has]]))
    return BitFlips(bits=bits, flip=flip, pairs=pairs)


@dataclass(frozen=True)
class XorModel:
    """label(a) = parity(a & mask) XOR c(page), page = a >> page_bit: a binary label linear over GF(2) in the
    address bits below page_bit (the offset inside a page, equal in virtual and physical addresses), with
    one constant per page for the bits above (the physical frame, unknown to user space). bits: the mask's
    bits; ambiguous: tested bits whose flip fraction lies between 0.1 and 0.9 (what a linear hash cannot
    explain)."""

    bits: np.ndarray
    ambiguous: np.ndarray
    page_bit: int
    flips: BitFlips

    @property
    def mask(self) -> int:
        return int(sum(1 << int(b) for b in self.bits))

    def parity(self, addresses) -> np.ndarray:
        v = np.asarray(addresses, dtype=np.int64) & np.int64(self.mask)
        out = np.zeros(v.shape, dtype=np.int64)
        while np.any(v):
            out ^= v & 1
            v = v >> 1
        return out

    def predict(self, addresses, anchors, anchor_labels) -> np.ndarray:
        """Labels of `addresses`, each page's constant taken from the anchors on that page (majority of the
        anchors' parity residuals); -1 for pages without a decided anchor."""
        a = np.asarray(addresses, dtype=np.int64)
        an, al = np.asarray(anchors, dtype=np.int64), np.asarray(anchor_labels)
        ok = al >= 0
        an, al = an[ok], al[ok]
        resid = self.parity(an) ^ al
        pages = an >> self.page_bit
        const = {}
        for p in np.unique(pages):
            r = resid[pages == p]
            const[int(p)] = int(np.mean(r) > 0.5)
        c = np.array([const.get(int(p), -1) for p in (a >> self.page_bit)], dtype=np.int64)
        return np.where(c >= 0, self.parity(a) ^ np.maximum(c, 0), -1)


def xor_model(addresses, labels, page_bit: int, low_bit: int = 7) -> XorModel:
    """Fit the XOR model of a binary label (e.g. the home partition of each block) from labelled addresses:
    bit b is in the mask when flipping it changes the label in most pairs (bits low_bit..page_bit - 1)."""
    lab = np.asarray(labels)
    if np.any(lab > 1):
        raise ValueError("xor_model takes binary labels (0/1, -1 undecided)")
    if not 0 < low_bit < page_bit < 48:
        raise ValueError(f"need 0 < low_bit < page_bit < 48, got {low_bit}, {page_bit}")
    flips = bit_flips(addresses, lab, np.arange(low_bit, page_bit))
    f = np.nan_to_num(flips.flip, nan=0.5)
    return XorModel(bits=flips.bits[f > 0.5], ambiguous=flips.bits[(f > 0.1) & (f < 0.9)], page_bit=page_bit,
                    flips=flips)


def pattern_accuracy(addresses, labels, page_bit: int, anchors_per_page: int = 64, seed: int = 0) -> dict:
    """A model for labels that no XOR of address bits explains: every page repeats one of a few patterns
    (label by offset inside the page), chosen by its physical frame. Training pages give the patterns; a
    held-out page takes the training pattern (or its complement) that agrees best with `anchors_per_page` of
    its labelled blocks, and the rest of its blocks are scored. Returns accuracy, the distinct patterns among
    the training pages (up to complement), counts."""
    a = np.asarray(addresses, dtype=np.int64)
    lab = np.asarray(labels).astype(np.int64)
    page = a >> page_bit
    pages = np.unique(page)
    block = int(np.min(np.diff(np.unique(a)))) if a.size > 1 else 1
    per_page = (1 << page_bit) // block
    full = [p for p in pages if np.sum(page == p) == per_page]  # only pages the buffer covers whole
    if len(full) < 2:
        raise ValueError("pattern_accuracy needs at least two whole pages of labelled addresses")
    rows = [np.flatnonzero(page == p) for p in full]
    grid = np.stack([lab[idx[np.argsort(a[idx])]] for idx in rows])  # (page, block in the page) in address order
    rng = np.random.default_rng(seed)
    test = rng.permutation(len(full))[: len(full) // 2]
    train = np.setdiff1d(np.arange(len(full)), test)
    pats = grid[train]
    canon = np.where(pats[:, :1] == 1, 1 - pats, pats)  # a pattern and its complement are one
    distinct = len({row.tobytes() for row in canon})
    right = total = 0
    for t in test:
        anchors = rng.permutation(per_page)[:anchors_per_page]
        rest = np.setdiff1d(np.arange(per_page), anchors)
        ok = grid[t, anchors] >= 0
        agree = (pats[:, anchors][:, ok] == grid[t, anchors][ok]).mean(axis=1)
        best = int(np.argmax(np.maximum(agree, 1 - agree)))
        guess = pats[best] if agree[best] >= 0.5 else 1 - pats[best]
        scored = (grid[t, rest] >= 0) & (guess[rest] >= 0)
        right += int(np.sum(guess[rest][scored] == grid[t, rest][scored]))
        total += int(scored.sum())
    return {"accuracy": right / total if total else float("nan"), "distinct_patterns": distinct,
            "n_train_pages": len(train), "n_test_pages": len(test), "page_bit": page_bit,
            "anchors_per_page": anchors_per_page, "n_scored": total}


def held_out_accuracy(addresses, labels, page_bit: int, anchors_per_page: int = 8, seed: int = 0,
                      low_bit: int = 7) -> dict:
    """Fit the XOR model on half the pages, predict the other half from `anchors_per_page` labelled addresses
    per held-out page (its constant) and score the rest of their addresses. Returns the model's bits, the
    ambiguous bits, accuracy and counts."""
    a = np.asarray(addresses, dtype=np.int64)
    lab = np.asarray(labels)
    pages = np.unique(a >> page_bit)
    if pages.size < 2:
        raise ValueError("held_out_accuracy needs addresses on at least two pages")
    rng = np.random.default_rng(seed)
    test_pages = rng.permutation(pages)[: pages.size // 2]
    test = np.isin(a >> page_bit, test_pages)
    model = xor_model(a[~test], lab[~test], page_bit, low_bit)
    ta, tl_ = a[test], lab[test]
    anchor = np.zeros(ta.size, dtype=bool)
    for p in test_pages:
        idx = np.flatnonzero((ta >> page_bit) == p)
        anchor[rng.permutation(idx)[:anchors_per_page]] = True
    pred = model.predict(ta[~anchor], ta[anchor], tl_[anchor])
    scored = (tl_[~anchor] >= 0) & (pred >= 0)
    acc = float(np.mean(pred[scored] == tl_[~anchor][scored])) if scored.any() else float("nan")
    return {"bits": model.bits.tolist(), "ambiguous_bits": model.ambiguous.tolist(), "page_bit": page_bit,
            "accuracy": acc, "n_scored": int(scored.sum()), "n_train": int((~test).sum()),
            "n_test_pages": int(test_pages.size), "flip": model.flips.flip.tolist()}


# ---- sets and ways: chases over lines at a power-of-two stride -------------------------------------------
MISS_FRACTION = 0.25  # a conflict: at least this fraction of a steady-state chase's loads miss (~100 cycles)


@dataclass(frozen=True)
class ConflictSets:
    """ways[j]: for strides[j], the largest n of lines that still hit, when every larger n measured misses
    (a conflict set of `ways` ways), else None. excess[j, i]: the miss fraction the detector read,
    (cycles - max(hit, control)) / (miss - hit)."""

    strides: np.ndarray
    n_lines: np.ndarray
    ways: list
    excess: np.ndarray
    reason: str = ""

    @property
    def found(self) -> bool:
        return any(w is not None for w in self.ways)

    def verdict(self) -> str:
        if self.found:
            j = next(j for j, w in enumerate(self.ways) if w is not None)
            return (f"conflict found at stride {int(self.strides[j])} B: n > {self.ways[j]} lines miss "
                    f"(strides with a conflict: {[int(s) for s, w in zip(self.strides, self.ways) if w is not None]})")
        return (f"no conflict set found up to n={int(self.n_lines.max())} lines for strides "
                f"{int(self.strides.min())}-{int(self.strides.max())} B: {self.reason}")


def conflict_sets(n_lines, strides, cycles, hit: float, miss: float, control=None, noise: float | None = None,
                  min_fraction: float = MISS_FRACTION) -> ConflictSets:
    """cycles[j, i]: cycles per load of a steady-state chase over n_lines[i] lines at stride strides[j]; hit and
    miss: the L2-hit and DRAM latencies. control (same shape, optional): the same lines each moved by a random
    whole number of lines within its stride (same pages, no power-of-two alignment); a rise there too is not a
    set conflict (TLB reach, say) and is subtracted. A conflict at a stride: from some n on, every point is
    above the reference by min_fraction of (miss - hit) and by Z_STEP noise sd, for at least two points of n,
    and the first point (the fewest lines) hits. noise: sd of one point (default: from the grid's rows)."""
    n = np.asarray(n_lines, dtype=np.float64)
    s = np.asarray(strides, dtype=np.float64)
    y = np.asarray(cycles, dtype=np.float64)
    if n.ndim != 1 or s.ndim != 1 or y.shape != (s.size, n.size):
        raise ValueError(f"conflict_sets: cycles must be (strides, n_lines) = ({s.size}, {n.size}), got {y.shape}")
    if n.size < 3 or np.any(np.diff(n) <= 0) or not np.all(np.isfinite(y)):
        raise ValueError("conflict_sets: need at least 3 increasing n_lines and finite cycles")
    if not miss > hit:
        raise ValueError(f"conflict_sets: miss ({miss}) must exceed hit ({hit})")
    ref = np.full_like(y, float(hit))
    if control is not None:
        c = np.asarray(control, dtype=np.float64)
        if c.shape != y.shape:
            raise ValueError(f"conflict_sets: control must have the shape of cycles {y.shape}, got {c.shape}")
        ref = np.maximum(ref, c)
    sd = float(np.median([noise_sd(row) for row in y])) if noise is None else float(noise)
    excess = (y - ref) / (miss - hit)
    above = (excess >= min_fraction) & (y - ref > Z_STEP * sd)
    ways = []
    for row in above:
        k = row.size
        while k > 0 and row[k - 1]:
            k -= 1
        ways.append(int(n[k - 1]) if row.size - k >= 2 and k >= 1 else None)
    reason = "" if any(w is not None for w in ways) else (
        f"no stride where every n from some point on misses {min_fraction:.0%} of its loads "
        f"(largest miss fraction {excess.max():.2f})")
    return ConflictSets(strides=s, n_lines=n, ways=ways, excess=excess, reason=reason)


# ---- layout fixes: the same kernel with and without ------------------------------------------------------
@dataclass(frozen=True)
class FixEffect:
    """ratio: median time with the fix / median without; spread: the larger relative spread of the two sets
    of repeats (timing.Measurement.spread: (p80 - p20) / median); verdict: 'faster', 'slower' or 'no effect'."""

    ratio: float
    spread: float
    verdict: str


def fix_effect(with_fix, without, min_rel: float = 0.02) -> FixEffect:
    """Whether a layout fix changed a kernel's time: the ratio of medians must leave 1 by more than the
    repeats' own relative spread and by min_rel (2%: run-to-run drift of a warm kernel), else 'no effect'."""
    a, b = np.asarray(with_fix, dtype=np.float64), np.asarray(without, dtype=np.float64)
    if a.size < 2 or b.size < 2 or np.any(a <= 0) or np.any(b <= 0):
        raise ValueError("fix_effect needs at least two positive times with and without the fix")
    a, b = Measurement(a), Measurement(b)
    spread = max(a.spread, b.spread)
    ratio = a.median / b.median
    margin = max(spread, min_rel)
    verdict = "faster" if ratio < 1 - margin else "slower" if ratio > 1 + margin else "no effect"
    return FixEffect(ratio=ratio, spread=spread, verdict=verdict)
