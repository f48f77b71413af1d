"""The C++ eager forest kernel (ops/eager_kernels.py) against the Triton kernel, on bench_ops.py's forests.

Per forest and batch, checked against the Triton kernel first (float32 rounding apart), three eager calls: "auto"
(the op's default call: the C++ kernel below forest_predict.EAGER_MAX_STEPS walk steps once it is loaded, the
Triton kernel above), "eager C++" (forest_predict.eager_forest with the line lifted: the C++ kernel's call without
the op's argument checks) and "plain" (policy="plain": the Triton kernel's lean launch). Two rows each:
- "eager": calls back to back (the whole call: host time where the batch is small), bench_ops.py's interleaved
  rounds;
- "gpu": the two kernels' GPU time, each call queued behind a GPU spin (SPIN_CYCLES) between two events, so that
  its host time is hidden (a CUDA graph would not do: captured calls run the Triton kernel). Where a call's host
  time outlasts the spin, the row reads it: on H200 8d8bc563d7d7 the Triton call's "gpu" quantiles at small
  batches spread to 0.1-0.18 ms (its first call after a synchronize), so there its CUDA-graph time
  (benchmarks/results/diagnosis/eager_forest_graphs_h200_*) is the GPU time to read.
Rows have bench_ops.py's format, with "auto" (eager) or "eager C++" (gpu) as ours and "plain" as the reference, and
"auto_ran": the kernel that "auto" ran. `--forests held_out` runs forests and batches the line was not set on
(tests/test_ops_forest.py checks the line against that run). Hummingbird and scikit-learn are bench_ops.py's
(`--only forest`).

    python benchmarks/bench_eager_forest.py --out benchmarks/results/eager_forest/eager_forest_h200_<uuid>.json
    python benchmarks/bench_eager_forest.py --forests held_out --out FILE
"""
from __future__ import annotations

import time

import numpy as np
from bench_ops import FOREST_GRIDS, N_FEATURES, RATIOS, _fit, _print, forest_case, gpu_rounds, quantiles, summary
from common import case_rows, gpu_parser, write_result

TABLE = "eager_forest"


def table_rows(figures: dict) -> list:
    return case_rows(figures["forest"], forest_case, "ms", ratios=RATIOS)


RUNS = {  # (forests (kind, trees, depth), batches)
    "default": (FOREST_GRIDS["default"][0] + [("boosting", 500, 8)], (1, 16, 132, 1024, 16384, 65536)),
    "held_out": ([("boosting", 200, 5), ("random_forest", 1000, 10), ("random_forest", 50, 12)],
                 (2, 64, 512, 2048, 4096, 8192, 32768)),
}
SPIN_CYCLES = 400_000  # ~0.2 ms at the H200's clock: longer than any of these calls' host time
OURS = "auto"


def spun_rounds(launches: dict, reps: int) -> dict:
    """{name: quantiles of GPU ms per call}: each call queued behind a GPU spin, between two events, entries
    interleaved in a new random order each round (after one warm-up round)."""
    import torch

    events = {name: [] for name in launches}
    order = np.random.default_rng(0)
    for r in range(reps + 1):
        for name in order.permutation(list(launches)):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            torch.cuda._sleep(SPIN_CYCLES)
            start.record()
            launches[name]()
            end.record()
            if r:
                events[name].append((start, end))
    torch.cuda.synchronize()
    return {name: {**quantiles([s.elapsed_time(e) for s, e in ev]), "inner": 1} for name, ev in events.items()}


def forest_rows(forest, x, batch: int, shape: dict, reps: int) -> tuple:
    """(eager row, gpu row) of one forest at one batch."""
    import importlib

    import torch

    from torch_l2topo.ops import forest_predict

    forests = importlib.import_module("torch_l2topo.ops.forest_predict")  # the package exports the function
    eager_forest = forests.eager_forest
    xs = x[:batch]

    def cpp():  # the C++ kernel's call wherever it takes the call, the line lifted
        return eager_forest(forest, xs, max_steps=1 << 62)

    calls = {OURS: lambda: forest_predict(forest, xs), "eager C++": cpp,
             "plain": lambda: forest_predict(forest, xs, policy="plain")}
    got, expected = cpp(), calls["plain"]()
    if got is None:
        raise AssertionError(f"the C++ eager kernel did not take {shape} at batch {batch}")
    error = float((got - expected).abs().max())
    if not torch.allclose(got, expected, rtol=2e-6, atol=2e-6):
        raise AssertionError(f"the C++ eager kernel differs from the Triton kernel at {shape}, batch {batch}: {error}")
    shape = {**shape, "batch": batch, "steps": batch * forest.n_trees * forest.depth, "max_abs_diff_vs_triton": error,
             "auto_ran": "eager C++" if eager_forest(forest, xs) is not None else "plain"}
    eager = summary({**shape, "timing": "eager", "impl": gpu_rounds(calls, reps)}, OURS, ("plain",), "plain")
    kernels = {k: calls[k] for k in ("eager C++", "plain")}
    gpu = summary({**shape, "timing": "gpu", "impl": spun_rounds(kernels, reps)}, "eager C++", ("plain",), "plain")
    for row in (eager, gpu):
        del row["auto_chose"]  # auto_ran says what ran
    return eager, gpu


def main(argv=None) -> dict:
    p = gpu_parser(__doc__, reps=5)
    p.add_argument("--forests", choices=tuple(RUNS), default="default")
    args = p.parse_args(argv)
    import torch

    from torch_l2topo.ops import Forest
    from torch_l2topo.ops.eager_kernels import build_now

    torch.cuda.set_device(args.device)
    if not build_now(args.device):
        raise SystemExit("the C++ eager kernels did not build (see the log above)")
    models, batches = RUNS[args.forests]
    rng = np.random.default_rng(1)
    x = torch.from_numpy(rng.normal(size=(max(batches), N_FEATURES)).astype(np.float32)).cuda()
    rows, start = [], time.perf_counter()
    for i, (kind, trees, depth) in enumerate(models):
        forest = Forest.from_sklearn(_fit(kind, trees, depth)).to("cuda")
        shape = {"model": kind, "trees": trees, "depth": depth, "nodes_mb": forest.nbytes / 2 ** 20,
                 "layout": forest.layout}
        print(f"[{i + 1}/{len(models)}] {kind}, {trees} trees, depth {depth} (fitted at "
              f"{time.perf_counter() - start:.0f} s)", flush=True)
        for batch in batches:
            eager, gpu = forest_rows(forest, x, batch, shape, args.reps)
            _print(eager, f"  batch {batch} eager (auto ran {eager['auto_ran']})")
            _print(gpu, f"  batch {batch} gpu")
            rows += [eager, gpu]
        torch.cuda.empty_cache()
    print(f"{len(models)} forests: {time.perf_counter() - start:.0f} s", flush=True)
    figures = {"reps": args.reps, "forests": args.forests, "forest": rows}
    write_result(args.out, figures, args.device, TABLE, table_rows(figures))
    return figures


if __name__ == "__main__":
    main()
