"""Whole-model profiling (profile(kernels="triton")) on the compiled transformer block of
examples/profile_compiled.py: what the twins cost and what the per-SM view covers (docs/profiler.md).

1. Instrumentation cost: the block's forward step, GPU time per step (CUDA events around a synchronized step),
   with every Triton kernel's twin swapped in against the originals, in alternating blocks of steps (the drift of
   the machine cancels). Target: twins / originals <= 1.10. The twins' build time (first cycle) is reported.
2. Coverage, in profiled cycles of the same block: Triton launches (kernel events whose name the cycle listed as
   a Triton kernel) with CTA tracks over all Triton launches (target >= 0.95); GPU time of the kernel events with
   CTA tracks over all kernel events; every CTA once and inside its kernel event (max misalignment); and
   HolisticTraceAnalysis's kernel breakdown of the enriched trace equal to the plain one's (where importable).

    python benchmarks/bench_whole_model.py --device 0 --out FILE
"""
from __future__ import annotations

import importlib.util
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from bench_profiler import coverage, hta_check
from common import gpu_parser, quantiles, row, write_result

from torch_l2topo.measure import recording
from torch_l2topo.profiler import session
from torch_l2topo.profiler.kernels.twins import Twins
from torch_l2topo.profiler.trace.tracefile import load_trace

ROOT = Path(__file__).resolve().parents[1]
TABLE = "whole_model"
CASE = "transformer block bf16"


def _example():
    spec = importlib.util.spec_from_file_location("profile_compiled", ROOT / "examples" / "profile_compiled.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _step_ms(step, rec) -> float:
    rec.reset()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def instrumentation_cost(step, device: int, reps: int, block: int = 10) -> dict:
    """GPU ms per step with the twins swapped in and out, in alternating blocks of `block` steps."""
    rec = recording.recorder(device, session.held_capacity())
    twins = Twins()
    t0 = time.perf_counter()
    twins.build({device: rec})
    build_s = time.perf_counter() - t0
    times = {"originals": [], "twins": []}
    kernels = None
    for i in range(reps):
        for which in (("originals", "twins") if i % 2 == 0 else ("twins", "originals")):
            if which == "twins":
                kernels = twins.swap_in({device: rec})
            try:
                times[which] += [_step_ms(step, rec) for _ in range(block)]
            finally:
                twins.swap_out()
    plain, ours = np.median(times["originals"]), np.median(times["twins"])
    return {"build_s": build_s, "kernels": kernels, "step_ms": {k: quantiles(v) for k, v in times.items()},
            "ratio": float(ours / plain)}


def triton_coverage(trace_path: Path, device: int) -> dict:
    """The coverage figures the enrichment wrote for the device (profiler/trace/coverage.py)."""
    meta = load_trace(trace_path)["l2topo"]["devices"][str(device)]
    return {k: meta.get(k) for k in ("triton_launch_coverage", "instrumented_gpu_time_ratio", "kernel_launches",
                                     "uncovered_kernels")}


def profiled(model_step, device: int, work: Path, cycles: int) -> tuple:
    import torch_l2topo

    sched = torch.profiler.schedule(wait=1, warmup=1, active=1, repeat=cycles)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch_l2topo.profile(work, schedule=sched, activities=acts, kernels="triton", devices=[device]) as prof:
        for _ in range(3 * cycles):
            model_step()
            prof.step()
    return prof.written, prof.handler.triton_kernels  # the last cycle's, kept after it ended


def main(argv=None) -> dict:
    p = gpu_parser(__doc__, reps=10)
    p.add_argument("--cycles", type=int, default=2, help="profiled cycles for the coverage figures")
    args = p.parse_args(argv)
    torch.cuda.set_device(args.device)
    example = _example()
    torch.manual_seed(0)
    model = torch.compile(example.Block().cuda().to(torch.bfloat16))
    x = torch.randn(example.BATCH, example.SEQ, example.DIM, device="cuda", dtype=torch.bfloat16)

    def step():
        with torch.no_grad():
            model(x)

    for _ in range(3):
        step()  # compiled and warm
    print("timing twins against originals ...", flush=True)
    cost = instrumentation_cost(step, args.device, args.reps)
    print(f"  twins / originals = {cost['ratio']:.3f}; twins built in {cost['build_s']:.1f} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="l2topo-whole-") as tmp:
        print("profiling cycles ...", flush=True)
        written, triton_kernels = profiled(step, args.device, Path(tmp), args.cycles)
        last = Path(written[-1])
        n_sm = torch.cuda.get_device_properties(args.device).multi_processor_count
        figures = {"instrumentation": cost, "triton_kernels": triton_kernels,
                   "coverage": triton_coverage(last, args.device), "ctas": coverage(last, n_sm),
                   "hta": hta_check(last, Path(tmp))}
    ctas = figures["ctas"]["kernels"]
    figures["every_cta_once_inside"] = all(k["each_program_once"] and k["inside_kernel"] and k["sms_in_range"]
                                           for k in ctas.values())
    figures["max_misalignment_ns"] = max((k["max_misalignment_ns"] for k in ctas.values()), default=None)
    cov = figures["coverage"]
    print(f"  Triton launch coverage {cov['triton_launch_coverage']}, instrumented GPU time "
          f"{cov['instrumented_gpu_time_ratio']}, every CTA once inside: {figures['every_cta_once_inside']}")
    rows = [row(CASE, "originals_step", "ms", cost["step_ms"]["originals"]),
            row(CASE, "twins_step", "ms", cost["step_ms"]["twins"]),
            row(CASE, "twins_over_originals", "ratio", cost["ratio"]),
            row(CASE, "twins_build", "s", cost["build_s"]),
            row(CASE, "triton_launch_coverage", "fraction", cov["triton_launch_coverage"]),
            row(CASE, "instrumented_gpu_time_ratio", "fraction", cov["instrumented_gpu_time_ratio"]),
            row(CASE, "every_cta_once_inside", "bool", figures["every_cta_once_inside"]),
            row(CASE, "max_misalignment", "ns", figures["max_misalignment_ns"])]
    if figures["hta"].get("breakdown_equal") is not None:
        rows.append(row(CASE, "hta_breakdown_equal", "bool", figures["hta"]["breakdown_equal"]))
    rows = [r for r in rows if r.get("value", 0) is not None]  # a figure the run could not take has no row
    write_result(args.out, figures, args.device, TABLE, rows)
    print(f"written {args.out}")
    return figures


if __name__ == "__main__":
    main()
