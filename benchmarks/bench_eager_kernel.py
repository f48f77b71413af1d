"""The C++ eager embedding-bag kernel (ops/eager_kernels.py) against torch's op and the Triton kernel, on every
embedding-bag shape of bench_ops.py's grids (the full grid, then the default grid's shapes it lacks).

Per shape, checked equal to torch's op first, the same three calls ("eager C++", "F.embedding_bag", and the Triton
kernel as an unchecked plain launch, "plain") in CUDA graphs of bench_ops.GRAPH_CALLS calls (GPU time per call)
and eager, back to back (the whole call), with bench_ops.py's interleaved rounds. Rows have bench_ops.py's format;
tests/test_ops_embedding_bag.py checks where embedding_bag's eager rule sends calls against the three eager calls'
times. (The committed runs of 2026-12-02, tests/data/eager_kernel/ and results/eager_kernel/, timed graphs of one
call: their graph times of calls of a few microseconds are the host's replay rate, bench_ops.py says why.)

    python benchmarks/bench_eager_kernel.py --out benchmarks/results/eager_kernel/eager_kernel_h200_<uuid>.json
"""
from __future__ import annotations

import time

from bench_ops import BAG_GRIDS, RATIOS, _print, bag_case, gpu_rounds, graph_rounds, parse_part, part_of, summary
from common import case_rows, gpu_parser, write_result

TABLE = "eager_kernel"


def table_rows(figures: dict) -> list:
    return case_rows(figures["embedding_bag"], bag_case, "ms", ratios=RATIOS)


SHAPES = BAG_GRIDS["full"] + [s for s in BAG_GRIDS["default"] if s not in BAG_GRIDS["full"]]
OURS = "eager C++"


def shape_rows(bags, weight, bag: int, batch: int, mode: str, shape: dict, reps: int) -> tuple:
    """(eager row, graph row) of one shape on `weight`."""
    import torch
    import torch.nn.functional as F

    from torch_l2topo.ops import embedding_bag
    from torch_l2topo.ops.embedding_bag import MODES

    input = torch.randint(0, weight.size(0), (bag * batch,), device=weight.device)
    offsets = torch.arange(0, bag * batch, bag, device=weight.device)
    code = MODES[mode]
    calls = {OURS: lambda: bags(weight, input, offsets, code, False),
             "F.embedding_bag": lambda: F.embedding_bag(input, weight, offsets, mode=mode),
             "plain": lambda: embedding_bag(input, weight, offsets, mode=mode, policy="plain", check_indices=False)}
    if not torch.equal(calls[OURS](), calls["F.embedding_bag"]()):
        raise AssertionError(f"the eager kernel differs from torch's op at {shape}")
    shape = {**shape, "bag": bag, "batch": batch, "mode": mode,
             "bytes_read": bag * batch * weight.size(1) * weight.element_size()}
    eager_row = summary({**shape, "timing": "eager", "impl": gpu_rounds(calls, reps)}, OURS, ("F.embedding_bag",),
                        "plain")
    graph_row = summary({**shape, "timing": "graph", "impl": graph_rounds(calls, reps)}, OURS, ("F.embedding_bag",),
                        "plain")
    for row in (eager_row, graph_row):
        del row["auto_chose"]  # these rows time the kernels themselves, not the op's choice
    return eager_row, graph_row


def main(argv=None) -> dict:
    p = gpu_parser(__doc__, reps=5)
    p.add_argument("--part", type=parse_part, default=(1, 1), metavar="K/N")
    args = p.parse_args(argv)
    import torch

    from torch_l2topo.ops.eager_kernels import build_now, eager_device

    torch.cuda.set_device(args.device)
    if not build_now(args.device):
        raise SystemExit("the C++ eager kernel did not build (see the log above)")
    bags = eager_device(args.device).bags
    shapes = part_of(SHAPES, args.part)
    rows, start, tables = [], time.perf_counter(), {}
    for i, (table_mb, dim, dtype_name, bag, batch, mode) in enumerate(shapes):
        key = (table_mb, dim, dtype_name)
        if key not in tables:  # one table per size and row type: allocating 4 GB per shape would dominate
            tables.clear()
            dtype = getattr(torch, dtype_name)
            n_rows = max(256, (table_mb << 20) // (dim * dtype.itemsize))
            tables[key] = torch.randn(n_rows, dim, device="cuda", dtype=dtype)
        weight = tables[key]
        shape = dict(table_mb=table_mb, rows=weight.size(0), dim=dim, dtype=dtype_name)
        eager, in_graph = shape_rows(bags, weight, bag, batch, mode, shape, args.reps)
        label = f"[{i + 1}/{len(shapes)}] {table_mb} MB x {dim} {dtype_name}, {batch} bags of {bag}, {mode}"
        _print(eager, label + " eager")
        _print(in_graph, label + " graph")
        rows += [eager, in_graph]
    print(f"{len(shapes)} shapes: {time.perf_counter() - start:.0f} s", flush=True)
    figures = {"reps": args.reps, "part": "{}/{}".format(*args.part), "embedding_bag": rows}
    write_result(args.out, figures, args.device, TABLE, table_rows(figures))
    return figures


if __name__ == "__main__":
    main()
