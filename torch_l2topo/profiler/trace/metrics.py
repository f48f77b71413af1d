"""What a user acts on, per launch of an instrumented kernel, from its aligned CTAs and the calibration
(docs/profiler.md, the per-launch table, defines each figure):

- busy time per SM (union of its CTAs' intervals); tail: the last CTA's end minus the median SM's last end;
  imbalance: the busiest SM's busy time over the mean, minus 1;
- near share of the items done (where the kernel counts them), next to a placement blind to the map;
- the slowest decile (the tenth of SMs with the highest calibrated L2 latency): its share of busy time and
  slow_sm_cost_ns, the last CTA end minus the last end on the other SMs;
- placement estimate: the CTAs' span minus placement.plans.limit() over the SMs' measured rates, a lower bound;
- the wave picture (CTAs on the device's SMs): resident = the most CTAs at once on one SM, estimated from
  the records; waves = ceil(CTAs / (n_sm x resident)); last_wave_fill; last_wave_cost_ns = the last CTA end
  minus the first SM idle for good (an SM without CTAs: from the first start); regrid_saving_ns_estimate =
  the last CTA end minus the mean over all SMs of that moment (the tail's idle SM time over n_sm).
"""
from __future__ import annotations

import numpy as np

ESTIMATE_NOTE = ("estimate: CTA span minus placement.plans.limit over the SMs' measured rates (a lower bound on "
                 "the makespan of any placement), not a measurement")


def busy_by_sm(sm: np.ndarray, start: np.ndarray, end: np.ndarray, n_sm: int) -> np.ndarray:
    """(n_sm,) ns during which each SM had at least one CTA (union of intervals)."""
    keep = (sm >= 0) & (sm < n_sm)
    sm, start, end = sm[keep], start[keep], end[keep]
    if not len(sm):
        return np.zeros(n_sm, np.int64)
    # one pass over all SMs: shift SM s's times by s x (more than the whole span), so that a running maximum
    # of ends never carries from one SM into the next
    t0 = start.min()
    stride = int(max(end.max(), start.max()) - t0) + 1
    st, en = start - t0 + sm * stride, end - t0 + sm * stride
    order = np.lexsort((st, sm))
    st, en, sm = st[order], np.maximum.accumulate(en[order]), sm[order]
    before = np.r_[st[0], en[:-1]]  # the furthest end reached before each interval
    covered = np.maximum(en - np.maximum(st, before), 0)
    return np.bincount(sm, weights=covered, minlength=n_sm).astype(np.int64)


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
    on_device = (sm >= 0) & (sm < n_sm)
    used = np.unique(sm[on_device])
    # each SM's last CTA end; an SM without CTAs is idle from the launch's first CTA start
    last = np.full(n_sm, start[on_device].min() if on_device.any() else 0, np.int64)
    np.maximum.at(last, sm[on_device], end[on_device])
    last_end = last[used]
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
    out["far_share"] = None if out["near_share"] is None else round(1 - out["near_share"], 4)
    partition = smmap.partition if smmap is not None and smmap.n_sm == n_sm else None
    out["blind_near_share"] = None if partition is None else blind_near_share(class_counts, partition)
    if partition is not None and len(used):
        slow = smmap.slowest()
        out["slow_decile_sms"] = slow.tolist()
        out["slow_decile_busy_share"] = round(float(busy[slow].sum() / max(busy.sum(), 1)), 4)
        out["slow_decile_sm_share"] = round(float(np.isin(used, slow).sum() / len(used)), 4)
        others = used[~np.isin(used, slow)]
        out["slow_sm_cost_ns"] = int(last_end.max() - last[others].max()) if len(others) else None
    out.update(wave_picture(sm[on_device], start[on_device], end[on_device], n_sm, last))
    out.update(placement_estimate(sm, busy, items, n_sm, out["cta_span_ns"]))
    return out


def max_resident(sm: np.ndarray, start: np.ndarray, end: np.ndarray) -> int:
    """The most CTAs running at once on one SM (a CTA ending when another starts does not overlap it); 1 for
    CTAs of no duration, 0 for none."""
    if not len(sm):
        return 0
    # per SM, +1 at each start and -1 at each end, ends first at a tie; every SM's steps sum to 0, so one
    # running sum over all SMs in (SM, time) order restarts from 0 at each SM
    t = np.r_[start, np.maximum(end, start)]
    step = np.r_[np.ones(len(sm), np.int64), -np.ones(len(sm), np.int64)]
    order = np.lexsort((step, t, np.r_[sm, sm]))
    return max(int(np.cumsum(step[order]).max()), 1)


def wave_picture(sm, start, end, n_sm: int, last: np.ndarray) -> dict:
    """{"ctas_per_sm", "resident_per_sm", "waves", "last_wave_fill", "last_wave_cost_ns",
    "regrid_saving_ns_estimate"} (module docstring) of CTAs on the device's SMs; last: (n_sm,) each SM's last
    CTA end, an SM without CTAs at the first CTA's start."""
    n, resident = len(sm), max_resident(sm, start, end)
    if not n:
        return {"ctas_per_sm": 0.0, "resident_per_sm": 0, "waves": 0, "last_wave_fill": None,
                "last_wave_cost_ns": 0, "regrid_saving_ns_estimate": 0}
    slots = n_sm * resident
    waves = -(-n // slots)
    return {"ctas_per_sm": round(n / len(np.unique(sm)), 4), "resident_per_sm": resident, "waves": waves,
            "last_wave_fill": round((n - (waves - 1) * slots) / slots, 4),
            "last_wave_cost_ns": int(last.max() - last.min()),
            "regrid_saving_ns_estimate": int(round(last.max() - last.mean()))}


def placement_estimate(sm, busy: np.ndarray, items, n_sm: int, span_ns: int) -> dict:
    """{"balanced_span_ns_estimate", "placement_saving_ns_estimate", "estimate_note"} (module docstring).

    The balanced span is placement.plans.limit(SpeedModel.from_measured(items per SM, busy ns per SM),
    Workload(items)): for these items of one class that LP has the closed form total / sum over SMs of
    1 / (ns per item) (plans.limit's docstring), computed here directly: a few microseconds instead of an LP
    per launch (tests/test_profiler_metrics.py checks that the two agree)."""
    keep = (sm >= 0) & (sm < n_sm)
    work = items if np.asarray(items).sum() > 0 else np.ones(len(sm), np.int64)  # CTAs stand for items
    per_sm = np.bincount(sm[keep], weights=work[keep], minlength=n_sm)
    seen = (per_sm > 0) & (busy > 0)
    if not seen.any():
        return {}
    # SpeedModel.from_measured: an SM without measured work gets the median ns per item of the others
    ns_per_item = np.full(n_sm, np.median(busy[seen] / per_sm[seen]))
    ns_per_item[seen] = busy[seen] / per_sm[seen]
    balanced = per_sm.sum() / (1.0 / ns_per_item).sum()
    return {"balanced_span_ns_estimate": int(round(balanced)),
            "placement_saving_ns_estimate": int(max(span_ns - round(balanced), 0)), "estimate_note": ESTIMATE_NOTE}
