"""Plan SM-aware placement for a latency-bound workload, and (on a GPU) run a kernel with @sm_aware.

Without a GPU: the default bundled calibration, a workload whose items read data homed half in each L2
partition, and what each policy's plan predicts against the best achievable makespan. With one: the same,
then the placement demo kernel launched through @sm_aware(policy="auto"), which times the candidate
placements on this GPU beside a plain launch and keeps the fastest (never one slower than plain).

    python examples/plan_placement.py
"""
import numpy as np
import torch

import torch_l2topo
from torch_l2topo.placement.plans import SpeedModel, Workload, limit, make_plan, predict


def main() -> dict:
    gpu = torch.cuda.is_available()
    topo = torch_l2topo.calibrate() if gpu else torch_l2topo.load_example()
    speeds = SpeedModel.from_topology(topo)
    n_items = 64 * topo.n_sm
    work = Workload(n_items, item_class=(np.arange(n_items) % 2).astype(np.int8), loads_per_item=320)
    best = limit(speeds, work)
    predicted = {}
    print(f"{topo.meta['device']['name']} ({'this GPU' if gpu else 'bundled calibration'}): {n_items} items, "
          f"half homed in each L2 partition; limit {best / 1e6:.3f} M cycles")
    for policy in ("uniform", "weighted", "partition_affine", "affine_weighted", "partition_queues"):
        predicted[policy] = predict(make_plan(policy, speeds, work), speeds, work)
        print(f"  {policy:17s} predicted {predicted[policy] / 1e6:.3f} M cycles "
              f"({100 * (predicted[policy] / predicted['uniform'] - 1):+.1f}% vs uniform)")
    if gpu:
        from torch_l2topo.placement.sm_aware import sm_aware
        from torch_l2topo.triton_kernels.placement_demo import checksum_kernel

        kernel = sm_aware(checksum_kernel, policy="auto", num_warps=4)
        total = torch.zeros(16, dtype=torch.int64, device="cuda")
        count = torch.zeros(n_items, dtype=torch.int32, device="cuda")
        while not kernel.decisions:
            kernel(total, count, 16, n_items=n_items, item_class=work.classes())
            torch.cuda.synchronize()
        print("  @sm_aware(policy='auto') on this GPU: " + kernel.explain().replace("\n", "\n  "))
    return predicted


if __name__ == "__main__":
    from torch_l2topo.cli import run_script  # a closed pipe (`| head`) ends it quietly

    raise SystemExit(run_script(main))
