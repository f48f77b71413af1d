"""Agreement between two latency maps of the same GPU (repeats, backends, modes): pure numpy/scipy."""
from __future__ import annotations

import numpy as np
from scipy import stats


def compare_maps(a, b) -> dict:
    """How far map `b` is from map `a`, entry by entry (any shape, same for both).

    offset: median of a - b (a constant per-load overhead differs between backends; it is removed before
    the per-entry figures). max/median_abs_diff: raw |a - b|. max/median_after_offset: |a - b - offset|.
    spearman: rank correlation of the flattened maps.
    """
    a = np.asarray(a, dtype=float).ravel()
    b = np.asarray(b, dtype=float).ravel()
    if a.shape != b.shape:
        raise ValueError(f"maps differ in shape: {a.shape} vs {b.shape}")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("maps hold NaN or infinite values")
    d = a - b
    offset = float(np.median(d))
    r = np.abs(d - offset)
    rho = stats.spearmanr(a, b).statistic if np.ptp(a) > 0 and np.ptp(b) > 0 else float("nan")
    return {"offset": offset, "max_abs_diff": float(np.abs(d).max()), "median_abs_diff": float(np.median(np.abs(d))),
            "max_after_offset": float(r.max()), "median_after_offset": float(np.median(r)),
            "spearman": float(rho)}
