"""Unmodified ops on chosen SMs through green contexts (torch_l2topo.on_sms): does it help a latency-bound op?

1. The SM groups of the driver's split, each group's SM ids (census) and how its SMs fall in the
   calibration's L2 partitions and chain latency.
2. An unmodified latency-bound kernel: a plain Triton kernel (no placement helpers), one single-warp program
   per walk, each walk a chain of dependent loads through lines all homed in partition 0. Launched as is
   (the hardware places the programs on any SM), and inside on_sms() on the groups near partition 0, the
   groups near partition 1 (the control: should be slower), and the groups of lowest chain latency.
3. An unmodified torch op, latency-bound: F.embedding_bag over few bags of an L2-resident table (rows of
   both partitions), as is and on the 64 / 32 lowest-latency SMs; and the same op at full size (throughput
   bound) on 64 SMs, to show what a restriction costs there.
4. What entering on_sms() costs: a tiny op with and without the block, host time per call.
Every result is checked against the run as is; makespan = CUDA-event time, median over --reps rounds in
which every variant runs once (interleaved, so that clock and cache drift touch all variants alike).

    python benchmarks/bench_green.py --device 0 --out benchmarks/results/green/green_h200_<uuid>.json
"""
from __future__ import annotations

import contextlib
import time

import numpy as np
from common import calibrated_device, gpu_parser, quantile_rows, row, write_result
from placement_workloads import chase_plain_kernel, chase_workload

import torch_l2topo
import torch_l2topo.placement.green_contexts
from torch_l2topo.measure.timing import interleaved

CHASE_MB = 16
CHASE_LOADS = 2048
CHASE_WALKS = (32, 64)     # one program per walk
SM_COUNTS = (32, 64)       # SMs of the green context


def describe_groups(groups, topo) -> list:
    from torch_l2topo.analysis.labels import sm_labels

    part = sm_labels(topo).partition
    return [{"index": g.index, "sms": list(g.sms),
             "in_partition": [int((part[list(g.sms)] == p).sum()) for p in (0, 1)],
             "mean_chain_cycles": float(topo.chain_cycles[list(g.sms)].mean())} for g in groups]


def side_by_side(variants: dict, reps: int) -> dict:
    """{label: quantiles of ms, sms, vs_as_is}: variants = {label: (n_sm, near, launch)}, each launched inside
    on_sms(n_sm, near=near) (n_sm None: as is), in interleaved rounds. The events are recorded on the caller's
    stream around the block, so a time includes the block's stream hand-offs: what a user pays."""
    def inside(n_sm, near, launch):
        def run():
            with torch_l2topo.on_sms(n_sm, near=near):
                launch()
        return run if n_sm else launch

    # 3 untimed rounds, then every variant once a round in a fixed order, read at the end
    timed = interleaved({label: inside(*v) for label, v in variants.items()}, reps, warmup=3, alternate=False)
    out = {label: m.quantiles() for label, m in timed.items()}
    for label, (n_sm, near, _) in variants.items():
        sel = torch_l2topo.green_contexts.select(n_sm, near=near) if n_sm else None
        out[label]["sms"] = None if sel is None or sel.sms is None else len(sel.sms)
        out[label]["vs_as_is"] = out[label]["p50"] / out["as_is"]["p50"]
    return out


CHASE_VARIANTS = (("as_is", None, None), ("near_p0", 32, 0), ("near_p1", 32, 1), ("lowest_latency", 32, None),
                  ("near_p0_64", 64, 0), ("near_p1_64", 64, 1))


def bench_chase(dev, topo, reps) -> dict:
    import torch

    w = chase_workload(dev, CHASE_MB << 20, 2 * max(CHASE_WALKS), CHASE_LOADS)
    mine = np.flatnonzero(w.classes == 0)  # walks through lines homed in partition 0 only
    out = {"ring_lines": w.ring_lines, "loads": CHASE_LOADS}
    for n_walks in CHASE_WALKS:
        starts = w.starts[torch.from_numpy(mine[:n_walks]).to(dev)]
        ends = torch.zeros(n_walks, dtype=torch.int64, device=dev)

        def launch():
            chase_plain_kernel[(n_walks,)](starts, ends, CHASE_LOADS, num_warps=1)

        for label, n_sm, near in CHASE_VARIANTS:  # each variant's result, checked once
            ends.zero_()
            with torch_l2topo.on_sms(n_sm, near=near) if n_sm else contextlib.nullcontext():
                launch()
            torch.cuda.synchronize()
            if not np.array_equal(ends.cpu().numpy(), w.expected[mine[:n_walks]]):
                raise AssertionError(f"chase {n_walks} walks, {label}: walks ended elsewhere")
        rows = side_by_side({label: (n_sm, near, launch) for label, n_sm, near in CHASE_VARIANTS}, reps)
        out[f"{n_walks}_walks"] = rows
        print(f"chase {n_walks} walks:", {k: (round(v['p50'], 4), round(v['vs_as_is'], 3)) for k, v in rows.items()},
              flush=True)
    return out


def bench_embedding_bag(dev, topo, reps) -> dict:
    import torch
    import torch.nn.functional as F

    table = torch.randn((16 << 20) // 256, 64, device=dev)
    out = {}
    for n_bags, variants in ((132, (("as_is", None), ("lowest_latency_64", 64), ("lowest_latency_32", 32))),
                             (65536, (("as_is", None), ("lowest_latency_64", 64)))):
        idx = torch.randint(0, table.shape[0], (n_bags, 32), device=dev)
        ref = F.embedding_bag(idx, table, mode="sum")
        result = {}

        def launch():
            result["y"] = F.embedding_bag(idx, table, mode="sum")

        for label, n_sm in variants:
            with torch_l2topo.on_sms(n_sm) if n_sm else contextlib.nullcontext():
                launch()
            torch.cuda.synchronize()
            torch.testing.assert_close(result["y"], ref, msg=lambda m: f"embedding_bag {label}: {m}")
        rows = side_by_side({label: (n_sm, None, launch) for label, n_sm in variants}, reps)
        out[f"{n_bags}_bags"] = rows
        print(f"embedding_bag {n_bags} bags:", {k: (round(v['p50'], 4), round(v['vs_as_is'], 3))
                                                for k, v in rows.items()}, flush=True)
    return out


def bench_overhead(dev, topo) -> dict:
    import torch

    x = torch.zeros(1, device=dev)
    res = {}
    for label in ("as_is", "on_sms"):
        for attempt in range(2):  # the first round builds the context and warms up
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(1000):
                if label == "on_sms":
                    with torch_l2topo.on_sms(32, topology=topo):
                        x.add_(1)
                else:
                    x.add_(1)
            torch.cuda.synchronize()
            res[f"{label}_host_us"] = (time.perf_counter() - t0) / 1000 * 1e6
    res["overhead_us"] = res["on_sms_host_us"] - res["as_is_host_us"]
    print("overhead", res, flush=True)
    return res


TABLE = "green"


def table_rows(figures: dict) -> list:
    """Makespans (ms) per workload and variant (as is, on chosen SMs), and on_sms()'s host overhead."""
    rows = [r for part in ("chase", "embedding_bag") for case, variants in figures[part].items()
            if isinstance(variants, dict) for r in quantile_rows(variants, f"{part} {case}", "ms")]
    return rows + [row("on_sms", "overhead", "us", figures["overhead"]["overhead_us"])]


def main(argv=None) -> dict:
    args = gpu_parser(__doc__, reps=30).parse_args(argv)
    from torch_l2topo.placement.green_contexts import sm_groups

    dev, topo, calibration = calibrated_device(args.device, "green")  # cached: on_sms() ranks with it
    t0 = time.perf_counter()
    groups = sm_groups(dev)
    figures = {"calibration": calibration, "groups": describe_groups(groups, topo),
               "groups_s": time.perf_counter() - t0}
    print(f"{len(groups)} groups in {figures['groups_s']:.2f} s:", [(g['sms'][:4], g['in_partition'])
                                                                     for g in figures["groups"]], flush=True)
    for part, fn in (("chase", bench_chase), ("embedding_bag", bench_embedding_bag)):
        figures[part] = fn(dev, topo, args.reps)
        write_result(args.out, figures, args.device)
    figures["overhead"] = bench_overhead(dev, topo)
    write_result(args.out, figures, args.device, TABLE, table_rows(figures))
    return figures


if __name__ == "__main__":
    main()
