"""The per-SM timeline of one kernel launch, drawn with matplotlib from an enriched trace.

One row per SM in the L2 map's order (partition, then latency: the trace's track order), each CTA a bar
coloured by the SM's partition, time in microseconds from the kernel's start, the kernel's own span
outlined; rows labelled with the track names every few SMs. What the README shows of a recorded run.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ...errors import TraceFormatError
from . import readback
from .tracks import pid_of

PARTITION_COLOURS = {0: "#1f77b4", 1: "#ff7f0e", -1: "#7f7f7f"}


def pick_launch(trace: dict, kernel: str | None = None, device: int | None = None, source: str = "trace") -> dict:
    """The launch to draw: of `kernel` (default: the first instrumented kernel) on `device` (default: any),
    the one with the largest tail."""
    found = [launch for launch in readback.launches(trace, source) if (kernel is None or launch["kernel"] == kernel)
             and (device is None or launch["device"] == device)]
    if not found:
        what = f"kernel {kernel!r}" if kernel else "any kernel"
        raise TraceFormatError(f"{source} has no instrumented launch of {what}")
    if kernel is None:
        found = [launch for launch in found if launch["kernel"] == found[0]["kernel"]]
    return max(found, key=lambda launch: launch["tail_ns"])


def timeline_rows(trace: dict, launch: dict, source: str = "trace") -> dict:
    """{"order": SM ids top to bottom (the trace's track order), "names": {sm: track name}, "bars": {sm:
    [(start_us, dur_us), ...]}, "partition": {sm: p}} for one launch (times from the kernel's start)."""
    device = launch["device"]
    smmap = readback.calibrations(trace, source).get(device)
    order, names = readback.sm_tracks(trace, device, source)
    bars: dict = {s: [] for s in order}
    t0_us = launch["ts_ns"] / 1000
    for ev in readback.cta_events(trace, source):
        if ev["pid"] == pid_of(device) and ev["args"]["launch"] == launch["launch"]:
            bars.setdefault(ev["args"]["sm"], []).append((ev["ts"] - t0_us, ev["dur"]))
    partition = {s: int(smmap.partition[s]) if smmap is not None and s < smmap.n_sm else -1 for s in bars}
    return {"order": order, "names": names, "bars": bars, "partition": partition}


def render_timeline(trace: dict, out, kernel: str | None = None, device: int | None = None,
                    label_every: int = 8, source: str = "trace") -> Path:
    """Draw the per-SM timeline of one launch (pick_launch) into the PNG `out` (`source`: the trace's file, named
    in the TraceFormatError of a damaged one)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    launch = pick_launch(trace, kernel, device, source)
    rows = timeline_rows(trace, launch, source)
    order = rows["order"]
    fig, ax = plt.subplots(figsize=(10, max(4.0, 0.045 * len(order) + 1.5)))
    for y, sm in enumerate(order):
        if rows["bars"][sm]:
            ax.broken_barh(rows["bars"][sm], (y - 0.4, 0.8), color=PARTITION_COLOURS[rows["partition"][sm]],
                           linewidth=0)
    ax.axvline(0, color="k", lw=0.8)
    ax.axvline(launch["dur_ns"] / 1000, color="k", lw=0.8, ls="--")
    ticks = np.arange(0, len(order), max(label_every, 1))
    ax.set_yticks(ticks, [rows["names"][order[i]] for i in ticks], fontsize=7)
    ax.set_ylim(len(order) - 0.5, -0.5)
    ax.set_xlabel("time from the kernel's start (us); solid: kernel start, dashed: kernel end")
    ax.set_title(f"{launch['kernel']} on GPU {launch['device']}: {launch['ctas']} CTAs, tail "
                 f"{launch['tail_ns'] / 1000:.1f} us, imbalance {launch['imbalance']:.2f} "
                 f"(SMs by L2 partition, then latency)", fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in PARTITION_COLOURS.values()]
    ax.legend(handles, ["partition 0", "partition 1", "undecided"], loc="lower right", fontsize=7)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
