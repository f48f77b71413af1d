"""The report's PNG figures, drawn with matplotlib (the `plots` extra; imported only when drawing).

build_figures() returns the matplotlib figures (tests read their titles and legends); draw_figures() saves
them. FIGURES holds each figure's file name and the one-line caption report.md prints under it.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..analysis.summary import Analysis

# key -> (file name, caption under the figure in report.md)
FIGURES = {
    "sm_map": ("sm_map.png", "Each SM's chain latency (a random 2 MiB ring) above the fastest SM's, coloured by "
                             "the L2 partition the SM is near to: which SMs are slow, and where they sit."),
    "heatmap": ("heatmap.png", "Cycles per load from every SM to every probed line, SMs and lines grouped by "
                               "partition: the dark diagonal blocks are near pairs, the light ones far."),
    "r2": ("r2_by_rank.png", "Share of the map the NUCA model explains with k interaction terms (R^2), and what "
                             "it leaves against the repeat noise: terms past the dotted line fit noise."),
    "hist": ("near_far_hist.png", "Latency of every SM-line pair, near (line homed in the SM's partition) and far: "
                                  "the gap is the cost of reaching across partitions."),
    "truth": ("gpc_vs_truth.png", "SMs shared by each latency cluster and each ground-truth group from "
                                  "thread-block cluster co-residence: one dark cell per row means clusters nest "
                                  "inside GPCs."),
}
PARTITION_COLORS = {0: "tab:blue", 1: "tab:orange", -1: "lightgrey"}


def draw_figures(a: Analysis, out_dir) -> dict:
    """Write the PNG figures into out_dir; returns {key: file name}. Raises ImportError without matplotlib."""
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    files = {}
    for key, fig in build_figures(a).items():
        files[key] = FIGURES[key][0]
        fig.savefig(out_dir / files[key], dpi=110, bbox_inches="tight")
        plt.close(fig)
    return files


def build_figures(a: Analysis) -> dict:
    """{key: matplotlib Figure} for every figure this analysis has data for (close them when done)."""
    import matplotlib

    matplotlib.use("Agg")
    figures = {"sm_map": _sm_map(a), "heatmap": _heatmap(a), "r2": _r2(a)}
    if a.partitions.found:
        figures["hist"] = _near_far_hist(a)
    if a.gpc_truth is not None:
        figures["truth"] = _gpc_vs_truth(a)
    return figures


def _device(a: Analysis) -> str:
    return a.topology.meta.get("device", {}).get("name", "") if a.topology is not None else ""


def _sm_map(a: Analysis):
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    m, p = a.model, a.partitions
    # The chain probe's ring covers every slice, so it ranks SMs; a bare matrix has only its line means.
    if a.topology is not None:
        values, what = a.topology.chain_cycles, "chain latency (random 2 MiB ring)"
    else:
        values, what = m.mu + m.a, "mean latency over the probed lines"
    base = float(values.min())
    fig, ax = plt.subplots(figsize=(12, 3.6))
    sm = np.arange(len(values))
    ax.bar(sm, values - base, width=0.85, color=[PARTITION_COLORS[int(s)] for s in p.sm_partition])
    ax.set_xlim(-1, len(values))
    ax.set_xlabel("SM id")
    ax.set_ylabel(f"cycles above the fastest SM\n(SM {int(values.argmin())}: {base:.1f} cycles per load)")
    ax.set_title(f"{_device(a)} per-SM {what}, coloured by L2 partition".strip())
    handles = [Patch(color=PARTITION_COLORS[k], label=f"near partition {k} ({int(np.sum(p.sm_partition == k))} SMs)")
               for k in (0, 1) if np.any(p.sm_partition == k)]
    if np.any(p.sm_partition < 0):
        handles.append(Patch(color=PARTITION_COLORS[-1], label=f"undecided ({int(np.sum(p.sm_partition < 0))} SMs)"))
    ax.legend(handles=handles, loc="upper left", fontsize=8, ncol=len(handles))
    ax.set_ylim(0, (values.max() - base) * 1.2 or 1.0)  # headroom for the legend
    return fig


def _heatmap(a: Analysis):
    import matplotlib.pyplot as plt

    m, p, g, sl = a.model, a.partitions, a.gpcs, a.slices
    # Groups in order of their mean offset, members by their own: the blocks read as bands.
    rows = np.lexsort((m.a, g.labels, _group_means(m.a, g.labels), p.sm_partition))
    cols = np.lexsort((m.b, sl.labels, _group_means(m.b, sl.labels), p.line_partition))
    fig, ax = plt.subplots(figsize=(12, 5))
    im = ax.imshow(m.matrix[np.ix_(rows, cols)], aspect="auto", cmap="viridis", interpolation="nearest")
    fig.colorbar(im, ax=ax, label="cycles per load")
    ax.set_title(f"{_device(a)} L2 hit latency from every SM (rows) to every probed 128-byte line (columns)".strip())
    if p.found:
        sm_sides, line_homes = p.sm_partition[rows], p.line_partition[cols]
        ax.set_yticks(*_block_ticks(sm_sides, "SMs near\npartition {k}\n({n})"))
        ax.set_xticks(*_block_ticks(line_homes, "lines homed in partition {k} ({n})"))
        for edge in _block_edges(sm_sides):
            ax.axhline(edge, color="white", lw=1)
        for edge in _block_edges(line_homes):
            ax.axvline(edge, color="white", lw=1)
        ax.set_xlabel("lines, by home partition, then slice class and mean latency")
        ax.set_ylabel("SMs, by partition, then latency cluster")
    else:
        ax.set_xlabel("lines, by slice class and mean latency")
        ax.set_ylabel("SMs, by latency cluster")
    return fig


def _r2(a: Analysis):
    import matplotlib.pyplot as plt

    m = a.model
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ranks = np.arange(len(m.r2))
    ax.plot(ranks, m.r2, "o-", label="R^2 (share of the variance explained)")
    ax.axvline(m.significant_rank, color="grey", ls=":",
               label=f"{m.significant_rank} terms stand above the noise")
    ax.set_xlabel("interaction terms (0 = additive: SM offset + line offset)")
    ax.set_ylabel("R^2")
    ax2 = ax.twinx()
    ax2.semilogy(ranks, m.residual_over_noise, "s--", color="C1", label="residual RMS / repeat noise")
    ax2.set_ylabel("residual RMS / repeat noise", color="C1")
    ax.set_title("NUCA model: what k interaction terms explain")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="center right", fontsize=8)
    return fig


def _near_far_hist(a: Analysis):
    import matplotlib.pyplot as plt

    m, p = a.model, a.partitions
    near, far = p.near_far_values(m.matrix)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    bins = np.linspace(m.matrix.min(), m.matrix.max(), 80)
    ax.hist(near, bins=bins, alpha=0.7, label=f"near: line homed in the SM's partition (mean {near.mean():.1f})")
    ax.hist(far, bins=bins, alpha=0.7, label=f"far: homed in the other partition (mean {far.mean():.1f})")
    ax.set_xlabel("cycles per load")
    ax.set_ylabel("SM-line pairs")
    ax.set_title(f"Near and far L2 hits: {p.gap_cycles:.1f} cycles apart")
    ax.legend(fontsize=8)
    return fig


def _gpc_vs_truth(a: Analysis):
    import matplotlib.pyplot as plt

    g, t = a.gpcs, a.gpc_truth
    truth = np.asarray(a.topology.extras["gpc_truth"])
    groups = truth_groups(truth)
    keep = (truth >= 0) & (g.labels >= 0)
    table = np.zeros((g.k, len(groups)))
    column = {label: i for i, (label, _) in enumerate(groups)}
    np.add.at(table, (g.labels[keep], [column[label] for label in truth[keep]]), 1)
    n_gpc = sum(len(sms) > 2 for _, sms in groups)
    fig, ax = plt.subplots(figsize=(9, 6))
    im = ax.imshow(table, aspect="auto", cmap="Blues", interpolation="nearest")
    fig.colorbar(im, ax=ax, label="SMs in both")
    ax.set_xticks(range(len(groups)), [f"GPC {i}\n{len(sms)} SMs" if i < n_gpc else f"TPC\n{sms[0]},{sms[1]}"
                                       for i, (_, sms) in enumerate(groups)], fontsize=7)
    ax.set_xlabel(f"ground truth from thread-block cluster co-residence: {len(groups)} groups = {n_gpc} GPCs + "
                  f"{len(groups) - n_gpc} TPCs (their SM ids)\nnever co-resident with another TPC")
    ax.set_ylabel(f"latency cluster ({g.k} clusters of similar SM profiles)")
    ax.set_title(f"Latency clusters against GPCs: {100 * t.purity:.1f}% of SMs in a cluster inside one group, "
                 f"{100 * t.matched_fraction:.1f}% matched one-to-one", fontsize=10)
    return fig


def truth_groups(truth) -> list[tuple[int, list[int]]]:
    """The ground-truth groups of a calibration's extras["gpc_truth"], GPCs first, each as (label, its SMs).

    Cluster co-residence joins the TPCs of one GPC; a group of one TPC (2 SMs) never shared a cluster with
    another TPC, so it is a TPC whose GPC the probe could not tell, not a GPC of its own."""
    truth = np.asarray(truth)
    groups = [(int(label), np.flatnonzero(truth == label).tolist()) for label in np.unique(truth[truth >= 0])]
    return sorted(groups, key=lambda group: (len(group[1]) <= 2, group[0]))


def _group_means(values: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each item's group mean of `values` (labels -1 form one group)."""
    _, inverse = np.unique(labels, return_inverse=True)
    return (np.bincount(inverse, weights=values) / np.bincount(inverse))[inverse]


def _block_edges(sorted_labels: np.ndarray) -> np.ndarray:
    """Pixel positions between runs of equal labels in a sorted label array."""
    return np.flatnonzero(np.diff(sorted_labels)) + 0.5


def _block_ticks(sorted_labels: np.ndarray, text: str) -> tuple[list, list]:
    """One tick at the middle of each run of a sorted label array: `text` formatted with k (the label) and n
    (the run's length); a run of undecided items (-1) reads "undecided (n)"."""
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_labels)) + 1]
    ends = np.r_[starts[1:], len(sorted_labels)]
    return ([(s + e - 1) / 2 for s, e in zip(starts, ends)],
            [text.format(k=int(sorted_labels[s]), n=e - s) if sorted_labels[s] >= 0 else f"undecided ({e - s})"
             for s, e in zip(starts, ends)])
