"""Calibration under load: does calibrate() refuse a map that other work disturbed, and accept a clean one?

Conditions, on one GPU: idle; another process running bf16 matrix products (8192 x 8192) on the same GPU;
this process streaming a memory-bound kernel on another stream. In each: calibrate(check=True) as a user
would (outcome, attempts, wall time, the error message), then a single unchecked measurement whose raw
repeats are saved for the CPU tests of the detector (tests/test_trust.py), with how far its map is from
the idle map measured in the same run: the physical ground truth of "disturbed".

    python benchmarks/bench_trust.py --device 0 --out /tmp/trust_h200_gpu0.json \
        --raw /tmp/trust_gpu0.npz
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from common import row, write_result

MATMUL = """
import sys, time, torch
torch.cuda.set_device(int(sys.argv[1]))
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print("ready", flush=True)
end = time.time() + float(sys.argv[2])
while time.time() < end:
    for _ in range(8):
        c = a @ b
    torch.cuda.synchronize()
"""


class Streamer:
    """Keeps a memory-bound kernel (a 1 GiB copy) running on a side stream of this process."""

    def __init__(self, device):
        import torch

        self.stream = torch.cuda.Stream(device=device)
        self.src = torch.empty(1 << 28, dtype=torch.float32, device=device)
        self.dst = torch.empty_like(self.src)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        import torch

        with torch.cuda.stream(self.stream):
            while not self.stop.is_set():
                for _ in range(4):
                    self.dst.copy_(self.src)
                self.stream.synchronize()

    def __enter__(self):
        self.thread.start()
        time.sleep(0.5)
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


class OtherProcess:
    def __init__(self, device, seconds):
        self.proc = subprocess.Popen([sys.executable, "-c", MATMUL, str(device), str(seconds)], stdout=subprocess.PIPE,
                                     text=True)

    def __enter__(self):
        assert self.proc.stdout.readline().strip() == "ready"
        time.sleep(1.0)  # let it reach full speed
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


def run_condition(dev, name, idle_map=None) -> tuple[dict, dict]:
    import torch_l2topo
    from torch_l2topo.errors import L2TopoError

    out = {}
    t0 = time.perf_counter()
    try:
        topo = torch_l2topo.calibrate(dev, force=True)
        out.update(outcome="trusted", attempts=topo.meta["trust"]["attempt"], notes=topo.meta["trust"]["notes"])
    except L2TopoError as exc:
        out.update(outcome=f"refused ({type(exc).__name__})", message=str(exc))
    out["wall_s"] = time.perf_counter() - t0
    out["cached_files"] = len(list(Path(os.environ["TORCH_L2TOPO_CACHE"]).glob("*.npz")))
    try:
        raw = torch_l2topo.calibrate(dev, use_cache=False, check=False, attempts=1)
    except L2TopoError as exc:  # the probe could not run at all (SMs held): nothing to record
        out["unchecked"] = {"error": str(exc)}
        print(f"{name:8s} {out['outcome']:8s} {out['wall_s']:.2f} s  unchecked: {exc}", flush=True)
        return out, {}
    verdict = raw.meta["trust"]
    out["unchecked"] = {"trusted": verdict["trusted"], "problems": verdict["problems"], "figures": verdict["figures"],
                        "chain_median": float(np.median(raw.chain_cycles))}
    if idle_map is not None:
        d = raw.chain_cycles - idle_map
        out["unchecked"]["vs_idle"] = {"median_shift": float(np.median(d)), "max_abs": float(np.abs(d).max())}
    arrays = {f"{name}_{k}": v for k, v in raw.extras.items()}
    arrays[f"{name}_chain_cycles"] = raw.chain_cycles
    print(f"{name:8s} {out['outcome']:8s} {out['wall_s']:.2f} s  unchecked: trusted {verdict['trusted']} "
          f"ratio {verdict['figures']['resident_ratio_max']:.2f} chain median {out['unchecked']['chain_median']:.1f}",
          flush=True)
    return out, arrays


TABLE = "trust"


def table_rows(figures: dict) -> list:
    """Per condition: whether calibrate() trusted it (1) or refused (0), its wall time, and the unchecked
    calibration's largest resident ratio (a chain load's latency over the line probe's L2 hits)."""
    rows = []
    for condition, f in figures.items():
        rows += [row(condition, "trusted", "bool", f["outcome"] == "trusted"), row(condition, "wall", "s", f["wall_s"])]
        if "figures" in f.get("unchecked", {}):
            rows.append(row(condition, "resident_ratio_max", "x", f["unchecked"]["figures"]["resident_ratio_max"]))
    return rows


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--out", required=True)
    p.add_argument("--raw", required=True, help=".npz for the raw repeats of every condition")
    args = p.parse_args(argv)
    os.environ["TORCH_L2TOPO_CACHE"] = tempfile.mkdtemp(prefix="l2topo-trust-")

    import torch

    import torch_l2topo

    dev = args.device
    torch.cuda.set_device(dev)
    torch_l2topo.calibrate(dev, use_cache=False, check=False, repeats=1)  # compile first
    figures, arrays = {}, {}
    figures["idle"], a = run_condition(dev, "idle")
    arrays.update(a)
    idle_map = arrays["idle_chain_cycles"]
    with OtherProcess(dev, seconds=60):
        figures["matmul_other_process"], a = run_condition(dev, "matmul", idle_map)
    arrays.update(a)
    with Streamer(dev):
        figures["copy_stream_same_process"], a = run_condition(dev, "stream", idle_map)
    arrays.update(a)
    figures["idle_after"], a = run_condition(dev, "idle2", idle_map)
    arrays.update(a)
    write_result(args.out, figures, dev, TABLE, table_rows(figures))
    os.makedirs(os.path.dirname(os.path.abspath(args.raw)), exist_ok=True)
    np.savez_compressed(args.raw, **arrays)
    return figures


if __name__ == "__main__":
    main()
