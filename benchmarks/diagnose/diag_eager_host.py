"""Where an eager embedding_bag call's host time goes, on calls so small that the host sets its pace (one bag and
1,024 bags of 32 rows of 64 fp32, 65,536 bags of 4): torch's op, ours (the C++ eager kernel, and the same rule in
front of torch's op as before that kernel), and each piece of ours on its own, in
microseconds of host time per call (2,000 calls back to back, after a warm-up), plus cProfiles of ours and of
the kernel's eager path; and forest_predict on one sample, the same way.

    python benchmarks/diagnose/diag_eager_host.py --out benchmarks/results/diagnosis/eager_host_h200.json
"""
from __future__ import annotations

import cProfile
import importlib
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
from common import gpu_parser, write_result

CALLS = 2000
PROFILED = ("ours", "ours._forward")  # cProfiled: the small eager call, and the Triton kernel's eager path


def host_us(fn, calls: int = CALLS) -> float:
    """Median over 5 blocks of host microseconds per call (the GPU drained before each block)."""
    import torch

    for _ in range(50):
        fn()
    blocks = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        blocks.append((time.perf_counter() - t0) / calls * 1e6)
    torch.cuda.synchronize()
    return sorted(blocks)[2]


def pieces(batch: int, bag: int) -> dict:
    import torch
    import torch.nn.functional as F
    from triton.runtime.driver import driver
    from triton.runtime.jit import compute_cache_key

    from torch_l2topo.measure.lean_launch import _options, lean
    from torch_l2topo.ops import embedding_bag
    from torch_l2topo.ops.eager_kernels import EAGER_KERNEL_US, TORCH_OP_US, eager_device, torch_bags
    from torch_l2topo.ops.policy import _unread_plan, direct_call
    from torch_l2topo.triton_kernels.embedding_bag import embedding_bag_kernel

    eb_module = importlib.import_module("torch_l2topo.ops.embedding_bag")  # the package exports the function
    dev = "cuda"
    weight = torch.randn(65536, 64, device=dev)
    input = torch.randint(0, 65536, (bag * batch,), device=dev)
    offsets = torch.arange(0, bag * batch, bag, device=dev)
    out = torch.empty(batch, 64, device=dev)
    plan, state = _unread_plan(out, True)
    rows, block_d, warps = eb_module.tile_config(input.numel(), batch, 64, 4)
    group = eb_module.bags_per_program(batch, rows, block_d, 4)
    args = (input, offsets, weight, out, out, batch, input.numel(), offsets.numel(), weight.size(0), 64,
            weight.stride(0), -1, plan, state)
    kwargs = dict(MODE=0, HAS_PSW=False, CHECK=False, ROWS=rows, BAGS=group, BLOCK_D=block_d, PLACE=0,
                  num_warps=warps, debug=False, sanitize_overflow=False)
    grid = (-(-batch // group),)
    embedding_bag_kernel[grid](*args, **kwargs)  # compiled
    device = driver.active.get_current_device()
    kernel_cache, key_cache, _, _, binder = embedding_bag_kernel.device_caches[device]
    bound, specialization, options = binder(*args, **_options(embedding_bag_kernel, dict(kwargs)))
    compiled = kernel_cache[compute_cache_key(key_cache, specialization, options)]
    stream = driver.active.get_current_stream(device)
    values = tuple(bound.values())

    device_state = eager_device(torch.cuda.current_device())
    eager_bags = device_state.bags  # the C++ module's function (main waited for its build)

    def ours_torch_behind():  # the rule in front of torch's op, as before the C++ eager kernel
        device_state.bags, device_state.terms = torch_bags, TORCH_OP_US
        try:
            return embedding_bag(input, weight, offsets, mode="sum")
        finally:
            device_state.bags, device_state.terms = eager_bags, EAGER_KERNEL_US

    def run_only():
        compiled.run(grid[0], 1, 1, stream, compiled.function, compiled.packed_metadata, None, None, None, *values)

    ops = {
        "F.embedding_bag": lambda: F.embedding_bag(input, weight, offsets, mode="sum"),
        "torch.embedding_bag (aten)": lambda: torch.embedding_bag(weight, input, offsets, False, 0),
        "ours": lambda: embedding_bag(input, weight, offsets, mode="sum"),
        "ours, torch's op behind the rule": ours_torch_behind,
        "eager C++ bags": lambda: eager_bags(weight, input, offsets, 0, False),
        "ours, plain unchecked": lambda: embedding_bag(input, weight, offsets, mode="sum", policy="plain",
                                                       check_indices=False),
        "ours._forward": lambda: eb_module._forward(input, offsets, weight, None, 0, -1, False, False, "plain"),
        "kernel[grid]": lambda: embedding_bag_kernel[grid](*args, **kwargs),
        "lean(kernel)[grid]": lambda: lean(embedding_bag_kernel)[grid](*args, **kwargs),
        "binder + cache key": lambda: kernel_cache.get(compute_cache_key(
            key_cache, binder(*args, **_options(embedding_bag_kernel, dict(kwargs)))[1], options)),
        "compiled.run": run_only,
        "get_current_device + stream": lambda: driver.active.get_current_stream(driver.active.get_current_device()),
        "is_current_stream_capturing": torch.cuda.is_current_stream_capturing,
        "new_empty": lambda: weight.new_empty((batch, 64)),
        "contiguous x3": lambda: (input.contiguous(), offsets.contiguous(), weight.contiguous()),
        "direct_call": lambda: direct_call(weight, None),
        "is_compiling": torch.compiler.is_compiling,
    }
    times = {name: host_us(fn) for name, fn in ops.items()}
    return {"host_us": times, "cprofile_tottime": {name: profiled(ops[name]) for name in PROFILED}}


def profiled(fn) -> str:
    """cProfile of CALLS calls of fn, by each function's own time (its first 30 lines)."""
    import torch

    profile = cProfile.Profile()
    profile.enable()
    for _ in range(CALLS):
        fn()
    profile.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
    return text.getvalue()


def forest_pieces() -> dict:
    """The same for forest_predict on one sample (100 boosted trees of depth 6, as bench_ops fits them): the
    whole call, the op's body, and its two allocations."""
    import torch
    from bench_ops import N_FEATURES, _fit

    from torch_l2topo.ops import Forest, forest_predict

    fp_module = importlib.import_module("torch_l2topo.ops.forest_predict")  # the package exports the function
    forest = Forest.from_sklearn(_fit("boosting", 100, 6)).to("cuda")
    x = torch.randn(1, N_FEATURES, device="cuda")
    args = (forest.nodes, forest.values, forest.roots, forest.groups, forest.base, x, forest.depth,
            forest.divisor, "plain", forest.sm_partition, forest.transform)
    ops = {"forest_predict": lambda: forest_predict(forest, x),
           "forest _forest_predict": lambda: fp_module._forest_predict(*args),
           "forest new_empty x2": lambda: (torch.empty((1, 2), device="cuda"), torch.empty((8, 1, 1),
                                                                                          device="cuda"))}
    times = {name: host_us(fn) for name, fn in ops.items()}
    return {"host_us": times, "cprofile_tottime": {"forest_predict": profiled(ops["forest_predict"])}}


def main(argv=None) -> dict:
    p = gpu_parser(__doc__, reps=1)
    args = p.parse_args(argv)
    import torch

    from torch_l2topo.ops.eager_kernels import build_now

    torch.cuda.set_device(args.device)
    if not build_now(args.device):
        raise SystemExit("the C++ eager kernel did not build (see the log above): nothing to compare")
    figures = {"calls": CALLS}
    for batch, bag in ((1, 32), (1024, 32), (65536, 4)):
        figures[f"{batch} bags of {bag}"] = result = pieces(batch, bag)
        for k, v in result["host_us"].items():
            print(f"  {batch:5d} bags of {bag:2d}  {k:32s} {v:7.2f} us", flush=True)
    figures["forest, 1 sample"] = result = forest_pieces()
    for k, v in result["host_us"].items():
        print(f"  forest, 1 sample  {k:32s} {v:7.2f} us", flush=True)
    for name, result in figures.items():
        for op, text in (result.get("cprofile_tottime", {}) if isinstance(result, dict) else {}).items():
            print(f"--- {name}: {op}\n{text[:3500]}", flush=True)
    write_result(args.out, figures, args.device)
    return figures


if __name__ == "__main__":
    main()
