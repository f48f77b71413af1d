"""The geometry suite's result as text: a few lines per experiment, the derived numbers (the JSON has the
curves). The command line prints it and the report quotes it.

Capacity is stated once per regime, each by the number that regime supports: one SM per partition chasing
its own ring (the write-ups' method) leaves a flat latency curve up to a footprint, which is the statement;
with every SM warming the footprint the curve rises early and slowly, and the miss ratio gives the effective
capacity. The detectors' knee midway to DRAM (find_regimes) is the middle of a ramp, not a capacity, and the
miss ratio of the one-SM curve mixes in the other partition's SM: neither is printed as a capacity.
"""
from __future__ import annotations

import numpy as np

from . import detectors as G

MB = 1 << 20


def _fmt(v, unit="") -> str:
    return "n/a" if v is None or (isinstance(v, float) and not np.isfinite(v)) else f"{v:.0f}{unit}"


def summary_lines(result: dict) -> list[str]:
    """A few lines per experiment: the derived numbers (the JSON has the curves)."""
    e = result["experiments"]
    out = [f"L2 geometry ({'quick' if result['quick'] else 'full'}): {result['n_sm']} SMs, "
           f"L2 {result['l2_bytes'] / MB:.0f} MB, {result['clock_ghz']:.3f} GHz, {result['total_s']:.1f} s"]
    for name, r in e.items():
        if "error" in r:
            out.append(f"{name}: ERROR {r['error']}")
        elif name == "first_touch":
            out.append(f"first touch: granule {_fmt(r['granule_bytes'], ' B')} (hit {r['hit_cycles']:.0f}, miss "
                       f"{r['miss_cycles']:.0f} cycles){'' if r['found'] else ' not found: ' + r['reason']}; "
                       f"driver's max L2 fetch granularity {r['driver_max_l2_fetch_granularity']}")
        elif name == "stride_sweep":
            out.append(f"cold stride sweep: levels off at {_fmt(r['line_bytes'], ' B')} "
                       f"({', '.join(f'{s}:{c:.0f}' for s, c in zip(r['strides'], r['mean_cycles']))})")
        elif name == "capacity":
            out += capacity_lines(r)
        elif name == "prefetch":
            for t in ("cold", "warm"):
                d = r.get(f"{t}_dips")
                if d:
                    out.append(f"prefetch {t}: dips at {d['strides'] or 'no stride'} (threshold {d['threshold']:.0f}"
                               f" cycles; regular-random max {max(d['effect_cycles']):.0f})")
        elif name == "address_bits":
            m = r["model_2MB_pages"]
            out.append(f"home partition: changes at {_fmt(r['partition_granularity_bytes'], ' B')}; XOR bits "
                       f"{m['bits']} (2 MB pages) held-out accuracy {m['accuracy']:.4f}; ambiguous bits "
                       f"{m['ambiguous_bits']}")
            pat = r.get("patterns_2MB_pages")
            if pat:
                out.append(f"home partition, page-pattern model: held-out accuracy {pat['accuracy']:.4f} from "
                           f"{pat['distinct_patterns']} distinct patterns in {pat['n_train_pages']} training pages")
            if "slice_classes" in r:
                out.append(f"slices: {r['slice_classes']} latency classes in 512 lines; class changes at "
                           f"{_fmt(r['slice_granularity_bytes'], ' B')}")
        elif name == "contention" and r.get("k"):
            out.append(f"contention at k={r['k'][-1]} SMs: one class {r['one_requests_per_ns'][-1]:.2f} req/ns "
                       f"({r['one_latency_cycles'][-1]:.0f} cycles), spread {r['spread_requests_per_ns'][-1]:.2f} "
                       f"req/ns ({r['spread_latency_cycles'][-1]:.0f} cycles); pairs same "
                       f"{r['pairs']['same']['median_cycles']:.0f} vs different "
                       f"{r['pairs']['different']['median_cycles']:.0f} cycles; {r['ncu_note']}")
        elif name == "conflict_sets" and "verdict" in r:
            out.append(f"conflict sets: {r['verdict']} (hit {r['hit_cycles']:.0f}, miss {r['miss_cycles']:.0f} "
                       f"cycles; largest aligned {np.max(r['aligned_cycles']):.0f}, control "
                       f"{np.max(r['control_cycles']):.0f})")
        elif name == "layout_fixes":
            fixes = [(k, r["columns"][k]) for k in ("padding", "swizzle")]
            fixes += [(f"bursts ({k})", r["bursts"][k]) for k in ("one_class", "spread") if "bursts" in r]
            out.append("layout fixes, time with / without: " + "; ".join(
                f"{k} {f['ratio']:.3f} ({f['verdict']}, spread {f['spread']:.3f})" for k, f in fixes))
        elif name == "persisting":
            for run in r["runs"]:
                out.append(f"persisting: hot {run['hot_bytes'] / MB:.0f} MB ratio {run['hit_ratio']}: "
                           f"{run['latency_cycles']:.0f} cycles, hits {run['hit_fraction']:.2f}, "
                           f"copy {run['stream_copy_ms']:.3f} ms")
    return out


def capacity_lines(r: dict) -> list[str]:
    """The capacity experiment's statements, one per regime measured: one SM per partition on its own ring
    (flat to F MB: detectors.first_rise), and all SMs warming the footprint (effective capacity: the miss
    ratio's, with the L2 hit latency near and far from the line's home partition)."""
    out = []
    sw = r.get("self_warmed")
    if sw and len(sw["footprint"]) > G.MIN_POINTS:
        cycles = np.mean(sw["cycles"], axis=1)
        rise = G.first_rise(sw["footprint"], cycles)
        if rise.found:
            after = float(cycles[list(sw["footprint"]).index(rise.rises_at)])
            out.append(f"capacity, one SM per partition on its own ring: flat to {rise.flat_until / MB:.0f} MB "
                       f"({rise.level:.0f} cycles; {after:.0f} at {rise.rises_at / MB:.0f} MB, DRAM "
                       f"{sw['cold_cycles']:.0f})")
        else:
            out.append(f"capacity, one SM per partition on its own ring: no rise up to "
                       f"{sw['footprint'][-1] / MB:.0f} MB ({rise.reason})")
    if "effective_capacity_bytes" in r:
        near, far = (r.get(f"regimes_{k}") for k in ("near", "far"))
        out.append(f"capacity, all SMs warming the footprint: effective capacity "
                   f"{_fmt((r['effective_capacity_bytes'] or np.nan) / MB, ' MB')} (miss ratio)"
                   + (f"; L2 hits {near['levels'][0]:.0f} cycles on lines homed in the SM's partition, "
                      f"{far['levels'][0]:.0f} in the other" if near and far else ""))
    return out
