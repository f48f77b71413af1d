"""Operations on labelings (one integer label per SM or line, -1 = unlabelled): relabel in first-seen
order, best one-to-one agreement between two labelings, adjusted Rand index. Pure numpy/scipy; imports
nothing else of the package, so probes and analysis share it.
"""
from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.special import comb


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
