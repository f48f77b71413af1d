"""Structure in an SM x line latency matrix beyond the labels: TPC twins, GPC clusters and SM-id symmetry.

Every finder takes a Topology, a fitted NucaModel, or a bare matrix with its per-entry noise, returns a
plain dataclass with a margin, and says "none found" (found=False, with the reason) when the data carries
no such structure: a flat or pure-noise matrix yields no partitions, twins or GPC clusters. The SM
profiles compared are the NUCA model's (nuca.py), restricted to the terms that stand above the noise, so
repeat noise does not split what is identical; two profiles differ when they are more than the model's
resolution (NOISE_TOLERANCE x the repeat noise, RMS over lines) apart. The L2 partitions are labels and
live in labels.py; line (slice) classes live in slices.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import pdist, squareform

from ..labelings import adjusted_rand_index, best_match_agreement, first_seen_labels
from .labels import FALSE_ALARM
from .nuca import as_model


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
    The offset is left out because it steps by a few cycles between TPCs that share one profile shape (on
    the H200): it orders the TPCs inside a group rather than separating groups.
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
