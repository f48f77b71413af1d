"""The ops against what a PyTorch user runs instead, side by side on one GPU: the ops issue's figures.

embedding_bag: torch_l2topo.ops.embedding_bag against torch.nn.functional.embedding_bag and nn.EmbeddingBag
(same table, same indices: uniform random rows, so tables beyond the L2 read from DRAM), eager and inside a
CUDA graph; "ours" is the default call (policy "auto", indices checked inside the kernel, no host sync),
"ours_unchecked" the same without the check, "plain" policy="plain" unchecked. One more row times forward +
backward (mode "sum") against torch.
forest_predict: a fitted scikit-learn forest through forest_predict (each node layout), against Hummingbird's
PyTorch backend on the same GPU with each of its tree strategies (gemm, tree_trav, perf_tree_trav; a strategy
whose tensors would not fit is recorded as skipped), and against scikit-learn's own predict_proba on the CPU
(n_jobs=-1).

Every row: time_ms (median of --reps rounds, p20/p80 kept per implementation), vs_reference (ours over the best
reference: torch's op / Hummingbird's best strategy), vs_plain (ours over the same kernel as a plain launch),
auto_chose (what policy "auto" resolves to: plain, ops/policy.py says why; "eager C++" for the small eager
embedding bags and the eager forest calls that it sends to the C++ eager kernels, ops/eager_kernels.py says why, or
"torch" where that kernel is not built and small bags run torch's own op; "plain" is the Triton kernel). In each
round every implementation runs `inner` calls (a "graph" row: `inner` replays of a CUDA graph of GRAPH_CALLS
calls, times per call) back to back between two CUDA events (interleaved, in a new random order each round, so
drift and round order touch all alike); results are checked against torch / scikit-learn once per row before
timing. An entry whose one call takes over SLOW_CALL_MS is timed by that call alone ("one_call", n =
1), and scikit-learn's CPU predict is skipped where one call would take over CPU_SECONDS (the reason is recorded).
--grid full is the issue's whole grid (tables 1 MB-4 GB, bags 1-256, batch 1-65,536; forests 10-2,000 trees,
depth 4-12, batch 1-1M; docs/ops_full_grid.md): its forests alone take minutes each to fit and convert, so it
runs in slices (--part K/N, one file each) within a device call's 10 minutes; the default grid (~3 min on an
H200) keeps the target shape and one point per axis.

    python benchmarks/bench_ops.py --out benchmarks/results/ops/ops_h200_<uuid>.json [--grid full] [--only forest]
    python benchmarks/bench_ops.py --grid full --only forest --part 2/6 --out FILE   # one slice of a long grid
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from common import case_rows, gpu_parser, quantiles, write_result

# embedding_bag rows: (table MB, dim, dtype, rows per bag, bags, mode)
TARGET = (16, 64, "float32", 32, 65536, "sum")  # the target: >= 2x torch
BAG_GRIDS = {
    "default": [TARGET, (16, 64, "float32", 32, 65536, "mean"), (16, 64, "float32", 32, 65536, "max"),
                (1024, 64, "float32", 32, 65536, "sum"), (16, 64, "float32", 1, 65536, "sum"),
                (16, 64, "float32", 256, 4096, "sum"), (16, 64, "float32", 32, 1, "sum"),
                (16, 64, "float32", 32, 1024, "sum"), (1024, 128, "bfloat16", 32, 65536, "sum"),
                (16, 8, "float32", 32, 65536, "sum"), (16, 256, "float32", 32, 16384, "sum"),
                # shapes outside the fit of torch's op's time (the eager rule's test): the C++ eager kernel takes
                # all four, torch's op (until the kernel is built) the first two
                (16, 64, "float32", 8, 4096, "sum"), (16, 32, "float32", 4, 16384, "sum"),
                (16, 64, "float32", 2, 65536, "sum"), (16, 64, "float32", 4, 65536, "sum")],
    "full": [(mb, 64, dtype, bag, batch, "sum") for mb in (1, 16, 256, 4096) for dtype in ("float32", "bfloat16")
             for bag in (1, 8, 32, 256) for batch in (1, 64, 1024, 65536)]
            + [(16, row_bytes // 4, "float32", 32, 65536, "sum") for row_bytes in (32, 128, 512, 1024)]
            + [(16, 64, "float32", 32, 65536, m) for m in ("mean", "max")],
}
# forest rows: (model, trees, depth); batches per grid
FOREST_GRIDS = {
    "default": ([("random_forest", 10, 4), ("boosting", 100, 6), ("random_forest", 500, 8),
                 ("random_forest", 500, 12)], (1, 132, 1024, 65536)),
    "full": ([("random_forest", 10, 4), ("boosting", 100, 6), ("boosting", 500, 8), ("random_forest", 500, 8),
              ("random_forest", 2000, 10), ("random_forest", 2000, 12)], (1, 16, 132, 1024, 16384, 262144, 1 << 20)),
}
N_FEATURES = 16
HUMMINGBIRD_STRATEGIES = ("gemm", "tree_trav", "perf_tree_trav")
GEMM_LIMIT_BYTES = 16 << 30  # Hummingbird's gemm holds (trees x leaves x internal nodes) floats: skip beyond this
CPU_SECONDS = 5.0            # scikit-learn's predict on the CPU: at most this long per row (fewer rounds)
CPU_PROBE_SAMPLES = 4096     # a call expected to take longer than CPU_SECONDS (timed on this many) is skipped
SLOW_CALL_MS = 2000.0        # an entry whose one warm call takes longer is timed by that one call (n = 1)
# Each timed block of `inner` calls lasts about this long (at most 200 calls). The first calls after the idle
# GPU of a block's start take longer on the host (a batch-1 forest_predict: 111 us per call in blocks of 4 calls,
# 99 us in blocks of 64, H200 host, 2026-12-01); blocks of 2 ms gave a 0.12 ms call 4-16 calls, and the entry
# whose one probe call ran slow got the fewest and read up to 1.4x slower than the same code path in the same row.
TIMED_MS = 20.0
PROBE_CALLS = 3
# A "graph" row's graph holds this many calls, and its times are per call. A graph of one call timed the host's
# replay rate, not the GPU, wherever the call takes a few microseconds: in the full grid's run of 2026-12-01
# (H200 b4c6b51f1736) every implementation read 5.5 us per replay at the 1 MB table whatever it launched, and
# per-replay quantiles were bimodal (3 and 5 us) in the rows that read above torch. Triton's do_bench_cudagraph
# and bench_ops_kernels.py (which takes this constant) time graphs of many calls for the same reason.
GRAPH_CALLS = 20
DEVICE = "cuda"              # tests/test_ops_bench.py runs the row functions on the CPU with a host timer


def _event_ms(fn, calls: int = 1) -> float:
    """CUDA-event milliseconds of `calls` calls of fn, from an idle GPU."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def gpu_rounds(launches: dict, reps: int) -> dict:
    """{name: quantiles of ms per call}: `inner` calls of each entry between two events, from an idle GPU,
    entries interleaved within each of `reps` rounds (after one warm-up round) in a new seeded random order each
    round; `inner` sized from PROBE_CALLS calls, once every entry is warm. An entry whose one warm call takes
    over SLOW_CALL_MS (Hummingbird on a million samples) is timed by that call alone ("one_call": n = 1), so
    that the full grid's rows stay within minutes."""
    import torch

    for launch in launches.values():  # every entry warm before any is probed: the first probe came right after
        launch()                      # the row's first calls, read slow, and gave its entry a third of the calls
    inner, slow = {}, {}
    for name, launch in launches.items():
        one = _event_ms(launch)
        if one > SLOW_CALL_MS:
            slow[name] = {**quantiles([one]), "inner": 1, "one_call": True}
            continue
        inner[name] = int(np.clip(TIMED_MS * PROBE_CALLS / max(_event_ms(launch, PROBE_CALLS), 1e-3), 1, 200))
    launches = {name: launch for name, launch in launches.items() if name not in slow}
    events = {name: [] for name in launches}
    order = np.random.default_rng(0)
    for r in range(reps + 1):
        # a new order every round: the first block of a round measured slower (up to 1.45x on the same call), and
        # with a fixed order, even rotated, every entry always followed the same one: the first entry of the
        # forest rows (ours_bfs), always right after Hummingbird's blocks, read up to 1.46x slower than the same
        # code path (plain) on host-bound calls (H200 host, 2026-12-01)
        for name in order.permutation(list(launches)):
            launch = launches[name]
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            # an empty queue at the start: work still queued from the entry before would hide this entry's host
            # time (its calls queue up behind it), so eager rows depended on which entry ran before them
            torch.cuda.synchronize()
            start.record()
            for _ in range(inner[name]):
                launch()
            end.record()
            if r:
                events[name].append((start, end))
    torch.cuda.synchronize()
    return {**{name: {**quantiles([s.elapsed_time(e) / inner[name] for s, e in ev]), "inner": inner[name]}
               for name, ev in events.items()}, **slow}


def graphed(fn, calls: int = 1):
    """A CUDA graph of `calls` calls of fn (warmed up on a side stream first), replayed by the returned
    function."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph.replay


def graph_rounds(calls: dict, reps: int, optional: tuple = (), per_graph: int = GRAPH_CALLS) -> dict:
    """gpu_rounds of CUDA graphs of `per_graph` calls of each entry, in ms per call (each quantile over per_graph;
    "calls_per_graph" kept). An entry named in `optional` whose capture fails is recorded as skipped (a reference
    torch cannot capture is a row entry, not a crash); any other failure raises."""
    graphs, failed = {}, {}
    for name, fn in calls.items():
        try:
            graphs[name] = graphed(fn, per_graph)
        except Exception as e:
            if name not in optional:
                raise
            failed[name] = {"skipped": f"failed: {type(e).__name__}: {e}"[:200]}
    times = gpu_rounds(graphs, reps)
    per_call = {name: {**t, **{q: t[q] / per_graph for q in ("p20", "p50", "p80")}, "calls_per_graph": per_graph}
                for name, t in times.items()}
    return {**per_call, **failed}


def summary(row: dict, ours: str, references: tuple, plain: str) -> dict:
    times = row["impl"]
    best = min((r for r in references if r in times and "p50" in times[r]), key=lambda r: times[r]["p50"],
               default=None)
    row.update(time_ms=times[ours]["p50"], reference=best,
               vs_reference=times[ours]["p50"] / times[best]["p50"] if best else None,
               vs_plain=times[ours]["p50"] / times[plain]["p50"], auto_chose="plain")
    return row


TABLE = "ops"
RATIOS = ("vs_reference", "vs_plain")


def bag_case(row: dict) -> str:
    """An embedding_bag row's case in the tables: its shape and timing."""
    return (f"{row['table_mb']} MB x {row['dim']} {row['dtype']}, {row['batch']} bags of {row['bag']}, {row['mode']}, "
            f"{row['timing']}")


def forest_case(row: dict) -> str:
    """A forest row's case in the tables: the forest, the batch and (where rows say) the timing."""
    timing = f", {row['timing']}" if row.get("timing") else ""
    return f"{row['model']} {row['trees']} x d{row['depth']}, batch {row['batch']}{timing}"


def table_rows(figures: dict) -> list:
    """Every row's times per call (ms) of each implementation, and its ratios."""
    return (case_rows(figures.get("embedding_bag", []), bag_case, "ms", ratios=RATIOS)
            + case_rows(figures.get("forest", []), forest_case, "ms", ratios=RATIOS))


def _print(row: dict, label: str) -> None:
    parts = [f"{k} {v['p50']:.4f}" if "p50" in v else f"{k} {v.get('skipped', 'failed')[:40]}"
             for k, v in row["impl"].items()]
    ratio = f"{row['vs_reference']:.2f}" if row["vs_reference"] else "n/a"
    print(f"  {label}: ours {row['time_ms']:.4f} ms, vs {row['reference']} {ratio}x; " + ", ".join(parts),
          flush=True)


def part_of(items: list, part: tuple) -> list:
    """The k-th of n contiguous slices of items (part = (k, n), k from 1): a grid too long for one device call
    runs as n commands (--part k/n), each writing its own file."""
    k, n = part
    size = -(-len(items) // n)
    return items[(k - 1) * size:k * size]


def bench_embedding_bag(grid: str, reps: int, part: tuple = (1, 1)) -> list:
    import torch

    from torch_l2topo.ops.eager_kernels import build_now

    configs = part_of(BAG_GRIDS[grid], part)
    # the small eager calls' C++ kernel, built ahead of time as `python -m torch_l2topo build` does: time what a
    # prepared machine runs
    built = build_now(torch.cuda.current_device())
    print(f"embedding_bag: {len(configs)} shapes, eager and CUDA graph; small eager calls on "
          f"{'the C++ eager kernel' if built else 'torch op (the C++ eager kernel did not build)'}", flush=True)
    rows = []
    for i, config in enumerate(configs):
        eager, in_graph = bag_rows(*config, reps=reps)
        table_mb, dim, dtype_name, bag, batch, mode = config
        label = f"[{i + 1}/{len(configs)}] {table_mb} MB x {dim} {dtype_name}, {batch} bags of {bag}, {mode}"
        _print(eager, label + " eager")
        _print(in_graph, label + " graph")
        rows += [eager, in_graph]
    if part[0] == 1:
        rows.append(bench_backward(reps))
    return rows


def bag_rows(table_mb: int, dim: int, dtype_name: str, bag: int, batch: int, mode: str, reps: int) -> tuple:
    """(eager row, CUDA-graph row) of one shape, after checking ours against torch."""
    import torch
    import torch.nn.functional as F

    from torch_l2topo.ops import embedding_bag
    from torch_l2topo.ops.eager_kernels import torch_bags
    from torch_l2topo.ops.embedding_bag import eager_launch

    dtype = getattr(torch, dtype_name)
    n_rows = max(bag, (table_mb << 20) // (dim * dtype.itemsize))
    weight = torch.randn(n_rows, dim, device=DEVICE, dtype=dtype)
    input = torch.randint(0, n_rows, (bag * batch,), device=DEVICE)
    offsets = torch.arange(0, bag * batch, bag, device=DEVICE)
    module = torch.nn.EmbeddingBag.from_pretrained(weight, mode=mode, freeze=True)
    calls = {
        "ours": lambda: embedding_bag(input, weight, offsets, mode=mode),
        "ours_unchecked": lambda: embedding_bag(input, weight, offsets, mode=mode, check_indices=False),
        "plain": lambda: embedding_bag(input, weight, offsets, mode=mode, policy="plain", check_indices=False),
        "F.embedding_bag": lambda: F.embedding_bag(input, weight, offsets, mode=mode),
        "nn.EmbeddingBag": lambda: module(input, offsets),
    }
    expected = calls["F.embedding_bag"]().float()
    error = float((calls["ours"]().float() - expected).abs().max())
    tol = 1e-3 if dtype == torch.float32 else 5e-2
    if not error <= tol * max(1.0, float(expected.abs().max())):
        raise AssertionError(f"embedding_bag {table_mb} MB x {dim} {dtype_name}: max error {error}")
    shape = dict(table_mb=table_mb, rows=n_rows, dim=dim, dtype=dtype_name, bag=bag, batch=batch, mode=mode,
                 bytes_read=bag * batch * dim * dtype.itemsize, max_abs_err=error)
    references = ("F.embedding_bag", "nn.EmbeddingBag")
    timings = gpu_rounds(calls, reps)
    eager = summary({**shape, "timing": "eager", "impl": timings}, "ours", references, "plain")
    launch = eager_launch(input, weight, offsets, mode)
    if launch is not None:
        eager["auto_chose"] = "torch" if launch is torch_bags else "eager C++"
    times = eager["impl"]
    eager["unchecked_vs_reference"] = times["ours_unchecked"]["p50"] / times[eager["reference"]]["p50"]
    # the check needs no host sync, so a graph captures the default call
    graph_calls = {k: calls[k] for k in ("ours", "plain", *references)}
    in_graph = summary({**shape, "timing": "graph", "impl": graph_rounds(graph_calls, reps, optional=references)},
                       "ours", references, "plain")
    return eager, in_graph


def bench_backward(reps: int) -> dict:
    """Forward + backward (mode "sum", dense weight gradient) at the target shape, ours against torch."""
    import torch
    import torch.nn.functional as F

    from torch_l2topo.ops import embedding_bag

    table_mb, dim, _, bag, batch, mode = TARGET
    weight = torch.randn((table_mb << 20) // (dim * 4), dim, device=DEVICE, requires_grad=True)
    input = torch.randint(0, weight.size(0), (bag * batch,), device=DEVICE)
    offsets = torch.arange(0, bag * batch, bag, device=DEVICE)
    grad = torch.randn(batch, dim, device=DEVICE)

    def step(fn, **kwargs):
        def run():
            weight.grad = None
            fn(input, weight, offsets, mode=mode, **kwargs).backward(grad)
        return run

    calls = {"ours": step(embedding_bag), "F.embedding_bag": step(F.embedding_bag)}
    row = summary({"table_mb": table_mb, "dim": dim, "dtype": "float32", "bag": bag, "batch": batch, "mode": mode,
                   "timing": "eager forward+backward", "impl": gpu_rounds(calls, reps)}, "ours",
                  ("F.embedding_bag",), "ours")
    _print(row, "forward+backward at the target shape")
    return row


def _fit(kind: str, trees: int, depth: int):
    from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier

    rng = np.random.default_rng(0)
    n = min(200_000, max(20_000, 8 << depth))  # enough rows for full-depth trees
    x = rng.normal(size=(n, N_FEATURES)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] * x[:, 2] - x[:, 3] ** 2 + 0.5 * rng.normal(size=n) > 0).astype(int)
    if kind == "boosting":
        model = GradientBoostingClassifier(n_estimators=trees, max_depth=depth, subsample=0.5, random_state=0)
        return model.fit(x[:20_000], y[:20_000])
    model = RandomForestClassifier(n_estimators=trees, max_depth=depth, max_features=0.5, n_jobs=-1, random_state=0)
    return model.fit(x, y)


def _hummingbird(model, trees: int, depth: int) -> dict:
    """{strategy: the converted torch module on the GPU, or the reason it is missing}."""
    try:
        import hummingbird.ml as hb
    except ImportError as e:
        return {s: f"skipped: hummingbird-ml is not installed ({e})" for s in HUMMINGBIRD_STRATEGIES}
    out = {}
    for strategy in HUMMINGBIRD_STRATEGIES:
        gemm_bytes = trees * (1 << depth) * (1 << depth) * 4
        if strategy == "gemm" and gemm_bytes > GEMM_LIMIT_BYTES:
            out[strategy] = f"skipped: gemm would hold {gemm_bytes / 2 ** 30:.0f} GiB"
            continue
        try:
            out[strategy] = hb.convert(model, "torch", extra_config={"tree_implementation": strategy}).to(DEVICE)
        except Exception as e:  # a strategy that cannot convert this forest is a row entry, not a crash
            out[strategy] = f"failed: {type(e).__name__}: {e}"[:200]
    return out


def sklearn_cpu_timing(model, x_cpu: np.ndarray, reps: int) -> dict:
    """Quantiles of scikit-learn's predict_proba on the CPU, or why not: a call that CPU_PROBE_SAMPLES samples
    say would take over CPU_SECONDS is skipped (2,000 trees on a million samples), not timed."""
    probe = x_cpu[:CPU_PROBE_SAMPLES]
    start = time.perf_counter()
    model.predict_proba(probe)
    estimate = (time.perf_counter() - start) * len(x_cpu) / len(probe)
    if estimate > CPU_SECONDS:
        return {"skipped": f"one call would take about {estimate:.0f} s ({len(probe)} samples timed), over the "
                           f"{CPU_SECONDS:.0f} s a row may spend"}
    return _cpu_quantiles(lambda: model.predict_proba(x_cpu), reps)


def _cpu_quantiles(fn, reps: int) -> dict:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - start))
        if sum(times) > 1e3 * CPU_SECONDS:
            break
    return quantiles(times)


def bench_forest(grid: str, reps: int, part: tuple = (1, 1)) -> list:
    import torch

    from torch_l2topo.ops.eager_kernels import build_now

    models, batches = FOREST_GRIDS[grid]
    models = part_of(models, part)
    # eager calls run the C++ eager kernel once built (`python -m torch_l2topo build`): time a prepared machine
    built = build_now(torch.cuda.current_device()) if DEVICE == "cuda" else False
    print(f"forest_predict: {len(models)} forests x {len(batches)} batches; eager calls on "
          f"{'the C++ eager kernel' if built else 'the Triton kernel (the C++ eager kernel did not build)'}",
          flush=True)
    rng = np.random.default_rng(1)
    x_all = torch.from_numpy(rng.normal(size=(max(batches), N_FEATURES)).astype(np.float32)).to(DEVICE)
    rows = []
    for i, (kind, trees, depth) in enumerate(models):
        rows += forest_rows(kind, trees, depth, x_all, batches, reps, f"[{i + 1}/{len(models)}]")
        torch.cuda.empty_cache()
    return rows


def forest_rows(kind: str, trees: int, depth: int, x_all, batches, reps: int, label: str) -> list:
    """One row per batch size for one fitted forest, after checking ours against scikit-learn."""
    import torch

    from torch_l2topo.ops import Forest, forest_predict
    from torch_l2topo.ops.forest import LAYOUTS
    from torch_l2topo.ops.forest_predict import eager_forest

    start = time.perf_counter()
    model = _fit(kind, trees, depth)
    forests = {layout: Forest.from_sklearn(model, layout=layout).to(DEVICE) for layout in LAYOUTS}
    converted = _hummingbird(model, trees, depth)
    nodes_mb = forests["bfs"].nbytes / 2 ** 20
    print(f"{label} {kind}, {trees} trees, depth {depth}: {nodes_mb:.1f} MB of nodes, fit and convert "
          f"{time.perf_counter() - start:.0f} s", flush=True)
    rows = []
    for batch in batches:
        x = x_all[:batch]
        x_cpu = x.cpu().numpy()
        calls = {f"ours_{layout}": (lambda f=f: forest_predict(f, x)) for layout, f in forests.items()}
        calls["plain"] = lambda: forest_predict(forests["bfs"], x, policy="plain")
        failed = {}
        with torch.no_grad():
            for strategy, hb_model in converted.items():
                if isinstance(hb_model, str):
                    failed[f"hummingbird_{strategy}"] = {"skipped": hb_model}
                    continue
                try:
                    hb_model.model(x)
                    calls[f"hummingbird_{strategy}"] = lambda m=hb_model: m.model(x)
                except Exception as e:  # e.g. out of memory at this batch: a row entry, not a crash
                    failed[f"hummingbird_{strategy}"] = {"skipped": f"failed: {type(e).__name__}: {e}"[:200]}
                    torch.cuda.empty_cache()
            error = float(np.abs(calls["ours_bfs"]()[:4096].cpu().numpy() - model.predict_proba(x_cpu[:4096])).max())
            if error > 1e-4:
                raise AssertionError(f"forest {kind} {trees}x{depth} batch {batch}: max error {error}")
            timings = gpu_rounds(calls, reps)
        timings.update(failed)
        timings["sklearn_cpu"] = sklearn_cpu_timing(model, x_cpu, reps)
        timings["ours"] = timings["ours_bfs"]
        fastest = min(LAYOUTS, key=lambda layout: timings[f"ours_{layout}"]["p50"])
        row = summary({"model": kind, "trees": trees, "depth": depth, "nodes_mb": nodes_mb, "batch": batch,
                       "max_abs_err": error, "fastest_layout": fastest, "impl": timings}, "ours",
                      tuple(f"hummingbird_{s}" for s in HUMMINGBIRD_STRATEGIES), "plain")
        if x.is_cuda and eager_forest(forests["bfs"], x) is not None:
            row["auto_chose"] = "eager C++"  # what an eager "auto" call runs (the op's "plain" is the Triton kernel)
        cpu = timings["sklearn_cpu"]
        row["vs_sklearn_cpu"] = row["time_ms"] / cpu["p50"] if "p50" in cpu else None
        _print(row, f"batch {batch}")
        rows.append(row)
    return rows


def parse_part(text: str) -> tuple:
    """"K/N" -> (K, N), 1 <= K <= N."""
    try:
        k, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--part takes K/N, such as 2/3; got {text!r}") from None
    if not 1 <= k <= n:
        raise argparse.ArgumentTypeError(f"--part K/N needs 1 <= K <= N; got {text!r}")
    return k, n


def main(argv=None) -> dict:
    p = gpu_parser(__doc__, reps=7)
    p.add_argument("--grid", choices=("default", "full"), default="default")
    p.add_argument("--only", choices=("embedding_bag", "forest"), action="append")
    p.add_argument("--part", type=parse_part, default=(1, 1), metavar="K/N",
                   help="run the K-th of N slices of each grid (default 1/1: all of it)")
    args = p.parse_args(argv)
    import torch

    torch.cuda.set_device(args.device)
    figures = {"grid": args.grid, "reps": args.reps, "part": "{}/{}".format(*args.part)}
    for op, fn in (("embedding_bag", bench_embedding_bag), ("forest", bench_forest)):
        if args.only is None or op in args.only:
            start = time.perf_counter()
            figures[op] = fn(args.grid, args.reps, args.part)
            print(f"{op}: {time.perf_counter() - start:.0f} s", flush=True)
            write_result(args.out, figures, args.device)  # keep what is done if a later part fails
    write_result(args.out, figures, args.device, TABLE, table_rows(figures))
    return figures


if __name__ == "__main__":
    main()
