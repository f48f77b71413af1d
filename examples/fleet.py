"""The fleet of a torchrun job: each rank calibrates its own GPU (or takes it from the cache), the job gathers one
table of every GPU with their fingerprint distances and DCGM-style health lines.

    torchrun --nproc_per_node=2 examples/fleet.py   # one rank per GPU
    python examples/fleet.py                        # one process: a fleet of one (a bundled map without a GPU)
"""
import torch

import torch_l2topo
import torch_l2topo.distributed as l2dist


def main() -> l2dist.Fleet:
    with l2dist.torchrun_group() as joined:
        rank = torch.distributed.get_rank() if joined else 0
        topology = None
        if not torch.cuda.is_available():
            topology = torch_l2topo.load_example()  # no GPU here: report a real bundled calibration instead
        fleet = l2dist.gather_fleet(topology)
    if rank == 0:
        ranks = f"{len(fleet.table)} rank(s) of a torchrun job" if joined else "this process alone (not under torchrun)"
        source = f"a bundled calibration of an {topology.meta['device']['name']} (no GPU here)" \
            if topology is not None else "its own GPU's calibration"
        print(f"gathered the L2 maps of {ranks}, each reporting {source}:\n")
        print(fleet.summary())
    return fleet


if __name__ == "__main__":
    from torch_l2topo.cli import run_script  # a closed pipe (`| head`) ends it quietly

    raise SystemExit(run_script(main))
