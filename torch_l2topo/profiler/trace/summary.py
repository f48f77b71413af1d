"""trace-summary: per instrumented kernel, what the enriched trace says (SM busy time, tail, imbalance, the
slow-SM share, near share, the placement estimate), read back from its launch slices and metadata.

A kernel's row aggregates its launches: medians of the per-launch figures (the maximum for the tail and the
misalignment as well), near shares weighted by items.
"""
from __future__ import annotations

import numpy as np

from . import readback


def _median(rows, key):
    values = [r[key] for r in rows if r.get(key) is not None]
    return float(np.median(values)) if values else None


def kernel_rows(launches: list) -> list:
    """One row per (device, kernel): the aggregates of its launches."""
    groups: dict = {}
    for launch in launches:
        groups.setdefault((launch["device"], launch["kernel"]), []).append(launch)
    rows = []
    for (device, kernel), ls in sorted(groups.items()):
        counted = [r for r in ls if r.get("near_share") is not None and r.get("items")]
        near = sum(r["near_share"] * r["items"] for r in counted) / sum(r["items"] for r in counted) \
            if counted else None
        rows.append({"device": device, "kernel": kernel, "source": ls[0].get("source"), "launches": len(ls),
                     "ctas": sum(r["ctas"] for r in ls), "sms_used": max(r["sms_used"] for r in ls),
                     "n_sm": ls[0]["n_sm"], "kernel_ns": _median(ls, "kernel_ns"),
                     "busy_ns_median": _median(ls, "busy_ns_median"), "busy_ns_max": _median(ls, "busy_ns_max"),
                     "tail_ns": _median(ls, "tail_ns"), "tail_ns_max": max(r["tail_ns"] for r in ls),
                     "imbalance": _median(ls, "imbalance"),
                     "slow_decile_busy_share": _median(ls, "slow_decile_busy_share"),
                     "slow_decile_sm_share": _median(ls, "slow_decile_sm_share"),
                     "near_share": None if near is None else round(near, 4),
                     "blind_near_share": _median(ls, "blind_near_share"),
                     "placement_saving_ns_estimate": _median(ls, "placement_saving_ns_estimate"),
                     "max_misalignment_ns": max(r.get("max_misalignment_ns", 0) for r in ls)})
    return rows


def summarize(trace: dict, source: str = "trace") -> dict:
    """{"devices": {index: calibration and alignment facts}, "kernels": kernel_rows, "notes": [...]}; `source`
    names the file in the TraceFormatError of a trace that was not enriched or was damaged."""
    meta = readback.require_enriched(trace, source)
    maps = readback.calibrations(trace, source)
    devices = {}
    for d, m in sorted(meta["devices"].items(), key=lambda kv: int(kv[0])):
        smmap = maps.get(int(d))
        part = smmap.partition if smmap is not None else np.zeros(0)
        devices[d] = {"device": smmap.device.get("name") if smmap else None, "ids": smmap.ids if smmap else {},
                      "measured": smmap.measured if smmap else None,
                      "trusted": (smmap.trust or {}).get("trusted") if smmap else None,
                      "sms": int(part.size), "partition_sms": [int((part == 0).sum()), int((part == 1).sum())],
                      "alignment": m.get("alignment", {}), "dropped": m.get("dropped", {})}
    return {"devices": devices, "kernels": kernel_rows(readback.launches(trace, source)),
            "notes": meta.get("notes", [])}


def _us(ns) -> str:
    return "-" if ns is None else f"{ns / 1000:.1f}"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def format_summary(summary: dict) -> str:
    """The summary as text for a terminal."""
    lines = []
    for d, dev in summary["devices"].items():
        cal = f"{dev['device'] or 'no calibration'}"
        if dev["sms"]:
            cal += (f", {dev['sms']} SMs ({dev['partition_sms'][0]} + {dev['partition_sms'][1]} by L2 partition), "
                    f"calibrated {dev['measured'] or '?'}" + ("" if dev["trusted"] is not False else ", NOT TRUSTED"))
        lines.append(f"GPU {d}: {cal}")
        for source, a in dev["alignment"].items():
            lines.append(f"  {source}: {a['matched']}/{a['records']} CTAs inside {a['launches']} launches, max "
                         f"misalignment {a['max_misalignment_ns']} ns ({a['outside']} beyond {a['tick_ns']} ns), "
                         f"{dev['dropped'].get(source, 0)} dropped")
    if not summary["kernels"]:
        lines.append("no instrumented kernel launches in this trace")
    else:
        head = ("kernel", "launches", "CTAs", "kernel us", "busy us (med/max)", "tail us (med/max)", "imbal",
                "slow 10% busy/SMs", "near (blind)", "save us (est.)")
        table = [head]
        for r in summary["kernels"]:
            near = "-" if r["near_share"] is None else f"{_pct(r['near_share'])} ({_pct(r['blind_near_share'])})"
            table.append((f"{r['kernel']} [GPU {r['device']}]", str(r["launches"]), str(r["ctas"]),
                          _us(r["kernel_ns"]), f"{_us(r['busy_ns_median'])}/{_us(r['busy_ns_max'])}",
                          f"{_us(r['tail_ns'])}/{_us(r['tail_ns_max'])}",
                          "-" if r["imbalance"] is None else f"{r['imbalance']:.2f}",
                          f"{_pct(r['slow_decile_busy_share'])}/{_pct(r['slow_decile_sm_share'])}", near,
                          _us(r["placement_saving_ns_estimate"])))
        widths = [max(len(row[i]) for row in table) for i in range(len(head))]
        lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
        lines.append("save us (est.): CTA span minus placement.plans.limit over the SMs' measured rates, an estimate")
    lines += [f"note: {n}" for n in summary["notes"]]
    return "\n".join(lines)
