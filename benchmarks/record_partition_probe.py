"""Record the partition probe's raw timings on the local GPU, with independent serialized re-probes, for
offline analysis of the block classifier (partition_decision.classify_blocks) and its CPU tests.

For tensors of --sizes MB: the map probe's raw timings (cycles per load, 2 timings per block, by SM pairs:
4-load means in recordings made before 2026-11-30 23:00 UTC, the minimum of 4 single loads since) twice,
and the serialized re-probe (the calibration's best pair, 16 loads, one SM at a time) of every block of
the smallest tensor and of a sample of the others. Everything goes to one .npz.

    python benchmarks/record_partition_probe.py --device 0 --out /tmp/partition_gpu0.npz  # tests: tests/data/partition/
"""
from __future__ import annotations

import argparse

import numpy as np
from common import command_line


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--sizes", type=int, nargs="+", default=[2, 32])
    p.add_argument("--sample", type=int, default=4096)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    import torch

    import torch_l2topo
    from torch_l2topo.analysis.labels import sm_labels
    from torch_l2topo.measure.calibration import measuring
    from torch_l2topo.placement.partition import maps as pm
    from torch_l2topo.placement.partition.check import reprobe
    from torch_l2topo.placement.partition.pairs import choose_pairs, probe_plan, timers_of_blocks

    dev = torch.device("cuda", args.device)
    torch.cuda.set_device(dev)
    topo = torch_l2topo.calibrate(dev)
    labels = sm_labels(topo)
    pairs = choose_pairs(topo.line_cycles, labels.partition, labels.line_partition)
    data = {"command": np.array(command_line()), "uuid_hash": np.array(topo.meta["uuid_hash"]),
            "sm_partition": labels.partition, "near": labels.near_cycles, "far": labels.far_cycles,
            "pairs": pairs.sms}
    rng = np.random.default_rng(0)
    for i, mb in enumerate(sorted(args.sizes)):
        t = torch.randn((mb << 20) // 4, device=dev)
        n_blocks = pm.n_blocks_of(t.untyped_storage().nbytes(), 256)
        plan = probe_plan(n_blocks, pairs.sms, topo.n_sm)
        with measuring(args.device):
            for r in range(2):
                data[f"mb{mb}_cycles_r{r}"], data[f"mb{mb}_probe_s_r{r}"] = pm.run_probe(t, plan, topo.n_sm)
        data[f"mb{mb}_plan"] = plan
        data[f"mb{mb}_timers"] = timers_of_blocks(plan, n_blocks)
        sample = np.arange(n_blocks) if i == 0 else np.sort(rng.choice(n_blocks, args.sample, replace=False))
        check = reprobe(t, sample, topology=topo)
        data[f"mb{mb}_reprobe_blocks"] = check.blocks
        data[f"mb{mb}_reprobe_cycles"] = check.cycles
        data[f"mb{mb}_reprobe_sms"] = check.sms
        data[f"mb{mb}_reprobe_homes"] = check.homes
        print(f"{mb} MB: {n_blocks} blocks, probe {data[f'mb{mb}_probe_s_r0'] * 1e3:.1f} ms, reprobe "
              f"{check.elapsed_s * 1e3:.0f} ms of {len(sample)} blocks", flush=True)
        del t
    np.savez_compressed(args.out, **data)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
