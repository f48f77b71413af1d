"""Put per-CTA records (device %globaltimer ns) on the trace's clock, CTA by CTA inside its own kernel event.

The records and Kineto's kernel events come from the same GPU timer with an unknown offset, estimated from the
data (docs/profiler.md, How it works): the records of each kernel are split into launches (on one stream a
launch's CTAs all end before the next one starts); pairings of early launches with kernel events of the same
name propose offsets, and the one that puts the most records inside events of their kernel wins; each record
goes to the event holding its midpoint; the offset is refit to maximize the smallest margin between any
launch's CTAs and its event's edges (constant, or drifting linearly up to MAX_DRIFT_PPM: a small linear
program), until the assignment no longer changes. Every CTA is then checked: its misalignment is how far it
sticks out of its kernel event (a correct alignment leaves each inside, up to TICK_NS). The offset is known
only to within the smallest margin (slack_ns).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TICK_NS = 32             # %globaltimer advances in 32 ns steps on Hopper
MATCH_TOLERANCE_NS = 1000  # when counting which records an offset puts inside events (before the refit)
CANDIDATE_LAUNCHES = 8   # launches per kernel whose pairings with events propose offsets
SPREAD_CAP_NS = 1_000_000  # a launch this far from any event counts as far as any other (tie-break)
MAX_DRIFT_PPM = 100.0
# Refits until the assignment settles: a drifting clock matches only the launches near the coarse offset at
# first, and each refit reaches further (the H200 traces settle in 1-2).
MAX_REFITS = 8


@dataclass(frozen=True)
class Alignment:
    """Where each record went: kernel[i] is the position (in the device's Kernels) of record i's kernel event,
    -1 when it falls in none (records from steps outside the trace's window); start/end: the record on the
    trace clock, ns; misalignment_ns: how far it sticks out of its event (0 inside, -1 unmatched)."""

    kernel: np.ndarray
    start: np.ndarray
    end: np.ndarray
    misalignment_ns: np.ndarray
    offset_ns: int       # trace ns - record ns at the first record
    drift_ppm: float     # 0 for the constant model
    slack_ns: float      # smallest margin between a launch's CTAs and its event's edges (< 0: some stick out)
    model: str           # "constant", "drift" or "none" (nothing matched)

    def summary(self, tick_ns: int = TICK_NS) -> dict:
        matched = self.kernel >= 0
        mis = self.misalignment_ns[matched]
        return {"records": int(len(self.kernel)), "matched": int(matched.sum()),
                "unmatched": int((~matched).sum()), "launches": int(len(np.unique(self.kernel[matched]))),
                "offset_ns": int(self.offset_ns), "drift_ppm": round(float(self.drift_ppm), 4),
                "slack_ns": round(float(self.slack_ns), 1), "model": self.model,
                "max_misalignment_ns": int(mis.max()) if mis.size else 0,
                "outside": int((mis > tick_ns).sum()), "tick_ns": tick_ns}


def launch_groups(start: np.ndarray, end: np.ndarray) -> list:
    """Index arrays of the launches in a set of CTA intervals of one kernel: a new launch starts where a CTA
    starts after every earlier CTA has ended."""
    if len(start) == 0:
        return []
    order = np.argsort(start, kind="stable")
    reach = np.maximum.accumulate(end[order])
    cuts = np.flatnonzero(start[order][1:] > reach[:-1]) + 1
    return np.split(order, cuts)


def _containing(starts: np.ndarray, ends: np.ndarray, t: np.ndarray, tol: int) -> np.ndarray:
    """Position of the interval [starts, ends] (sorted by start, non-overlapping on one stream) holding each t
    within tol, -1 for none. Overlapping events (several streams) resolve to the latest-starting one."""
    pos = np.searchsorted(starts, t + tol, side="right") - 1
    ok = (pos >= 0) & (t <= ends[np.clip(pos, 0, None)] + tol) if len(starts) else np.zeros(len(t), bool)
    return np.where(ok, pos, -1)


def _by_name(kernels, names: dict, tag: np.ndarray) -> dict:
    """{tag: positions of that kernel's events} for every tag with records."""
    return {t: kernels.of_name(names[t]) for t in np.unique(tag).tolist()}


def _assign(kernels, events: dict, tag, start, end, shift) -> np.ndarray:
    """Position of each record's event (its midpoint shifted by `shift` ns, a scalar or per record), or -1."""
    out = np.full(len(tag), -1, np.int64)
    mid = start + (end - start) // 2 + shift
    for t, pos in events.items():
        rows = np.flatnonzero(tag == t)
        if len(pos) == 0 or len(rows) == 0:
            continue
        hit = _containing(kernels.start_ns[pos], kernels.end_ns[pos], mid[rows], MATCH_TOLERANCE_NS)
        out[rows] = np.where(hit >= 0, pos[np.clip(hit, 0, None)], -1)
    return out


def _distance(starts: np.ndarray, ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """ns from each t to the nearest interval [starts, ends] (sorted by start), 0 inside one."""
    right = np.searchsorted(starts, t, side="right")
    before = np.where(right > 0, t - ends[np.clip(right - 1, 0, None)], np.inf)
    after = np.where(right < len(starts), starts[np.clip(right, None, len(starts) - 1)] - t, np.inf)
    return np.maximum(np.minimum(np.where(before <= 0, 0, before), after), 0)


def _coarse_offset(kernels, events: dict, tag, start, end) -> int | None:
    """The candidate offset that puts the most launches inside events of their kernel (module docstring, 1);
    ties go to the candidate that leaves the others nearest to an event (a clock that drifts leaves launches
    just outside; an offset off by whole launches leaves them far away)."""
    candidates, groups = [], []
    for t, pos in events.items():
        rows = np.flatnonzero(tag == t)
        launches = [rows[g] for g in launch_groups(start[rows], end[rows])]
        groups += [(t, g) for g in launches]
        for g in launches[:CANDIDATE_LAUNCHES]:
            g_lo, g_hi = start[g].min(), end[g].max()
            candidates += ((kernels.start_ns[pos] + kernels.end_ns[pos]) // 2 - (g_lo + (g_hi - g_lo) // 2)).tolist()
    if not candidates:
        return None
    g_tag = np.array([t for t, _ in groups])
    g_mid = np.array([start[g].min() + (end[g].max() - start[g].min()) // 2 for _, g in groups], np.int64)
    g_size = np.array([len(g) for _, g in groups])
    best, best_key = None, None
    for c in np.unique(np.array(candidates, np.int64)):
        score, spread = 0, 0.0
        for t, pos in events.items():
            sel = g_tag == t
            if len(pos) and sel.any():
                d = _distance(kernels.start_ns[pos], kernels.end_ns[pos], g_mid[sel] + c)
                score += int(g_size[sel][d <= MATCH_TOLERANCE_NS].sum())
                spread += float(np.minimum(d, SPREAD_CAP_NS).sum())
        if best_key is None or (score, -spread) > best_key:
            best, best_key = int(c), (score, -spread)
    return best if best_key[0] > 0 else None


def _margins(kernels, kernel, start, end, base):
    """Per matched launch: (lo, hi, t) such that offsets d with lo <= d - base <= hi put it inside its event, and
    its first record's time (ns, relative to the first record)."""
    lo, hi, t = [], [], []
    t_ref = start.min()
    for k in np.unique(kernel[kernel >= 0]):
        rows = kernel == k
        lo.append(float(kernels.start_ns[k] - start[rows].min() - base))
        hi.append(float(kernels.end_ns[k] - end[rows].max() - base))
        t.append(float(start[rows].min() - t_ref))
    return np.array(lo), np.array(hi), np.array(t)


def _fit(lo: np.ndarray, hi: np.ndarray, t: np.ndarray) -> tuple:
    """(a, b_per_ns, slack, model): the offset a + b t (relative to the coarse offset) that maximizes the smallest
    margin s in lo + s <= a + b t <= hi - s over the launches."""
    a = (lo.max() + hi.min()) / 2
    slack = (hi.min() - lo.max()) / 2
    if slack >= 0 or len(lo) < 2 or np.ptp(t) == 0:
        return a, 0.0, slack, "constant"
    from scipy.optimize import linprog

    scale = max(np.ptp(t), 1.0)
    tau = (t - t.mean()) / scale  # well-conditioned: |tau| <= 1
    bound = MAX_DRIFT_PPM * 1e-6 * scale
    # variables (a, b, s): maximize s subject to  a + b tau + s <= hi  and  -a - b tau + s <= -lo
    ones = np.ones_like(tau)
    res = linprog(c=[0, 0, -1], A_ub=np.vstack([np.c_[ones, tau, ones], np.c_[-ones, -tau, ones]]),
                  b_ub=np.r_[hi, -lo], bounds=[(None, None), (-bound, bound), (None, None)], method="highs")
    if not res.success or -res.fun <= slack:
        return a, 0.0, slack, "constant"
    a_lp, b_lp, s_lp = res.x
    b = b_lp / scale
    return a_lp - b * t.mean(), b, s_lp, "drift"


def align(kernels, records) -> Alignment:
    """Align one device's CtaRecords to its Kernels (module docstring)."""
    tag, start, end = records.tag, records.start_ns, records.end_ns
    n = len(tag)
    none = Alignment(np.full(n, -1, np.int64), start.copy(), end.copy(), np.full(n, -1, np.int64), 0, 0.0,
                     float("nan"), "none")
    if n == 0 or kernels is None or len(kernels) == 0:
        return none
    events = _by_name(kernels, records.names, tag)
    base = _coarse_offset(kernels, events, tag, start, end)
    if base is None:
        return none
    kernel = _assign(kernels, events, tag, start, end, base)
    for _ in range(MAX_REFITS):  # fit on the assignment, assign again with the fit, until nothing moves
        if not (kernel >= 0).any():
            return none
        lo, hi, t = _margins(kernels, kernel, start, end, base)
        a, b, slack, model = _fit(lo, hi, t)
        shift = base + np.rint(a + b * (start - start.min())).astype(np.int64)
        kernel, before = _assign(kernels, events, tag, start, end, shift), kernel
        if (kernel == before).all():
            break
    s, e = start + shift, end + shift
    inside = kernel >= 0
    k = np.clip(kernel, 0, None)
    mis = np.maximum(np.maximum(kernels.start_ns[k] - s, e - kernels.end_ns[k]), 0)
    return Alignment(kernel, s, e, np.where(inside, mis, -1), int(shift[np.argmin(start)]), b * 1e6,
                     float(slack), model)
