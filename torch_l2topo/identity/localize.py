"""Self-localization, host side: which SM (or TPC, GPC, partition) a kernel ran on, from a few latencies.

A kernel that times dependent loads to a handful of lines of a buffer this process has calibrated gets a
short vector of cycles per load. Every SM sees those lines at its own latencies, so the vector points back
at the SM, up to the resolution the lines allow. This module chooses the lines (SMClassifier.fit), maps
such vectors to units (SMClassifier.predict) and scores the result (evaluate). The in-kernel probe that
produces the vectors lives with the kernels; everything here is numpy on a saved line matrix.

Distances are offset-free throughout: each vector and profile is centered over the chosen lines before
comparing, because a probe's per-load overhead (backend, instrumentation) adds a constant to every load.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..labelings import first_seen_labels

# Two SMs are one unit when their whole line profiles differ by no more than this many times the
# per-entry noise (RMS of the offset-free difference): a difference of that size is what repeating the
# measurement of one SM gives (TPC twins sit within it), so no choice of lines separates them.
MERGE_IN_NOISE = 2.0
# Two units stay apart only when every prototype of one is this many noise units from every prototype of
# the other, over the chosen lines. Gaussian noise would need ~6, but the tails are heavier (whatever k, the
# noise projected on a direction has the per-entry spread).
# 12: the worst-case unit accuracy on two H200s' held-out calibrations (benchmarks/bench_fingerprint.py).
SEPARATION_IN_NOISE = 12.0


@dataclass
class Prediction:
    """Result of SMClassifier.predict for n vectors. pred["tpc"] reads like a dict of labels.

    labels: level -> (n,) int labels; -1 where the predicted unit spans several labels of that level.
    unit: (n,) the unit of the nearest prototype (see SMClassifier.units). distance: (n,) offset-free
    Euclidean distance to that prototype over the k lines (cycles). margin: (n,) distance to the nearest
    prototype of any other unit minus `distance` (inf with one unit): how much noise the decision tolerates.
    """

    labels: dict
    unit: np.ndarray
    distance: np.ndarray
    margin: np.ndarray

    def __getitem__(self, level: str) -> np.ndarray:
        return self.labels[level]


def _offset_free_rms(profiles: np.ndarray) -> np.ndarray:
    """(n, n) per-entry RMS of profile differences after removing each pair's median offset."""
    n = len(profiles)
    out = np.zeros((n, n))
    for i in range(n):
        d = profiles - profiles[i]
        d -= np.median(d, axis=1, keepdims=True)
        out[i] = np.sqrt(np.mean(d * d, axis=1))
    return out


def _components(adjacent: np.ndarray) -> np.ndarray:
    """Connected components of a boolean adjacency matrix, numbered in order of their lowest member."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    _, comp = connected_components(csr_matrix(adjacent), directed=False)
    return first_seen_labels(comp)  # ids in the order of each component's lowest member


def _centered_distances(profiles: np.ndarray) -> np.ndarray:
    c = profiles - profiles.mean(axis=1, keepdims=True)
    return np.sqrt(((c[:, None, :] - c[None, :, :]) ** 2).sum(axis=2))


def _choose_lines(prototypes: np.ndarray, unit: np.ndarray, k: int) -> np.ndarray:
    """Greedy maximin: k columns maximizing the smallest offset-free distance between prototypes of
    different units (prototypes of one unit need not be told apart).

    Seeded with the best pair of columns (one column alone carries no offset-free information), then one
    column at a time. With one unit there is nothing to separate and any k columns do: the first k.
    """
    i, j = np.triu_indices(len(prototypes), 1)
    apart = unit[i] != unit[j]
    if not apart.any():
        return np.arange(k)
    delta = prototypes[i[apart]] - prototypes[j[apart]]  # (pairs, lines): what the columns must show
    n_lines = delta.shape[1]
    best, seed = -1.0, (0, 1)
    for a in range(n_lines):
        worst = ((delta[:, a:a + 1] - delta) ** 2).min(axis=0) / 2  # min over pairs, for each partner b
        worst[a] = -1.0
        b = int(np.argmax(worst))
        if worst[b] > best:
            best, seed = float(worst[b]), (a, b)
    chosen = list(seed)
    s1 = delta[:, chosen].sum(axis=1, keepdims=True)
    s2 = (delta[:, chosen] ** 2).sum(axis=1, keepdims=True)
    while len(chosen) < k:
        n = len(chosen) + 1
        worst = ((s2 + delta ** 2) - (s1 + delta) ** 2 / n).min(axis=0)  # offset-free squared distance
        worst[chosen] = -np.inf
        c = int(np.argmax(worst))
        chosen.append(c)
        s1 += delta[:, c:c + 1]
        s2 += delta[:, c:c + 1] ** 2
    return np.array(sorted(chosen))


class SMClassifier:
    """Nearest-profile localization of SMs from latencies to a few chosen lines.

    Prototypes are the mean profiles of SMs whose whole line profiles agree within noise (TPC twins and
    the like). A unit is a set of prototypes the chosen lines cannot tell apart; a vector is assigned the
    unit of its nearest prototype. (Not the nearest unit mean: a unit merged from two distinct profiles
    has a mean that looks like neither.)

    After fit(): chosen_lines (k column indices into the fitted matrix), units ((n_sm,) the unit of each
    SM), labels (level -> (n_sm,) labels, "sm" included), n_units, n_prototypes, noise (per-entry noise,
    cycles), separation (smallest offset-free distance between prototypes of different units over the
    chosen lines), levels (finest first), unit_labels (level -> (n_units,) label, -1 where a unit spans
    several), resolvable (levels whose every unit lies inside one label; needs >= 2 labels), finest_level
    (the finest resolvable level, or None).
    """

    def __init__(self):
        self.chosen_lines = None

    def fit(self, line_cycles, labels: dict | None = None, n_lines_used: int = 8,
            noise: float | None = None) -> "SMClassifier":
        """Choose n_lines_used lines of `line_cycles` (n_sm, n_lines) and build the units.

        labels: level name -> (n_sm,) int array (e.g. {"tpc": sm // 2, "partition": side}); "sm" (the SM
        id) is added when absent. noise: per-entry RMS of the offset-free difference between two
        measurements of one SM's profile (cycles). None estimates it as the median over SMs of the
        distance to the nearest other SM's profile: right where SMs come in near-identical pairs (TPC
        twins), an overestimate otherwise, which merges more units, never fewer.
        """
        lc = np.asarray(line_cycles, dtype=np.float64)
        if lc.ndim != 2 or lc.shape[0] < 2:
            raise ValueError(f"line_cycles must be an (n_sm >= 2, n_lines) matrix, got shape {lc.shape}")
        if not np.all(np.isfinite(lc)):
            raise ValueError("line_cycles holds NaN or infinite values")
        n_sm, n_lines = lc.shape
        if not isinstance(n_lines_used, (int, np.integer)) or not 2 <= n_lines_used <= n_lines:
            raise ValueError(f"n_lines_used must be an integer in [2, {n_lines}] (one line carries no "
                             f"offset-free information), got {n_lines_used!r}")
        self.levels, self.labels = self._check_labels(labels, n_sm)

        rms = _offset_free_rms(lc)
        if noise is None:
            nearest = rms + np.diag(np.full(n_sm, np.inf))
            noise = float(np.median(nearest.min(axis=1)))
        if not (np.isfinite(noise) and noise >= 0):
            raise ValueError(f"noise must be a finite non-negative number of cycles, got {noise!r}")
        self.noise = float(noise)
        sep = SEPARATION_IN_NOISE * self.noise

        proto_of_sm = _components(rms <= MERGE_IN_NOISE * self.noise)
        prototypes = np.stack([lc[proto_of_sm == p].mean(axis=0) for p in range(proto_of_sm.max() + 1)])
        unit = np.arange(len(prototypes))
        while True:  # choose lines for the current units; merge what they cannot separate; repeat
            lines = _choose_lines(prototypes, unit, int(n_lines_used))
            dist = _centered_distances(prototypes[:, lines])
            merged = _components((dist <= sep) | (unit[:, None] == unit[None, :]))
            if merged.max() == unit.max():
                break
            unit = merged

        self.chosen_lines = lines
        self.units = unit[proto_of_sm]
        self.n_units = int(unit.max() + 1)
        self.n_prototypes = len(prototypes)
        self._proto_unit = unit
        protos = prototypes[:, lines]
        self._prototypes = protos - protos.mean(axis=1, keepdims=True)
        apart = unit[:, None] != unit[None, :]
        self.separation = float(dist[apart].min()) if apart.any() else 0.0
        self.unit_labels = {}
        self.resolvable = []
        for level in self.levels:
            lab = self.labels[level]
            per_unit = np.full(self.n_units, -1, dtype=np.int64)
            for u in range(self.n_units):
                values = np.unique(lab[self.units == u])
                if len(values) == 1:
                    per_unit[u] = values[0]
            self.unit_labels[level] = per_unit
            if len(np.unique(lab)) >= 2 and np.all(per_unit >= 0):
                self.resolvable.append(level)
        self.finest_level = self.resolvable[0] if self.resolvable else None
        return self

    @staticmethod
    def _check_labels(labels, n_sm: int) -> tuple[list, dict]:
        labels = dict(labels or {})
        labels.setdefault("sm", np.arange(n_sm))
        out = {}
        for level, lab in labels.items():
            if not isinstance(level, str) or not level:
                raise ValueError(f"label levels must be non-empty strings, got {level!r}")
            arr = np.asarray(lab)
            if arr.shape != (n_sm,) or not np.issubdtype(arr.dtype, np.integer) or (arr < 0).any():
                raise ValueError(f"labels[{level!r}] must be {n_sm} non-negative integers (one per SM), got "
                                 f"shape {arr.shape} dtype {arr.dtype}")
            out[level] = arr.astype(np.int64)
        # Finest first: more distinct labels is finer; ties keep the caller's order.
        order = sorted(out, key=lambda lv: -len(np.unique(out[lv])))
        return order, out

    def predict(self, signatures) -> Prediction:
        """Localize (n, k) vectors (or one (k,) vector) of cycles per load to the chosen lines, in order."""
        if self.chosen_lines is None:
            raise RuntimeError("SMClassifier.predict() before fit()")
        x = np.asarray(signatures, dtype=np.float64)
        if x.ndim == 1:
            x = x[None, :]
        k = len(self.chosen_lines)
        if x.ndim != 2 or x.shape[1] != k:
            raise ValueError(f"signatures must have shape (n, {k}) (one value per chosen line), got {x.shape}")
        if not np.all(np.isfinite(x)):
            raise ValueError("signatures hold NaN or infinite values")
        xc = x - x.mean(axis=1, keepdims=True)
        d = np.sqrt(((xc[:, None, :] - self._prototypes[None, :, :]) ** 2).sum(axis=2))
        nearest_proto = np.argmin(d, axis=1)
        unit = self._proto_unit[nearest_proto]
        nearest = d[np.arange(len(x)), nearest_proto]
        # margin: how much closer the winning unit is than the best prototype of any other unit
        other = np.where(self._proto_unit[None, :] == unit[:, None], np.inf, d).min(axis=1)
        margin = other - nearest
        return Prediction(labels={lv: self.unit_labels[lv][unit] for lv in self.levels}, unit=unit,
                          distance=nearest, margin=margin)


def evaluate(classifier: SMClassifier, signatures, true_sm, max_confusions: int = 10) -> dict:
    """Accuracy of `classifier` on vectors measured on known SMs.

    unit_accuracy: the predicted unit holds the true SM. levels: per level, accuracy (predicted label ==
    true label; -1 counts as wrong), decided (share with a label at all), resolvable. confusions: the
    most frequent (true unit -> predicted unit) errors with their SMs, largest first.
    """
    true_sm = np.asarray(true_sm)
    pred = classifier.predict(signatures)
    n_sm = len(classifier.units)
    if true_sm.shape != pred.unit.shape or not np.issubdtype(true_sm.dtype, np.integer) \
            or (true_sm < 0).any() or (true_sm >= n_sm).any():
        raise ValueError(f"true_sm must hold one SM id in [0, {n_sm}) per signature")
    true_unit = classifier.units[true_sm]
    levels = {}
    for level in classifier.levels:
        truth = classifier.labels[level][true_sm]
        got = pred.labels[level]
        levels[level] = {"accuracy": float(np.mean(got == truth)), "decided": float(np.mean(got >= 0)),
                         "resolvable": level in classifier.resolvable,
                         "n_labels": int(len(np.unique(classifier.labels[level])))}
    wrong = pred.unit != true_unit
    pairs, counts = np.unique(np.stack([true_unit[wrong], pred.unit[wrong]], axis=1).reshape(-1, 2), axis=0,
                              return_counts=True)
    top = np.argsort(-counts, kind="stable")[:max_confusions]

    def sms(u):
        return np.flatnonzero(classifier.units == u).tolist()

    return {"n": int(len(true_sm)), "n_units": classifier.n_units, "finest_level": classifier.finest_level,
            "unit_accuracy": float(np.mean(~wrong)), "levels": levels,
            "margin": {"min": float(pred.margin.min()), "median": float(np.median(pred.margin))},
            "confusions": [{"true_unit": int(pairs[t, 0]), "true_sms": sms(pairs[t, 0]),
                            "predicted_unit": int(pairs[t, 1]), "predicted_sms": sms(pairs[t, 1]),
                            "count": int(counts[t])} for t in top]}
