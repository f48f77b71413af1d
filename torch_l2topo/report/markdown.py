"""The topology report: an Analysis (analysis/summary.py) written up as Markdown, with figures (figures.py),
each under a one-line caption.

Figures need matplotlib (the `plots` extra); without it the report is text-only and says so.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..analysis.summary import Analysis, analyze
from .figures import FIGURES, draw_figures, truth_groups

# The L2 geometry suite's figures (geometry/figures.py), by experiment: the caption under each in report.md.
GEOMETRY_CAPTIONS = {
    "capacity": "Latency against footprint: where the L2 stops holding a working set (near and far lines, and "
                "one SM per partition on its own ring).",
    "strides": "Cold stride sweep and first touch: the bytes one miss brings into the L2.",
    "prefetch": "Regular against random order of the same addresses: a prefetcher would make regular faster.",
    "contention": "Requests per ns as more SMs chase lines of one slice class or of many: where the L2 saturates.",
    "persisting": "Hot-buffer hits after a streaming copy, with and without a persisting-L2 window.",
    "conflict_sets": "Chases over n lines at power-of-two strides, and a control off the stride: a set conflict "
                     "would show as a miss band on the left only.",
    "layout_fixes": "Time with each layout fix over time without it (below 1: the fix helps).",
}


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
    def fig(key, alt):
        return f"\n![{alt}]({figures[key]})\n\n*{FIGURES[key][1]}*\n" if figures and key in figures else ""

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
            groups = truth_groups(a.topology.extras["gpc_truth"])
            lone = sum(len(sms) <= 2 for _, sms in groups)
            what = f"{len(groups) - lone} GPCs" + (f" and {lone} TPCs never co-resident with another" if lone else "")
            out += ["", f"Against the cluster co-residence ground truth ({what}, {t.n_compared} SMs): "
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
        other_gpu = " (another GPU)" if v.same_gpu is False else ""
        out += ["", f"Against {v.name}{other_gpu}: partition sides agree for "
                f"{100 * v.partitions['sm_agreement']:.1f}% of SMs and {100 * v.partitions['line_agreement']:.1f}% "
                f"of lines; GPC clusters ARI {v.gpc_ari:.3f}"
                + (f"; slice classes {v.slices.count_a} vs {v.slices.count_b}, ARI {v.slices.ari:.3f}." if v.slices
                   else "; slices not compared (different lines probed).")]
    out += ["", "## Figures", ""]
    if figures:
        out += [fig("sm_map", "per-SM map"), fig("heatmap", "SM x line heatmap")]
    else:
        out.append(figure_note)
    return "\n".join(out) + "\n"


def write_report(data, out_dir, noise=None, other=None, geometry=None) -> Path:
    """Analyze `data` and write out_dir/report.md (and PNG figures when matplotlib is installed). geometry: a
    result of the L2 geometry suite (geometry_figures.load_geometry), added as a section with its figures."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    analysis = analyze(data, noise, other)
    try:
        figures, note = draw_figures(analysis, out_dir), ""
    except ImportError:
        figures, note = None, ("Text only: matplotlib is not installed (`pip install torch-l2topo[plots]` "
                               "adds the figures).")
    text = render_markdown(analysis, figures, note)
    if geometry is not None:
        text += render_geometry(geometry, out_dir, with_figures=figures is not None)
    path = out_dir / "report.md"
    path.write_text(text)
    return path


def render_geometry(result: dict, out_dir, with_figures: bool) -> str:
    """The report's L2 geometry section: the suite's derived numbers and, with matplotlib, its figures."""
    from ..geometry.figures import draw_geometry_figures
    from ..geometry.summary import summary_lines

    out = ["", "## L2 geometry", "", "```", *summary_lines(result), "```", ""]
    if with_figures:
        for key, name in draw_geometry_figures(result, out_dir).items():
            out += [f"![geometry: {key}]({name})", "", f"*{GEOMETRY_CAPTIONS.get(key, key)}*", ""]
    return "\n".join(out) + "\n"
