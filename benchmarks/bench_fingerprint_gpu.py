"""Calibrations for the fingerprint's within-device distances: a fresh process, and after sustained load.

Each call is one process: optionally keeps every SM busy (matrix products) for --burn-s seconds, then
calibrates with both backends (force, no cache) and saves the calibrations (uuid hashed) as
h200-<uuid hash>-<backend>-waves-<phase>.npz. The distances are computed on CPU by bench_fingerprint.py.

    python benchmarks/bench_fingerprint_gpu.py --device 0 --phase restart --out tests/data/calibrations
    python benchmarks/bench_fingerprint_gpu.py --device 0 --phase load --burn-s 120 --out ...
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from common import command_line


def burn(device: int, seconds: float) -> float:
    """Full load: back-to-back bf16 matrix products on every SM for `seconds`; returns TFLOP/s achieved."""
    import torch

    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(20):
            torch.mm(a, b)
        torch.cuda.synchronize(device)
        n += 20
    return 2 * 8192**3 * n / (time.perf_counter() - start) / 1e12


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--phase", required=True, help="label in the file name: restart, load, ...")
    p.add_argument("--burn-s", type=float, default=0.0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    import torch_l2topo

    tflops = burn(args.device, args.burn_s) if args.burn_s > 0 else None
    for backend in ("triton", "cuda"):
        topo = torch_l2topo.calibrate(args.device, backend=backend, use_cache=False)
        extra = {"phase": args.phase, "burn_s": args.burn_s, "burn_tflops": tflops}
        path = Path(args.out) / f"h200-{topo.meta['uuid_hash'][:6]}-{backend}-waves-{args.phase}.npz"
        topo.export_copy(command=command_line(), **extra).save(path)
        print(f"saved {path} (burn {args.burn_s:.0f} s at {tflops or 0:.0f} TFLOP/s)")


if __name__ == "__main__":
    main()
