"""trace-summary: what an enriched trace says, per GPU: how much of its kernel time the per-SM view covers (and
the largest kernels it misses); per instrumented kernel its time, CTAs, waves and tail, what its SMs did (busy
time, imbalance, the slow-SM share and cost, near share); and its kernels ranked by what placement or a better
grid could save (estimates), read back from the launch slices and the metadata.

A kernel's row aggregates its launches: medians of the per-launch figures (the maximum for the tail and the
misalignment as well), near shares weighted by items, totals of GPU time and of the saving estimates. Per step
is per profiler step of the trace ("ProfilerStep#N" annotations; the whole trace where it has none).
"""
from __future__ import annotations

import numpy as np

from . import readback

COVERAGE_KEYS = ("kernel_gpu_ns", "kernel_launches", "instrumented_gpu_time_ratio", "triton_launch_coverage",
                 "uncovered_kernels")
NAME_WIDTH = 32   # kernel names are cut to this (Inductor's run long), so that the tables fit 100 columns
TOP_UNCOVERED, TOP_RANKED = 5, 10


def _median(rows, key):
    values = [r[key] for r in rows if r.get(key) is not None]
    return float(np.median(values)) if values else None


def _total(rows, key):
    values = [r[key] for r in rows if r.get(key) is not None]
    return sum(values) if values else None


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
                     "n_sm": ls[0]["n_sm"], "kernel_ns": _median(ls, "kernel_ns"), "gpu_ns": _total(ls, "kernel_ns"),
                     "busy_ns_median": _median(ls, "busy_ns_median"), "busy_ns_max": _median(ls, "busy_ns_max"),
                     "tail_ns": _median(ls, "tail_ns"), "tail_ns_max": max(r["tail_ns"] for r in ls),
                     "imbalance": _median(ls, "imbalance"),
                     "slow_decile_busy_share": _median(ls, "slow_decile_busy_share"),
                     "slow_decile_sm_share": _median(ls, "slow_decile_sm_share"),
                     "slow_sm_cost_ns": _median(ls, "slow_sm_cost_ns"),
                     "near_share": None if near is None else round(near, 4),
                     "blind_near_share": _median(ls, "blind_near_share"),
                     "ctas_per_launch": _median(ls, "ctas"), "waves": _median(ls, "waves"),
                     "last_wave_fill": _median(ls, "last_wave_fill"),
                     "last_wave_cost_ns": _median(ls, "last_wave_cost_ns"),
                     "placement_saving_ns_estimate": _median(ls, "placement_saving_ns_estimate"),
                     "regrid_saving_ns_estimate": _median(ls, "regrid_saving_ns_estimate"),
                     "placement_saving_ns_total": _total(ls, "placement_saving_ns_estimate"),
                     "regrid_saving_ns_total": _total(ls, "regrid_saving_ns_estimate"),
                     "max_misalignment_ns": max(r.get("max_misalignment_ns", 0) for r in ls)})
    return rows


def ranking(rows: list, steps: int) -> list:
    """The kernels by what placement or a better grid could save per step, the larger of the two estimates
    first (they overlap: both shorten the same tail, so they never add)."""
    out = []
    for r in rows:
        place, regrid = r["placement_saving_ns_total"], r["regrid_saving_ns_total"]
        if place is None and regrid is None:
            continue
        out.append({"device": r["device"], "kernel": r["kernel"], "launches": r["launches"],
                    "placement_ns_per_step_estimate": None if place is None else place / max(steps, 1),
                    "regrid_ns_per_step_estimate": None if regrid is None else regrid / max(steps, 1)})
    return sorted(out, key=lambda r: -max(r["placement_ns_per_step_estimate"] or 0,
                                          r["regrid_ns_per_step_estimate"] or 0))


def summarize(trace: dict, source: str = "trace") -> dict:
    """{"devices": {index: calibration, alignment and coverage facts}, "steps", "kernels": kernel_rows,
    "ranking", "notes": [...]}; `source` names the file in the TraceFormatError of a trace that was not
    enriched or was damaged."""
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
                      "alignment": m.get("alignment", {}), "dropped": m.get("dropped", {}),
                      "coverage": {k: m.get(k) for k in COVERAGE_KEYS} if "kernel_gpu_ns" in m else None}
    steps = readback.profiler_steps(trace)
    rows = kernel_rows(readback.launches(trace, source))
    return {"devices": devices, "steps": steps, "kernels": rows, "ranking": ranking(rows, steps),
            "notes": meta.get("notes", [])}


def _us(ns) -> str:
    return "-" if ns is None else f"{ns / 1000:.1f}"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _name(kernel: str) -> str:
    return kernel if len(kernel) <= NAME_WIDTH else kernel[:NAME_WIDTH - 1] + "…"


def _num(x, fmt="{:.0f}") -> str:
    return "-" if x is None else fmt.format(x)


def _table(rows: list, indent: str = "  ") -> list:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def _coverage_lines(cov: dict) -> list:
    line = f"  per-SM view covers {_pct(cov['instrumented_gpu_time_ratio'])} of GPU time " \
           f"({_us(cov['kernel_gpu_ns'])} us, {cov['kernel_launches']} launches)"
    if cov["triton_launch_coverage"] is not None:
        line += f"; Triton launches covered {_pct(cov['triton_launch_coverage'])}"
    top = cov["uncovered_kernels"][:TOP_UNCOVERED]
    if not top:
        return [line]
    more = len(cov["uncovered_kernels"]) - len(top)
    return [line, "  uncovered, by share of GPU time" + (f" (top {len(top)} of {len(top) + more})" if more else "")
            + ":"] + [f"    {_pct(u['share']):>4}  {u['kind']:<7}  {u['launches']:>5} launches  {_name(u['name'])}"
                      for u in top]


def _kernel_tables(rows: list, per_step: int, time_head: str) -> list:
    rows = sorted(rows, key=lambda r: -(r["gpu_ns"] or 0))
    waves = [("kernel", "launches", time_head, "CTAs", "waves", "fill", "tail us", "idle us")]
    waves += [(_name(r["kernel"]), str(r["launches"]), _us(None if r["gpu_ns"] is None else r["gpu_ns"] / per_step),
               _num(r["ctas_per_launch"]), _num(r["waves"]), _pct(r["last_wave_fill"]),
               f"{_us(r['tail_ns'])}/{_us(r['tail_ns_max'])}", _us(r["last_wave_cost_ns"])) for r in rows]
    sms = [("kernel", "busy us med/max", "imbal", "slow busy/SMs", "slow us", "near (blind)")]
    for r in rows:
        near = "-" if r["near_share"] is None else f"{_pct(r['near_share'])} ({_pct(r['blind_near_share'])})"
        sms.append((_name(r["kernel"]), f"{_us(r['busy_ns_median'])}/{_us(r['busy_ns_max'])}",
                    _num(r["imbalance"], "{:.2f}"),
                    f"{_pct(r['slow_decile_busy_share'])}/{_pct(r['slow_decile_sm_share'])}",
                    _us(r["slow_sm_cost_ns"]), near))
    return _table(waves) + [""] + _table(sms)


def _ranking_lines(ranked: list, unit: str) -> list:
    if not ranked:
        return []
    table = [("#", "kernel", f"placement {unit} (est.)", f"re-grid {unit} (est.)")]
    table += [(str(i), _name(r["kernel"]), _us(r["placement_ns_per_step_estimate"]),
               _us(r["regrid_ns_per_step_estimate"])) for i, r in enumerate(ranked[:TOP_RANKED], 1)]
    return ["  what placement or a better grid could save, largest first (estimates, not measurements):",
            *_table(table)]


def format_summary(summary: dict) -> str:
    """The summary as text for a terminal, at most 100 columns wide (kernel names cut to NAME_WIDTH)."""
    lines = []
    per_step = max(summary.get("steps", 0), 1)
    for d, dev in summary["devices"].items():
        cal = f"{dev['device'] or 'no calibration'}"
        if dev["sms"]:
            cal += (f", {dev['sms']} SMs ({dev['partition_sms'][0]} + {dev['partition_sms'][1]} by L2 partition), "
                    f"calibrated {dev['measured'] or '?'}" + ("" if dev["trusted"] is not False else ", NOT TRUSTED"))
        lines.append(f"GPU {d}: {cal}")
        for source, a in dev["alignment"].items():
            lines.append(f"  {source}: {a['matched']}/{a['records']} CTAs in {a['launches']} launches, max "
                         f"misalignment {a['max_misalignment_ns']} ns ({a['outside']} beyond {a['tick_ns']} ns), "
                         f"{dev['dropped'].get(source, 0)} dropped")
        if dev.get("coverage"):
            lines += _coverage_lines(dev["coverage"])
        rows = [r for r in summary["kernels"] if r["device"] == int(d)]
        if not rows:
            lines.append("  no instrumented kernel launches on this GPU")
            continue
        steps, time_head, unit = (f"us/step over {summary['steps']} profiler steps", "us/step", "us/step") \
            if summary.get("steps") else ("GPU us: the whole trace, it has no profiler steps", "GPU us", "us")
        lines += [f"  instrumented kernels (medians per launch; {steps}):", *_kernel_tables(rows, per_step, time_head),
                  *_ranking_lines([r for r in summary["ranking"] if r["device"] == int(d)], unit)]
    if summary["kernels"]:
        lines += ["CTAs, waves, fill (of the last wave's SM slots), tail, idle (SMs idle for good to the last end):",
                  "medians per launch. slow: the slowest tenth of SMs by L2 latency, their share of busy time / of",
                  "SMs used, and how much later the launch ended for them. placement: CTA span minus",
                  "placement.plans.limit over the SMs' measured rates; re-grid: the tail's idle SM time over the SM",
                  "count. Both are estimates of the same tail: they never add."]
    elif not summary["devices"]:
        lines.append("no instrumented kernel launches in this trace")
    lines += [f"note: {n}" for n in summary["notes"]]
    return "\n".join(lines)
