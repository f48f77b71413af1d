"""The geometry figures (torch_l2topo/geometry/figures.py) drawn from the recorded H200 geometry JSON, through the
library and through `python -m torch_l2topo geometry --from FILE --figures DIR`; without matplotlib the CLI says
so and draws nothing."""
import sys
from pathlib import Path

import pytest

from torch_l2topo.cli import main
from torch_l2topo.geometry.figures import draw_geometry_figures, load_geometry

RECORDED = sorted((Path(__file__).resolve().parent / "data" / "geometry").glob("geometry_h200_*.json"))
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(not RECORDED, reason="no recorded H200 geometry JSON")
def test_figures_from_the_recorded_json(tmp_path):
    pytest.importorskip("matplotlib")
    result = load_geometry(RECORDED[0])
    files = draw_geometry_figures(result, tmp_path)
    e = result["experiments"]
    expected = {"capacity", "strides", "prefetch", "contention", "persisting"}
    expected |= {k for k in ("conflict_sets", "layout_fixes") if k in e and "error" not in e[k]}
    assert set(files) == expected
    for name in files.values():
        data = (tmp_path / name).read_bytes()
        assert data.startswith(PNG) and 5_000 < len(data) < 300_000


def test_an_experiment_that_failed_gets_no_figure(tmp_path):
    pytest.importorskip("matplotlib")
    result = {"experiments": {"capacity": {"error": "ProbeError: no"}, "prefetch": {"strides": []}}}
    assert draw_geometry_figures(result, tmp_path) == {}


@pytest.mark.skipif(not RECORDED, reason="no recorded H200 geometry JSON")
def test_cli_draws_from_a_file_and_says_when_matplotlib_is_missing(tmp_path, capsys, monkeypatch):
    if _has_matplotlib():
        assert main(["geometry", "--from", str(RECORDED[0]), "--figures", str(tmp_path / "a")]) == 0
        assert "wrote" in capsys.readouterr().out and any((tmp_path / "a").glob("*.png"))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    assert main(["geometry", "--from", str(RECORDED[0]), "--figures", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "L2 geometry (full)" in out and "matplotlib is not installed" in out
    assert not list((tmp_path / "b").glob("*.png"))


def test_a_file_that_is_not_a_geometry_result_is_refused(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text('{"figures": {"n_sm": 132}}')
    assert main(["geometry", "--from", str(bad)]) == 2
    assert "not a geometry result" in capsys.readouterr().err
    bad.write_text("not json")
    assert main(["geometry", "--from", str(bad)]) == 2


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True
