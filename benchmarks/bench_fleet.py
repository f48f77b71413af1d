"""Fleets: calibrate_all() on the local GPUs, the fleet table of a torchrun job, and a 1,000-GPU job on paper.

Three parts, one command each (results under benchmarks/results/fleet/, with the usual header; rows in
benchmarks/results/fleet.jsonl):

    python benchmarks/bench_fleet.py calibrate-all --out benchmarks/results/fleet/fleet_h200_calibrate_all_1gpu.json
    torchrun --nproc_per_node=N benchmarks/bench_fleet.py gather \\
        --out benchmarks/results/fleet/fleet_h200_table_<N>gpu.json
    python benchmarks/bench_fleet.py paper --out benchmarks/results/fleet/fleet_h200_cpu.json

calibrate-all (a GPU machine; every visible GPU): wall time of calibrating 1, 2, ... N GPUs, uncached, three
ways side by side in one run: one after the other with calibrate() (what a user would write instead), and
calibrate_all() with each mechanism (threads, spawned processes); in this process after a warm-up, and as the
first call of a new process (what the command line costs). The ratio N GPUs / 1 GPU per mechanism decides
measure/multi.py's DEFAULT_MECHANISM (target <= 1.2); the concurrent maps are compared with the sequential
ones (a calibration must not disturb its neighbour's).

gather (under torchrun, NCCL on GPUs, gloo without): the fleet of the job, cold (each rank measures) and
cached, with each rank's calibration and gather time and the bytes it sent. Rank 0 writes the file.

paper (CPU, recorded calibrations): health.PEER_LIMITS set on the tuning sessions and checked on the held-out
ones; the bytes one rank contributes to the gather; the time to build the fleet (all pairwise fingerprint
distances, the findings) for 2 ... 1,000 ranks, measured on recorded signatures; the extrapolations to a
1,000-GPU job, labelled as such.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import command_line, cpu_environment, quantile_rows, quantiles, row, write_json, write_result

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MANIFEST = ROOT / "tests" / "data" / "fingerprints" / "manifest.csv"
TABLE = "fleet"
# health.PEER_LIMITS are set on the sessions before this time and tested on the later ones (8 and 7 H200 boards)
HELD_OUT_FROM = "2026-11-30T23"
LIMIT_FACTOR = 3.0  # limit = this x the largest healthy deviation of the tuning sessions, rounded up to 0.5
FLEET_SIZES = (2, 8, 64, 256, 1000)
LOOP_PAIRS = 2000  # pairs timed with fingerprint.distance() one by one, for the per-pair cost


# ---- calibrate-all -------------------------------------------------------------------------------------------
def calibrate_all_part(args) -> dict:
    os.environ["TORCH_L2TOPO_CACHE"] = tempfile.mkdtemp(prefix="l2topo-fleet-")  # never the user's cache
    import torch

    import torch_l2topo
    from torch_l2topo.analysis.compare import compare_maps

    n_gpus = torch.cuda.device_count()
    counts = [n for n in (args.counts or range(1, n_gpus + 1)) if n <= n_gpus]
    for i in range(n_gpus):
        torch.zeros(1, device=f"cuda:{i}")  # CUDA contexts are not calibration cost
    print(f"{n_gpus} GPU(s); warming up (compiles the probes once)", flush=True)
    torch_l2topo.calibrate_all(use_cache=False)
    from torch_l2topo.device import device_info

    figures: dict = {"n_gpus": n_gpus, "uuid_hashes": [device_info(i).uuid_hash for i in range(n_gpus)],
                     "counts": counts, "reps": args.reps, "process_reps": args.process_reps,
                     "fresh_reps": args.fresh_reps, "wall_s": {}, "fresh_process_s": {}, "agreement": {},
                     "trusted": {}}

    def sequential(devices):
        return {i: torch_l2topo.calibrate(i, use_cache=False) for i in devices}

    ways = {"sequential": (sequential, args.reps),
            "threads": (lambda d: torch_l2topo.calibrate_all(d, mechanism="threads", use_cache=False), args.reps),
            "processes": (lambda d: torch_l2topo.calibrate_all(d, mechanism="processes", use_cache=False),
                          args.process_reps)}
    for n in counts:
        devices = list(range(n))
        maps = {}
        for rep in range(max(r for _, r in ways.values())):
            for name, (run, reps) in ways.items():  # interleaved: drift hits every way alike
                if rep >= reps:
                    continue
                t0 = time.perf_counter()
                maps[name] = run(devices)
                figures["wall_s"].setdefault(f"{n}gpu/{name}", []).append(time.perf_counter() - t0)
        for name in ("threads", "processes") if len(maps) == len(ways) else ():
            figures["agreement"][f"{n}gpu/{name}_vs_sequential"] = {
                f"cuda:{i}": compare_maps(maps["sequential"][i].chain_cycles, maps[name][i].chain_cycles)
                for i in devices}
        figures["trusted"][f"{n}gpu"] = {name: all(t.meta["trust"]["trusted"] for t in m.values())
                                         for name, m in maps.items()}
        timed = {w: figures["wall_s"][f"{n}gpu/{w}"] for w in ways if f"{n}gpu/{w}" in figures["wall_s"]}
        print(f"{n} GPU(s): " + ", ".join(f"{w} p50 {np.median(t):.2f} s" for w, t in timed.items()), flush=True)
        for rep in range(args.fresh_reps):  # what a user's first call costs: a new process, Python and torch included
            for name in ways:
                figures["fresh_process_s"].setdefault(f"{n}gpu/{name}", []).append(_fresh_process(name, n))
    figures["wall_s"] = {k: quantiles(v) | {"all": v} for k, v in figures["wall_s"].items()}
    figures["fresh_process_s"] = {k: quantiles(v) | {"all": v} for k, v in figures["fresh_process_s"].items()}
    figures["decision"] = decide_mechanism(figures["wall_s"], figures["fresh_process_s"], counts)
    print(json.dumps(figures["decision"], indent=1))
    write_result(args.out, figures, 0, TABLE, table_rows(figures))
    return figures


def table_rows(figures: dict) -> list:
    """The rows of whichever part wrote the figures: calibrate-all's wall times (warm and in a new process) per
    GPU count and way; gather's per-rank times; paper's fleet build times and peer limits."""
    if "wall_s" in figures:
        return quantile_rows(figures["wall_s"], "calibrate-all", "s") + quantile_rows(
            figures["fresh_process_s"], "calibrate-all, new process", "s")
    if "per_rank" in figures:
        return [row(f"gather, {figures['world']} ranks, rank {r['rank']}", f"wall_{k}", "s", v)
                for r in figures["per_rank"] for k, v in r["wall_s"].items()]
    rows = [row(f"paper, {n} ranks", k.removesuffix("_s"), "s", b[k]) for n, b in figures["fleet_build"].items()
            for k in ("pairwise_distances_s", "fleet_from_records_s")]
    return rows + [row("paper", f"peer_limit_{metric}", "cycles" if "cycles" in metric else "ns", v["limit"])
                   for metric, v in figures["peer_limits"].items()]


FRESH = {"sequential": "[torch_l2topo.calibrate(i, use_cache=False) for i in range(torch.cuda.device_count())]",
         "threads": "torch_l2topo.calibrate_all(mechanism='threads', use_cache=False)",
         "processes": "torch_l2topo.calibrate_all(mechanism='processes', use_cache=False)"}


def _fresh_process(way: str, n: int) -> float:
    """Seconds a new Python process takes to import torch_l2topo and calibrate GPUs 0..n-1 `way` (its first
    calibration in a process: Triton loads the probes from its disk cache, threads take turns on it)."""
    code = f"import torch, torch_l2topo\nif __name__ == '__main__':\n    {FRESH[way]}"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    first = visible.split(",")[:n] if visible else [str(i) for i in range(n)]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(first))
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    return time.perf_counter() - t0


def decide_mechanism(wall: dict, fresh: dict, counts) -> dict:
    """Per timing (warm: in this process after a warm-up; fresh: a new process's first call), the mechanism with
    the lowest median at the largest GPU count, and each mechanism's ratio of that count to 1 GPU."""
    top = max(counts)
    out = {"gpus": top, "target_ratio": 1.2, "decided": top >= 2,
           "note": None if top >= 2 else "one GPU only: the mechanism cannot be decided here"}
    for name, timing in (("warm", wall), ("fresh_process", fresh)):
        ways = [m for m in ("threads", "processes", "sequential")
                if f"{top}gpu/{m}" in timing and f"1gpu/{m}" in timing]
        mechanisms = [m for m in ways if m != "sequential"]
        if mechanisms:
            out[name] = {"fastest": min(mechanisms, key=lambda m: timing[f"{top}gpu/{m}"]["p50"]),
                         "ratio_to_1gpu": {m: timing[f"{top}gpu/{m}"]["p50"] / timing[f"1gpu/{m}"]["p50"]
                                           for m in ways}}
    return out


# ---- gather --------------------------------------------------------------------------------------------------
def gather_part(args) -> dict | None:
    import torch
    import torch.distributed as dist

    from torch_l2topo.distributed import gather_fleet, torchrun_group

    os.environ.setdefault("TORCH_L2TOPO_CACHE", tempfile.mkdtemp(prefix="l2topo-fleet-"))
    with torchrun_group() as joined:
        if not joined:
            raise SystemExit("run the gather part under torchrun: torchrun --nproc_per_node=N bench_fleet.py gather")
        rank, world = dist.get_rank(), dist.get_world_size()
        runs = {}
        # cold: every rank measures; store: measures and caches; cached: every rank loads its cache
        for name, options in (("cold", {"use_cache": False}), ("store", {}), ("cached", {})):
            dist.barrier()
            t0 = time.perf_counter()
            fleet = gather_fleet(timeout_s=args.timeout, **options)
            runs[name] = {"wall_s": time.perf_counter() - t0, "fleet": fleet}
        sm_count = fleet.table.set_index("rank").loc[rank, "sm_count"]
        sent = {"rank": rank, "record_bytes": len(pickle.dumps(_record_of(fleet, rank))),
                "signature_bytes": 8 * 2 * int(sm_count) if sm_count == sm_count and sm_count else 0,
                "wall_s": {k: v["wall_s"] for k, v in runs.items()},
                "calibrate_s": {k: float(v["fleet"].table.set_index("rank").loc[rank, "calibrate_s"])
                                for k, v in runs.items()}}
        everyone = [None] * world
        dist.all_gather_object(everyone, sent)
        backend = dist.get_backend()
        device = torch.cuda.current_device() if torch.cuda.is_available() else None
    if rank != 0:
        return None
    figures = {"world": world, "backend": backend, "per_rank": everyone,
               "fleet_cold": runs["cold"]["fleet"].to_dict(), "fleet_cached": runs["cached"]["fleet"].to_dict()}
    print(runs["cold"]["fleet"].summary())
    print(json.dumps(everyone, indent=1))
    if device is not None:
        write_result(args.out, figures, device, TABLE, table_rows(figures))
    else:
        write_json(args.out, figures, cpu_environment(), TABLE, table_rows(figures))
    return figures


def _record_of(fleet, rank: int) -> dict:
    """The row of `rank` as the dict all_gather_object pickles (about the size of what each rank sends)."""
    row = fleet.table.set_index("rank").loc[rank].to_dict()
    return {k: v for k, v in row.items() if k not in ("nearest_rank", "nearest_distance", "findings")}


# ---- paper -----------------------------------------------------------------------------------------------------
def paper_part(args) -> dict:
    from torch_l2topo import Topology
    from torch_l2topo.distributed import Fleet, describe, local_record, pairwise_distances
    from torch_l2topo.distributed.health import PEER_GROUP, PEER_LIMITS
    from torch_l2topo.identity.evaluation import load_collection
    from torch_l2topo.identity.fingerprint import DeviceSignature, distance

    reports = []
    for rec in load_collection(MANIFEST, ROOT):  # screened by the trust checks, as the fingerprint fit was
        if rec.signature is None or not rec.trusted:
            continue  # raw repeats (no line matrix, no layout) or a disturbed calibration
        topo = Topology.load(ROOT / rec.row["file"])
        report, vector = describe(topo)
        reports.append({**report, "gpu": rec.serial_hash or rec.uuid_hash, "session": rec.session,
                        "vector": vector, "topo": topo})
    print(f"{len(reports)} trusted calibrations of {len({r['gpu'] for r in reports})} boards", flush=True)
    tuning = [r for r in reports if r["session"] < HELD_OUT_FROM]
    held_out = [r for r in reports if r["session"] >= HELD_OUT_FROM]
    limits = {}
    for metric in PEER_LIMITS:
        worst = max_deviation(tuning, metric, PEER_GROUP)
        limits[metric] = {"tuning_max_abs_deviation": worst,
                          "limit": math.ceil(LIMIT_FACTOR * worst["value"] / 0.5) * 0.5,
                          "in_health_py": PEER_LIMITS[metric][2],
                          "held_out_max_abs_deviation": max_deviation(held_out, metric, PEER_GROUP)}
    figures: dict = {"peer_limits": limits, "tuning_boards": len({r["gpu"] for r in tuning}),
                     "held_out_boards": len({r["gpu"] for r in held_out})}

    # what one rank contributes to the gather
    record, vector = local_record(reports[0]["topo"])
    record["rank"] = 0
    figures["bytes_per_rank"] = {"record_pickled": len(pickle.dumps(record)), "signature_float64": int(vector.nbytes)}
    per_rank = sum(figures["bytes_per_rank"].values())

    # building the fleet: all pairwise distances and the findings, on recorded signatures cycled to n ranks
    sigs = [r["vector"] for r in reports]
    sig_objects = [DeviceSignature("NVIDIA H200", 132, (9, 0), v) for v in sigs[:64]]
    pairs = [(a, b) for a in sig_objects for b in sig_objects][:LOOP_PAIRS]
    t0 = time.perf_counter()
    for a, b in pairs:
        distance(a, b)
    per_pair = (time.perf_counter() - t0) / len(pairs)
    build = {}
    for n in FLEET_SIZES:
        vectors = [sigs[i % len(sigs)] for i in range(n)]
        t0 = time.perf_counter()
        pairwise_distances(vectors, 132)
        t_pairs = time.perf_counter() - t0
        records = [dict(record, rank=i, uuid_hash=f"{i:012x}") for i in range(n)]
        t0 = time.perf_counter()
        Fleet.from_records(records, vectors)
        build[n] = {"pairwise_distances_s": t_pairs, "fleet_from_records_s": time.perf_counter() - t0,
                    "pairs": n * (n - 1) // 2, "loop_over_distance_s_estimate": per_pair * n * (n - 1) / 2,
                    "gathered_bytes_per_rank": n * per_rank}
        print(f"{n:5d} ranks: pairwise {t_pairs:.3f} s, fleet {build[n]['fleet_from_records_s']:.3f} s, "
              f"gathered {n * per_rank / 1e6:.2f} MB per rank", flush=True)
    figures["distance_per_pair_s"] = per_pair
    figures["fleet_build"] = build
    figures["calibration_per_rank_s"] = recorded_calibration_times()
    figures["load_average_1_5_15"] = os.getloadavg()  # this machine is shared: timings above are under this load
    figures["openblas_num_threads"] = os.environ.get("OPENBLAS_NUM_THREADS")  # 1 on a 2-core machine (see docs)
    write_json(args.out, figures, cpu_environment(), TABLE, table_rows(figures))
    print(json.dumps({"peer_limits": limits, "bytes_per_rank": figures["bytes_per_rank"]}, indent=1))
    return figures


def max_deviation(reports, metric: str, group_keys) -> dict:
    """The largest |value - median of its peer group| over the calibrations: each calibration placed in a group
    with one value per other board of its model, layout and backend (that board's median), itself included."""
    worst = {"value": 0.0, "gpu": None, "groups_checked": 0}
    groups: dict = {}
    for r in reports:
        groups.setdefault(tuple(r[k] for k in group_keys), []).append(r)
    for members in groups.values():
        boards = sorted({m["gpu"] for m in members})
        if len(boards) < 3:
            continue
        worst["groups_checked"] += 1
        per_board = {b: float(np.median([m[metric] for m in members if m["gpu"] == b])) for b in boards}
        for m in members:
            peers = [v for b, v in per_board.items() if b != m["gpu"]] + [m[metric]]
            dev = abs(m[metric] - float(np.median(peers)))
            if dev > worst["value"]:
                worst.update(value=dev, gpu=m["gpu"])
    return worst


def recorded_calibration_times() -> dict:
    """Per-rank calibration times measured on H200s (bench_calibrate.py's results): cold waves (Triton and CUDA),
    the first Triton calibration of a process (JIT compile), a cached calibrate()."""
    out = {}
    for path in sorted((RESULTS / "calibrate").glob("calibrate_h200_*.json")):
        f = json.loads(path.read_text())["figures"]
        out[path.stem] = {"cold_triton_waves_p50": f["cold_s"]["triton/waves"]["p50"],
                          "cold_cuda_waves_p50": f["cold_s"]["cuda/waves"]["p50"],
                          "first_triton_waves": f["compile_s"].get("triton_first_calibration_waves"),
                          "cached_p50": f["cached_s"]["p50"]}
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="part", required=True)
    c = sub.add_parser("calibrate-all", help="calibrate_all() on 1..N local GPUs, both mechanisms, vs sequential")
    c.add_argument("--reps", type=int, default=5, help="timed repeats of the sequential and threads ways")
    c.add_argument("--process-reps", type=int, default=3, help="timed repeats of the processes way (~5 s each)")
    c.add_argument("--fresh-reps", type=int, default=2, help="timed new processes per way and count (~5-10 s each)")
    c.add_argument("--counts", type=int, nargs="*", help="GPU counts to time (default 1..all)")
    g = sub.add_parser("gather", help="the fleet of this torchrun job: cold and cached")
    g.add_argument("--timeout", type=float, default=120.0, help="gather_fleet's per-rank calibration timeout (s)")
    sub.add_parser("paper", help="CPU: peer limits, bytes per rank, fleet build time up to 1,000 ranks")
    for q in sub.choices.values():
        q.add_argument("--out", required=True, help="result JSON path")
    args = p.parse_args(argv)
    print(command_line(), flush=True)
    return {"calibrate-all": calibrate_all_part, "gather": gather_part, "paper": paper_part}[args.part](args)


if __name__ == "__main__":
    main()
