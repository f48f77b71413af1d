"""Fit the GPU-time estimates that embedding_bag's small-eager-call rule uses (no GPU needed): torch's op
(`ops.eager_kernels.TORCH_OP_US`) and the C++ eager kernel (`ops.eager_kernels.EAGER_KERNEL_US`).

    python benchmarks/fit_eager_rule.py [--impl "F.embedding_bag" | --impl "eager C++"] [--from RESULT.json ...]

Reads an implementation's CUDA-graph times (p50) from bench_ops.py-format results (bench_ops.py for torch's op:
the issue's full grid of 2026-12-01, tests/data/ops/full_one_call_graphs/, whose graphs held one call each;
bench_eager_kernel.py for the C++ kernel, tests/data/eager_kernel/eager_kernel_h200.json)
and fits, by non-negative least squares on relative error, microseconds as a sum of five terms:
- per row of the mean bag: both walk a bag's rows in turn (torch's op one row at a time: one bag of 256 rows takes
  ~29 us however few bags there are; the C++ kernel four or sixteen at a time);
- per MB read, per bag and per row read;
- per row read from a table larger than the L2: a random row from DRAM costs a DRAM access whatever its size (the
  C++ kernel took 58-62 us for 65,536 bags of 8 rows of 256 fp32 bytes or 128 bf16 bytes alike). In the fp32 rows
  alone this term and a dearer MB from DRAM are indistinguishable (every DRAM row there is 256 bytes).
Only the fp32 "sum" rows are fitted; the other rows of the same runs, and other H200 runs, are what
tests/test_ops_embedding_bag.py checks the rule against. Prints the coefficients as the module's constant.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"  # the runs the fits are tested on too
IMPLS = {  # implementation timed: (ops.eager_kernels' constant, the runs it is fitted to)
    "F.embedding_bag": ("TORCH_OP_US", sorted((DATA / "ops" / "full_one_call_graphs").glob("*.json"))),
    "eager C++": ("EAGER_KERNEL_US", [DATA / "eager_kernel" / "eager_kernel_h200.json"]),
}
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


def shape_rows(paths) -> list:
    """(eager row, graph row, the run's L2 bytes) of every embedding_bag shape in the results at paths."""
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


def fitted_rows(impl: str = "F.embedding_bag", paths=None) -> list:
    """The shapes an implementation's constants are fitted to: the fp32 "sum" rows of its runs."""
    return [r for r in shape_rows(paths or IMPLS[impl][1]) if r[0]["dtype"] == "float32" and r[0]["mode"] == "sum"]


def features(row: dict, l2_bytes: int) -> list:
    """The fit's terms for one shape (the arithmetic of ops.eager_kernels.gpu_us)."""
    row_bytes = row["dim"] * ITEMSIZE[row["dtype"]]
    reads = row["bag"] * row["batch"]
    beyond_l2 = row["rows"] * row_bytes > l2_bytes
    return [reads / row["batch"], reads * row_bytes * 1e-6, row["batch"], reads, reads if beyond_l2 else 0]


def measured_us(graph_row: dict, impl: str) -> float:
    return 1e3 * graph_row["impl"][impl]["p50"]


def fit(rows: list, impl: str = "F.embedding_bag") -> np.ndarray:
    from scipy.optimize import nnls

    x = np.array([features(eager, l2) for eager, _, l2 in rows], dtype=float)
    us = np.array([measured_us(graph, impl) for _, graph, _ in rows])
    weight = 1 / np.maximum(us, 5.0)  # relative error; calls of a few us are launch-bound, and far below the rule
    coef, _ = nnls(x * weight[:, None], us * weight)
    return coef


def main(argv=None) -> np.ndarray:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", choices=list(IMPLS), default="F.embedding_bag")
    p.add_argument("--from", dest="paths", nargs="+", type=Path)
    args = p.parse_args(argv)
    rows = fitted_rows(args.impl, args.paths)
    coef = fit(rows, args.impl)
    name, runs = IMPLS[args.impl]
    print(f"# {args.impl}: fitted to {len(rows)} fp32 'sum' shapes of {len(args.paths or runs)} files")
    print(f"{name} = ({', '.join(f'{c:.3g}' for c in coef)})")
    return coef


if __name__ == "__main__":
    main()
