"""The report: Markdown and figures from bundled and planted data, the text-only fallback, the CLI command."""
import json
import re
import subprocess
import sys

import numpy as np
import pytest
from test_structure import NOISE, planted

import torch_l2topo
from torch_l2topo import Topology
from torch_l2topo.analysis.summary import analyze
from torch_l2topo.cli import build_parser
from torch_l2topo.report.markdown import write_report


def planted_topology(with_truth=True) -> Topology:
    """A Topology around the planted map of test_structure, with its GPC labels as ground truth."""
    m, truth = planted()
    n = m.shape[0]
    return Topology(chain_cycles=m.mean(axis=1), chain_ns=m.mean(axis=1) / 1.98, line_cycles=m.astype(np.float32),
                    line_addresses=truth["addresses"], chain_noise=np.zeros(n),
                    # the per-SM median range of 2 repeats that a per-entry sd of NOISE gives
                    line_noise=np.full(n, NOISE * 0.953873 / 0.707107), sm_clock_ghz=np.full(n, 1.98),
                    meta={"config": {"repeats": 2}, "source": "planted"},
                    extras={"gpc_truth": truth["gpc"]} if with_truth else {})


def test_report_on_bundled_data_with_a_second_calibration(tmp_path):
    pytest.importorskip("matplotlib")
    topo = torch_l2topo.load_example("h200-d557bc-cuda-waves")
    path = write_report(topo, tmp_path, other=torch_l2topo.load_example("h200-d557bc-triton-waves"))
    text = path.read_text()
    for heading in ("## NUCA model", "## L2 partitions", "## TPC twins", "## GPC clusters", "## Symmetry",
                    "## Slice classes"):
        assert heading in text
    assert "66 pairs of SMs" in text and "Home partition granularity: 256 bytes" in text
    assert "No GPC ground truth" in text and "partition sides agree for 100.0% of SMs" in text
    for png in ("sm_map.png", "heatmap.png", "r2_by_rank.png", "near_far_hist.png"):
        assert (tmp_path / png).stat().st_size > 1000 and f"]({png})" in text
    assert not (tmp_path / "gpc_vs_truth.png").exists()


def _captions(text: str) -> dict:
    """{png: the line under it} for every figure of a report.md."""
    lines = [line for line in text.splitlines() if line.strip()]
    return {line.split("](")[1].rstrip(")"): lines[i + 1] for i, line in enumerate(lines) if line.startswith("![")}


def test_every_report_figure_has_a_title_axis_labels_a_legend_and_a_caption(tmp_path):
    """Rendered on the bundled H200 calibration (partitions and GPC ground truth: every figure), read back as
    matplotlib objects: what each figure says is checked against the calibration itself."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgba

    from torch_l2topo.report.figures import FIGURES, PARTITION_COLORS, build_figures

    topo = torch_l2topo.load_example("h200")
    figures = build_figures(analyze(topo))
    try:
        assert set(figures) == set(FIGURES)
        for key, fig in figures.items():
            ax = fig.axes[0]
            assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel(), key
            if key in ("heatmap", "truth"):  # images: the colour bar is the legend
                assert len(fig.axes) == 2 and fig.axes[1].get_ylabel(), key
            else:
                assert ax.get_legend() is not None and ax.get_legend().get_texts(), key

        # sm_map: bar height = chain latency above the fastest SM, colour = the SM's partition, named in the legend
        ax = figures["sm_map"].axes[0]
        bars = ax.patches
        np.testing.assert_allclose([b.get_height() for b in bars], topo.chain_cycles - topo.chain_cycles.min(),
                                   atol=1e-4)
        side = topo.to_frame("sm")["partition"].to_numpy()
        assert [b.get_facecolor() for b in bars] == [to_rgba(PARTITION_COLORS[int(s)]) for s in side]
        assert [t.get_text() for t in ax.get_legend().get_texts()] == \
            [f"near partition {k} ({int(np.sum(side == k))} SMs)" for k in (0, 1)]
        assert "fastest SM" in ax.get_ylabel() and f"{topo.chain_cycles.min():.1f}" in ax.get_ylabel()

        heat = figures["heatmap"]
        assert heat.axes[1].get_ylabel() == "cycles per load"
        assert [t.get_text() for t in heat.axes[0].get_yticklabels()] == \
            [f"SMs near\npartition {k}\n({int(np.sum(side == k))})" for k in (0, 1)]

        assert len(figures["r2"].axes[0].get_legend().get_texts()) == 3  # R^2, the noise line, the residual
        assert [t.get_text().split(":")[0] for t in figures["hist"].axes[0].get_legend().get_texts()] == \
            ["near", "far"]

        # gpc_vs_truth says what its axis counts: groups of the ground truth, GPCs and lone TPCs apart
        sizes = np.bincount(topo.extras["gpc_truth"][topo.extras["gpc_truth"] >= 0])
        sizes = sizes[sizes > 0]
        xlabel = figures["truth"].axes[0].get_xlabel()
        assert f"{len(sizes)} groups = {int(np.sum(sizes > 2))} GPCs + {int(np.sum(sizes == 2))} TPCs" in xlabel
        assert len(figures["truth"].axes[0].get_xticklabels()) == len(sizes)
    finally:
        for fig in figures.values():
            plt.close(fig)

    text = write_report(topo, tmp_path).read_text()
    assert _captions(text) == {name: f"*{caption}*" for name, caption in FIGURES.values()}


def test_a_map_without_structure_draws_no_partition_figure(tmp_path):
    """Negative fixture: a flat map has no partitions, so no near/far histogram and every SM undecided."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from torch_l2topo.report.figures import build_figures

    rng = np.random.default_rng(0)
    flat = 300 + rng.normal(0, NOISE, (64, 128))
    figures = build_figures(analyze(flat, NOISE))
    try:
        assert set(figures) == {"sm_map", "heatmap", "r2"}
        assert [t.get_text() for t in figures["sm_map"].axes[0].get_legend().get_texts()] == ["undecided (64 SMs)"]
        assert figures["sm_map"].axes[0].get_title() == "per-SM mean latency over the probed lines, coloured by " \
                                                         "L2 partition"
    finally:
        for fig in figures.values():
            plt.close(fig)


def test_report_compares_gpc_clusters_with_ground_truth(tmp_path):
    pytest.importorskip("matplotlib")
    text = write_report(planted_topology(), tmp_path).read_text()
    assert "Against the cluster co-residence ground truth (8 GPCs, 132 SMs): 100.0% matched" in text
    assert (tmp_path / "gpc_vs_truth.png").exists() and "](gpc_vs_truth.png)" in text


def test_report_without_matplotlib_is_text_only_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    text = write_report(torch_l2topo.load_example("h200"), tmp_path).read_text()
    assert "Text only: matplotlib is not installed" in text and "![" not in text
    assert not list(tmp_path.glob("*.png"))


def test_analysis_modules_do_not_import_matplotlib():
    code = ("import sys, torch_l2topo.report.markdown, torch_l2topo.analysis.summary, torch_l2topo.analysis.labels, "
            "torch_l2topo.analysis.structure, torch_l2topo.analysis.slices, torch_l2topo.analysis.nuca; "
            "sys.exit('matplotlib' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


def test_summary_is_plain_json():
    a = analyze(planted_topology())
    doc = json.loads(json.dumps(a.summary()))
    assert doc["partitions"]["sm_counts"] == [66, 66] and doc["twins"]["count"] == 66
    assert doc["gpc_clusters"]["k"] == 8 and doc["gpc_truth"]["matched_fraction"] == 1.0
    assert doc["slices"]["count"] == 16 and doc["partitions"]["granularity_bytes"] == 256


def test_ground_truth_of_the_wrong_shape_is_rejected():
    topo = planted_topology()
    topo.extras["gpc_truth"] = np.zeros(5, dtype=np.int64)
    with pytest.raises(ValueError, match="gpc_truth"):
        analyze(topo)


def test_report_command_defaults_and_a_saved_file(tmp_path, capsys):
    args = build_parser().parse_args(["report"])
    # no --example: the default bundled calibration, chosen when the command runs (bundled.default_example)
    assert (args.file, args.example, args.out_dir, args.compare) == (None, None, "l2topo-report", None)
    saved = torch_l2topo.load_example("h200-f78934-cuda-waves").save(tmp_path / "cal.npz")
    out = tmp_path / "out"
    args = build_parser().parse_args(["report", str(saved), "-o", str(out), "--compare", "h200-f78934-triton-waves"])
    assert args.func(args) == 0
    assert str(out / "report.md") in capsys.readouterr().out
    assert "Against bundled example h200-f78934-triton-waves" in (out / "report.md").read_text()


def test_report_command_on_a_missing_file_raises_what_the_cli_reports(tmp_path):
    args = build_parser().parse_args(["report", str(tmp_path / "missing.npz"), "-o", str(tmp_path)])
    with pytest.raises(FileNotFoundError):
        args.func(args)


def test_report_with_a_recorded_geometry_run_adds_its_section_and_figures(tmp_path):
    """`report --geometry FILE`: the L2 geometry section holds the suite's derived numbers from the recorded
    H200 run (the 64-byte fetch granule, no prefetch) and, with matplotlib, one figure per experiment."""
    from pathlib import Path

    from torch_l2topo.cli import main

    recorded = sorted((Path(__file__).resolve().parent / "data" / "geometry").glob("geometry_h200_*.json"))
    assert recorded, "no recorded geometry run"
    assert main(["report", "--geometry", str(recorded[0]), "-o", str(tmp_path)]) == 0
    text = (tmp_path / "report.md").read_text()
    section = text[text.index("## L2 geometry"):]
    assert "granule 64 B" in section and "dips at no stride" in section
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    from torch_l2topo.report.markdown import GEOMETRY_CAPTIONS

    captions = _captions(section)
    assert len(captions) >= 6 and all((tmp_path / png).exists() for png in captions)
    assert sorted(captions.values()) == sorted(f"*{GEOMETRY_CAPTIONS[png[len('geometry_'):-4]]}*" for png in captions)


def test_report_refuses_a_file_that_is_not_a_geometry_result(tmp_path):
    from torch_l2topo.cli import main

    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"figures": {"nothing": 1}}))
    assert main(["report", "--geometry", str(bad), "-o", str(tmp_path / "out")]) == 2


@pytest.mark.parametrize("example", ["h100-4ea7ab-cuda-waves", "h200-1e5731-cuda-waves"])
def test_report_command_on_each_models_bundled_map_writes_every_figure(tmp_path, capsys, example):
    """`report --example` on the bundled H100 and H200 maps: the report names its GPU and links every figure, each
    file written (the analysis runs on the CPU on either model's real data)."""
    pytest.importorskip("matplotlib")
    from torch_l2topo.cli import main

    assert main(["report", "--example", example, "-o", str(tmp_path)]) == 0
    text = (tmp_path / "report.md").read_text()
    model = "NVIDIA H100 80GB HBM3" if example.startswith("h100") else "NVIDIA H200"
    figures = re.findall(r"\]\(([\w_]+\.png)\)", text)
    assert model in text and len(figures) >= 5 and all((tmp_path / f).stat().st_size > 10_000 for f in figures)
