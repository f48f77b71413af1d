"""Fit the GPU-time estimate of torch's embedding_bag that `ops.embedding_bag.torch_op_us` uses (no GPU needed).

    python benchmarks/fit_torch_op_rule.py [--from benchmarks/results/ops_full/ops_full_h200_eb_*.json]

Reads torch's CUDA-graph times (`F.embedding_bag`, p50) from bench_ops.py results and fits, by non-negative
least squares on relative error, microseconds as a sum of five terms:
- per row of the mean bag: torch's op walks a bag's rows one after another, so a single bag of 256 rows takes
  ~29 us however few bags there are;
- per MB read from a table that fits in the L2, and per MB read from one that does not (random rows from DRAM);
- per bag and per row read.
Only the fp32 "sum" rows are fitted; the bf16 rows of the same run, and the default-grid runs, are what
tests/test_ops_embedding_bag.py checks the rule against. Prints the coefficients as the module's constants.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
FIT_RUNS = sorted((RESULTS / "ops_full").glob("ops_full_h200_eb_*.json"))
NAMES = ("TORCH_US_PER_BAG_ROW", "TORCH_US_PER_MB", "TORCH_US_PER_DRAM_MB", "TORCH_US_PER_BAG", "TORCH_US_PER_ROW")


def shape_rows(paths) -> list:
    """(eager row, graph row, the run's L2 bytes) of every shape in the bench_ops results at paths."""
    out = []
    for path in paths:
        doc = json.loads(Path(path).read_text())
        by_timing = {}
        for r in doc["figures"].get("embedding_bag", []):
            key = (r["table_mb"], r["dim"], r["dtype"], r["bag"], r["batch"], r["mode"])
            by_timing.setdefault(key, {})[r["timing"]] = r
        out += [(t["eager"], t["graph"], doc["env"]["l2_bytes"]) for t in by_timing.values()
                if "eager" in t and "graph" in t]
    return out


def fitted_rows(paths=FIT_RUNS) -> list:
    """The shapes the constants are fitted to: the fp32 "sum" rows."""
    return [r for r in shape_rows(paths) if r[0]["dtype"] == "float32" and r[0]["mode"] == "sum"]


def features(row: dict, l2_bytes: int) -> list:
    """The fit's terms for one shape (the same arithmetic as torch_op_us)."""
    itemsize = {"float32": 4, "bfloat16": 2, "float16": 2}[row["dtype"]]
    row_bytes = row["dim"] * itemsize
    reads = row["bag"] * row["batch"]
    mb = reads * row_bytes * 1e-6
    in_l2 = row["rows"] * row_bytes <= l2_bytes
    return [reads / row["batch"], mb if in_l2 else 0.0, 0.0 if in_l2 else mb, row["batch"], reads]


def fit(rows: list) -> np.ndarray:
    from scipy.optimize import nnls

    x = np.array([features(eager, l2) for eager, _, l2 in rows])
    us = np.array([1e3 * graph["impl"]["F.embedding_bag"]["p50"] for _, graph, _ in rows])
    weight = 1 / np.maximum(us, 5.0)  # relative error; calls of a few us are launch-bound, and far below the rule
    coef, _ = nnls(x * weight[:, None], us * weight)
    return coef


def main(argv=None) -> np.ndarray:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--from", dest="paths", nargs="+", default=FIT_RUNS)
    args = p.parse_args(argv)
    rows = fitted_rows(args.paths)
    coef = fit(rows)
    print(f"# fitted to {len(rows)} fp32 'sum' shapes of {len(args.paths)} files")
    for name, value in zip(NAMES, coef):
        print(f"{name} = {value:.3g}")
    return coef


if __name__ == "__main__":
    main()
