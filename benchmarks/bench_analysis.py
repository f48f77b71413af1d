"""Topology analysis on CPU: its cost on a 132 x 4096 map, and its figures on the bundled H200 calibrations.

Timing: report.analyze() (NUCA fit, partitions, twins, GPC clusters, symmetry, slice classes) on a 132 x 4096
matrix built from real data: the 512 line columns of the eight waves- and serialized-mode calibrations in
tests/data/calibrations (two H200s x two backends x two modes) side by side. Each block is a real
calibration of the same 512 lines, so the matrix carries real structure and noise at 8x the width.
Figures: analyze() on each bundled calibration against the other backend's calibration of the same GPU
(partition agreement, slice-class stability), the same comparison between GPUs, and the latency clusters
against the thread-block-cluster GPC ground truth where a calibration carries it.

    python benchmarks/bench_analysis.py --out benchmarks/results/analysis/analysis_h200.json
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from common import cpu_environment, quantiles, row, write_json

from torch_l2topo import Topology, list_examples, load_example
from torch_l2topo.analysis.labels import find_partitions
from torch_l2topo.analysis.nuca import fit_nuca, repeat_sigma
from torch_l2topo.analysis.slices import slice_classes
from torch_l2topo.analysis.structure import cluster_gpcs, find_twins, sm_symmetry
from torch_l2topo.analysis.summary import analyze

ROOT = Path(__file__).resolve().parents[1]
WIDE_SOURCES = tuple(f"h200-{gpu}-{backend}-{mode}" for gpu in ("d557bc", "f78934") for backend in ("cuda", "triton")
                     for mode in ("waves", "serialized"))


def wide_matrix() -> tuple[np.ndarray, float]:
    topos = [Topology.load(ROOT / "tests" / "data" / "calibrations" / f"{name}.npz") for name in WIDE_SOURCES]
    return np.hstack([t.line_cycles for t in topos]).astype(np.float64), max(repeat_sigma(t) for t in topos)


def timing(repeats: int) -> dict:
    m, sigma = wide_matrix()
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        analyze(m, sigma)
        walls.append(time.perf_counter() - t0)
    stages = {}
    t0 = time.perf_counter()
    model = fit_nuca(m, sigma)
    stages["fit_nuca"] = time.perf_counter() - t0
    for name, fn in (("find_partitions", find_partitions), ("find_twins", find_twins), ("cluster_gpcs", cluster_gpcs),
                     ("sm_symmetry", sm_symmetry), ("slice_classes", slice_classes)):
        t0 = time.perf_counter()
        fn(model)
        stages[name] = time.perf_counter() - t0
    return {"matrix": f"132 x {m.shape[1]}: line columns of {', '.join(WIDE_SOURCES)} side by side "
                      "(tests/data/calibrations); timing only: two GPUs side by side are no one GPU's "
                      "structure",
            "shape": list(m.shape), "noise_sigma": sigma, "analyze_s": quantiles(walls), "stage_s_one_pass": stages}


def bundled() -> dict:
    names = list_examples()
    per = {}
    for name in names:
        gpu = name.split("-")[1]
        other = next(n for n in names if n != name and n.split("-")[1] == gpu)
        per[name] = analyze(load_example(name), other=load_example(other)).summary()
    between = {f"{a}_vs_{b}": analyze(load_example(f"h200-{a}-cuda-waves"),
                                      other=load_example(f"h200-{b}-cuda-waves")).summary()["versus"]
               for a, b in (("d557bc", "f78934"), ("1e5731", "d00e55"), ("1e5731", "d557bc"))}
    return {"per_calibration": per, "between_gpus_cuda_waves": between}


def headline(per: dict, between: dict) -> dict:
    """Ranges over the four bundled calibrations of what the issue asks to record."""
    def span(values):
        values = [v for v in values if v is not None]
        return [min(values), max(values)]

    s = list(per.values())
    return {"r2_additive": span([x["r2_by_rank"][0] for x in s]),
            **{f"r2_rank{k}": span([x["r2_by_rank"][k] for x in s]) for k in (1, 2, 3)},
            "significant_rank": span([x["significant_rank"] for x in s]),
            "residual_over_noise_at_significant_rank":
                span([x["residual_over_noise"][x["significant_rank"]] for x in s]),
            "partition_sm_counts": sorted({tuple(x["partitions"]["sm_counts"]) for x in s}),
            "partition_line_counts": sorted({tuple(x["partitions"]["line_counts"]) for x in s}),
            "near_cycles": span([x["partitions"]["near_cycles"] for x in s]),
            "far_cycles": span([x["partitions"]["far_cycles"] for x in s]),
            "gap_cycles": span([x["partitions"]["gap_cycles"] for x in s]),
            "gap_ratio": span([x["partitions"]["gap_ratio"] for x in s]),
            "granularity_bytes": span([x["partitions"]["granularity_bytes"] for x in s]),
            "twin_pairs": span([x["twins"]["count"] for x in s]),
            "gpc_clusters_k": span([x["gpc_clusters"]["k"] for x in s]),
            "gpc_clusters_runner_up_k": span([x["gpc_clusters"]["runner_up_k"] for x in s]),
            "slice_classes": span([x["slices"]["count"] for x in s]),
            "slice_ari_same_gpu": span([x["versus"]["slice_ari"] for x in s]),
            "partition_sm_agreement_same_gpu": span([x["versus"]["sm_agreement"] for x in s]),
            "partition_sm_agreement_between_gpus": {k: v["sm_agreement"] for k, v in between.items()},
            "partition_line_agreement_between_gpus": {k: v["line_agreement"] for k, v in between.items()},
            "slice_ari_between_gpus": {k: v["slice_ari"] for k, v in between.items()},
            "gpc_ari_between_gpus": {k: v["gpc_ari"] for k, v in between.items()},
            # latency clusters against thread-block-cluster ground truth, where a calibration carries it
            "gpc_vs_truth": {name: x["gpc_truth"] for name, x in per.items() if x.get("gpc_truth")}}


TABLE = "analysis"


def table_rows(figures: dict) -> list:
    """The table's rows: analyze()'s time on the 132 x 4096 matrix, and per calibration what it found."""
    rows = [row("132x4096", "analyze", "s", figures["timing_132x4096"]["analyze_s"])]
    for name, x in figures["per_calibration"].items():
        rows += [row(name, "noise_sigma", "cycles", x["noise_sigma"]),
                 row(name, "significant_rank", "count", x["significant_rank"]),
                 row(name, "twins", "count", x["twins"]["count"]), row(name, "gpc_clusters", "count",
                                                                        x["gpc_clusters"]["k"]),
                 row(name, "slice_classes", "count", x["slices"]["count"])]
        if x["partitions"].get("found"):
            rows.append(row(name, "partition_gap", "cycles", x["partitions"]["gap_cycles"]))
        if x.get("gpc_truth"):
            rows.append(row(name, "gpc_ari_vs_truth", "ari", x["gpc_truth"]["ari"]))
    return rows


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "analysis" / "analysis_h200.json"))
    p.add_argument("--repeats", type=int, default=5, help="timed analyze() runs on the 132 x 4096 matrix")
    args = p.parse_args(argv)
    real = bundled()
    figures = {"headline": headline(real["per_calibration"], real["between_gpus_cuda_waves"]),
               "timing_132x4096": timing(args.repeats), **real}
    write_json(args.out, figures, cpu_environment(), TABLE, table_rows(figures))
    print(json.dumps(figures["headline"], indent=1))
    t = figures["timing_132x4096"]
    print(f"analyze() on {t['shape']}: p50 {t['analyze_s']['p50']:.2f} s; stages "
          + ", ".join(f"{k} {v:.2f} s" for k, v in t["stage_s_one_pass"].items()))
    return figures


if __name__ == "__main__":
    main()
