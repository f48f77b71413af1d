"""What partition maps derive once per calibration and keep on disk (torch_l2topo/placement/partition/calibrated.py):
the same near/far latencies, SM pairs and probe plans as computing them in place (sm_labels + choose_pairs, the
path before the file was kept) on every bundled calibration, a file per calibration that no other calibration
reads, damaged or unwritable files that cost only a new derivation, and a process's first partition_map whose
host path, with the file kept, imports no scipy (on a stand-in GPU, tests/fake_gpu.py)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import torch_l2topo
from torch_l2topo import sm_labels
from torch_l2topo.placement.partition import calibrated as cp
from torch_l2topo.placement.partition import maps as pm
from torch_l2topo.placement.partition.pairs import choose_pairs

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def empty_cache(cache_dir):
    pm.clear_cache(setups=True)
    yield cache_dir
    pm.clear_cache(setups=True)


def _in_place(topo):
    """The oracle: what GpuSetup.of computed before anything was kept (sm_labels, then choose_pairs)."""
    labels = sm_labels(topo)
    return labels.near_cycles, labels.far_cycles, choose_pairs(topo.line_cycles, labels.partition,
                                                                labels.line_partition)


def _assert_same(got, near, far, pairs):
    np.testing.assert_array_equal(got.near, near)
    np.testing.assert_array_equal(got.far, far)
    np.testing.assert_array_equal(got.pairs.sms, pairs.sms)
    np.testing.assert_array_equal(got.pairs.margin, pairs.margin)
    assert got.pairs.best == pairs.best and got.pairs.sms.dtype == pairs.sms.dtype


@pytest.mark.parametrize("name", torch_l2topo.list_examples())
def test_kept_pairs_and_plans_are_those_computed_in_place(name, empty_cache):
    topo = torch_l2topo.load_example(name)
    near, far, pairs = _in_place(topo)
    assert len(pairs.sms) >= 32 and np.isfinite(near).sum() >= 100  # a real two-partition calibration
    _assert_same(cp.calibrated(topo), near, far, pairs)  # derived and kept
    path = cp.derived_path(topo)
    assert path.is_file() and path.parent == empty_cache / "derived"
    before = path.stat().st_mtime_ns
    read = cp.calibrated(torch_l2topo.load_example(name))  # read from the file: another object, same content
    _assert_same(read, near, far, pairs)
    assert path.stat().st_mtime_ns == before
    kept, fresh = pm.GpuSetup.of(topo), pm.GpuSetup.of(topo, use_cache=False)
    for n_blocks in (7, pm.n_blocks_of(16 << 20, 256)):
        a, b = kept.plan(n_blocks, "cpu"), fresh.plan(n_blocks, "cpu")
        np.testing.assert_array_equal(a.plan, b.plan)
        assert a.n_timing == b.n_timing == 2 * min(n_blocks, len(pairs.sms))
        for field in ("pairs", "mid", "half", "usable"):
            np.testing.assert_array_equal(getattr(a.blocks, field), getattr(b.blocks, field), err_msg=field)
        for field in ("pair", "mid_g", "half_g", "ids", "fallback"):
            np.testing.assert_array_equal(getattr(a.blocks, field).numpy(), getattr(b.blocks, field).numpy(), field)


def test_another_calibration_never_reads_the_file_kept_for_one():
    """Two SMs' rows swapped: the pairs must follow the SMs, so a file read by the wrong key would be caught."""
    topo = torch_l2topo.load_example("h200")
    first = cp.calibrated(topo)
    sm = int(first.pairs.sms[0, 0])
    swapped = torch_l2topo.load_example("h200")
    other = (sm + 1) % topo.n_sm
    for name in ("line_cycles", "line_noise", "chain_cycles"):
        a = getattr(swapped, name).copy()
        a[[sm, other]] = a[[other, sm]]
        setattr(swapped, name, a)
    assert cp.derived_path(swapped) != cp.derived_path(topo)
    near, far, pairs = _in_place(swapped)
    assert not np.array_equal(pairs.sms, first.pairs.sms)
    _assert_same(cp.calibrated(swapped), near, far, pairs)
    assert len(list((cp.cache_dir() / "derived").iterdir())) == 2


def test_a_file_of_other_code_or_another_version_is_another_file(monkeypatch):
    topo = torch_l2topo.load_example("h200")
    path = cp.derived_path(topo)
    monkeypatch.setattr(cp, "__version__", "0.0.0-other")
    assert cp.derived_path(topo) != path
    monkeypatch.undo()
    monkeypatch.setattr(cp, "DERIVED_BY", cp.DERIVED_BY[:-1])
    assert cp.derived_path(topo) != path


@pytest.mark.parametrize("damage", ["garbage", "truncated", "other_shapes", "sm_out_of_range"])
def test_a_damaged_file_is_derived_again_and_replaced(damage, caplog):
    topo = torch_l2topo.load_example("h200")
    near, far, pairs = _in_place(topo)
    path = cp.derived_path(topo)
    cp.calibrated(topo)
    raw = path.read_bytes()
    if damage == "garbage":
        path.write_bytes(b"not an npz at all")
    elif damage == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
    else:  # a readable file whose arrays no calibration of these SMs gives
        with open(path, "wb") as f:
            np.savez(f, near=near[:-1] if damage == "other_shapes" else near, far=far,
                     sms=pairs.sms + (0 if damage == "other_shapes" else topo.n_sm), margin=pairs.margin,
                     best=np.array(pairs.best))
    with caplog.at_level("WARNING", logger="torch_l2topo"):
        _assert_same(cp.calibrated(topo), near, far, pairs)
    assert "ignoring" in caplog.text and str(path) in caplog.text
    assert path.read_bytes() == raw  # replaced by the derivation's file


def test_an_unwritable_cache_costs_only_a_warning(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("TORCH_L2TOPO_CACHE", str(blocker))  # derived/ cannot be made under a file
    topo = torch_l2topo.load_example("h100")
    with caplog.at_level("WARNING", logger="torch_l2topo"):
        got = cp.calibrated(topo)
    _assert_same(got, *_in_place(topo))
    assert "not kept" in caplog.text


def test_a_calibration_without_partitions_is_refused_and_nothing_is_kept():
    topo = torch_l2topo.load_example("h200")
    rng = np.random.default_rng(0)
    topo.line_cycles = (300 + rng.normal(0, 0.01, topo.line_cycles.shape)).astype(np.float32)  # flat: no structure
    with pytest.raises(torch_l2topo.ProbeError, match="no two L2 partitions"):
        cp.calibrated(topo)
    assert not (cp.cache_dir() / "derived").exists()


def _run(code: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_derive_imports_only_the_modules_its_key_names():
    code = """if True:
        import json, sys
        import torch_l2topo
        from torch_l2topo.placement.partition import calibrated as cp
        topo = torch_l2topo.load_example("h200")
        before = set(sys.modules)
        cp.derive(topo)
        print(json.dumps(sorted(m for m in set(sys.modules) - before if m.startswith("torch_l2topo"))))
    """
    new = _run(code)
    assert "torch_l2topo.analysis.labels" in new  # the check sees the derivation's imports
    files = {m.removeprefix("torch_l2topo.").replace(".", "/") for m in new}
    named = {f.removesuffix(".py").removesuffix("/__init__") for f in cp.DERIVED_BY}
    assert files <= named, f"add to DERIVED_BY: {sorted(files - named)}"


# A process's partition_map on the stand-in GPU (calibrate() through its real cache), the probe replaced by each
# timing SM's calibrated near or far latency for random homes: the map must read them back, and say whether scipy
# was imported.
FIRST_CALL = """if True:
    import contextlib, json, sys
    from pathlib import Path
    import numpy as np, torch
    import fake_gpu
    from torch_l2topo.measure import calibration as cal
    from torch_l2topo.placement.partition import maps as pm
    from torch_l2topo.placement.partition.pairs import timers_of_blocks

    fake_gpu.install(setattr, Path(sys.argv[1]))
    rng, truth = np.random.default_rng(0), []

    def probe(tensor, plan, n_sm, **options):
        setup = pm.setup_for(0)
        sms = timers_of_blocks(plan.plan, plan.n_blocks).T  # row p: the SM near partition p
        home = rng.integers(0, 2, plan.n_blocks)
        truth.append(home)
        cycles = np.where(np.arange(2)[:, None] == home, setup.near[sms], setup.far[sms])
        return torch.from_numpy(cycles + rng.normal(0, 0.3, cycles.shape)), 1e-3

    pm.storage_of = lambda tensor, block_bytes: tensor.untyped_storage()
    pm.probe_timings = probe
    cal.measuring = lambda index: contextlib.nullcontext()
    torch.cuda.device = lambda index: contextlib.nullcontext()
    torch.cuda.is_current_stream_capturing = lambda: False
    m = pm.partition_map(torch.zeros((16 << 20) // 4))
    print(json.dumps({"scipy": "scipy" in sys.modules, "n_blocks": m.n_blocks,
                      "right": bool(np.array_equal(m.homes, truth[0]))}))
"""


def test_a_first_call_with_the_kept_file_imports_no_scipy(empty_cache, tmp_path):
    """The first process calibrates (stand-in) and derives the pairs: scipy is imported, the positive control. The
    next process's first call reads the calibration and the kept file: no scipy, and the same right map."""
    measured = tmp_path / "measured"
    measured.mkdir()
    code = FIRST_CALL.replace("sys.argv[1]", repr(str(measured)))
    first, second = _run(code), _run(code)
    assert first == {"scipy": True, "n_blocks": 65536, "right": True}
    assert second == {"scipy": False, "n_blocks": 65536, "right": True}
    assert len(list(measured.iterdir())) == 1  # one measurement: the second process read the calibration cache
    assert len(list((empty_cache / "derived").iterdir())) == 1
