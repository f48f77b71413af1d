"""The L2 geometry suite's figures: PNGs of its main curves, drawn from a geometry JSON with matplotlib (the
`plots` extra; imported only when drawing). No GPU: the JSON is what `python -m torch_l2topo geometry --out`
or benchmarks/run_geometry.py wrote.

One figure per experiment that the JSON holds without an error: capacity (footprint sweeps), strides (cold
stride sweep and first touch), prefetch (regular against random order), contention (requests/ns against k
SMs), persisting (hits after a streaming copy, by window), conflict_sets (the n x stride grid and its control),
layout_fixes (time with / without each fix).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..errors import GeometryFormatError
from ..files import read_json
from .summary import summary_lines

MB = 1 << 20


# What the summary reads at the top of a result, and its types
RESULT_FIELDS = {"quick": bool, "n_sm": int, "l2_bytes": (int, float), "clock_ghz": (int, float),
                 "total_s": (int, float)}


def load_geometry(path) -> dict:
    """The suite's result from a geometry JSON: benchmarks' files keep it under "figures" next to "env" and
    "command"; the CLI's --out writes it at the top level. GeometryFormatError naming the file for one that is not
    UTF-8 JSON, not a geometry result, or lacks what the summary reads (each experiment is summarized here once,
    so a damaged one is found at load, not halfway through a report)."""
    d = read_json(path, GeometryFormatError, "a geometry result")
    result = d.get("figures", d)
    if not isinstance(result, dict) or not isinstance(result.get("experiments"), dict):
        raise GeometryFormatError(f"{path} is not a geometry result (no 'experiments' object)")
    for key, kind in RESULT_FIELDS.items():
        value = result.get(key)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise GeometryFormatError(f"{path}: '{key}' is {json.dumps(value)}, not the {key} of a geometry result")
    for name, experiment in result["experiments"].items():
        try:
            if not isinstance(experiment, dict):
                raise TypeError("not an object")
            summary_lines({**result, "experiments": {name: experiment}})
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise GeometryFormatError(f"{path}: experiment {name!r} is malformed ({type(exc).__name__}: {exc})") \
                from None
    return result


def _ok(e: dict, name: str, key: str) -> dict | None:
    r = e.get(name)
    return r if r and "error" not in r and r.get(key) else None


def draw_geometry_figures(result: dict, out_dir) -> dict:
    """Write one PNG per experiment present into out_dir; returns {experiment: file name}. Raises ImportError
    without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    e = result["experiments"]
    files = {}

    def save(fig, key):
        name = f"geometry_{key}.png"
        fig.savefig(out_dir / name, dpi=90, bbox_inches="tight")
        plt.close(fig)
        files[key] = name

    def finish(fig, ax, key, xlabel, ylabel, title):
        """Label a one-panel figure, add its legend and save it."""
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(fontsize=8)
        save(fig, key)

    if c := _ok(e, "capacity", "footprint"):
        fig, ax = plt.subplots(figsize=(7, 4))
        x = np.array(c["footprint"]) / MB
        for key, style in (("near", "-"), ("far", "-"), ("mean", "k--")):
            ax.semilogx(x, c[key], style, marker=".", label=f"all SMs warm, lines {key}")
        if sw := c.get("self_warmed"):
            ax.semilogx(np.array(sw["footprint"]) / MB, np.mean(sw["cycles"], axis=1), "o-",
                        label="one SM per partition, own ring (no per-load clock: ~68 cycles less)")
            ax.axhline(sw["cold_cycles"], color="grey", ls=":", label="cold (DRAM)")
        finish(fig, ax, "capacity", "footprint (MB)", "cycles per load", "capacity: latency against footprint")

    s, ft = _ok(e, "stride_sweep", "strides"), _ok(e, "first_touch", "k_bytes")
    if s or ft:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        if s:
            axes[0].semilogx(s["strides"], s["mean_cycles"], "o-", base=2)
            line = s.get("line_bytes")
            axes[0].set_title(f"cold stride sweep (levels off at {line:.0f} B)" if line else "cold stride sweep")
            axes[0].set_xlabel("stride (B)")
            axes[0].set_ylabel("cycles per load")
        if ft:
            axes[1].semilogx(ft["k_bytes"], ft["second_load_cycles"], "o-", base=2,
                             label="byte a + k after a miss at a")
            axes[1].axhline(ft["hit_cycles"], color="C2", ls=":", label="hit")
            axes[1].axhline(ft["miss_cycles"], color="C3", ls=":", label="miss")
            g = ft.get("granule_bytes")
            axes[1].set_title(f"first touch (granule {g} B)" if g else "first touch (no granule found)")
            axes[1].set_xlabel("k (B)")
            axes[1].legend(fontsize=8)
        save(fig, "strides")

    if p := _ok(e, "prefetch", "strides"):
        fig, ax = plt.subplots(figsize=(7, 4))
        for t, color in (("cold", "C3"), ("warm", "C0")):
            ax.semilogx(p["strides"], p[f"{t}_regular"], "o-", color=color, base=2, label=f"{t}, regular order")
            ax.semilogx(p["strides"], p[f"{t}_random"], "s--", color=color, base=2, label=f"{t}, LFSR order")
        finish(fig, ax, "prefetch", "stride (B)", "cycles per load",
               "prefetch: regular against random order of the same addresses")

    if c := _ok(e, "contention", "k"):
        fig, ax = plt.subplots(figsize=(7, 4))
        for key, label in (("one", "lines of one slice class"), ("spread", "lines of distinct classes")):
            at = c.get(f"{key}_saturates_at_k")
            ax.plot(c["k"], c[f"{key}_requests_per_ns"], "o-",
                    label=f"{label} (saturates at k={at:.0f})" if at else f"{label} (no saturation found)")
        finish(fig, ax, "contention", "SMs chasing (k)", "requests per ns",
               f"contention: {c['lanes']} chases per SM over {c['lines_per_set']} lines")

    if p := _ok(e, "persisting", "runs"):
        fig, ax = plt.subplots(figsize=(7, 4))
        for ratio in sorted({r["hit_ratio"] for r in p["runs"]}):
            runs = [r for r in p["runs"] if r["hit_ratio"] == ratio]
            ax.plot([r["hot_bytes"] / MB for r in runs], [r["hit_fraction"] for r in runs], "o-",
                    label="no window" if ratio == 0 else f"window, hitRatio {ratio}")
        ax.axvline(p["max_persisting_l2_bytes"] / MB, color="grey", ls=":", label="max persisting L2")
        finish(fig, ax, "persisting", "hot buffer (MB)", "hot loads that hit after a streaming copy",
               "persisting L2 window")

    if c := _ok(e, "conflict_sets", "strides"):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
        grids = [np.array(c["aligned_cycles"]), np.array(c["control_cycles"])]
        lo, hi = c.get("hit_cycles", min(g.min() for g in grids)), c["miss_cycles"]
        for ax, g, title in zip(axes, grids, ("power-of-two stride", "control: each line moved off the stride")):
            im = ax.imshow(g, aspect="auto", origin="lower", cmap="viridis", vmin=lo * 0.95, vmax=hi)
            ax.set_xticks(range(len(c["n_lines"])), c["n_lines"], fontsize=7, rotation=90)
            ax.set_yticks(range(len(c["strides"])), [_bytes(v) for v in c["strides"]], fontsize=7)
            ax.set_xlabel("lines in the chase (n)")
            ax.set_title(title)
        axes[0].set_ylabel("stride")
        fig.colorbar(im, ax=axes, label=f"cycles per load (top of scale: DRAM, {hi:.0f})")
        fig.suptitle(c.get("verdict", ""), fontsize=8)
        save(fig, "conflict_sets")

    if f := _ok(e, "layout_fixes", "columns"):
        fixes = [(k, f["columns"][k]) for k in ("padding", "swizzle")]
        fixes += [(f"bursts\n({k})", f["bursts"][k]) for k in ("one_class", "spread") if "bursts" in f]
        fig, ax = plt.subplots(figsize=(7, 4))
        ratios = [v["ratio"] for _, v in fixes]
        ax.bar(range(len(fixes)), ratios, yerr=[v["spread"] * v["ratio"] for _, v in fixes], capsize=4,
               color=["C2" if v["verdict"] == "faster" else "C3" if v["verdict"] == "slower" else "grey"
                      for _, v in fixes])
        ax.axhline(1, color="k", lw=0.8)
        ax.set_xticks(range(len(fixes)), [f"{k}\n{v['verdict']}" for k, v in fixes], fontsize=8)
        ax.set_ylabel("time with fix / without (median)")
        ax.set_title("layout fixes (error bar: the repeats' relative spread)")
        save(fig, "layout_fixes")
    return files


def _bytes(v: int) -> str:
    return f"{v // MB} MiB" if v >= MB else f"{v >> 10} KiB"
