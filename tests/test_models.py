"""The analysis on every GPU model's calibrations: each bundled one (H200s and an H100) and synthetic ones of
other shapes (an A100-like 108 SMs / 40 MiB, an L40-like 142 SMs / 96 MiB), checked against the physics and
the calibration's own metadata, never against 132 SMs; and which bundled map is the default on which GPU."""
import re

import numpy as np
import pytest

import torch_l2topo
from torch_l2topo import Topology
from torch_l2topo.analysis.labels import sm_labels
from torch_l2topo.analysis.nuca import fit_nuca
from torch_l2topo.analysis.summary import analyze
from torch_l2topo.bundled import default_example, load_example, model_key
from torch_l2topo.cli import main
from torch_l2topo.errors import TopologyFormatError

EXAMPLES = torch_l2topo.list_examples()
MIB = 1 << 20


def reshaped(base: Topology, sms: np.ndarray, name: str, l2_mib: int) -> Topology:
    """A calibration of another shape from a real one: the rows of `sms` (an SM may repeat) as its SMs, the
    device metadata edited to match (what a calibration of that GPU would carry)."""
    device = dict(base.meta["device"], name=name, sm_count=len(sms), l2_bytes=l2_mib * MIB)
    return Topology(**{k: getattr(base, k)[sms] for k in ("chain_cycles", "chain_ns", "chain_noise", "line_noise",
                                                          "sm_clock_ghz", "line_cycles")},
                    line_addresses=base.line_addresses.copy(), meta=dict(base.meta, device=device))


def a100_like() -> Topology:
    """108 SMs (54 whole TPCs of an H100 map), 40 MiB of L2."""
    return reshaped(load_example("h100"), np.arange(108), "NVIDIA A100-SXM4-40GB", 40)


def l40_like() -> Topology:
    """142 SMs (an H200 map's 132 and 5 TPCs again), 96 MiB of L2."""
    return reshaped(load_example("h200"), np.r_[np.arange(132), np.arange(10)], "NVIDIA L40", 96)


SHAPES = {"a100-like": a100_like, "l40-like": l40_like}


def check_labels(topo: Topology) -> None:
    """Every SM labelled, as many labels as the metadata's SM count, two partitions covering them."""
    n = topo.meta["device"]["sm_count"]
    labels = sm_labels(topo)
    assert labels.n_sm == n and labels.tpc.shape == (n,) and labels.line_partition.shape == (topo.n_lines,)
    assert set(np.unique(labels.partition)) <= {-1, 0, 1}
    decided = labels.partition >= 0
    sizes = np.bincount(labels.partition[decided], minlength=2)
    assert labels.partitions.found and sizes.sum() + (~decided).sum() == n and sizes.min() > n // 4
    assert (labels.far_cycles[decided] > labels.near_cycles[decided]).all()  # far is farther, on every SM
    assert np.array_equal(np.bincount(labels.tpc), [2] * (n // 2) + [1] * (n % 2))


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_bundled_calibration_analyses_to_its_own_shape(name):
    topo = load_example(name)
    dev = topo.meta["device"]
    assert topo.n_sm == dev["sm_count"] and dev["l2_bytes"] in (50 * MIB, 60 * MIB)  # H100, H200
    check_labels(topo)
    model = fit_nuca(topo)
    assert (model.n_sm, model.n_lines) == topo.line_cycles.shape
    a = analyze(topo)
    assert sum(a.partitions.sm_counts) <= dev["sm_count"] and a.summary()["partitions"]["found"]


@pytest.mark.parametrize("name", EXAMPLES)
def test_show_and_report_on_every_bundled_calibration(name, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    topo = load_example(name)
    dev = topo.meta["device"]
    assert main(["show", "--example", name]) == 0
    out = capsys.readouterr().out
    assert f"{dev['name']}  cc" in out and f"{dev['sm_count']} SMs  L2 {dev['l2_bytes'] // MIB} MiB" in out
    assert out.rstrip().endswith(f"source: bundled example {name}")
    assert main(["report", "--example", name, "-o", str(tmp_path)]) == 0
    text = (tmp_path / "report.md").read_text()
    figures = re.findall(r"\]\(([\w_]+\.png)\)", text)
    # four figures, five with GPC ground truth
    assert dev["name"] in text and len(figures) >= 4 + ("gpc_truth" in topo.extras)
    assert all((tmp_path / f).exists() for f in figures)


@pytest.mark.parametrize("shape", SHAPES)
def test_other_shapes_analyse_and_report_without_assuming_132_sms(shape, tmp_path, capsys):
    topo = SHAPES[shape]()
    n, l2 = topo.meta["device"]["sm_count"], topo.meta["device"]["l2_bytes"] // MIB
    check_labels(topo)
    a = analyze(topo)
    assert a.model.n_sm == n and len(a.gpcs.labels) == n
    path = topo.save(tmp_path / f"{shape}.npz")
    assert main(["show", str(path)]) == 0
    assert f"{n} SMs  L2 {l2} MiB" in capsys.readouterr().out
    frame = Topology.load(path).to_frame("sm")
    assert len(frame) == n and frame["partition"].isin([-1, 0, 1]).all()
    pytest.importorskip("matplotlib")
    assert main(["report", str(path), "-o", str(tmp_path / "r")]) == 0
    text = (tmp_path / "r" / "report.md").read_text()
    assert f"{n} SMs  L2 {l2} MiB" in text and topo.meta["device"]["name"] in text
    assert all((tmp_path / "r" / f).exists() for f in re.findall(r"\]\(([\w_]+\.png)\)", text))


def test_a_reshaped_map_whose_metadata_keeps_the_old_sm_count_is_refused():
    base = load_example("h100")
    with pytest.raises(TopologyFormatError, match="sm_count.* is 132 but the arrays hold 108 SMs"):
        Topology(**{k: getattr(base, k)[:108] for k in ("chain_cycles", "chain_ns", "chain_noise", "line_noise",
                                                        "sm_clock_ghz", "line_cycles")},
                 line_addresses=base.line_addresses, meta=base.meta)


@pytest.mark.parametrize("name, key", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                       ("NVIDIA A100-SXM4-40GB", "a100"), ("NVIDIA GH200 480GB", "gh200"),
                                       ("NVIDIA L40S", "l40s"), ("NVIDIA GeForce RTX 4090", "4090"),
                                       ("NVIDIA", None)])
def test_model_key_is_the_first_word_with_a_digit(name, key):
    assert model_key(name) == key


@pytest.mark.parametrize("gpu, model, why", [
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", "the model of this machine's GPU, h100"),
    ("NVIDIA H200", "NVIDIA H200", "the model of this machine's GPU, h200"),
    ("NVIDIA A100-SXM4-40GB", "NVIDIA H200", "no bundled calibration of this machine's GPU model, a100: the h200"),
    (None, "NVIDIA H200", "no CUDA GPU here: the h200 fallback")])
def test_the_default_example_is_the_local_models_and_says_why(monkeypatch, gpu, model, why):
    monkeypatch.setattr("torch_l2topo.bundled.visible_gpu_name", lambda: gpu)
    name, reason = default_example()
    topo = load_example()
    assert topo.meta["device"]["name"] == model and name.startswith(model_key(model) + "-")
    assert why in reason and topo.source == f"bundled example {name} (default: {reason})"
