"""The L2 geometry suite, recorded: every curve and derived number of `run_suite` as one result JSON
(benchmarks/results/geometry/geometry_<gpu>_<uuidhash>.json, with the environment, the command and the run
times; its key numbers appended to benchmarks/results/geometry.jsonl) and the curves the CPU tests read back
(tests/data/geometry/<name>.npz).

    python benchmarks/run_geometry.py [--quick] [--device N] [--out-dir DIR] [--curves-dir DIR]
    ncu -k regex:lanes_chase --metrics <counters> python benchmarks/run_geometry.py --ncu-target
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, row, write_json

from torch_l2topo.geometry.suite import contention_for_profiler, run_suite
from torch_l2topo.geometry.summary import summary_lines

ROOT = Path(__file__).resolve().parents[1]
TABLE = "geometry"
FOUND = {  # experiment: (number, unit) of what it found
    "first_touch": (("granule_bytes", "bytes"), ("hit_cycles", "cycles"), ("miss_cycles", "cycles")),
    "stride_sweep": (("line_bytes", "bytes"),),
    "capacity": (("effective_capacity_bytes", "bytes"),),
    "address_bits": (("partition_granularity_bytes", "bytes"), ("slice_classes", "count")),
    "contention": (("one_saturates_at_k", "lanes"), ("spread_saturates_at_k", "lanes")),
    "persisting": (("max_persisting_l2_bytes", "bytes"),),
}


def table_rows(result: dict) -> list:
    """What each experiment found (where it found it), and each experiment's run time."""
    e = result["experiments"]
    rows = [row(name, key, unit, e[name][key]) for name, found in FOUND.items() for key, unit in found
            if isinstance(e.get(name, {}).get(key), (int, float))]
    return rows + [row(name, "elapsed", "s", x["elapsed_s"]) for name, x in e.items() if "elapsed_s" in x]


def curves(result: dict) -> dict:
    """The arrays tests/test_geometry.py reads: first touch, capacity (all SMs warming, and one SM per
    partition on its own ring), stride and prefetch sweeps, contention, the home-partition flip fractions, the
    conflict-set grid (n lines x stride, aligned and control, with its hit and miss references)."""
    e = result["experiments"]
    out = {}
    if "granule_bytes" in e.get("first_touch", {}):
        ft = e["first_touch"]
        out.update(ft_k=ft["k_bytes"], ft_cycles=ft["second_load_cycles"])
    if "footprint" in e.get("capacity", {}):
        c = e["capacity"]
        out.update({f"cap_{k}": c[k] for k in ("footprint", "mean", "near", "far", "p0", "p1")})
    if "strides" in e.get("stride_sweep", {}):
        out.update(stride=e["stride_sweep"]["strides"], stride_cycles=e["stride_sweep"]["mean_cycles"])
    if "strides" in e.get("prefetch", {}):
        p = e["prefetch"]
        out.update(pf_stride=p["strides"], **{f"pf_{k}": p[k] for k in ("cold_regular", "cold_random",
                                                                           "warm_regular", "warm_random")})
    if "self_warmed" in e.get("capacity", {}):
        sw = e["capacity"]["self_warmed"]
        out.update(sw_footprint=sw["footprint"], sw_cycles=np.mean(sw["cycles"], axis=1), sw_cold=[sw["cold_cycles"]])
    if "k" in e.get("contention", {}):
        c = e["contention"]
        out.update(k=c["k"], one_rate=c["one_requests_per_ns"], spread_rate=c["spread_requests_per_ns"])
    if "partition_flip" in e.get("address_bits", {}):
        out.update(bits=e["address_bits"]["bits"], partition_flip=e["address_bits"]["partition_flip"])
    if "aligned_cycles" in e.get("conflict_sets", {}):
        c = e["conflict_sets"]
        out.update(cs_n=c["n_lines"], cs_stride=c["strides"], cs_aligned=c["aligned_cycles"],
                   cs_control=c["control_cycles"], cs_refs=[c["hit_cycles"], c["miss_cycles"]])
    return {k: np.asarray(v, dtype=np.float64) for k, v in out.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the quick suite (<= 20 s) instead of the full one")
    ap.add_argument("--device", type=int, default=0, help="CUDA device index")
    ap.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results" / "geometry"), help="result JSON")
    ap.add_argument("--curves-dir", default=str(ROOT / "tests" / "data" / "geometry"), help="curves the tests read")
    ap.add_argument("--ncu-target", action="store_true",
                    help="only the two contention launches, for `ncu -k regex:lanes_chase --metrics ...`")
    args = ap.parse_args(argv)
    if args.ncu_target:
        contention_for_profiler(args.device)
        return 0
    result = run_suite(quick=args.quick, device=args.device)
    result["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")  # which GPU --device 0 was
    env = environment(args.device)
    out = Path(args.out_dir)
    name = f"geometry{'_quick' if args.quick else ''}_h200_{env['uuid_hash']}" if "H200" in env["gpu"] else \
        f"geometry{'_quick' if args.quick else ''}_{env['uuid_hash']}"
    path = write_json(out / f"{name}.json", result, env, TABLE, table_rows(result))
    Path(args.curves_dir).mkdir(parents=True, exist_ok=True)
    np.savez_compressed(Path(args.curves_dir) / f"{name}.npz", **curves(result))
    print("\n".join(summary_lines(result)))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
