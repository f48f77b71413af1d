"""What a user acts on, per launch of an instrumented kernel, from its aligned CTAs and the calibration.

- busy time per SM: the union of its CTAs' intervals (CTAs resident together count once);
- tail: the last CTA's end minus the median SM's last end (how long the slowest SM kept the kernel alive);
- imbalance: the busiest SM's busy time over the mean, minus 1 (SMs that ran a CTA);
- near share: of the items done, those whose data is homed in the partition of the SM that did them (where
  the kernel counts them), next to what a placement blind to the map would give (blind_near_share: each
  item on an SM drawn in proportion to the partitions' SM counts) where its items' classes are known;
- the slowest decile: the busy time spent on the tenth of SMs with the highest calibrated L2 latency, next to
  their share of the SMs that ran;
- what placement could save, an estimate: the CTAs' span minus plans.limit() over the SMs' measured rates
  (items per busy ns; CTAs stand for items where the kernel counts none), the makespan if every item went
  where it finishes soonest. A lower bound on what any placement reaches, not a promise.
"""
from __future__ import annotations

import numpy as np

from ..placement.plans import SpeedModel, Workload, limit

ESTIMATE_NOTE = ("estimate: CTA span minus placement.plans.limit over the SMs' measured rates (a lower bound on "
                 "the makespan of any placement), not a measurement")


def busy_by_sm(sm: np.ndarray, start: np.ndarray, end: np.ndarray, n_sm: int) -> np.ndarray:
    """(n_sm,) ns during which each SM had at least one CTA (union of intervals)."""
    busy = np.zeros(n_sm, np.int64)
    order = np.lexsort((start, sm))
    sm, start, end = sm[order], start[order], end[order]
    for s in np.unique(sm):
        if not 0 <= s < n_sm:
            continue
        lo, hi = np.searchsorted(sm, s), np.searchsorted(sm, s, side="right")
        st, en = start[lo:hi], np.maximum.accumulate(end[lo:hi])
        # each interval adds what it covers beyond the furthest end reached before it
        before = np.r_[st[0], en[:-1]]
        busy[s] = int(np.maximum(en - np.maximum(st, before), 0).sum())
    return busy


def blind_near_share(class_counts, partition: np.ndarray) -> float | None:
    """Near share of items placed without looking at the map: an item homed in partition c lands on an SM of
    partition c with the share of SMs there (items of unknown home are never near). None without classes or
    decided partitions."""
    if class_counts is None or sum(class_counts) == 0 or not (partition >= 0).any():
        return None
    sms = np.array([(partition == 0).sum(), (partition == 1).sum()], float) / len(partition)
    return float((np.asarray(class_counts[:2], float) * sms).sum() / sum(class_counts))


def launch_metrics(sm, start, end, items, near, n_sm: int, kernel_ns: int, smmap=None,
                   class_counts=None) -> dict:
    """The args of one launch (module docstring) from its aligned CTA columns; smmap: the device's SmMap
    (None: no calibration, no slowest-decile figures)."""
    sm, start, end = np.asarray(sm), np.asarray(start), np.asarray(end)
    items, near = np.asarray(items), np.asarray(near)
    busy = busy_by_sm(sm, start, end, n_sm)
    used = np.unique(sm[(sm >= 0) & (sm < n_sm)])
    last_end = np.array([end[sm == s].max() for s in used]) if len(used) else np.zeros(0)
    out = {"ctas": int(len(sm)), "sms_used": int(len(used)), "n_sm": int(n_sm), "kernel_ns": int(kernel_ns),
           "cta_span_ns": int(end.max() - start.min()) if len(sm) else 0,
           "busy_ns_median": int(np.median(busy[used])) if len(used) else 0,
           "busy_ns_max": int(busy.max()), "busy_ns_by_sm": busy.tolist(),
           "tail_ns": int(last_end.max() - np.median(last_end)) if len(used) else 0,
           "imbalance": round(float(busy[used].max() / busy[used].mean() - 1), 4) if busy[used].sum() else 0.0,
           "items": int(items.sum())}
    counted = near >= 0
    out["near_share"] = round(float(near[counted].sum() / items[counted].sum()), 4) \
        if counted.any() and items[counted].sum() else None
    partition = smmap.partition if smmap is not None and smmap.n_sm == n_sm else None
    out["blind_near_share"] = None if partition is None else blind_near_share(class_counts, partition)
    if partition is not None and len(used):
        slow = smmap.slowest()
        out["slow_decile_sms"] = slow.tolist()
        out["slow_decile_busy_share"] = round(float(busy[slow].sum() / max(busy.sum(), 1)), 4)
        out["slow_decile_sm_share"] = round(float(np.isin(used, slow).sum() / len(used)), 4)
    out.update(placement_estimate(sm, busy, items, n_sm, out["cta_span_ns"]))
    return out


def placement_estimate(sm, busy: np.ndarray, items, n_sm: int, span_ns: int) -> dict:
    """{"balanced_span_ns_estimate", "placement_saving_ns_estimate", "estimate_note"} (module docstring)."""
    keep = (sm >= 0) & (sm < n_sm)
    work = items if np.asarray(items).sum() > 0 else np.ones(len(sm), np.int64)  # CTAs stand for items
    per_sm = np.bincount(sm[keep], weights=work[keep], minlength=n_sm)
    if not ((per_sm > 0) & (busy > 0)).any():
        return {}
    balanced = limit(SpeedModel.from_measured(per_sm, busy), Workload(int(per_sm.sum())))
    return {"balanced_span_ns_estimate": int(round(balanced)),
            "placement_saving_ns_estimate": int(max(span_ns - round(balanced), 0)), "estimate_note": ESTIMATE_NOTE}
