"""The report: Markdown and figures from bundled and planted data, the text-only fallback, the CLI command."""
import json
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
    assert (args.file, args.example, args.out_dir, args.compare) == (None, "h200", "l2topo-report", None)
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

    recorded = sorted((Path(__file__).resolve().parents[1] / "benchmarks" / "results").glob("geometry_h200_*.json"))
    assert recorded, "no recorded geometry run"
    assert main(["report", "--geometry", str(recorded[0]), "-o", str(tmp_path)]) == 0
    text = (tmp_path / "report.md").read_text()
    section = text[text.index("## L2 geometry"):]
    assert "granule 64 B" in section and "dips at no stride" in section
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    pngs = [line for line in section.splitlines() if line.startswith("![")]
    assert len(pngs) >= 6 and all((tmp_path / line.split("(")[1].rstrip(")")).exists() for line in pngs)


def test_report_refuses_a_file_that_is_not_a_geometry_result(tmp_path):
    from torch_l2topo.cli import main

    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"figures": {"nothing": 1}}))
    assert main(["report", "--geometry", str(bad), "-o", str(tmp_path / "out")]) == 2
