"""CPU tests of green-context SM selection (torch_l2topo.placement.green_contexts): which groups choose_groups() takes,
on synthetic groups with known answers and on the SM groups an H200 census recorded
(tests/data/green/green_h200.json) with the bundled H200 calibrations; bad arguments; and the fallback
where green contexts cannot be used (warn once, run normally)."""
import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from torch_l2topo.analysis.labels import sm_labels
from torch_l2topo.bundled import list_examples, load_topology
from torch_l2topo.placement import green_contexts as gc
from torch_l2topo.placement.green_contexts import SmGroup, choose_groups

RECORDED = Path(__file__).resolve().parent / "data" / "green" / "green_h200.json"


def _recorded_groups():
    groups = json.loads(RECORDED.read_text())["figures"]["groups"]
    return [SmGroup(g["index"], g["sms"]) for g in groups]


def test_the_fewest_fastest_groups_are_chosen():
    groups = [SmGroup(0, (0, 1)), SmGroup(1, (2, 3)), SmGroup(2, (4, 5)), SmGroup(3, (6, 7))]
    latency = np.array([300, 300, 280, 281, 290, 290, 270, 271.0])
    assert [g.index for g in choose_groups(groups, latency, 3)] == [3, 1]
    assert [g.index for g in choose_groups(groups, latency, 2)] == [3]
    assert [g.index for g in choose_groups(groups, latency, 8)] == [3, 1, 2, 0]


def test_near_ranks_the_groups_of_that_partition_first_even_when_slower():
    groups = [SmGroup(0, (0, 1)), SmGroup(1, (2, 3)), SmGroup(2, (4, 5))]
    latency = np.array([300, 300, 270, 270, 280, 280.0])
    partition = np.array([1, 1, 0, 0, 1, -1])
    assert [g.index for g in choose_groups(groups, latency, 2, partition=partition, near=1)] == [0]
    assert [g.index for g in choose_groups(groups, latency, 4, partition=partition, near=1)] == [0, 2]
    assert [g.index for g in choose_groups(groups, latency, 2, partition=partition, near=0)] == [1]


@pytest.mark.parametrize("n_sm", [0, 7, -1, True, 2.5])
def test_bad_sm_counts_are_refused(n_sm):
    groups = [SmGroup(0, (0, 1)), SmGroup(1, (2, 3, 4))]
    with pytest.raises(ValueError, match="n_sm"):
        choose_groups(groups, np.zeros(5), n_sm)


def test_bad_partitions_and_foreign_groups_are_refused():
    groups = [SmGroup(0, (0, 1))]
    with pytest.raises(ValueError, match="near must be"):
        choose_groups(groups, np.zeros(2), 1, partition=np.array([0, 0]), near=1)
    with pytest.raises(ValueError, match="partition labels"):
        choose_groups(groups, np.zeros(2), 1, near=0)
    with pytest.raises(ValueError, match="beyond the calibration"):
        choose_groups([SmGroup(0, (0, 140))], np.zeros(132), 1)
    with pytest.raises(ValueError, match="no SM"):
        SmGroup(0, ())


def test_recorded_h200_groups_cover_the_device_and_lie_in_one_partition():
    """The recorded census (one H200) against every bundled H200 calibration (four other GPUs): the driver's
    groups of 8 are TPC pairs that never straddle the two L2 partitions, so near=p can be honoured."""
    groups = _recorded_groups()
    ids = sorted(s for g in groups for s in g.sms)
    assert ids == list(range(132))
    names = sorted({n.rsplit("-", 2)[0] for n in list_examples()})
    assert len(names) >= 2
    for name in names:
        topo = load_topology(f"{name}-triton-waves")
        part = sm_labels(topo).partition
        for g in groups:
            if len(g.sms) == 8:
                assert len(set(part[list(g.sms)].tolist())) == 1, f"{name}: group {g.index} straddles partitions"
        for p in (0, 1):
            pure = sum(len(g.sms) for g in groups if len(g.sms) == 8 and np.all(part[list(g.sms)] == p))
            chosen = choose_groups(groups, topo.chain_cycles, pure, partition=part, near=p)
            assert all(np.all(part[list(g.sms)] == p) for g in chosen)
            assert sum(len(g.sms) for g in chosen) == pure


def test_without_cuda_python_green_contexts_are_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda", None)
    with pytest.raises(gc.GreenUnavailable, match=r"torch-l2topo\[green\]"):
        gc._driver()


def test_on_sms_falls_back_with_one_warning_per_reason(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(gc, "_warned", set())
    x = torch.arange(4.0)
    with pytest.warns(RuntimeWarning, match="no CUDA device; the ops run on all SMs") as record:
        with gc.on_sms(8) as sel:
            y = x * 2
    assert record[0].filename == __file__  # the warning points at the caller's `with`, not at contextlib
    assert sel.sms is None and sel.stream is None and sel.reason == "no CUDA device"
    torch.testing.assert_close(y, torch.tensor([0.0, 2, 4, 6]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with gc.on_sms(8):
            pass
