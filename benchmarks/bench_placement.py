"""Makespan of SM-aware placement on the local GPU, every policy side by side: the placement issue's figures.

1. Latency-bound chase (placement_workloads.Chase), one CTA of one warp per SM, footprints 4-40 MB and a
   256 MB DRAM-bound control: every plan policy, "auto", the plain persistent loop (static equal shares,
   no stealing: what "uniform" means without the placement helpers), and the limit (plans.limit, scaled
   from cycles to ms by uniform's measured/predicted ratio).
   "auto" chooses among the persistent policies only: the workload is one chase per SM by definition, and
   policy "plain" (one program per item) would run every chase at once, a different workload.
2. Embedding-bag-like gather at 1, 4, 16 and 64 warps per SM: the policies that matter there, "plain" (one
   program per bag through the helpers' direct mode) and "auto" with every default candidate; and the
   plain kernel without the helpers, the reference "auto" must not lose to.
3. @sm_aware launch overhead over a plain Triton launch of the same kernel: eager, and inside a CUDA graph.
Every result is checked against its reference once per policy (chase ends, bag sums) and every launch's
items are counted on the device (the placement statistics): each item exactly once. Makespan = one
kernel's CUDA-event time, median over --reps rounds (p20/p80 kept); in each round every policy of a block
runs once (interleaved), so that the GPU's drift between states touches all of them alike.

    python benchmarks/bench_placement.py --device 0 --out benchmarks/results/placement_h200.json
"""
from __future__ import annotations

import time

import numpy as np
from common import calibrated_device, gpu_parser, quantiles, write_result
from placement_workloads import (
    chase_kernel,
    chase_plain_kernel,
    chase_workload,
    gather_kernel,
    gather_plain_kernel,
    gather_workload,
)

from torch_l2topo.placement.sm_aware import DEFAULT_CANDIDATES

CHASE_FOOTPRINTS_MB = (4, 8, 16, 24, 32, 40, 256)
CHASE_ITEMS_PER_SM = 64
CHASE_LOADS = 320            # ~3 ms makespan: 64 items x 320 loads x ~290 cycles / 1.98 GHz per SM
GATHER_TABLE_MB = 16
GATHER_BAGS = 65536
GATHER_OCCUPANCY = {1: (1, 1), 4: (4, 1), 16: (16, 1), 64: (32, 2)}  # warps/SM: (CTAs per SM, warps per CTA)
POLICIES = ("uniform", "dynamic", "weighted", "partition_affine", "affine_weighted", "measured", "auto")
GATHER_POLICIES = ("uniform", "dynamic", "partition_affine", "affine_weighted", "plain", "auto")
CHASE_CANDIDATES = tuple(p for p in DEFAULT_CANDIDATES if p != "plain")


def timed(launch, reps: int, warmup: int = 3) -> dict:
    """CUDA-event times (ms) of `reps` launches after `warmup`."""
    return interleaved({"one": launch}, reps, warmup)["one"]


def interleaved(launches: dict, reps: int, warmup: int = 3) -> dict:
    """{name: quantiles of CUDA-event ms}: `reps` rounds after `warmup`, each launching every entry once. Side
    by side in rounds, so that drift (the H200's L2 latency steps between states lasting milliseconds to
    seconds; clocks) touches every entry alike: timed one after the other in blocks, the same 0.07 ms gather
    read 0.068 ms in one block and 0.118 ms in another."""
    import torch

    events = {name: [] for name in launches}
    for r in range(warmup + reps):
        for name, launch in launches.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            launch()
            end.record()
            if r >= warmup:
                events[name].append((start, end))
    torch.cuda.synchronize()
    return {name: quantiles([s.elapsed_time(e) for s, e in ev]) for name, ev in events.items()}


def settle(kernel, launch):
    """Launch until an "auto" kernel has decided, or a "measured" one has rebuilt its plan a few times."""
    import torch

    if kernel.policy == "measured":
        for _ in range(3 * kernel.refresh + 1):
            launch()
    while kernel.policy == "auto" and not kernel.decisions:
        launch()
        torch.cuda.synchronize()  # lets the trial launches' events complete


def run_policies(make_kernel, args, n_items, classes, loads, policies, reps, check, extra=None) -> dict:
    """Time every policy's kernel side by side (interleaved rounds), with `extra` launches ({name: launch},
    e.g. a plain kernel without the helpers); check each result once and that the launches of every plan did
    each item exactly once (the device's statistics)."""
    import torch

    kernels, launches, first_s = {}, {}, {}
    for policy in policies:
        kernel = kernels[policy] = make_kernel(policy)

        def launch(kernel=kernel):
            kernel(*args, n_items=n_items, item_class=classes, loads_per_item=loads)

        settle(kernel, launch)
        before = time.perf_counter()
        launch()
        torch.cuda.synchronize()
        first_s[policy] = time.perf_counter() - before
        check(policy)
        launches[policy] = launch
    for name, launch in (extra or {}).items():
        launch()
        torch.cuda.synchronize()
        check(name)
        launches[name] = launch
    out = interleaved(launches, reps)
    for policy, kernel in kernels.items():
        result = out[policy]
        used = kernel.decisions[next(iter(kernel.decisions))]["policy"] if policy == "auto" else policy
        # every launch of this plan counted on the device: n_items each, or an item was lost or done twice
        # (direct mode counts nothing: there the reference check is the proof)
        slot = kernel.slot(n_items, classes, loads, policy=used)
        done = int(slot.stats()["items"].sum())
        if not slot.loaded.direct and (done % n_items or done < reps * n_items):
            raise AssertionError(f"{policy}: the device counted {done} items, not a whole number of launches of "
                                 f"{n_items}")
        result["policy_used"] = used
        if policy == "auto":
            result["decision"] = {k: v for k, v in kernel.decisions[next(iter(kernel.decisions))].items()
                                  if k != "timings"}
        result["first_launch_s"] = first_s[policy]
    for name, result in out.items():
        print(f"  {name:17s} {result['p50']:8.3f} ms  (p20 {result['p20']:.3f}, p80 {result['p80']:.3f})"
              + (f"  -> {result['policy_used']}" if name == "auto" else ""), flush=True)
    return out


def with_ratios(results: dict, predicted: dict | None = None, limit_cycles: float | None = None) -> dict:
    uniform = results["uniform"]["p50"]
    for r in results.values():
        r["makespan_ms"] = r["p50"]
        r["vs_uniform"] = r["p50"] / uniform
        if "plain_loop" in results:
            r["vs_plain_loop"] = r["p50"] / results["plain_loop"]["p50"]
    out = {"policies": results}
    if predicted:
        out["predicted_cycles"] = predicted
        out["predicted_vs_uniform"] = {p: v / predicted["uniform"] for p, v in predicted.items()}
    if limit_cycles is not None:
        out["limit_ms"] = uniform * limit_cycles / predicted["uniform"]
        out["limit_vs_uniform"] = limit_cycles / predicted["uniform"]
    return out


def bench_chase(dev, topo, reps) -> dict:
    import torch

    from torch_l2topo.placement.plans import SpeedModel, Workload, limit, make_plan, predict
    from torch_l2topo.placement.sm_aware import sm_aware

    speeds = SpeedModel.from_topology(topo)
    n_items = CHASE_ITEMS_PER_SM * topo.n_sm
    figures = {}
    for mb in CHASE_FOOTPRINTS_MB:
        w = chase_workload(dev, mb << 20, n_items, CHASE_LOADS)
        ends = torch.zeros(n_items, dtype=torch.int64, device=dev)
        print(f"chase {mb} MB: rings of {w.ring_lines} lines, partition map {w.map_s * 1e3:.1f} ms", flush=True)

        def check(policy):
            got = ends.cpu().numpy()
            bad = np.flatnonzero(got != w.expected)
            if bad.size:
                raise AssertionError(f"chase {mb} MB, {policy}: {bad.size} items ended elsewhere (first {bad[:5]})")
            ends.zero_()

        def make(policy):
            return sm_aware(chase_kernel, policy=policy, num_warps=1, topology=topo, candidates=CHASE_CANDIDATES)

        # the plain persistent loop on the same grid (one single-warp program per SM): static equal shares
        plain_loop = {"plain_loop": lambda: chase_plain_kernel[(topo.n_sm,)](w.starts, ends, CHASE_LOADS, n_items,
                                                                             num_warps=1)}
        results = run_policies(make, (w.starts, ends, CHASE_LOADS), n_items, w.classes, CHASE_LOADS, POLICIES, reps,
                               check, extra=plain_loop)
        wl = Workload(n_items, item_class=w.classes, loads_per_item=CHASE_LOADS)
        predicted = {p: predict(make_plan(p, speeds, wl), speeds, wl)
                     for p in ("uniform", "dynamic", "weighted", "partition_affine", "affine_weighted")}
        figures[f"{mb}MB"] = dict(with_ratios(results, predicted, limit(speeds, wl)), ring_lines=w.ring_lines,
                                  partition_map_s=w.map_s, items=n_items, loads_per_item=CHASE_LOADS)
    return figures


def bench_gather(dev, topo, reps) -> dict:
    import torch

    from torch_l2topo.placement.sm_aware import sm_aware

    w = gather_workload(dev, GATHER_TABLE_MB << 20, GATHER_BAGS)
    out = torch.empty_like(w.reference)
    figures = {}

    def check(policy):
        torch.testing.assert_close(out, w.reference, rtol=1e-5, atol=1e-4, msg=lambda m: f"gather {policy}: {m}")
        out.zero_()

    for warps, (ctas, num_warps) in GATHER_OCCUPANCY.items():
        print(f"gather, {warps} warps/SM", flush=True)

        def make(policy):
            return sm_aware(gather_kernel, policy=policy, ctas_per_sm=ctas, num_warps=num_warps, topology=topo)

        # side by side with each block: the kernel without the helpers, one program per bag, placed by the
        # hardware (the plain launch "auto" must not lose to)
        plain_kernel = {"plain_kernel": lambda: gather_plain_kernel[(GATHER_BAGS,)](w.table, w.idx, out, w.bag, w.dim,
                                                                                     num_warps=1)}
        results = run_policies(make, (w.table, w.idx, out, w.bag, w.dim), GATHER_BAGS, w.classes, 1.0,
                               GATHER_POLICIES, reps, check, extra=plain_kernel)
        for r in results.values():
            r["vs_plain_kernel"] = r["p50"] / results["plain_kernel"]["p50"]
        figures[f"{warps}_warps_per_sm"] = with_ratios(results)
    return figures


def bench_overhead(dev, topo) -> dict:
    """Host time per launch (eager) and device time per launch (graph) of a one-item-per-SM no-op workload."""
    import torch

    from torch_l2topo.measure.launch import launch_triton
    from torch_l2topo.placement.sm_aware import sm_aware

    n = topo.n_sm
    starts = torch.zeros(n, dtype=torch.int64, device=dev)  # chase 0 loads: the item loop itself is the work
    ends = torch.zeros(n, dtype=torch.int64, device=dev)
    out = {}
    for policy in ("dynamic", "auto"):
        kernel = sm_aware(chase_kernel, policy=policy, num_warps=1, topology=topo)

        def wrapped():
            kernel(starts, ends, 0, n_items=n)

        settle(kernel, wrapped)
        plan, state = kernel.plan_tensors(n)

        def plain():
            launch_triton(chase_kernel, n, (starts, ends, 0, plan, state), 1)

        row = {}
        for name, fn in (("plain_triton", plain), ("sm_aware", wrapped)):
            for _ in range(50):
                fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(2000):
                fn()
            row[f"{name}_host_us"] = (time.perf_counter() - t0) / 2000 * 1e6
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                with torch.cuda.graph(graph, stream=stream):
                    for _ in range(100):
                        fn()
            graph.replay()
            torch.cuda.synchronize()
            t = timed(graph.replay, 20)
            row[f"{name}_graph_us_per_launch"] = t["p50"] * 1e3 / 100
        row["eager_overhead_us"] = row["sm_aware_host_us"] - row["plain_triton_host_us"]
        row["graph_overhead_us"] = row["sm_aware_graph_us_per_launch"] - row["plain_triton_graph_us_per_launch"]
        out[policy] = row
        print(f"overhead {policy}: {row}", flush=True)
    return out


def main(argv=None) -> dict:
    p = gpu_parser(__doc__, reps=15)
    p.add_argument("--only", choices=("chase", "gather", "overhead"), action="append")
    args = p.parse_args(argv)
    dev, topo, calibration = calibrated_device(args.device, "placement")
    parts = args.only or ("chase", "gather", "overhead")
    figures = {"calibration": calibration}
    for part, fn in (("chase", bench_chase), ("gather", bench_gather), ("overhead", bench_overhead)):
        if part in parts:
            figures[part] = fn(dev, topo, args.reps) if part != "overhead" else fn(dev, topo)
            write_result(args.out, figures, args.device)  # keep what is done if a later part fails
    return figures


if __name__ == "__main__":
    main()
