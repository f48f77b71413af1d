"""Where a process's first partition_map spends its host time, piece by piece, each run in a fresh process: importing
the map module, the calibration, what maps derive from it (SM labels and pairs, or the file kept for it), the
probe plan for the tensor's size and, with a GPU, the probe (Triton's import, the launch, the wait) and the decision.

Without --device (any machine, no GPU needed): a bundled calibration (--example) stands in for the GPU's, read as
calibrate() reads its cache, and each process stops where the probe would launch (the plan's per-block work, GPU
launches on a GPU, runs on the CPU). With --device N: the real first call on that GPU, its calibration from the
cache (calibrate()), and a second tensor's call after it. The first process starts without the derived file
(--example: an empty cache of the run's own; --device: the GPU's file removed, then kept again), the others find
it. Times in ms; "scipy" says whether the process imported it.

    python benchmarks/diagnose/diag_partition_map_first_call.py --example h100 --runs 4
    python benchmarks/diagnose/diag_partition_map_first_call.py --device 0 --runs 4 \\
        --out benchmarks/results/diagnosis/partition_first_call_h100.json
    python -m torch_l2topo build && python benchmarks/diagnose/diag_partition_map_first_call.py --device 0 \\
        --backend auto
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]


def child(example: str | None, device: int | None, mb: int, cold: bool, backend: str = "triton") -> dict:
    """One fresh process's first call, timed by piece (ms), as JSON-able values. cold: check that the derived file
    is not there yet (--example runs only; the parent removes the GPU's). backend: partition_map's."""
    t0 = time.perf_counter()
    import torch

    t1 = time.perf_counter()
    if device is not None:  # the user's tensors exist before the first map: not part of its cost
        tensors = [torch.empty(mb << 20, dtype=torch.uint8, device=f"cuda:{device}") for _ in range(2)]
        torch.cuda.synchronize(device)
    t2 = time.perf_counter()
    from torch_l2topo.placement.partition import maps as pm

    t3 = time.perf_counter()
    sys.path.insert(0, str(BENCH))  # common, after the timed imports
    from common import time_each_call

    from torch_l2topo.measure import calibration as cal
    from torch_l2topo.placement.partition import calibrated as cp

    times = defaultdict(list)
    time_each_call(pm, "calibrated", times, "derived data: read or derive")
    original_derive = cp.derive

    def derive(topology):  # its pieces: the analysis imports (scipy), the labels inside sm_labels, the pairs
        t = time.perf_counter()
        from torch_l2topo.analysis import labels

        times["derive: import labels (scipy)"].append(time.perf_counter() - t)
        time_each_call(labels, "sm_labels", times, "derive: sm_labels")
        time_each_call(cp, "choose_pairs", times, "derive: choose_pairs")
        return original_derive(topology)

    cp.derive = derive
    time_each_call(pm.GpuSetup, "plan", times, "plan")
    out = {"import torch": 1e3 * (t1 - t0), "import maps": 1e3 * (t3 - t2)}
    if device is None:
        from torch_l2topo.bundled import example_path
        from torch_l2topo.topology import Topology

        t = time.perf_counter()
        topo = Topology.load(example_path(example))  # what calibrate() does with its cache's file
        out["calibration (file read)"] = 1e3 * (time.perf_counter() - t)
        if cold and cp.derived_path(topo).exists():
            raise SystemExit(f"a derived file exists in a cache meant to be empty: {cp.derived_path(topo)}")
        t = time.perf_counter()
        setup = pm.GpuSetup.of(topo)
        setup.plan(pm.n_blocks_of(mb << 20, 256), torch.device("cpu"))
        out["first call, import included (stops before the launch)"] = (
            1e3 * (time.perf_counter() - t) + out["calibration (file read)"] + out["import maps"])
    else:
        time_each_call(cal, "calibration_for", times, "calibration (calibrate: device query, file read)")
        first_launch = "Triton's JIT lookup" if backend == "triton" else "loading the CUDA extension"
        time_each_call(pm, "probe_timings", times, f"probe: launches and wait ({first_launch})")
        probe = pm.probe_timings

        def probe_timings(*args, **kwargs):  # its first piece: importing Triton and the probe's kernel module
            if kwargs["backend"] == "triton":
                t = time.perf_counter()
                import torch_l2topo.triton_kernels.partition_probe  # noqa: F401

                times["probe: import Triton and the kernel"].append(time.perf_counter() - t)
            return probe(*args, **kwargs)

        pm.probe_timings = probe_timings
        time_each_call(pm, "classify_blocks", times, "decision")
        triton_before = "triton" in sys.modules
        t = time.perf_counter()
        pm.partition_map(tensors[0], backend=backend)
        out["first call, import included"] = 1e3 * (time.perf_counter() - t) + out["import maps"]
        t = time.perf_counter()
        pm.partition_map(tensors[1], backend=backend)
        out["second tensor's call"] = 1e3 * (time.perf_counter() - t)
        out["triton imported before"] = triton_before
    out.update({k: 1e3 * v[0] for k, v in times.items()})
    out["scipy"] = "scipy" in sys.modules
    return out


def run(args, index: int, env: dict) -> dict:
    cmd = [sys.executable, __file__, "--child", "--mb", str(args.mb), "--backend", args.backend]
    cmd += ["--example", args.example] if args.device is None else ["--device", str(args.device)]
    cmd += ["--cold"] if index == 0 and args.device is None else []
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode:
        raise SystemExit(f"run {index} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.splitlines()[-1])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--example", default="h100", help="bundled calibration standing in for the GPU's (no --device)")
    p.add_argument("--device", type=int, help="time the real first call on this GPU")
    p.add_argument("--runs", type=int, default=4, help="fresh processes; the first without the derived file")
    p.add_argument("--mb", type=int, default=16, help="the tensor's size in MiB")
    p.add_argument("--out", help="write the runs as a result file (with --device: the GPU's environment)")
    p.add_argument("--backend", default="triton", choices=("triton", "cuda", "auto"),
                   help="partition_map's probe (cuda, auto: build the extension first, python -m torch_l2topo build)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cold", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.example, args.device, args.mb, args.cold, args.backend)))
        return
    env = dict(os.environ, OPENBLAS_NUM_THREADS=os.environ.get("OPENBLAS_NUM_THREADS", "1"))
    with tempfile.TemporaryDirectory(prefix="l2topo-first-call-") as cache:
        if args.device is None:
            env["TORCH_L2TOPO_CACHE"] = cache  # an empty cache of this run's own
            # the plan's per-block ops, a GPU's launches, run here on the CPU: torch's first parallel op would start
            # its thread pool (~45 ms on a 2-core machine), which the GPU's call never does
            env["OMP_NUM_THREADS"] = "1"
        else:  # the GPU's own cache, without the derived file: the first run derives and keeps it again
            from torch_l2topo.measure.calibration import calibrate
            from torch_l2topo.placement.partition.calibrated import derived_path

            derived_path(calibrate(args.device)).unlink(missing_ok=True)
        runs = [run(args, i, env) for i in range(args.runs)]
    keys = list(dict.fromkeys(k for r in runs for k in r))
    print(f"{'piece (ms)':52s}" + "".join(f"{'run ' + str(i) + (' cold' if i == 0 else ''):>12s}"
                                          for i in range(len(runs))))
    for k in keys:
        cells = [r.get(k, "") for r in runs]
        print(f"{k:52s}" + "".join(f"{c:>12.1f}" if isinstance(c, float) else f"{str(c):>12s}" for c in cells))
    if args.out:
        sys.path.insert(0, str(BENCH))
        from common import cpu_environment, write_json, write_result

        figures = {"mb": args.mb, "backend": args.backend, "runs": runs,
                   "example": args.example if args.device is None else None}
        if args.device is None:
            write_json(args.out, figures, cpu_environment())
        else:
            write_result(args.out, figures, args.device)


if __name__ == "__main__":
    main()
