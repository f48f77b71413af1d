"""Calibration cost and quality on the local GPU: the figures of the foundation issue.

For each backend (triton, cuda) and mode (waves, serialized, concurrent): one-time compile cost, cold calibration
wall time (kernels compiled, nothing cached), two calibrations for repeat noise; then CUDA vs Triton and
concurrent vs serialized agreement, the cached calibrate() time, chain-map min/mean/max and SM coverage.
Optionally saves every calibration (uuid hashed) for bundling.

    python benchmarks/bench_calibrate.py --device 0 --out /tmp/calibrate_h200_gpu0.json \
        --save-dir /tmp/calibrations
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from common import command_line, quantile_rows, quantiles, row, write_result

BACKENDS = ("triton", "cuda")
MODES = ("waves", "serialized", "concurrent")
TABLE = "calibrate"


def table_rows(figures: dict) -> list:
    """Per backend/mode: the cold calibration's time, the chain map's mean, the repeat's largest difference after
    a constant offset; the one-time compiles and the cached calibrate()."""
    rows = quantile_rows(figures["cold_s"], "cold", "s") + [row("cached", "calibrate", "s", figures["cached_s"])]
    rows += [row("first call", k, "s", v) for k, v in figures["compile_s"].items()]
    for name, m in figures["maps"].items():
        rows += [row(name, "chain_mean", "cycles", m["chain_mean"]),
                 row(name, "repeat_max_after_offset", "cycles", figures["repeat"][name]["chain"]["max_after_offset"])]
    return rows


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--out", required=True, help="result JSON path")
    p.add_argument("--save-dir", help="directory for the calibrations (.npz, uuid hashed)")
    p.add_argument("--cold-runs", type=int, default=5, help="timed cold calibrations per backend and mode")
    p.add_argument("--gpc", action="store_true", help="record cluster GPC ground truth with the saved calibrations")
    args = p.parse_args(argv)
    os.environ["TORCH_L2TOPO_CACHE"] = tempfile.mkdtemp(prefix="l2topo-bench-")  # never the user's cache

    import torch

    import torch_l2topo
    from torch_l2topo.analysis.compare import compare_maps
    from torch_l2topo.measure import extension

    dev = args.device
    torch.cuda.set_device(dev)
    torch.zeros(1, device=dev)  # CUDA context creation is not calibration cost
    figures: dict = {"compile_s": {}, "cold_s": {}, "cached_s": None, "repeat": {}, "maps": {}}

    t0 = time.perf_counter()
    extension.load(torch.cuda.get_device_capability(dev))
    figures["compile_s"]["cuda_ext_build_and_load"] = time.perf_counter() - t0
    gpc = None
    if args.gpc:
        from torch_l2topo.measure.gpc_probe import gpc_ground_truth

        t0 = time.perf_counter()
        gpc = gpc_ground_truth(dev)
        figures["gpc_truth"] = {"labels": gpc.tolist(), "sizes": np.bincount(gpc[gpc >= 0]).tolist(),
                                "unlabelled": int((gpc < 0).sum()), "wall_s": time.perf_counter() - t0}

    tops = {}
    for backend in BACKENDS:
        for mode in MODES:
            t0 = time.perf_counter()
            first = torch_l2topo.calibrate(dev, backend=backend, mode=mode, use_cache=False)
            first_s = time.perf_counter() - t0
            runs, walls = [first], []
            for _ in range(max(args.cold_runs, 2)):
                t0 = time.perf_counter()
                runs.append(torch_l2topo.calibrate(dev, backend=backend, mode=mode, use_cache=False))
                walls.append(time.perf_counter() - t0)
            name = f"{backend}/{mode}"
            if backend == "triton":  # the first call JIT-compiles (Triton's disk cache is empty on a fresh box)
                figures["compile_s"][f"triton_first_calibration_{mode}"] = first_s
            figures["cold_s"][name] = quantiles(walls)
            a, b = runs[-2], runs[-1]
            figures["repeat"][name] = {"chain": compare_maps(a.chain_cycles, b.chain_cycles),
                                       "lines": compare_maps(a.line_cycles, b.line_cycles),
                                       "within_calibration_chain_noise_max": float(a.chain_noise.max())}
            c = b.chain_cycles
            twins = np.abs(c[0::2] - c[1::2])
            figures["maps"][name] = {
                "sm_covered": int(b.n_sm), "chain_min": float(c.min()), "chain_mean": float(c.mean()),
                "chain_max": float(c.max()), "chain_ns_mean": float(b.chain_ns.mean()),
                "sm_clock_ghz_median": float(np.median(b.sm_clock_ghz)),
                "sm_clock_ghz_median_per_run": [float(np.median(r.sm_clock_ghz)) for r in runs],
                "line_min": float(b.line_cycles.min()), "line_median": float(np.median(b.line_cycles)),
                "line_max": float(b.line_cycles.max()),
                "pair_2i_2i1_abs_diff_median": float(np.median(twins)), "pair_2i_2i1_abs_diff_max": float(twins.max()),
                "probe_s": b.meta["probe_s"]}
            tops[name] = b
            if gpc is not None:
                b.extras["gpc_truth"] = gpc
            if args.save_dir:
                stem = f"h200-{b.meta['uuid_hash'][:6]}-{backend}-{mode}"
                b.export_copy(command=command_line()).save(Path(args.save_dir) / f"{stem}.npz")

    figures["agreement"] = {}
    for mode in MODES:
        a, b = tops[f"cuda/{mode}"], tops[f"triton/{mode}"]
        figures["agreement"][f"cuda_vs_triton_{mode}"] = {
            "chain": compare_maps(a.chain_cycles, b.chain_cycles), "lines": compare_maps(a.line_cycles, b.line_cycles)}
    for backend in BACKENDS:
        s = tops[f"{backend}/serialized"]
        for mode in ("waves", "concurrent"):
            c = tops[f"{backend}/{mode}"]
            figures["agreement"][f"serialized_vs_{mode}_{backend}"] = {
                "chain": compare_maps(s.chain_cycles, c.chain_cycles),
                "lines": compare_maps(s.line_cycles, c.line_cycles)}

    torch_l2topo.calibrate(dev)  # fill the cache with the default calibration
    cached = []
    for _ in range(20):
        t0 = time.perf_counter()
        torch_l2topo.calibrate(dev)
        cached.append(time.perf_counter() - t0)
    figures["cached_s"] = quantiles(cached)
    write_result(args.out, figures, dev, TABLE, table_rows(figures))
    _print_table(figures)
    return figures


def _print_table(f: dict) -> None:
    print(f"compile: {', '.join(f'{k} {v:.2f}s' for k, v in f['compile_s'].items())}")
    print(f"cached calibrate(): p50 {f['cached_s']['p50'] * 1e3:.2f} ms")
    for name, q in f["cold_s"].items():
        m, r = f["maps"][name], f["repeat"][name]["chain"]
        print(f"{name:22s} cold p50 {q['p50'] * 1e3:7.1f} ms  chain {m['chain_min']:.2f}/{m['chain_mean']:.2f}/"
              f"{m['chain_max']:.2f}  repeat max {r['max_abs_diff']:.3f} med {r['median_abs_diff']:.3f}  "
              f"clock {m['sm_clock_ghz_median']:.3f} GHz")
    for name, a in f["agreement"].items():
        ch, li = a["chain"], a["lines"]
        print(f"{name:32s} chain offset {ch['offset']:+.2f} max|d-off| {ch['max_after_offset']:.3f} "
              f"spearman {ch['spearman']:.3f} | lines med|d-off| {li['median_after_offset']:.3f} "
              f"max {li['max_after_offset']:.2f}")


if __name__ == "__main__":
    main()
