"""SM-aware placement against the hand-written plain kernel of the same work, side by side: the placement issue's
figures.

For each workload and each number of items per SM (1, 2, 4, ... 64), in interleaved rounds (every entry once per
round, so that drift touches all alike), each timed as a CUDA graph of `reps_per_graph` launches (GPU time, not
the host's launch cost):
- the hand plain kernel: the same loop written without the placement helpers, one program per item, placed by
  the hardware: what a user would run instead, and the reference of every ratio (`vs_plain_kernel`);
- "auto" (@sm_aware's default): its ratio, what it chose, and the trial launches it spent;
- every (policy, CTAs per SM) pair an exhaustive search can try: "plain" (the helpers in direct mode),
  "partition_queues" at 1 item per claim and at claim_chunk()'s (where an SM cannot hold all its items' programs),
  and each persistent policy at 1, 2, 4, ... CTAs per SM up to what the kernel holds and the items fill; the best;
- persistent "uniform" at equal concurrency (as many CTAs per SM as items per SM, where the kernel holds them):
  what the shares mode costs against the plain kernel running the same programs at once, each program taking its
  item by program id (`uniform_equal_concurrency_vs_plain_kernel`; target <= 1.02);
- the limit: plans.limit of the calibration's near/far costs over plans.predict of the plain plan, times the plain
  kernel's time (a model estimate of what placement by partition could reach, labelled so).
`vs_uniform` is the ratio to persistent "uniform" at the CTAs per SM "auto" would give a persistent policy.

Workloads (benchmarks/placement_workloads.py; each result checked once per entry against an independent
reference): the latency-bound chase (one warp, 20480 / n dependent loads per item at n items per SM, at least
320: ~3 ms of loads per SM; 16 MB of lines, items alternating between the two partitions' rings); the
embedding-bag-like gather (bags of 32 rows of 64 floats homed in one partition, alternating); the capped chase
(a CUDA kernel whose 100 KB of shared memory per CTA caps an SM at 2 CTAs, as attention kernels are). Then the
@sm_aware launch overhead over a plain Triton launch (host time eager, device time in a graph) and the time of a
partition map of a tensor size not seen before (and of several in a row, and of the probe plan alone). `uniform`
(a diagnosis, bench_uniform): where persistent uniform's time goes at equal concurrency (a shares-mode program's
way out step by step, every item traced, the gather's floors).

    python benchmarks/bench_placement.py --only uniform --out benchmarks/results/diagnosis/placement_uniform_h200.json

    python benchmarks/bench_placement.py --device 0 --out benchmarks/results/placement/placement_h200.json
"""
from __future__ import annotations

import itertools
import statistics
import time

import numpy as np
from common import calibrated_device, case_rows, gpu_parser, quantiles, row, write_result
from placement_workloads import (
    chase_kernel,
    chase_plain_kernel,
    chase_workload,
    gather_kernel,
    gather_plain_kernel,
    gather_workload,
)

ITEMS_PER_SM = (1, 2, 4, 8, 16, 32, 64)
CHASE_TABLE_MB = 16
CHASE_LOADS_PER_SM = 20480   # ~3 ms of dependent loads per SM at ~290 cycles and 1.98 GHz
CHASE_MIN_LOADS = 320
GATHER_TABLE_MB = 16
CAPPED_SMEM = 100 << 10      # 2 CTAs of the capped chase per H200 SM (228 KB of shared memory)
CAPPED_ITEMS_PER_SM = (1, 2, 4, 8, 16)
PERSISTENT = ("affine_weighted", "partition_affine", "weighted", "uniform", "dynamic")
CTAS = (1, 2, 4, 8, 16, 32)
GRAPH_LAUNCHES = 5           # launches per graph replay in bench_uniform


def graph_of(launch, launches: int):
    """A CUDA graph replaying `launch` `launches` times (captured after one eager call built its plan)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for _ in range(launches):
            launch()
    torch.cuda.current_stream().wait_stream(stream)
    return graph


def timed(launch, reps: int) -> dict:
    """Quantiles of CUDA-event ms of `reps` launches of one entry."""
    return interleaved({"one": launch}, reps)["one"]


EAGER = False  # --eager: time eager launches behind a GPU spin (as "auto"'s trials do) instead of graph replays
SPIN_CYCLES = 200_000  # ~0.1 ms: the host queues the launch while the GPU spins, so its launch cost is not timed


def interleaved(runs: dict, reps: int, per_run: int = 1, warmup: int = 2, spin: bool | None = None) -> dict:
    """{name: quantiles of ms per launch}: `reps` rounds, each replaying every entry's graph once (per_run
    launches), after `warmup` rounds. Side by side in rounds: timed one after the other in blocks, the same
    0.07 ms gather read 0.068 ms in one block and 0.118 ms in another (the H200's latency states). spin (default
    EAGER): the GPU spins before each timed entry, so an eager launch is queued while it is busy and the events
    time the kernel, not the host's launch (without it, two kernels of the same PTX read 0.043 and 0.061 ms on
    an H100 machine whose host was slow: profiler_h100_fadce9f4e6f5.json, compiled_out)."""
    import torch

    spin = EAGER if spin is None else spin
    events = {name: [] for name in runs}
    for r in range(warmup + reps):
        for name, replay in runs.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if spin:
                torch.cuda._sleep(SPIN_CYCLES)
            start.record()
            replay()
            end.record()
            if r >= warmup:
                events[name].append((start, end))
    torch.cuda.synchronize()
    return {name: quantiles([s.elapsed_time(e) / per_run for s, e in ev]) for name, ev in events.items()}


def pairs(max_ctas: int, items_per_sm: int, has_classes: bool) -> list:
    """The exhaustive search: plain, partition_queues (1 item per claim, and claim_chunk()'s), and each persistent
    policy at every power-of-two CTAs per SM (and the auto value) up to what the kernel holds and the items fill."""
    from torch_l2topo.placement.choice import Candidate, claim_chunk, persistent_ctas

    top = persistent_ctas(max_ctas, items_per_sm, 1)
    ctas = sorted({c for c in CTAS if c <= top} | {top})
    policies = PERSISTENT if has_classes else tuple(p for p in PERSISTENT if "affin" not in p)
    chunks = dict.fromkeys((1, claim_chunk(max_ctas, items_per_sm, 1)))
    return [Candidate("plain")] + ([Candidate("partition_queues", chunk=c) for c in chunks] if has_classes else []) \
        + [Candidate(p, c) for p in policies for c in ctas]


def settle(kernel, launch) -> None:
    """Launch until "auto" has decided (synchronizing so the trial events complete)."""
    import torch

    while not kernel.decisions:
        launch()
        torch.cuda.synchronize()


def run_point(make, launch_plain, n_items, classes, loads, check, reps, per_run, topo, extra_info) -> dict:
    """Every entry of one workload point, side by side. make(candidate or "auto") -> (placement, launch)."""
    import torch

    from torch_l2topo.placement.choice import Candidate, persistent_ctas
    from torch_l2topo.placement.plans import SpeedModel, Workload, limit, make_plan, predict

    max_ctas = extra_info["max_ctas_per_sm"]
    auto, auto_launch = make("auto")
    settle(auto, auto_launch)
    decision = next(iter(auto.decisions.values()))
    entries = {"plain_kernel": launch_plain, "auto": auto_launch}
    for cand in pairs(max_ctas, -(-n_items // topo.n_sm), classes is not None):
        _, entries[cand.label] = make(cand)
    graphs = {}
    for name, launch in entries.items():
        launch()  # builds the plan (and compiles) outside capture
        torch.cuda.synchronize()
        check(name)
        graphs[name] = launch if EAGER else graph_of(launch, per_run).replay
    times = interleaved(graphs, reps, 1 if EAGER else per_run)
    plain = times["plain_kernel"]["p50"]
    c_star = persistent_ctas(max_ctas, n_items, topo.n_sm)
    uniform = times.get(Candidate("uniform", c_star).label, {}).get("p50")
    for t in times.values():
        t["vs_plain_kernel"] = t["p50"] / plain
        if uniform:
            t["vs_uniform"] = t["p50"] / uniform
    searched = {k: v for k, v in times.items() if k not in ("plain_kernel", "auto")}
    per_sm = -(-n_items // topo.n_sm)
    equal = times.get(Candidate("uniform", per_sm).label) if per_sm <= max_ctas else None
    best = min(searched, key=lambda k: searched[k]["p50"])
    speeds = SpeedModel.from_topology(topo)
    work = Workload(n_items, classes, loads)
    model = limit(speeds, work) / predict(make_plan("plain", speeds, work), speeds, work) if classes is not None \
        else None
    row = {"items": n_items, "items_per_sm": n_items / topo.n_sm, **extra_info,
           "plain_kernel_ms": plain, "auto_vs_plain_kernel": times["auto"]["vs_plain_kernel"],
           "auto_chose": decision.chosen.label, "auto_trial_launches": decision.launches,
           "auto_decision": decision.as_dict(), "auto_explain": decision.explain(),
           "best_fixed": best, "best_fixed_vs_plain_kernel": searched[best]["vs_plain_kernel"],
           "uniform_equal_concurrency_vs_plain_kernel": equal["vs_plain_kernel"] if equal else None,
           "limit_vs_plain_kernel_model_estimate": model, "entries": times}
    print(f"  {n_items / topo.n_sm:5.0f} items/SM: plain kernel {plain:8.4f} ms  auto {row['auto_vs_plain_kernel']:.3f}"
          f" ({row['auto_chose']}, {decision.launches} trials)  best {best} {row['best_fixed_vs_plain_kernel']:.3f}"
          + (f"  limit~{model:.3f}" if model else "")
          + (f"  uniform x{per_sm} {equal['vs_plain_kernel']:.3f}" if equal else ""), flush=True)
    return row


def triton_maker(fn, args, n_items, classes, loads, topo, num_warps, kwargs=None):
    """make(candidate or "auto") for a Triton kernel on the helpers."""
    from torch_l2topo.placement.sm_aware import sm_aware

    def make(cand):
        if cand == "auto":
            kernel = sm_aware(fn, num_warps=num_warps, topology=topo)
        else:
            kernel = sm_aware(fn, policy=cand.policy, ctas_per_sm=cand.ctas_per_sm, chunk=cand.chunk,
                              num_warps=num_warps, topology=topo)
        return kernel, lambda: kernel(*args, n_items=n_items, item_class=classes, loads_per_item=loads,
                                      **(kwargs or {}))

    return make


def max_ctas_of(fn, args, topo, num_warps) -> int:
    """CTAs per SM the kernel compiled in shares mode holds (what "auto" reads too)."""
    from torch_l2topo.placement.sm_aware import sm_aware

    return sm_aware(fn, num_warps=num_warps, topology=topo).occupancy(*args)


def _chase_items(dev, topo, m: int, shuffled: bool = False) -> tuple:
    """(items, dependent loads per item, the chase workload, a zeroed ends tensor) at m items per SM: ~3 ms of
    loads per SM whatever m (at least CHASE_MIN_LOADS per item); shuffled: classes in a random order."""
    import torch

    n = m * topo.n_sm
    loads = max(CHASE_LOADS_PER_SM // m, CHASE_MIN_LOADS)
    return (n, loads, chase_workload(dev, CHASE_TABLE_MB << 20, n, loads, shuffled=shuffled),
            torch.zeros(n, dtype=torch.int64, device=dev))


def bench_chase(dev, topo, reps) -> list:
    rows = []
    for m in ITEMS_PER_SM:
        n, loads, w, ends = _chase_items(dev, topo, m)

        def check(name, w=w, ends=ends):
            bad = np.flatnonzero(ends.cpu().numpy() != w.expected)
            if bad.size:
                raise AssertionError(f"chase {m}/SM, {name}: {bad.size} items ended elsewhere (first {bad[:5]})")
            ends.zero_()

        args = (w.starts, ends, loads)
        make = triton_maker(chase_kernel, args, n, w.classes, loads, topo, 1)
        def plain(w=w, ends=ends, n=n, loads=loads):
            return chase_plain_kernel[(n,)](w.starts, ends, loads, num_warps=1)
        info = {"loads_per_item": loads, "max_ctas_per_sm": max_ctas_of(chase_kernel, args, topo, 1),
                "partition_map_ms": w.map_s * 1e3}
        rows.append(run_point(make, plain, n, w.classes, loads, check, reps, 1, topo, info))
    return rows


def bench_gather(dev, topo, reps) -> list:
    import torch

    rows = []
    for m in ITEMS_PER_SM:
        n = m * topo.n_sm
        w = gather_workload(dev, GATHER_TABLE_MB << 20, n)
        out = torch.empty_like(w.reference)

        def check(name, w=w, out=out):
            torch.testing.assert_close(out, w.reference, rtol=1e-5, atol=1e-4, msg=lambda s: f"gather {name}: {s}")
            out.zero_()

        args = (w.table, w.idx, out, w.bag, w.dim)
        make = triton_maker(gather_kernel, args, n, w.classes, 1.0, topo, 1)
        def plain(w=w, out=out, n=n):
            return gather_plain_kernel[(n,)](w.table, w.idx, out, w.bag, w.dim, num_warps=1)
        info = {"bag_rows": w.bag, "max_ctas_per_sm": max_ctas_of(gather_kernel, args, topo, 1)}
        rows.append(run_point(make, plain, n, w.classes, 1.0, check, reps, 20, topo, info))
    return rows


def bench_capped(dev, topo, reps) -> list:
    """The capped chase (CUDA, 100 KB of shared memory per CTA): the CTAs per SM come from the CUDA occupancy
    API for each mode's kernel."""
    import torch

    from torch_l2topo.layout import PLACE_SHARES
    from torch_l2topo.measure.launch import cuda_ops, launch
    from torch_l2topo.placement.sm_aware import Placement

    ops = cuda_ops(dev)
    max_ctas = int(ops.capped_occupancy(PLACE_SHARES, CAPPED_SMEM))
    rows = []
    for m in CAPPED_ITEMS_PER_SM:
        n, loads, w, ends = _chase_items(dev, topo, m)
        no_plan, no_state = torch.zeros(1, dtype=torch.int32, device=dev), torch.zeros(1, dtype=torch.int64, device=dev)

        def check(name, w=w, ends=ends):
            bad = np.flatnonzero(ends.cpu().numpy() != w.expected)
            if bad.size:
                raise AssertionError(f"capped {m}/SM, {name}: {bad.size} items ended elsewhere")
            ends.zero_()

        def make(cand, w=w, ends=ends, n=n, loads=loads):
            placement = Placement(topology=topo, max_ctas_per_sm=max_ctas) if cand == "auto" else \
                Placement(policy=cand.policy, ctas_per_sm=cand.ctas_per_sm, chunk=cand.chunk, topology=topo,
                          max_ctas_per_sm=max_ctas)

            def run():
                placement(lambda grid, plan, state, place: launch("capped_chase", "cuda", grid, w.starts, ends, loads,
                                                                  plan, state, place, CAPPED_SMEM),
                          n_items=n, item_class=w.classes, loads_per_item=loads, device=dev)

            return placement, run

        def plain(w=w, ends=ends, n=n, loads=loads):  # the same kernel without the helpers (mode -1)
            launch("capped_chase", "cuda", n, w.starts, ends, loads, no_plan, no_state, -1, CAPPED_SMEM)

        info = {"loads_per_item": loads, "max_ctas_per_sm": max_ctas, "shared_bytes_per_cta": CAPPED_SMEM,
                "plain_kernel_ctas_per_sm": int(ops.capped_occupancy(-1, CAPPED_SMEM))}
        rows.append(run_point(make, plain, n, w.classes, loads, check, reps, 1, topo, info))
    return rows


def bench_diagnosis(dev, topo, reps) -> list:
    """Where each policy puts the chase's items and what each item costs: per item the SM that ran it (%smid),
    its start and end; summarized as the share of items run near their data, the spread of items per SM and the
    near/far item times. The chase at 1 and 4 items per SM, for plain, partition_queues and affine_weighted."""
    import torch
    from placement_workloads import traced_chase_kernel

    from torch_l2topo.analysis.labels import sm_labels
    from torch_l2topo.placement.sm_aware import sm_aware

    part = sm_labels(topo).partition
    rows = []
    for m in (1, 4):
        n, loads, w, ends = _chase_items(dev, topo, m)
        trace = torch.zeros(3 * n, dtype=torch.int64, device=dev)
        plain_kernel = sm_aware(traced_chase_kernel, policy="plain", num_warps=1, topology=topo)
        plain_trace = torch.zeros_like(trace)

        def after_plain(run):  # the placed launch right after a plain launch of the same items, as in the rounds
            def both():
                plain_kernel(w.starts, ends, loads, plain_trace, n_items=n, item_class=w.classes, loads_per_item=loads)
                run()
            return both

        for (policy, ctas), how in itertools.product((("plain", None), ("partition_queues", None),
                                                      ("affine_weighted", m)), ("eager", "graph", "after plain")):
            kernel = sm_aware(traced_chase_kernel, policy=policy, ctas_per_sm=ctas, num_warps=1, topology=topo)

            def run(kernel=kernel, w=w, ends=ends, loads=loads, trace=trace, n=n):
                kernel(w.starts, ends, loads, trace, n_items=n, item_class=w.classes, loads_per_item=loads)

            run()  # builds the plan
            replay = {"eager": run, "after plain": after_plain(run)}.get(how) or graph_of(run, 1).replay
            for _ in range(3):
                replay()
            torch.cuda.synchronize()
            check = np.flatnonzero(ends.cpu().numpy() != w.expected)
            if check.size:
                raise AssertionError(f"diagnosis {policy} {how}: {check.size} items ended elsewhere")
            t = trace.view(n, 3).cpu().numpy()
            sm, start, end = t[:, 0], t[:, 1] - t[:, 1].min(), t[:, 2] - t[:, 1].min()
            near = part[sm] == w.classes
            per_sm = np.bincount(sm, minlength=topo.n_sm)
            row = {"items_per_sm": m, "policy": policy, "launch": how, "near_share": float(near.mean()),
                   "items_per_sm_min_max": [int(per_sm.min()), int(per_sm.max())],
                   "sms_used": int((per_sm > 0).sum()), "makespan_us": float(end.max() / 1e3),
                   "near_item_us": float(np.median((end - start)[near]) / 1e3) if near.any() else None,
                   "far_item_us": float(np.median((end - start)[~near]) / 1e3) if (~near).any() else None,
                   "start_spread_us": float(np.quantile(start, 0.95) / 1e3)}
            rows.append(row)
            print(f"  {m}/SM {policy:17s} {how:11s} near {row['near_share']:.2f}  "
                  f"items/SM {row['items_per_sm_min_max']} "
                  f"on {row['sms_used']} SMs  makespan {row['makespan_us']:.0f} us  near {row['near_item_us']} "
                  f"far {row['far_item_us']} us  p95 start {row['start_spread_us']:.1f} us", flush=True)
    return rows


def _vs_plain_kernel(times: dict) -> dict:
    """Each entry's median over the hand plain kernel's, from interleaved()'s quantiles."""
    return {k: t["p50"] / times["plain_kernel"]["p50"] for k, t in times.items()}


def bench_uniform(dev, topo, reps) -> dict:
    """Where persistent `uniform` at equal concurrency (as many CTAs per SM as items per SM) loses to the hand plain
    kernel, in interleaved graph replays:
    - the chase at 16 and 32 items per SM, with its shares dealt (the default), in contiguous id blocks, and with
      no tail; then each traced (traced_chase_kernel: every item's SM, start and end): items per SM, the spread
      of item starts, the median item and the makespan, against the plain launch traced alike;
    - the gather at 1, 4 and 16 items per SM, against the two floors of any placement of its items: a static
      lookup of the item id (gather_lookup_kernel) and one atomic ticket then that lookup (gather_ticket_kernel),
      each the plain kernel plus only that;
    - the chase at 32 items per SM through chase_exit_kernel: which step of a shares-mode program's way out (a
      failed claim, the tail, the victim scan, the finish count) costs what, on a uniform plan with every item in a
      share (the real policy hands each program its item by program id at this concurrency: it runs alongside)."""
    return {"exit": _uniform_exit(dev, topo, reps), "chase": _uniform_chase(dev, topo, reps),
            "gather": _uniform_gather(dev, topo, reps)}


def _uniform_chase(dev, topo, reps) -> list:
    import torch
    from placement_workloads import traced_chase_kernel

    from torch_l2topo.placement.plans import SpeedModel
    from torch_l2topo.placement.sm_aware import sm_aware

    side = SpeedModel.from_topology(topo).partition  # each SM's L2 partition (-1: undecided)
    rows = []
    for m, shuffled in ((16, False), (32, False), (32, True)):
        n, loads, w, ends = _chase_items(dev, topo, m, shuffled)
        variants = {"uniform": {"policy": "uniform", "ctas_per_sm": m},
                    "uniform, blocks": {"policy": "uniform", "ctas_per_sm": m, "share_order": "blocks"},
                    "uniform, no tail": {"policy": "uniform", "ctas_per_sm": m, "tail_fraction": 0.0}}
        runs = {"plain_kernel": lambda: chase_plain_kernel[(n,)](w.starts, ends, loads, num_warps=1)}
        for name, options in variants.items():
            kernel = sm_aware(chase_kernel, num_warps=1, topology=topo, **options)
            runs[name] = (lambda k=kernel: k(w.starts, ends, loads, n_items=n, item_class=w.classes,
                                             loads_per_item=loads))
        for run in runs.values():
            run()
        times = interleaved({k: graph_of(f, GRAPH_LAUNCHES).replay for k, f in runs.items()}, reps,
                            per_run=GRAPH_LAUNCHES)
        row = {"items_per_sm": m, "classes": "shuffled" if shuffled else "alternating", "ms": times,
               "vs_plain_kernel": _vs_plain_kernel(times), "traced": {}}
        for name, options in {"plain": {"policy": "plain"}, **variants}.items():
            trace = torch.zeros(3 * n, dtype=torch.int64, device=dev)
            kernel = sm_aware(traced_chase_kernel, num_warps=1, topology=topo, **options)

            def run(kernel=kernel, trace=trace):
                kernel(w.starts, ends, loads, trace, n_items=n, item_class=w.classes, loads_per_item=loads)

            run()
            graph = graph_of(run, 1)
            for _ in range(3):
                graph.replay()
            torch.cuda.synchronize()
            if np.any(ends.cpu().numpy() != w.expected):
                raise AssertionError(f"uniform diagnosis, {name}: items ended elsewhere")
            t = trace.view(n, 3).cpu().numpy()
            sm, start, end = t[:, 0], t[:, 1] - t[:, 1].min(), t[:, 2] - t[:, 1].min()
            per_sm = np.bincount(sm, minlength=topo.n_sm)
            item = np.median(end - start)
            # the classes each SM ran: SMs whose items were all of one class (a far-only SM sets the makespan)
            is_far = (w.classes != side[sm]) & (side[sm] >= 0)
            far = np.bincount(sm, weights=is_far, minlength=topo.n_sm)
            took = (end - start) / 1e3
            row["traced"][name] = {
                "items_per_sm_min_max": [int(per_sm.min()), int(per_sm.max())],
                "far_items_per_sm_min_max": [int(far.min()), int(far.max())], "far_items": int(far.sum()),
                "start_us_p50_p95_max": [float(np.median(start) / 1e3), float(np.quantile(start, 0.95) / 1e3),
                                         float(start.max() / 1e3)],
                "items_starting_after_half_an_item": int(np.sum(start > item / 2)),
                "item_us_p50_max": [float(item / 1e3), float((end - start).max() / 1e3)],
                "near_far_item_us_p50_max": [[float(np.median(took[k])), float(took[k].max())] if k.any() else None
                                             for k in (~is_far, is_far)],
                "makespan_us": float(end.max() / 1e3)}
        rows.append(row)
        ratios = ", ".join(f"{k} {v:.3f}" for k, v in row["vs_plain_kernel"].items())
        print(f"  chase {m}/SM, {row['classes']} classes: {ratios}", flush=True)
        for name, tr in row["traced"].items():
            print(f"    traced {name}: {tr}", flush=True)
    return rows


def uniform_at_equal_concurrency(dev, topo, m: int) -> tuple:
    """The chase at m items per SM under persistent `uniform` at m CTAs per SM without a tail: (items, loads per
    item, workload, ends, a launch of it (built once), a launch of the same kernel on uniform's plan with every
    item in a share (the claim protocol: each program claims its item, then fails to claim another), and that
    plan's plan and state tensors, for the diagnoses that run their own kernels on it). The real policy's plan
    hands each program its item by program id (make_plan's grid), so it claims nothing at this concurrency."""
    from torch_l2topo.layout import PLACE_SHARES
    from torch_l2topo.placement.plans import SpeedModel, Workload, make_plan
    from torch_l2topo.placement.slots import PlanSlot
    from torch_l2topo.placement.sm_aware import sm_aware

    n, loads, w, ends = _chase_items(dev, topo, m)
    kernel = sm_aware(chase_kernel, num_warps=1, topology=topo, policy="uniform", ctas_per_sm=m, tail_fraction=0.0)

    def uniform():
        kernel(w.starts, ends, loads, n_items=n, item_class=w.classes, loads_per_item=loads)

    uniform()
    claims = PlanSlot(dev, topo.n_sm)
    claims.load(make_plan("uniform", SpeedModel.from_topology(topo), Workload(n, w.classes, loads), tail_fraction=0.0))

    def claimed():
        chase_kernel[(n,)](w.starts, ends, loads, claims.plan, claims.state, PLACE=PLACE_SHARES, num_warps=1)

    return n, loads, w, ends, uniform, claimed, claims.plan, claims.state


def check_each_once(runs: dict, ends, expected, label: str) -> None:
    """Run each entry once and check that every item ended where the reference says (ends zeroed after)."""
    import torch

    for name, run in runs.items():
        run()
        torch.cuda.synchronize()
        if np.any(ends.cpu().numpy() != expected):
            raise AssertionError(f"{label}, {name}: items ended elsewhere")
        ends.zero_()


def _uniform_exit(dev, topo, reps, m: int = 32) -> dict:
    """The chase at m items per SM through chase_exit_kernel at each EXIT step, against the plain kernel and the
    real uniform policy (all in graphs; the exit kernels' graphs zero the state before each launch, and so does
    one extra entry before the plain kernel, to time that memset alike)."""
    from placement_workloads import chase_exit_kernel

    n, loads, w, ends, uniform, claimed, plan, state = uniform_at_equal_concurrency(dev, topo, m)

    def exit_run(step):
        def run():
            state.zero_()
            chase_exit_kernel[(n,)](w.starts, ends, loads, plan, state, EXIT=step, num_warps=1)
        return run

    runs = {"plain_kernel": lambda: chase_plain_kernel[(n,)](w.starts, ends, loads, num_warps=1),
            "memset + plain_kernel": lambda: (state.zero_(), chase_plain_kernel[(n,)](w.starts, ends, loads,
                                                                                       num_warps=1)),
            "uniform": uniform, "uniform, every item claimed": claimed,
            **{f"exit {step}": exit_run(step) for step in range(6)}}
    check_each_once(runs, ends, w.expected, "uniform exit diagnosis")
    state.zero_()  # the claims plan's cursors start from zero again
    times = interleaved({k: graph_of(f, GRAPH_LAUNCHES).replay for k, f in runs.items()}, reps, per_run=GRAPH_LAUNCHES)
    ratios = _vs_plain_kernel(times)
    print(f"  chase {m}/SM, exit steps: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()), flush=True)
    return {"items_per_sm": m, "ms": times, "vs_plain_kernel": ratios}


def _uniform_gather(dev, topo, reps) -> list:
    import torch
    from placement_workloads import gather_lookup_kernel, gather_ticket_kernel

    from torch_l2topo.placement.sm_aware import sm_aware

    counters_n = 66  # divides every n = m * 132; elsewhere the ticket floor is left out
    rows = []
    for m in (1, 4, 16):
        n = m * topo.n_sm
        w = gather_workload(dev, GATHER_TABLE_MB << 20, n)
        out = torch.empty_like(w.reference)
        order = torch.arange(n, dtype=torch.int32, device=dev)
        counters = torch.zeros(counters_n, dtype=torch.int64, device=dev)
        args = (w.table, w.idx, out)
        runs = {"plain_kernel": lambda: gather_plain_kernel[(n,)](*args, w.bag, w.dim, num_warps=1),
                "lookup_floor": lambda: gather_lookup_kernel[(n,)](*args, order, w.bag, w.dim, num_warps=1)}
        if n % counters_n == 0:
            runs["ticket_floor"] = lambda: gather_ticket_kernel[(n,)](*args, order, counters, n // counters_n, w.bag,
                                                                      w.dim, counters_n, num_warps=1)
        for name, options in {"uniform": {}, "uniform, blocks": {"share_order": "blocks"}}.items():
            kernel = sm_aware(gather_kernel, num_warps=1, topology=topo, policy="uniform", ctas_per_sm=m, **options)
            runs[name] = lambda k=kernel: k(*args, w.bag, w.dim, n_items=n, item_class=w.classes, loads_per_item=1.0)
        for name, run in runs.items():
            run()
            torch.cuda.synchronize()
            torch.testing.assert_close(out, w.reference, rtol=1e-5, atol=1e-4, msg=lambda s: f"gather {name}: {s}")
            out.zero_()
        times = interleaved({k: graph_of(f, 20).replay for k, f in runs.items()}, reps, per_run=20)
        row = {"items_per_sm": m, "ms": times,
               "vs_plain_kernel": _vs_plain_kernel(times)}
        rows.append(row)
        print(f"  gather {m}/SM ({times['plain_kernel']['p50'] * 1e3:.1f} us): "
              + ", ".join(f"{k} {v:.3f}" for k, v in row["vs_plain_kernel"].items()), flush=True)
    return rows


OVERHEAD_POLICIES = ("plain", "partition_queues", "weighted", "auto")


def bench_overhead(dev, topo) -> dict:
    """Host time per launch (eager) and device time per launch (graph) of an empty workload (chases of 0 loads,
    one item per SM) through @sm_aware against the same kernel, plan and grid launched bare (kernel[grid](...),
    what a user writes) and lean (measure/lean_launch.py). host_overhead_us = @sm_aware's host time minus the
    bare launch's (median of 5 blocks of 2,000 calls, the three interleaved)."""
    import torch

    from torch_l2topo.measure.lean_launch import lean
    from torch_l2topo.placement.sm_aware import sm_aware

    n = topo.n_sm
    starts = torch.zeros(n, dtype=torch.int64, device=dev)
    ends = torch.zeros(n, dtype=torch.int64, device=dev)
    out = {}
    for policy in OVERHEAD_POLICIES:
        kernel = sm_aware(chase_kernel, policy=policy, num_warps=1, topology=topo)

        def wrapped():
            kernel(starts, ends, 0, n_items=n)

        if policy == "auto":
            settle(kernel, wrapped)
        else:
            wrapped()  # builds the plan
        chosen = policy if policy != "auto" else next(iter(kernel.decisions.values())).policy
        plan, state = kernel.plan_tensors(n, policy=chosen)
        place, grid = kernel.place(chosen), kernel.grid(dev, policy=chosen, n_items=n)
        slot = kernel.slot(n, policy=chosen)

        def bare():
            slot.prepare()
            chase_kernel[(grid,)](starts, ends, 0, plan, state, num_warps=1, PLACE=place)

        def lean_launch():
            slot.prepare()
            lean(chase_kernel)[(grid,)](starts, ends, 0, plan, state, num_warps=1, PLACE=place)

        calls = {"bare_triton": bare, "lean_triton": lean_launch, "sm_aware": wrapped}
        host = {name: [] for name in calls}
        for fn in calls.values():
            for _ in range(50):
                fn()
        for _ in range(5):
            for name, fn in calls.items():
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(2000):
                    fn()
                host[name].append((time.perf_counter() - t0) / 2000 * 1e6)
        torch.cuda.synchronize()
        row = {"chosen": chosen}
        for name, fn in calls.items():
            row[f"{name}_host_us"] = statistics.median(host[name])
            replay = graph_of(fn, 100).replay
            row[f"{name}_graph_us_per_launch"] = interleaved({"g": replay}, 20, 100)["g"]["p50"] * 1e3
        row["host_overhead_us"] = row["sm_aware_host_us"] - row["bare_triton_host_us"]
        row["graph_overhead_us"] = row["sm_aware_graph_us_per_launch"] - row["bare_triton_graph_us_per_launch"]
        out[policy] = row
        print(f"overhead {policy}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                                 for k, v in row.items()), flush=True)
    return out


def bench_partition_map_sizes(dev) -> dict:
    """partition_map of tensors of sizes not seen before in this process (cold plan), then again (warm), 3 sizes
    each; and the probe plan of further new sizes alone (GpuSetup.plan, what a new size adds; the issue's
    alternative target: well under a millisecond), median of 5 sizes."""
    import torch

    from torch_l2topo.placement.partition.maps import n_blocks_of, partition_map, setup_for

    out = {}
    for mb in (32, 40, 256):
        times = []
        for _ in range(2):
            t = torch.zeros((mb << 20) // 4, dtype=torch.float32, device=dev)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            partition_map(t)
            times.append((time.perf_counter() - t0) * 1e3)
            del t
        out[f"{mb}MB"] = {"first_size_ms": times[0], "seen_size_ms": times[1]}
        print(f"partition map {mb} MB: new size {times[0]:.1f} ms, seen size {times[1]:.1f} ms", flush=True)
    # several new sizes in a row, then the same sizes again: the first map after other work pays a warm-up of its
    # own, which the 32 MB row above carries
    series = {"sizes_mb": [32 + d for d in (3, -3, 4, -4, 5, -5, 6)]}
    for label in ("new_ms", "seen_ms"):
        series[label] = []
        for mb in series["sizes_mb"]:
            t = torch.zeros((mb << 20) // 4, dtype=torch.float32, device=dev)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            partition_map(t)
            series[label].append((time.perf_counter() - t0) * 1e3)
            del t
    out["sizes_in_a_row"] = series
    print(f"partition maps of new sizes 26-38 MB in a row: {np.round(series['new_ms'], 2).tolist()} ms; the same "
          f"sizes again: {np.round(series['seen_ms'], 2).tolist()} ms", flush=True)
    setup = setup_for(torch.device(dev).index or 0)
    plan_ms = []
    for mb in (43, 44, 45, 46, 47):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        setup.plan(n_blocks_of(mb << 20, 256), torch.device(dev))
        torch.cuda.synchronize()
        plan_ms.append((time.perf_counter() - t0) * 1e3)
    out["new_size_plan_ms"] = {"sizes_mb": [43, 44, 45, 46, 47], "ms": plan_ms, "median": float(np.median(plan_ms))}
    print(f"probe plan of a new size: {np.median(plan_ms):.3f} ms (median of 5)", flush=True)
    return out


TABLE = "placement"
RATIOS = ("auto_vs_plain_kernel", "best_fixed_vs_plain_kernel", "uniform_equal_concurrency_vs_plain_kernel")


def table_rows(figures: dict) -> list:
    """Per workload and items per SM: each entry's ms per launch and the ratios to the hand plain kernel; the
    @sm_aware launch overhead; a partition map's plan for a tensor size not seen before (the diagnosis parts,
    diagnosis and uniform, stay in the JSON)."""
    rows = []
    for part in ("chase", "gather", "capped"):
        rows += case_rows(figures.get(part, []), lambda r, p=part: f"{p}, {r['items_per_sm']:g} items per SM", "ms",
                          measured="entries", ratios=RATIOS)
    for policy, o in figures.get("overhead", {}).items():
        rows += [row(f"@sm_aware launch, policy {policy}", k, "us", o[k])
                 for k in ("host_overhead_us", "graph_overhead_us")]
    if "new_size_plan_ms" in figures.get("partition_map", {}):
        rows.append(row("partition map, new size", "plan_median", "ms",
                        figures["partition_map"]["new_size_plan_ms"]["median"]))
    return rows


PARTS = {"chase": bench_chase, "gather": bench_gather, "capped": bench_capped, "diagnosis": bench_diagnosis,
         "uniform": bench_uniform}


def main(argv=None) -> dict:
    p = gpu_parser(__doc__, reps=10)
    p.add_argument("--only", choices=(*PARTS, "overhead", "partition_map"), action="append")
    p.add_argument("--items-per-sm", type=int, nargs="*", help="a subset of the items per SM (default: all)")
    p.add_argument("--eager", action="store_true", help="time eager launches behind a GPU spin, as auto's trials "
                                                        "do, instead of CUDA graph replays (chase, gather, capped)")
    args = p.parse_args(argv)
    global ITEMS_PER_SM, CAPPED_ITEMS_PER_SM, EAGER
    EAGER = args.eager
    if args.items_per_sm:
        ITEMS_PER_SM = tuple(args.items_per_sm)
        CAPPED_ITEMS_PER_SM = tuple(m for m in args.items_per_sm if m <= max(CAPPED_ITEMS_PER_SM))
    dev, topo, calibration = calibrated_device(args.device, "placement")
    parts = args.only or (*PARTS, "overhead", "partition_map")
    figures = {"calibration": calibration, "reps": args.reps, "timing": "eager" if EAGER else "graph replays"}
    for part in parts:
        print(f"== {part}", flush=True)
        t0 = time.perf_counter()
        if part in PARTS:
            figures[part] = PARTS[part](dev, topo, args.reps)
        elif part == "overhead":
            figures[part] = bench_overhead(dev, topo)
        else:
            figures[part] = bench_partition_map_sizes(dev)
        print(f"   {part}: {time.perf_counter() - t0:.1f} s", flush=True)
        write_result(args.out, figures, args.device)  # keep what is done if a later part fails
    write_result(args.out, figures, args.device, TABLE, table_rows(figures))
    return figures


if __name__ == "__main__":
    main()
