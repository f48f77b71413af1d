"""The NUCA model of an SM x line latency matrix: mu + a(sm) + b(line) + a few rank-1 interaction terms.

Owns input checking for every analysis module (matrix_and_noise), the per-entry noise scale of a
calibration (repeat_sigma), the resolution below which two latencies count as equal, and the fit itself
(fit_nuca -> NucaModel: every term as arrays and tidy DataFrames, R^2 and residual-over-noise by rank, and
how many interaction terms stand above the noise).

On the bundled H200 calibrations the additive model explains little of the variance: the L2 partition is an
interaction (an SM is fast to the lines of its own side), so one rank-1 term takes most of it and a few terms
reach the repeat noise. Docs: docs/method.md ("The analysis").
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

# Two latencies (or two profiles, RMS over their entries) count as different only when they differ by
# more than this many times the per-entry repeat noise. The repeat noise is a median of ranges over 2-3
# repeats quantized to 1/8 cycle, and entries have heavier tails than a Gaussian (two backends' calibrations
# of one GPU differ by more than it predicts), so a difference within twice the predicted noise is not evidence.
NOISE_TOLERANCE = 2.0
# A term carried by one or two SMs or lines is an isolated disturbance, not topology: such terms in the bundled
# Triton calibrations have participation ratios below 3, where structural terms spread over dozens of SMs and
# hundreds of lines.
_MIN_PARTICIPATION = 2.0
# Relative round-off of float64 sums of a few thousand latencies: the resolution of a noise-free matrix.
_NUMERIC_FLOOR = 1e-9


def matrix_and_noise(data, noise=None) -> tuple[np.ndarray, float]:
    """(float64 SM x line matrix, per-entry noise sd in cycles) from a Topology, a NucaModel or an array.

    A Topology brings its own noise (repeat_sigma); a bare matrix needs `noise` (the standard deviation of
    one entry, in cycles; 0 for a noise-free matrix). Raises ValueError naming what is wrong.
    """
    from ..topology import Topology

    if isinstance(data, NucaModel):
        return data.matrix, data.noise_sigma if noise is None else _check_noise(noise)
    if isinstance(data, Topology):
        matrix = data.line_cycles
        sigma = repeat_sigma(data) if noise is None else _check_noise(noise)
    else:
        if noise is None:
            raise ValueError("noise is required with a bare matrix: the standard deviation of one entry in "
                             "cycles (a Topology carries it as line_noise)")
        matrix, sigma = data, _check_noise(noise)
    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim != 2:
        raise ValueError(f"the latency matrix must be 2-D (n_sm, n_lines), got shape {m.shape}")
    if m.shape[0] < 2 or m.shape[1] < 2:
        raise ValueError(f"the latency matrix needs at least 2 SMs and 2 lines, got shape {m.shape}")
    bad = ~np.isfinite(m)
    if bad.any():
        sm, line = np.argwhere(bad)[0]
        raise ValueError(f"the latency matrix holds {int(bad.sum())} NaN or infinite values (first at SM {sm}, "
                         f"line {line})")
    return m, sigma


def _check_noise(noise) -> float:
    if isinstance(noise, bool) or not isinstance(noise, (int, float, np.integer, np.floating)) \
            or not math.isfinite(noise) or noise < 0:
        raise ValueError(f"noise must be a finite non-negative number of cycles, got {noise!r}")
    return float(noise)


def repeat_sigma(topo) -> float:
    """Standard deviation of one entry of topo.line_cycles (cycles), from its repeat noise.

    line_noise[sm] is the median over lines of max - min over the k repeats, and each entry is the median
    of those k repeats. For Gaussian repeats of sd s the range has median c_k * s and the median of k has
    sd d_k * s (k=2: c = 0.954, d = 0.707), so one entry has sd median(line_noise) * d_k / c_k.
    """
    k = int(topo.meta.get("config", {}).get("repeats", 2))
    if k < 2:
        raise ValueError("this calibration has a single repeat, so no repeat noise: pass noise= explicitly")
    range_median, median_sd = _gaussian_repeat_constants(k)
    return float(np.median(topo.line_noise)) * median_sd / range_median


@lru_cache(maxsize=None)
def _gaussian_repeat_constants(k: int) -> tuple[float, float]:
    """(median of the range, sd of the median) of k iid N(0, 1), integrated over order statistics on a grid."""
    from scipy import integrate, optimize, special, stats

    x = np.linspace(-10.0, 10.0, 4001)  # trapezoid error ~1e-7 on these smooth, Gaussian-tailed integrands
    pdf, cdf = stats.norm.pdf(x), stats.norm.cdf(x)

    def range_cdf(r):
        return k * integrate.trapezoid(pdf * (stats.norm.cdf(x + r) - cdf) ** (k - 1), x)

    range_median = optimize.brentq(lambda r: range_cdf(r) - 0.5, 1e-6, 20.0)
    # The median is the mean of order statistics j and k + 1 - j (one and the same when k is odd); both have
    # the same second moment. For even k, E[X_(j) X_(j+1)] integrates their joint density over x < y.
    j = k // 2 if k % 2 == 0 else (k + 1) // 2
    second = integrate.trapezoid(x * x * k * special.comb(k - 1, j - 1) * cdf ** (j - 1) * (1 - cdf) ** (k - j)
                                 * pdf, x)
    if k % 2:
        return range_median, math.sqrt(second)
    upper = x * pdf * (1 - cdf) ** (k - j - 1)
    tail = integrate.trapezoid(upper, x) - integrate.cumulative_trapezoid(upper, x, initial=0.0)  # over y > x
    joint = math.factorial(k) / (math.factorial(j - 1) * math.factorial(k - j - 1))
    cross = integrate.trapezoid(x * joint * cdf ** (j - 1) * pdf * tail, x)
    return range_median, math.sqrt((2 * second + 2 * cross) / 4)


def resolution(sigma: float, matrix: np.ndarray) -> float:
    """The smallest difference in cycles that counts as real: NOISE_TOLERANCE * sigma, or round-off."""
    return max(NOISE_TOLERANCE * sigma, _NUMERIC_FLOOR * max(1.0, float(np.abs(matrix).max())))


def _optimal_threshold_factor(beta: float) -> float:
    """lambda*(beta) of Gavish & Donoho (2014): singular values of an n x m (n <= m, beta = n/m) matrix
    above lambda* * sqrt(m) * sigma carry signal; below it, keeping them adds more noise than signal."""
    return math.sqrt(2 * (beta + 1) + 8 * beta / (beta + 1 + math.sqrt(beta * beta + 14 * beta + 1)))


@dataclass(frozen=True)
class NucaModel:
    """L(sm, line) = mu + a[sm] + b[line] + sum_k s[k] * u[sm, k] * v[line, k], fit by least squares.

    a and b sum to zero; u and v have orthonormal columns (each sign fixed so its largest entry in u is
    positive). r2[k] and residual_rms[k] are for the model with k interaction terms (k = 0: additive).
    singular_values: all of the double-centered residual. significant_rank: how many leading terms stand
    above the noise (Gavish-Donoho threshold for noise NOISE_TOLERANCE * noise_sigma) and spread over more
    than two SMs and two lines; later terms fit noise or isolated disturbances.
    matrix is the data the model was fit on; noise_sigma its per-entry noise in cycles.
    """

    matrix: np.ndarray
    noise_sigma: float
    mu: float
    a: np.ndarray
    b: np.ndarray
    u: np.ndarray
    s: np.ndarray
    v: np.ndarray
    singular_values: np.ndarray
    r2: np.ndarray
    residual_rms: np.ndarray
    significant_rank: int
    rank_threshold: float

    def __repr__(self) -> str:
        """One line: shape, mean, how many terms stand above the noise and the R^2 they reach."""
        k = self.significant_rank
        return (f"NucaModel({self.n_sm} SMs x {self.n_lines} lines, mu {self.mu:.2f} cycles, R^2 additive "
                f"{self.r2[0]:.3f}, {k} significant interaction terms -> R^2 {self.r2[k]:.4f}, noise "
                f"{self.noise_sigma:.3f} cycles)")

    @property
    def n_sm(self) -> int:
        return self.matrix.shape[0]

    @property
    def n_lines(self) -> int:
        return self.matrix.shape[1]

    @property
    def resolution(self) -> float:
        return resolution(self.noise_sigma, self.matrix)

    @property
    def residual_over_noise(self) -> np.ndarray:
        """residual_rms / noise_sigma by rank: about 1 once the model holds everything but the noise."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return self.residual_rms / self.noise_sigma

    def _rank(self, rank) -> int:
        rank = self.significant_rank if rank is None else rank
        if not 0 <= rank <= len(self.s):
            raise ValueError(f"rank must be in [0, {len(self.s)}], got {rank}")
        return rank

    def interaction(self, rank=None) -> np.ndarray:
        """The (n_sm, n_lines) sum of the first `rank` interaction terms (default: the significant ones)."""
        r = self._rank(rank)
        return (self.u[:, :r] * self.s[:r]) @ self.v[:, :r].T

    def predict(self, rank=None) -> np.ndarray:
        return self.mu + self.a[:, None] + self.b[None, :] + self.interaction(rank)

    def sm_embedding(self, with_offset: bool = True, rank=None) -> np.ndarray:
        """Coordinates of each SM's model profile: Euclidean distance / sqrt(n_lines) = RMS difference of
        two SMs' profiles over the lines, in cycles. with_offset=False drops a[sm] (profile shape only)."""
        r = self._rank(rank)
        parts = [self.a[:, None] * math.sqrt(self.n_lines)] if with_offset else []
        return np.hstack(parts + [self.u[:, :r] * self.s[:r]]) / math.sqrt(self.n_lines)

    def line_embedding(self, with_offset: bool = True, rank=None) -> np.ndarray:
        """Like sm_embedding for lines: distance = RMS over SMs of two lines' model profiles, in cycles."""
        r = self._rank(rank)
        parts = [self.b[:, None] * math.sqrt(self.n_sm)] if with_offset else []
        return np.hstack(parts + [self.v[:, :r] * self.s[:r]]) / math.sqrt(self.n_sm)

    def to_frames(self) -> dict:
        """Tidy pandas views: "fit" (one row per rank), "sm" (a and u per SM), "line" (b and v per line)."""
        import pandas as pd

        ranks = np.arange(len(self.r2))
        sv = np.r_[np.nan, self.s]
        fit = pd.DataFrame({"rank": ranks, "r2": self.r2, "residual_rms": self.residual_rms,
                            "residual_over_noise": self.residual_over_noise, "singular_value": sv,
                            "significant": (ranks >= 1) & (ranks <= self.significant_rank)})
        sm = pd.DataFrame({"sm": np.arange(self.n_sm), "a": self.a,
                           **{f"u{k + 1}": self.u[:, k] for k in range(len(self.s))}})
        line = pd.DataFrame({"line": np.arange(self.n_lines), "b": self.b,
                             **{f"v{k + 1}": self.v[:, k] for k in range(len(self.s))}})
        return {"fit": fit, "sm": sm, "line": line}


def fit_nuca(data, noise=None, max_rank: int = 8) -> NucaModel:
    """Fit the additive NUCA model and its first max_rank interaction terms (SVD of the residual).

    data: a Topology, or an (n_sm, n_lines) matrix of cycles with `noise` (per-entry sd in cycles).
    """
    if isinstance(max_rank, bool) or not isinstance(max_rank, (int, np.integer)) or max_rank < 0:
        raise ValueError(f"max_rank must be a non-negative integer, got {max_rank!r}")
    m, sigma = matrix_and_noise(data, noise)
    n_sm, n_lines = m.shape
    mu = float(m.mean())
    a = m.mean(axis=1) - mu
    b = m.mean(axis=0) - mu
    resid = m - mu - a[:, None] - b[None, :]
    u, sv, vt = np.linalg.svd(resid, full_matrices=False)
    # Double centering leaves at most min(n_sm, n_lines) - 1 real terms.
    r = min(max_rank, min(n_sm, n_lines) - 1)
    u, v, s = u[:, :r].copy(), vt[:r].T.copy(), sv[:r].copy()
    flip = np.sign(u[np.abs(u).argmax(axis=0), np.arange(r)])
    u *= flip
    v *= flip

    total = float(((m - mu) ** 2).sum())
    # What k terms leave is the sum of the later squared singular values (exact, unlike a subtraction).
    sse = np.array([float(np.sum(sv[k:] ** 2)) for k in range(r + 1)])
    with np.errstate(divide="ignore", invalid="ignore"):
        r2 = 1.0 - sse / total if total > 0 else np.full(r + 1, np.nan)
    residual_rms = np.sqrt(sse / m.size)

    small, large = sorted((n_sm, n_lines))
    threshold = max(_optimal_threshold_factor(small / large) * math.sqrt(large) * resolution(sigma, m),
                    float(sv[0]) * large * np.finfo(np.float64).eps)
    # Participation ratio 1 / sum(x^4) of a unit vector: how many entries carry it.
    collective = (1 / (u ** 4).sum(axis=0) > _MIN_PARTICIPATION) & (1 / (v ** 4).sum(axis=0) > _MIN_PARTICIPATION)
    passing = (s > threshold) & collective
    significant = int(np.argmin(passing)) if not passing.all() else r
    return NucaModel(matrix=m, noise_sigma=sigma, mu=mu, a=a, b=b, u=u, s=s, v=v, singular_values=sv,
                     r2=r2, residual_rms=residual_rms, significant_rank=significant, rank_threshold=threshold)


def as_model(data, noise=None) -> NucaModel:
    """The NucaModel of `data` (fit once; a model passes through unchanged when no other noise is asked)."""
    if isinstance(data, NucaModel) and (noise is None or _check_noise(noise) == data.noise_sigma):
        return data
    return fit_nuca(data, noise)
