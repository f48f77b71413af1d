"""Launch every kernel of the package once, small, for compute-sanitizer (benchmarks/run_sanitizer.sh).

Each kernel runs through its normal host path with sizes that keep the sanitizer's slowdown to seconds;
watchdog timeouts are generous because instrumented kernels run far slower. Prints one line per kernel:
"ok <name>" or "FAILED <name>: <error>", and exits non-zero if any failed.

    python -m torch_l2topo calibrate --out /tmp/cal.npz
    compute-sanitizer --tool memcheck python benchmarks/sanitize_kernels.py /tmp/cal.npz
"""
from __future__ import annotations

import argparse
import sys
import traceback

TIMEOUT_S = 60.0


def kernels(device, topo):
    """(name, thunk) for every kernel of the package; topo: a calibration of this GPU."""
    import torch

    from torch_l2topo.device import device_info
    from torch_l2topo.identity.selfloc import measure_signatures
    from torch_l2topo.measure.oracles import measure_oracles
    from torch_l2topo.measure.probes import line_buffer, run_chain, run_lines
    from torch_l2topo.measure.rings import ring_plan

    n_sm = device_info(device.index).sm_count
    out = []
    for backend in ("triton", "cuda"):
        out.append((f"chain_probe[{backend}]", lambda b=backend: run_chain(
            device, n_sm, ring_plan(256, n_sm, seed=0), b, "waves", TIMEOUT_S, repeats=2, settle=16)))
        out.append((f"line_probe[{backend}]", lambda b=backend: run_lines(
            device, n_sm, 32, 2, 8, b, "waves", TIMEOUT_S)))
        out.append((f"whereami[{backend}]", lambda b=backend: measure_signatures(
            line_buffer(64, device), list(range(0, 64, 8)), 2 * n_sm, b)))
    out.append(("latency_oracle[triton]", lambda: measure_oracles(device, programs=2)))
    if torch.cuda.get_device_capability(device) >= (9, 0):
        from torch_l2topo.measure.gpc_probe import gpc_ground_truth

        out.append(("cluster_probe[cuda]", lambda: gpc_ground_truth(device.index, rounds=1)))

    def occupy():
        from torch_l2topo.triton_kernels.occupy import occupy_sms

        stream, held = occupy_sms(device, [0, 1], seconds=0.01)
        stream.synchronize()

    out.append(("occupy[triton]", occupy))
    out += optional_kernels(device, topo)
    return out


def optional_kernels(device, topo):
    """Kernels of the placement and partition-map modules, given a calibration of this GPU made outside the
    sanitizer (run_sanitizer.sh does it): under instrumentation the latencies are not the GPU's, and a
    calibration's clock warm-up runs cuBLAS kernels, whose asynchronous copies the sanitizer cannot follow
    (racecheck and initcheck flag them; they are not ours to check)."""
    import numpy as np
    import torch

    from torch_l2topo.measure.launch import launch
    from torch_l2topo.placement.partition.check import reprobe
    from torch_l2topo.placement.partition.maps import partition_map
    from torch_l2topo.placement.sm_aware import Placement

    data = torch.zeros(1 << 18, device=device)
    out = [("partition_probe[triton]", lambda: partition_map(data, topology=topo, timeout_s=TIMEOUT_S)),
           ("partition_reprobe[triton]", lambda: reprobe(data, np.arange(0, 4096, 64), topology=topo,
                                                         timeout_s=TIMEOUT_S, warmup_ms=0))]

    def placement(backend, policy):
        n = 1000
        total = torch.zeros(16, dtype=torch.int64, device=device)
        count = torch.zeros(n, dtype=torch.int32, device=device)
        Placement(policy=policy, topology=topo)(lambda grid, plan, state, place: launch(
            "placement_demo", backend, grid, total, count, 16, plan, state, place), n_items=n, device=device)
        torch.cuda.synchronize(device)
        assert np.all(count.cpu().numpy() == 1)

    for backend in ("triton", "cuda"):
        for policy in ("dynamic", "weighted", "partition_queues", "plain"):
            out.append((f"placement_demo[{backend},{policy}]", lambda b=backend, p=policy: placement(b, p)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("calibration", help="a calibration of this GPU (.npz), made outside the sanitizer")
    args = ap.parse_args(argv)

    import torch

    from torch_l2topo import Topology

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    topo = Topology.load(args.calibration)
    failed = 0
    for name, thunk in kernels(device, topo):
        try:
            thunk()
            torch.cuda.synchronize(device)
            print(f"ok {name}", flush=True)
        except Exception as exc:  # report every kernel, then fail
            failed += 1
            print(f"FAILED {name}: {type(exc).__name__}: {exc}", flush=True)
            traceback.print_exc()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
