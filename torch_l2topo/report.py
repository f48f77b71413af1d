"""The topology report: every analysis of one calibration, as Markdown plus PNG figures.

analyze() runs the NUCA model (nuca.py) and the structure finders (structure.py, slices.py) and returns
plain results; write_report() renders them. Figures need matplotlib (the `plots` extra), imported only
here and only when drawing; without it the report is text-only and says so. add_report_command()
registers `python -m torch_l2topo report [FILE] [--example NAME] [--compare OTHER] [-o DIR]`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .nuca import NucaModel, fit_nuca
from .slices import Granularity, SliceClasses, SliceStability, home_granularity, slice_classes, slice_stability
from .structure import (GpcClusters, GpcComparison, Partitions, Symmetry, Twins, adjusted_rand_index, cluster_gpcs,
                        compare_gpcs, compare_partitions, find_partitions, find_twins, sm_symmetry)
from .topology import Topology


_PAGE_BYTES = 2 << 20


@dataclass
class Comparison:
    """One calibration against a second one of the same GPU (or another GPU): how the structure holds."""

    name: str
    partitions: dict
    slices: SliceStability | None
    gpc_ari: float


@dataclass
class Analysis:
    """Everything analyze() found in one calibration (plain results of nuca, structure and slices)."""

    name: str
    topology: Topology | None
    model: NucaModel
    partitions: Partitions
    twins: Twins
    gpcs: GpcClusters
    gpc_truth: GpcComparison | None
    symmetry: Symmetry
    slices: SliceClasses
    granularity: Granularity | None
    versus: Comparison | None

    def summary(self) -> dict:
        """The headline figures as plain JSON-able values."""
        m, p, g = self.model, self.partitions, self.gpcs
        out = {"name": self.name, "shape": list(m.matrix.shape), "noise_sigma": m.noise_sigma,
               "r2_by_rank": [float(x) for x in m.r2], "residual_over_noise": [float(x) for x in m.residual_over_noise],
               "significant_rank": m.significant_rank,
               "partitions": {"found": p.found, "sm_counts": p.sm_counts, "line_counts": p.line_counts,
                              "near_cycles": p.near_cycles, "far_cycles": p.far_cycles, "gap_cycles": p.gap_cycles,
                              "gap_ratio": p.gap_ratio,
                              "granularity_bytes": self.granularity.block_bytes if self.granularity else None},
               "twins": {"count": self.twins.count, "consecutive_fraction": self.twins.consecutive_fraction,
                         "margin": self.twins.margin},
               "gpc_clusters": {"k": g.k, "gap": g.gap, "sizes": g.sizes().tolist() if g.found else [],
                                "runner_up_k": int(g.levels[1, 0]) if len(g.levels) > 1 else None},
               "symmetry": self.symmetry.verdict(),
               "slices": {"count": self.slices.count, "margin": self.slices.margin}}
        if self.gpc_truth:
            out["gpc_truth"] = {k: getattr(self.gpc_truth, k) for k in ("matched_fraction", "purity", "ari")}
        if self.versus:
            v = self.versus
            out["versus"] = {"name": v.name, **v.partitions, "gpc_ari": v.gpc_ari,
                             "slice_counts": [v.slices.count_a, v.slices.count_b] if v.slices else None,
                             "slice_ari": v.slices.ari if v.slices else None}
        return out


def _name(data) -> str:
    if isinstance(data, Topology):
        return data.meta.get("source") or data.meta.get("uuid_hash", "calibration")
    return "matrix"


def analyze(data, noise=None, other=None) -> Analysis:
    """Run every analysis on `data` (Topology, or matrix + noise); `other`, a second calibration of the same
    lines, adds how the partitions, GPC clusters and slice classes hold between the two."""
    topo = data if isinstance(data, Topology) else None
    model = fit_nuca(data, noise)
    parts, gpcs, slices = find_partitions(model), cluster_gpcs(model), slice_classes(model)
    truth = None
    if topo is not None and "gpc_truth" in topo.extras and gpcs.found:
        truth_labels = np.asarray(topo.extras["gpc_truth"]).astype(np.int64)
        if truth_labels.shape != (model.n_sm,):
            raise ValueError(f"extras['gpc_truth'] must have shape ({model.n_sm},), got {truth_labels.shape}")
        truth = compare_gpcs(gpcs.labels, truth_labels)
    granularity = None
    if topo is not None and parts.found:
        granularity = home_granularity(parts.line_partition, topo.line_addresses)
    versus = None
    if other is not None:
        model_b = fit_nuca(other)
        # Slice classes compare line by line when both probed the same offsets within a 2 MiB GPU page: the
        # slice hash reads physical address bits, and a page maps its low 21 bits unchanged (two H200s'
        # buffers at different virtual addresses give identical line homes).
        same_lines = isinstance(other, Topology) and topo is not None \
            and np.array_equal(other.line_addresses % _PAGE_BYTES, topo.line_addresses % _PAGE_BYTES)
        gpcs_b = cluster_gpcs(model_b)
        versus = Comparison(_name(other), compare_partitions(parts, find_partitions(model_b)),
                            slice_stability(slices, slice_classes(model_b)) if same_lines else None,
                            adjusted_rand_index(gpcs.labels, gpcs_b.labels) if gpcs.found and gpcs_b.found
                            else float("nan"))
    return Analysis(_name(data), topo, model, parts, find_twins(model), gpcs, truth, sm_symmetry(model), slices,
                    granularity, versus)


# ---- Markdown --------------------------------------------------------------------------------------------
def _ranges(ids) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    ids = sorted(int(i) for i in ids)
    out, start = [], None
    for k, i in enumerate(ids):
        if start is None:
            start = i
        if k + 1 == len(ids) or ids[k + 1] != i + 1:
            out.append(str(start) if start == i else f"{start}-{i}")
            start = None
    return ", ".join(out) or "none"


def render_markdown(a: Analysis, figures: dict | None, figure_note: str = "") -> str:
    m, p, tw, g, sl = a.model, a.partitions, a.twins, a.gpcs, a.slices
    fig = (lambda key, alt: f"\n![{alt}]({figures[key]})\n" if figures and key in figures else "")
    out = [f"# L2 topology report: {a.name}", ""]
    if a.topology is not None:
        out += ["```", a.topology.summary(), "```", ""]
    out += ["## NUCA model", "",
            f"L(sm, line) = mu + a(sm) + b(line) + sum_k s_k u_k(sm) v_k(line), least squares. mu = {m.mu:.2f} "
            f"cycles; a spans {m.a.min():+.2f}..{m.a.max():+.2f}, b spans {m.b.min():+.2f}..{m.b.max():+.2f}. "
            f"Repeat noise per entry: {m.noise_sigma:.3f} cycles; resolution (smallest difference counted): "
            f"{m.resolution:.3f} cycles.", "",
            "| interaction terms | R^2 | residual RMS (cycles) | residual / repeat noise | singular value |",
            "|---|---|---|---|---|"]
    for k in range(len(m.r2)):
        sv = f"{m.s[k - 1]:.1f}" if k else "-"
        out.append(f"| {k if k else 'additive'} | {m.r2[k]:.4f} | {m.residual_rms[k]:.3f} | "
                   f"{m.residual_over_noise[k]:.2f} | {sv} |")
    out += ["", f"{m.significant_rank} interaction terms stand above the noise (singular value > "
            f"{m.rank_threshold:.1f} and spread over more than two SMs and lines); later terms fit noise.",
            fig("r2", "R^2 by rank"), "## L2 partitions", ""]
    if p.found:
        (s0, s1), (l0, l1) = p.sm_counts, p.line_counts
        out += [f"Two partitions. Near side of partition 0: {s0} SMs ({_ranges(p.sms(0))}); of partition 1: "
                f"{s1} SMs ({_ranges(p.sms(1))}); undecided: {int(np.sum(p.sm_partition < 0))}.",
                f"Lines homed in partition 0: {l0}, in partition 1: {l1}, undecided: "
                f"{int(np.sum(p.line_partition < 0))}.",
                f"Near latency {p.near_cycles:.2f} cycles, far {p.far_cycles:.2f}: gap {p.gap_cycles:.2f} cycles, "
                f"far/near = {p.gap_ratio:.3f}. Weakest SM contrast {np.nanmin(p.sm_margin):.0f}, weakest line "
                f"{np.nanmin(p.line_margin):.0f} noise standard errors (decided above {p.z_critical:.1f})."]
        if a.granularity is not None:
            gr = a.granularity
            out.append(f"Home partition granularity: {gr.block_bytes} bytes (largest aligned block with one home; "
                       f"{gr.changes} home changes over the probed lines)." if gr.block_bytes else
                       "The home partition never changes over the probed lines.")
    else:
        out.append(f"No partitions found: {p.reason}.")
    out += [fig("hist", "near and far latency"), "## TPC twins", ""]
    if tw.found:
        out.append(f"{tw.count} pairs of SMs with indistinguishable profiles (RMS difference <= "
                   f"{tw.distance.max():.3f} cycles, every other SM >= {tw.nearest_other.min():.3f}; resolution "
                   f"{tw.resolution:.3f}, margin x{tw.margin:.2f}); {100 * tw.consecutive_fraction:.0f}% are "
                   f"(2i, 2i+1).")
    else:
        out.append("No twins: no two SMs are indistinguishable from each other and apart from all others.")
    out += ["", "## GPC clusters (latency profiles)", ""]
    if g.found:
        out += [f"{g.k} clusters (gap x{g.gap:.2f} between the farthest merge inside and the nearest between), "
                f"sizes {sorted(g.sizes().tolist())}. Candidate levels, best first:", "",
                "| clusters | inner (cycles) | outer (cycles) | gap |", "|---|---|---|---|"]
        out += [f"| {int(k)} | {i:.3f} | {o:.3f} | {gap:.2f} |" for k, i, o, gap in g.levels[:6]]
        if a.gpc_truth:
            t = a.gpc_truth
            out += ["", f"Against the cluster co-residence ground truth ({t.n_gpcs} GPCs, {t.n_compared} SMs): "
                    f"{100 * t.matched_fraction:.1f}% matched after the best one-to-one matching, purity "
                    f"{100 * t.purity:.1f}% (clusters inside one GPC), ARI {t.ari:.3f}.", fig("truth", "GPC vs truth")]
        else:
            out += ["", "No GPC ground truth in this calibration (extras['gpc_truth']): not compared. Latency "
                    "clusters need not be GPCs: units below a GPC (CPCs) can have profiles of their own, and GPCs "
                    "at equal distances from every slice share one."]
    else:
        out.append(f"No GPC clusters: {g.reason}.")
    verdict = a.symmetry.verdict()
    out += ["", "## Symmetry of the SM id range", "", verdict[0].upper() + verdict[1:] + "."]
    out += ["", "## Slice classes", ""]
    if sl.found:
        out.append(f"{sl.count} latency-distinguishable classes of lines (sizes {sl.sizes.min()}-{sl.sizes.max()}); "
                   f"lines within a class <= {sl.within_max:.3f} cycles RMS apart, classes >= {sl.between_min:.3f} "
                   f"(resolution {sl.resolution:.3f}, margin x{sl.margin:.2f}).")
    else:
        out.append("One class: every line is seen alike by every SM, within the resolution.")
    if a.versus:
        v = a.versus
        out += ["", f"Against {v.name}: partition sides agree for {100 * v.partitions['sm_agreement']:.1f}% of SMs "
                f"and {100 * v.partitions['line_agreement']:.1f}% of lines; GPC clusters ARI {v.gpc_ari:.3f}"
                + (f"; slice classes {v.slices.count_a} vs {v.slices.count_b}, ARI {v.slices.ari:.3f}." if v.slices
                   else "; slices not compared (different lines probed).")]
    out += ["", "## Figures", ""]
    if figures:
        out += [fig("sm_map", "per-SM map"), fig("heatmap", "SM x line heatmap")]
    else:
        out.append(figure_note)
    return "\n".join(out) + "\n"


# ---- figures ---------------------------------------------------------------------------------------------
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


def write_report(data, out_dir, noise=None, other=None) -> Path:
    """Analyze `data` and write out_dir/report.md (and PNG figures when matplotlib is installed)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    analysis = analyze(data, noise, other)
    try:
        figures, note = draw_figures(analysis, out_dir), ""
    except ImportError:
        figures, note = None, ("Text only: matplotlib is not installed (`pip install torch-l2topo[plots]` "
                               "adds the figures).")
    path = out_dir / "report.md"
    path.write_text(render_markdown(analysis, figures, note))
    return path


# ---- command line ----------------------------------------------------------------------------------------
def _load(spec: str) -> Topology:
    from .bundled import load_example

    return Topology.load(spec) if Path(spec).exists() else load_example(spec)


def cmd_report(args) -> int:
    from .bundled import load_example

    topo = Topology.load(args.file) if args.file else load_example(args.example)
    path = write_report(topo, args.out_dir, other=_load(args.compare) if args.compare else None)
    print(f"wrote {path}")
    return 0


def add_report_command(subparsers) -> None:
    """Register `report` on an argparse subparsers object (cli.py calls this)."""
    from .bundled import DEFAULT_EXAMPLE

    r = subparsers.add_parser("report", help="analyse a calibration: Markdown report with PNG figures")
    r.add_argument("file", nargs="?", help="a saved calibration (.npz); default: a bundled example")
    r.add_argument("--example", default=DEFAULT_EXAMPLE,
                   help=f"bundled calibration to analyse (default {DEFAULT_EXAMPLE}); see `examples`")
    r.add_argument("--compare", help="a second calibration of the same GPU (.npz path or bundled name): "
                                     "adds how partitions, clusters and slice classes hold between the two")
    r.add_argument("-o", "--out-dir", default="l2topo-report", help="output directory (default l2topo-report)")
    r.set_defaults(func=cmd_report)
