"""One rank of the GPU fleet job of tests/test_fleet_gpu.py, started by `torchrun --nproc_per_node=N
tests/fleet_gpu_job.py OUT_DIR`: the job's fleet (NCCL, each rank on its LOCAL_RANK GPU), and which calibration each
rank's Placement takes (calibrate() watched, not replaced). Writes OUT_DIR/fleet.json (rank 0) and
OUT_DIR/placement-rank<r>.json."""
import json
import sys
from pathlib import Path

from placement_watch import placement_calibrations

from torch_l2topo.device import device_info
from torch_l2topo.distributed import gather_fleet, torchrun_group


def main(out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    out = Path(out_dir)
    with torchrun_group() as joined:
        assert joined, "run me under torchrun"
        rank = dist.get_rank()
        fleet = gather_fleet(timeout_s=120, progress=lambda line: print(line, flush=True))
        # a persistent grid of one CTA per SM on the current device (torchrun_group set it): takes its calibration
        calls, grid = placement_calibrations()
        current = torch.cuda.current_device()
        doc = {"rank": rank, "current_device": current, "own_uuid_hash": device_info(current).uuid_hash,
               "calls": calls, "grid": grid}
        (out / f"placement-rank{rank}.json").write_text(json.dumps(doc))
        if rank == 0:
            (out / "fleet.json").write_text(fleet.to_json())
            print(fleet.summary())


if __name__ == "__main__":
    main(sys.argv[1])
