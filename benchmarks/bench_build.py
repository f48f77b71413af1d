"""One-time compilation cost, reported apart from calibration time: the CUDA extension's cold JIT build
and Triton's cold compile of the probe kernels, each into an empty cache directory.

    python benchmarks/bench_build.py --out benchmarks/results/build/build_h200.json
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

from common import row, write_result

TABLE = "build"
STEPS = ("cuda_ext_cold_build_s", "triton_first_probe_launches_s", "triton_cached_probe_launches_s")


def table_rows(figures: dict) -> list:
    return [row("cold caches", step.removesuffix("_s"), "s", figures[step]) for step in STEPS]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    # empty caches before torch or triton read their locations
    os.environ["TORCH_EXTENSIONS_DIR"] = tempfile.mkdtemp(prefix="l2topo-ext-")
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="l2topo-triton-")
    import torch

    from torch_l2topo.measure import extension
    from torch_l2topo.measure.probes import run_chain, run_lines
    from torch_l2topo.measure.rings import ring_plan

    dev = torch.device("cuda", 0)
    torch.zeros(1, device=dev)
    n_sm = torch.cuda.get_device_properties(dev).multi_processor_count
    figures = {"max_jobs": os.environ.get("MAX_JOBS"), "cpu_count": os.cpu_count()}
    t0 = time.perf_counter()
    extension.load(torch.cuda.get_device_capability(dev))
    figures["cuda_ext_cold_build_s"] = time.perf_counter() - t0
    plan = ring_plan(256, n_sm)
    for label in STEPS[1:]:
        t0 = time.perf_counter()
        run_chain(dev, n_sm, plan, "triton", "waves", 2.0)
        run_lines(dev, n_sm, 16, 2, 8, "triton", "waves", 2.0)
        figures[label] = time.perf_counter() - t0
    write_result(args.out, figures, 0, TABLE, table_rows(figures))
    print(figures)
    return figures


if __name__ == "__main__":
    main()
