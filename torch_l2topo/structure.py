"""Structure in an SM x line latency matrix: L2 partitions, TPC twins, GPC clusters and SM-id symmetry.

Every finder takes a Topology, a fitted NucaModel, or a bare matrix with its per-entry noise, returns a
plain dataclass with a margin, and says "none found" (found=False, with the reason) when the data carries
no such structure: a flat or pure-noise matrix yields no partitions, twins or GPC clusters. The SM
profiles compared are the NUCA model's (nuca.py), restricted to the terms that stand above the noise, so
repeat noise does not split what is identical; two profiles differ when they are more than the model's
resolution (NOISE_TOLERANCE x the repeat noise, RMS over lines) apart. Line (slice) classes live in
slices.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.optimize import linear_sum_assignment
from scipy.spatial.distance import pdist, squareform
from scipy.special import comb

from .nuca import as_model

# Chance that a map without partitions still gets some SM or line assigned a side: the per-item z
# threshold is Bonferroni-corrected over all SMs and lines for this family-wise rate.
FALSE_ALARM = 1e-3
# The side/home alternation converges in 1-2 sweeps on the H200 data; the bound only guards a cycle.
_MAX_SWEEPS = 20


def best_match_agreement(x, y) -> tuple[float, dict]:
    """Fraction of items with the same label in x and y after the best one-to-one label matching
    (Hungarian), and that matching {x label: y label}. Items labelled -1 in either are left out."""
    x, y = np.asarray(x), np.asarray(y)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"label arrays must be 1-D and of one length, got shapes {x.shape} and {y.shape}")
    keep = (x >= 0) & (y >= 0)
    if not keep.any():
        raise ValueError("no item is labelled in both label arrays")
    xs, xi = np.unique(x[keep], return_inverse=True)
    ys, yi = np.unique(y[keep], return_inverse=True)
    table = np.zeros((len(xs), len(ys)), dtype=np.int64)
    np.add.at(table, (xi, yi), 1)
    rows, cols = linear_sum_assignment(table, maximize=True)
    return float(table[rows, cols].sum() / keep.sum()), {int(xs[r]): int(ys[c]) for r, c in zip(rows, cols)}


def adjusted_rand_index(x, y) -> float:
    """Adjusted Rand index of two labelings of the same items: 1 identical, ~0 unrelated (Hubert & Arabie)."""
    x, y = np.asarray(x), np.asarray(y)
    if x.shape != y.shape or x.ndim != 1 or x.size < 2:
        raise ValueError(f"labelings must be 1-D, of one length >= 2, got shapes {x.shape} and {y.shape}")
    _, xi = np.unique(x, return_inverse=True)
    _, yi = np.unique(y, return_inverse=True)
    table = np.zeros((xi.max() + 1, yi.max() + 1))
    np.add.at(table, (xi, yi), 1)
    pairs = comb(table, 2).sum()
    rows, cols = comb(table.sum(axis=1), 2).sum(), comb(table.sum(axis=0), 2).sum()
    expected = rows * cols / comb(x.size, 2)
    best = (rows + cols) / 2
    return 1.0 if best == expected else float((pairs - expected) / (best - expected))


def first_seen_labels(labels) -> np.ndarray:
    """Relabel 0.. in order of first appearance, so that labels do not depend on a clustering's internals."""
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    return np.argsort(np.argsort(first))[inverse]


# ---- L2 partitions ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Partitions:
    """Two L2 partitions: each SM's near side and each line's home, 0/1 (-1: undecided, or none found).

    Partition 0 is the near side of the lowest-numbered decided SM. sm_margin / line_margin: the SM's (line's)
    far - near latency difference over its noise standard error (resolution-based); an item is decided when
    it exceeds z_critical. near_cycles / far_cycles: mean latency of SM -> line pairs on the same / opposite
    partitions (decided items only).
    """

    found: bool
    reason: str
    sm_partition: np.ndarray
    line_partition: np.ndarray
    sm_margin: np.ndarray
    line_margin: np.ndarray
    near_cycles: float
    far_cycles: float
    z_critical: float

    @property
    def gap_cycles(self) -> float:
        return self.far_cycles - self.near_cycles

    @property
    def gap_ratio(self) -> float:
        return self.far_cycles / self.near_cycles if self.found else float("nan")

    @property
    def sm_counts(self) -> tuple[int, int]:
        return int(np.sum(self.sm_partition == 0)), int(np.sum(self.sm_partition == 1))

    @property
    def line_counts(self) -> tuple[int, int]:
        return int(np.sum(self.line_partition == 0)), int(np.sum(self.line_partition == 1))

    def sms(self, partition: int) -> np.ndarray:
        return np.flatnonzero(self.sm_partition == partition)

    def lines(self, partition: int) -> np.ndarray:
        return np.flatnonzero(self.line_partition == partition)

    def near_far_values(self, matrix) -> tuple[np.ndarray, np.ndarray]:
        """The matrix entries of same-partition (near) and cross-partition (far) SM -> line pairs."""
        m = np.asarray(matrix)
        s, l = self.sm_partition, self.line_partition
        both = (s[:, None] >= 0) & (l[None, :] >= 0)
        same = s[:, None] == l[None, :]
        return m[both & same], m[both & ~same]

    def to_frames(self) -> dict:
        import pandas as pd

        return {"sm": pd.DataFrame({"sm": np.arange(len(self.sm_partition)), "partition": self.sm_partition,
                                    "margin": self.sm_margin}),
                "line": pd.DataFrame({"line": np.arange(len(self.line_partition)),
                                      "partition": self.line_partition, "margin": self.line_margin})}


def _no_partitions(n_sm: int, n_lines: int, reason: str, z_crit: float) -> Partitions:
    return Partitions(False, reason, np.full(n_sm, -1), np.full(n_lines, -1), np.full(n_sm, np.nan),
                      np.full(n_lines, np.nan), float("nan"), float("nan"), z_crit)


def find_partitions(data, noise=None) -> Partitions:
    """Split SMs and lines into two L2 partitions: an SM is fast to the lines homed on its side.

    Starts from the sign of the leading interaction term and alternates (a line's home is the SM group that
    sees it faster; an SM's side is the line group it sees faster) until nothing moves. Found only when that
    term stands above the noise and both partitions keep decided SMs and lines.
    """
    model = as_model(data, noise)
    m = model.matrix
    n_sm, n_lines = m.shape
    z_crit = float(stats.norm.isf(FALSE_ALARM / (n_sm + n_lines)))
    if model.significant_rank == 0:
        return _no_partitions(n_sm, n_lines, "no interaction term stands above the noise", z_crit)
    side = model.u[:, 0] > 0
    for _ in range(_MAX_SWEEPS):
        if side.all() or not side.any():
            return _no_partitions(n_sm, n_lines, "every SM falls on one side", z_crit)
        home = m[side].mean(axis=0) < m[~side].mean(axis=0)
        if home.all() or not home.any():
            return _no_partitions(n_sm, n_lines, "every line is homed on one side", z_crit)
        new_side = m[:, home].mean(axis=1) < m[:, ~home].mean(axis=1)
        if np.array_equal(new_side, side):
            break
        side = new_side

    res = model.resolution
    n_home = np.array([np.sum(~home), np.sum(home)])
    n_side = np.array([np.sum(~side), np.sum(side)])
    own = side[:, None] == home[None, :]
    near_of, far_of = np.where(own, m, np.nan), np.where(own, np.nan, m)
    s_own, l_own = side.astype(int), home.astype(int)
    sm_margin = (np.nanmean(far_of, axis=1) - np.nanmean(near_of, axis=1)) \
        / (res * np.sqrt(1 / n_home[s_own] + 1 / n_home[1 - s_own]))
    line_margin = (np.nanmean(far_of, axis=0) - np.nanmean(near_of, axis=0)) \
        / (res * np.sqrt(1 / n_side[l_own] + 1 / n_side[1 - l_own]))
    sm_ok, line_ok = sm_margin > z_crit, line_margin > z_crit
    if not (sm_ok & side).any() or not (sm_ok & ~side).any() or not (line_ok & home).any() \
            or not (line_ok & ~home).any():
        return _no_partitions(n_sm, n_lines, f"one partition has no SM or line whose near-far contrast exceeds "
                              f"{z_crit:.1f} noise standard errors", z_crit)
    first = side[np.flatnonzero(sm_ok)[0]]  # partition 0 is where the lowest decided SM is near
    sm_part = np.where(sm_ok, (side != first).astype(int), -1)
    line_part = np.where(line_ok, (home != first).astype(int), -1)
    both = sm_ok[:, None] & line_ok[None, :]
    near = float(m[both & own].mean())
    far = float(m[both & ~own].mean())
    return Partitions(True, "", sm_part, line_part, sm_margin, line_margin, near, far, z_crit)


def compare_partitions(p: Partitions, q: Partitions) -> dict:
    """How two partition results (same SMs and lines: two calibrations, or two GPUs) agree, after matching
    labels: fraction of SMs and of lines decided in both that sit in the same partition."""
    if not (p.found and q.found):
        return {"sm_agreement": float("nan"), "line_agreement": float("nan")}
    return {"sm_agreement": best_match_agreement(p.sm_partition, q.sm_partition)[0],
            "line_agreement": best_match_agreement(p.line_partition, q.line_partition)[0]}


# ---- TPC twins -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Twins:
    """SM pairs whose profiles are indistinguishable from each other and distinguishable from every other SM.

    pairs: (k, 2) SM ids, i < j. distance: RMS difference of the pair's model profiles (cycles).
    nearest_other: RMS difference from either member to the closest third SM. resolution: the boundary.
    """

    pairs: np.ndarray
    distance: np.ndarray
    nearest_other: np.ndarray
    resolution: float

    @property
    def found(self) -> bool:
        return len(self.pairs) > 0

    @property
    def count(self) -> int:
        return len(self.pairs)

    @property
    def margin(self) -> float:
        """Smallest factor by which a pair clears the resolution on either side (inf: exact copies)."""
        if not self.found:
            return float("nan")
        with np.errstate(divide="ignore"):
            inside = self.resolution / self.distance
        return float(min(inside.min(), (self.nearest_other / self.resolution).min()))

    @property
    def consecutive_fraction(self) -> float:
        """Fraction of pairs that are (2i, 2i+1): TPC twins follow the SM id numbering on NVIDIA GPUs."""
        if not self.found:
            return float("nan")
        return float(np.mean((self.pairs[:, 0] % 2 == 0) & (self.pairs[:, 1] == self.pairs[:, 0] + 1)))


def find_twins(data, noise=None) -> Twins:
    """Mutual nearest SMs (full model profile, offset a[sm] included) closer than the resolution, with no
    third SM within it: a pair, not a member of a larger indistinguishable group."""
    model = as_model(data, noise)
    res = model.resolution
    d = squareform(pdist(model.sm_embedding(with_offset=True)))
    np.fill_diagonal(d, np.inf)
    nearest = d.argmin(axis=1)
    pairs, dist, other = [], [], []
    for i, j in enumerate(nearest):
        if i < j and nearest[j] == i and d[i, j] <= res:
            rest = np.delete(np.minimum(d[i], d[j]), [i, j])
            closest = float(rest.min()) if rest.size else float("inf")
            if closest > res:
                pairs.append((i, j))
                dist.append(d[i, j])
                other.append(closest)
    return Twins(np.array(pairs, dtype=np.int64).reshape(-1, 2), np.array(dist), np.array(other), res)


# ---- GPC clusters ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GpcClusters:
    """SM clusters by latency profile shape: candidates for GPCs (or finer units; see cluster_gpcs).

    labels: (n_sm,) cluster per SM, 0.. in order of first SM (-1 everywhere when none found). k: number of
    clusters. levels: candidate cuts of the SM hierarchy as rows (k, inner, outer, gap): inner = largest
    merge height inside the clusters, outer = smallest merge height between them (RMS cycles), gap =
    outer / inner; sorted by gap, best first. The chosen level is levels[0] unless k was imposed.
    """

    found: bool
    reason: str
    labels: np.ndarray
    k: int
    levels: np.ndarray

    @property
    def gap(self) -> float:
        row = self.levels[self.levels[:, 0] == self.k] if self.found else []
        return float(row[0, 3]) if len(row) else float("nan")

    def sizes(self) -> np.ndarray:
        return np.bincount(self.labels[self.labels >= 0], minlength=self.k)


def cluster_gpcs(data, noise=None, k: int | None = None) -> GpcClusters:
    """Cluster SMs by the shape of their model profile (the interaction terms, offset a[sm] left out).

    Average linkage over RMS profile distances. Without k, the cut is the level of the hierarchy with the
    largest gap (outer / inner merge height) among levels whose clusters are apart by more than the
    resolution and typically hold more than one TPC (median size > 2: the TPC level is find_twins' job).
    The offset is left out because on the H200 it steps by ~5 cycles between TPCs that share one profile
    shape: it orders the TPCs inside a group rather than separating groups.
    """
    model = as_model(data, noise)
    n = model.n_sm
    if k is not None and (isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 2 <= k <= n):
        raise ValueError(f"k must be an integer in [2, {n}], got {k!r}")
    none = np.full(n, -1)
    if model.significant_rank == 0:
        return GpcClusters(False, "no interaction term stands above the noise", none, 0, np.empty((0, 4)))
    z = linkage(pdist(model.sm_embedding(with_offset=False)), method="average")
    heights = z[:, 2]
    # What noise alone leaves between identical SMs after projection on the model's terms: the floor of
    # an inner height, so that noise-free data does not divide by zero.
    floor = max(model.noise_sigma * math.sqrt(2 * model.significant_rank / model.n_lines), 1e-12)
    rows = []
    for merged in range(1, n - 1):  # cut after `merged` merges: n - merged clusters
        inner, outer = heights[merged - 1], heights[merged]
        if outer <= model.resolution:
            continue
        labels = fcluster(z, n - merged, criterion="maxclust")
        if np.median(np.bincount(labels)[1:]) <= 2:
            continue
        rows.append((labels.max(), inner, outer, outer / max(inner, floor)))
    levels = np.array(sorted(rows, key=lambda r: (-r[3], -r[0])), dtype=float).reshape(-1, 4)
    if k is None:
        if not len(levels):
            return GpcClusters(False, "no level of the SM hierarchy is apart by more than the resolution "
                               "with clusters larger than a TPC", none, 0, levels)
        k = int(levels[0, 0])
    labels = first_seen_labels(fcluster(z, k, criterion="maxclust"))
    return GpcClusters(True, "", labels, int(labels.max() + 1), levels)


@dataclass(frozen=True)
class GpcComparison:
    """Latency clusters against GPC ground truth (e.g. topo.extras["gpc_truth"], -1 = unknown).

    matched_fraction: SMs whose cluster maps to their GPC under the best one-to-one matching (Hungarian).
    purity: SMs whose cluster's majority GPC is their own (1.0 when clusters nest inside GPCs, even if
    finer). ari: adjusted Rand index. mapping: {cluster: GPC} of the matching.
    """

    matched_fraction: float
    purity: float
    ari: float
    n_compared: int
    n_clusters: int
    n_gpcs: int
    mapping: dict


def compare_gpcs(labels, truth) -> GpcComparison:
    """Score latency cluster labels against ground-truth GPC labels of the same SMs."""
    labels, truth = np.asarray(labels), np.asarray(truth)
    for name, arr in (("labels", labels), ("truth", truth)):
        if not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"{name} must hold integer labels, got dtype {arr.dtype}")
    matched, mapping = best_match_agreement(labels, truth)
    keep = (labels >= 0) & (truth >= 0)
    x, y = labels[keep], truth[keep]
    purity = sum(np.bincount(y[x == c]).max() for c in np.unique(x)) / keep.sum()
    return GpcComparison(matched, float(purity), adjusted_rand_index(x, y), int(keep.sum()),
                         len(np.unique(x)), len(np.unique(y)), mapping)


# ---- symmetry of the SM id range -------------------------------------------------------------------------
# Random pairings drawn for the null distribution of a mean pair correlation: enough to resolve the
# Bonferroni-adjusted FALSE_ALARM over the four tests (p down to 1 / 20001).
_PERMUTATIONS = 20_000


@dataclass(frozen=True)
class Symmetry:
    """Do the two halves of the SM id range repeat (or mirror) each other's profiles, as on the L40?

    rows: one dict per test: pairing ("halves": i <-> i + n/2, "reversed": i <-> n-1-i), terms ("all"
    interaction terms, or "beyond rank 1", which leaves the partition term out), mean_r (mean correlation
    of paired SM profiles), z and p_adjusted (against random pairings of the same SMs, which keeps their
    cluster structure; p two-sided, Bonferroni over the tests), significant (p_adjusted < FALSE_ALARM).
    """

    rows: list

    @property
    def found(self) -> bool:
        return any(r["significant"] for r in self.rows)

    def verdict(self) -> str:
        if not self.rows:
            return "no interaction term stands above the noise: nothing to compare"
        best = max(self.rows, key=lambda r: abs(r["z"]))
        what = (f"{best['pairing']} ({best['terms']}): mean r = {best['mean_r']:+.2f}, z = {best['z']:+.1f}, "
                f"p = {best['p_adjusted']:.2g}")
        if not best["significant"]:
            return f"no symmetry between the halves of the SM id range at p < {FALSE_ALARM:g} (strongest: {what})"
        kind = "paired SMs share profiles" if best["mean_r"] > 0 else "paired SMs have opposite profiles"
        return f"{what}: {kind}"


def sm_symmetry(data, noise=None) -> Symmetry:
    """Correlate SM i's interaction profile with SM i + n/2's and with SM n-1-i's (see Symmetry)."""
    model = as_model(data, noise)
    n, rank = model.n_sm, model.significant_rank
    half = n // 2
    pairings = {"halves": (np.arange(half), np.arange(half) + n - half),
                "reversed": (np.arange(half), n - 1 - np.arange(half))}
    term_sets = {name: lo for name, lo in (("all", 0), ("beyond rank 1", 1)) if rank > lo}
    n_tests = len(term_sets) * len(pairings)
    perm = np.argsort(np.random.default_rng(0).random((_PERMUTATIONS, n)), axis=1)
    rows = []
    for terms, lo in term_sets.items():
        profiles = (model.u[:, lo:rank] * model.s[lo:rank]) @ model.v[:, lo:rank].T
        with np.errstate(divide="ignore", invalid="ignore"):
            c = np.nan_to_num(np.corrcoef(profiles))
        null = c[perm[:, :half], perm[:, half:2 * half]].mean(axis=1)
        center, spread = null.mean(), null.std()
        for pairing, (i, j) in pairings.items():
            mean_r = float(c[i, j].mean())
            extreme = np.sum(np.abs(null - center) >= abs(mean_r - center))
            p = min(1.0, n_tests * (extreme + 1) / (_PERMUTATIONS + 1))
            z = (mean_r - center) / spread if spread > 0 else 0.0
            rows.append({"pairing": pairing, "terms": terms, "mean_r": mean_r, "z": float(z),
                         "p_adjusted": float(p), "significant": bool(p < FALSE_ALARM)})
    return Symmetry(rows)
