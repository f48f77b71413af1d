"""The report's PNG figures, drawn with matplotlib (the `plots` extra; imported only when drawing)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..analysis.summary import Analysis


def draw_figures(a: Analysis, out_dir) -> dict:
    """Write the PNG figures into out_dir; returns {key: file name}. Raises ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    files = {}
    m, p, g = a.model, a.partitions, a.gpcs

    def save(fig, key, name):
        fig.savefig(out_dir / name, dpi=110, bbox_inches="tight")
        plt.close(fig)
        files[key] = name

    k = max(g.k, 1)
    colors = matplotlib.colormaps["turbo"].resampled(k)
    fig, (top, strip) = plt.subplots(2, 1, figsize=(12, 4), sharex=True, height_ratios=(4, 1))
    sm = np.arange(m.n_sm)
    top.bar(sm, m.mu + m.a, color=[colors(int(c)) if c >= 0 else "grey" for c in g.labels], width=0.9)
    top.set_ylim((m.mu + m.a).min() - 2, (m.mu + m.a).max() + 2)
    top.set_ylabel("mean latency (cycles)")
    top.set_title(f"per-SM mean latency, coloured by latency cluster ({g.k if g.found else 'none'}); "
                  "strip: L2 partition side")
    strip.imshow(p.sm_partition[None, :], aspect="auto", cmap="coolwarm", vmin=-1, vmax=1,
                 extent=(-0.5, m.n_sm - 0.5, 0, 1))
    strip.set_yticks([])
    strip.set_xlabel("SM id")
    save(fig, "sm_map", "sm_map.png")

    # Groups in order of their mean offset, members by their own: the blocks read as bands.
    sl = a.slices.labels
    rows = np.lexsort((m.a, g.labels, _group_means(m.a, g.labels), p.sm_partition))
    cols = np.lexsort((m.b, sl, _group_means(m.b, sl), p.line_partition))
    fig, ax = plt.subplots(figsize=(12, 5))
    im = ax.imshow(m.matrix[np.ix_(rows, cols)], aspect="auto", cmap="viridis", interpolation="nearest")
    fig.colorbar(im, ax=ax, label="cycles per load")
    ax.set_xlabel("lines, ordered by home partition, slice class, mean latency")
    ax.set_ylabel("SMs, ordered by partition, cluster, offset")
    save(fig, "heatmap", "heatmap.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    ranks = np.arange(len(m.r2))
    ax.plot(ranks, m.r2, "o-")
    ax.axvline(m.significant_rank, color="grey", ls=":", label="significant terms")
    ax.set_xlabel("interaction terms (0 = additive)")
    ax.set_ylabel("R^2")
    ax2 = ax.twinx()
    ax2.semilogy(ranks, m.residual_over_noise, "s--", color="C1")
    ax2.set_ylabel("residual RMS / repeat noise", color="C1")
    ax.legend(loc="center right")
    save(fig, "r2", "r2_by_rank.png")

    if p.found:
        near, far = p.near_far_values(m.matrix)
        fig, ax = plt.subplots(figsize=(6, 4))
        bins = np.linspace(m.matrix.min(), m.matrix.max(), 80)
        ax.hist(near, bins=bins, alpha=0.7, label=f"near ({near.mean():.1f})")
        ax.hist(far, bins=bins, alpha=0.7, label=f"far ({far.mean():.1f})")
        ax.set_xlabel("cycles per load")
        ax.set_ylabel("SM x line pairs")
        ax.legend()
        save(fig, "hist", "near_far_hist.png")

    if a.gpc_truth is not None:
        truth = np.asarray(a.topology.extras["gpc_truth"])
        keep = (truth >= 0) & (g.labels >= 0)
        table = np.zeros((g.k, truth[keep].max() + 1))
        np.add.at(table, (g.labels[keep], truth[keep]), 1)
        fig, ax = plt.subplots(figsize=(6, 5))
        im = ax.imshow(table, aspect="auto", cmap="Blues")
        fig.colorbar(im, ax=ax, label="SMs")
        ax.set_xlabel("GPC (cluster co-residence ground truth)")
        ax.set_ylabel("latency cluster")
        save(fig, "truth", "gpc_vs_truth.png")
    return files


def _group_means(values: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each item's group mean of `values` (labels -1 form one group)."""
    _, inverse = np.unique(labels, return_inverse=True)
    return (np.bincount(inverse, weights=values) / np.bincount(inverse))[inverse]
