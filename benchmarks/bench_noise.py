"""Repeat noise of the default calibration on the local GPU, both backends, and where it comes from.

Each calibration puts every SM at its wave's clock before combining its repeats (measure/repeats.py); the JSON
says per calibration how many SM repeats had a clock off their wave's and what the correction moved.

Calibrates `--rounds` times per backend and variant, backends interleaved (so a slow drift of the GPU shows
in both alike), without the cache; one serialized calibration per backend is the reference. Records every
calibration's raw repeats (per-SM chain cycles and ns per load, the start time of each SM's timed pass,
line-probe medians) in an .npz, and in the JSON: for each backend and variant, the largest per-SM
difference between two calibrations (raw and after removing a constant offset), each calibration's own
repeat range, the cold wall time, and the agreement with serialized. The per-wave decomposition (the mean
difference of the SMs measured together vs the spread within a wave) says whether noise is common to a
wave (a GPU-wide disturbance at that moment) or per SM.

    python benchmarks/bench_noise.py --device 0 --out /tmp/noise_h200_gpu0.json --raw /tmp/noise_gpu0.npz
"""
from __future__ import annotations

import argparse
import itertools
import os
import tempfile
import time

import numpy as np
from common import quantiles, row, write_result

BACKENDS = ("triton", "cuda")
VARIANTS = {"default": {}, "repeats5": {"repeats": 5}}


def _clock(topo) -> np.ndarray:
    """(repeats, n_sm) SM clock of each chain repeat, GHz."""
    return topo.extras["repeat_chain_cycles"] / topo.extras["repeat_chain_ns"]


def pair_figures(maps: list[np.ndarray], wave: int) -> dict:
    """How far calibrations of one backend and variant are apart, per SM, over every pair."""
    raw, after, common, within = [], [], [], []
    waves = np.arange(len(maps[0])) // wave
    for a, b in itertools.combinations(maps, 2):
        d = a - b
        raw.append(float(np.abs(d).max()))
        d = d - np.median(d)
        after.append(float(np.abs(d).max()))
        means = np.array([d[waves == w].mean() for w in np.unique(waves)])
        common.append(float(np.abs(means).max()))
        within.append(float(np.mean([d[waves == w].std() for w in np.unique(waves)])))
    return {"max_abs_diff": max(raw), "max_after_offset": max(after), "pairs": len(raw),
            "per_pair_max_after_offset": after, "wave_mean_abs_max": max(common), "within_wave_sd_mean":
            float(np.mean(within))}


TABLE = "noise"


def table_rows(figures: dict) -> list:
    """Per backend/variant: cold calibration time, and how far calibrations of one GPU differ (largest
    difference after a constant offset, between calibrations and against the serialized mode)."""
    rows = []
    for name, f in figures["results"].items():
        rows += [row(name, "cold", "s", f["cold_s"]),
                 row(name, "between_max_after_offset", "cycles", f["between_calibrations"]["max_after_offset"]),
                 row(name, "vs_serialized_max_after_offset", "cycles", f["vs_serialized"]["max_after_offset"])]
    return rows


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--out", required=True, help="result JSON path")
    p.add_argument("--raw", help="also save every calibration's raw repeats to this .npz")
    args = p.parse_args(argv)
    os.environ["TORCH_L2TOPO_CACHE"] = tempfile.mkdtemp(prefix="l2topo-noise-")  # never the user's cache

    import torch

    import torch_l2topo
    from torch_l2topo.analysis.compare import compare_maps
    from torch_l2topo.measure.probes import wave_size
    from torch_l2topo.measure.repeats import wave_clock

    dev = args.device
    torch.cuda.set_device(dev)
    for backend in BACKENDS:  # compile and build first: not part of any timing
        torch_l2topo.calibrate(dev, backend=backend, use_cache=False, check=False, repeats=1)
    raw = {}
    serialized = {b: torch_l2topo.calibrate(dev, backend=b, mode="serialized", use_cache=False, check=False)
                  for b in BACKENDS}
    runs = {(b, v): [] for b in BACKENDS for v in VARIANTS}
    walls = {(b, v): [] for b in BACKENDS for v in VARIANTS}
    for r in range(args.rounds):
        for variant, config in VARIANTS.items():
            for backend in BACKENDS:
                t0 = time.perf_counter()
                topo = torch_l2topo.calibrate(dev, backend=backend, use_cache=False, check=False, **config)
                walls[backend, variant].append(time.perf_counter() - t0)
                runs[backend, variant].append(topo)
                for k, v in topo.extras.items():
                    raw[f"{backend}_{variant}_r{r}_{k}"] = v
                print(f"round {r} {backend:6s} {variant:9s} {walls[backend, variant][-1] * 1e3:6.1f} ms  trusted "
                      f"{topo.meta['trust']['trusted']}  repeat range max {topo.chain_noise.max():.3f}", flush=True)
    for b, t in serialized.items():
        for k, v in t.extras.items():
            raw[f"{b}_serialized_{k}"] = v
    n_sm = runs["triton", "default"][0].n_sm
    figures = {"rounds": args.rounds, "variants": VARIANTS, "results": {}}
    for (backend, variant), topos in runs.items():
        maps = [t.chain_cycles for t in topos]
        figures["results"][f"{backend}/{variant}"] = {
            "between_calibrations": pair_figures(maps, wave_size("waves", n_sm)),
            "within_calibration_range_max": [float(t.chain_noise.max()) for t in topos],
            "cold_s": quantiles(walls[backend, variant]),
            "vs_serialized": compare_maps(serialized[backend].chain_cycles, np.median(maps, axis=0)),
            "trusted": [bool(t.meta["trust"]["trusted"]) for t in topos],
            # SMs whose clock fell off their wave's (a TPC clock dip) and what putting them back moved
            "clock_dips": [int((np.abs(_clock(t) - wave_clock(_clock(t), wave_size("waves", n_sm))) > 1e-3).sum())
                           for t in topos],
            "clock_correction": [t.meta.get("clock_correction") for t in topos],
            "clock_ghz": [t.meta["trust"]["figures"]["clock_ghz_median"] for t in topos]}
    figures["serialized_backend_offset"] = compare_maps(serialized["cuda"].chain_cycles,
                                                        serialized["triton"].chain_cycles)
    write_result(args.out, figures, dev, TABLE, table_rows(figures))
    if args.raw:
        np.savez_compressed(args.raw, **raw)
    for name, f in figures["results"].items():
        bc = f["between_calibrations"]
        print(f"{name:18s} between calibrations max {bc['max_abs_diff']:.3f}"
              f" (after offset {bc['max_after_offset']:.3f})"
              f"  wave-common max {bc['wave_mean_abs_max']:.3f}  within-wave sd {bc['within_wave_sd_mean']:.3f}"
              f"  cold p50 {f['cold_s']['p50'] * 1e3:.0f} ms"
              f"  vs serialized max {f['vs_serialized']['max_after_offset']:.3f}")
    return figures


if __name__ == "__main__":
    main()
