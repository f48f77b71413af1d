"""What the fleet jobs (tests/fleet_job.py on CPU, tests/fleet_gpu_job.py on GPUs) ask of a rank's Placement:
which device it asked calibrate() for and which calibration came back (calibrate() watched, not replaced)."""
import numpy as np

from torch_l2topo.measure import calibration
from torch_l2topo.placement.sm_aware import Placement


def placement_calibrations() -> tuple:
    """(calls, grid): each calibrate() call a persistent grid of one CTA per SM made on the current device, with
    the uuid hash and chain median of what it got, and the grid itself."""
    calls, real = [], calibration.calibrate

    def watched(device=None, **options):
        topo = real(device, **options)
        calls.append({"device": device, "uuid_hash": topo.meta["uuid_hash"],
                      "chain_median_cycles": float(np.median(topo.chain_cycles))})
        return topo

    calibration.calibrate = watched
    try:
        grid = Placement(policy="dynamic", ctas_per_sm=1).grid(n_items=4096)
    finally:
        calibration.calibrate = real
    return calls, grid
