"""calibrate()'s cache on CPU: hits, key mismatch, corrupt files, concurrent calibrations of one GPU."""
import dataclasses
import logging
import multiprocessing as mp

import fake_gpu
import pytest

import torch_l2topo
from torch_l2topo.measure import cache
from torch_l2topo.version import __version__


@pytest.fixture
def fake(monkeypatch, tmp_path, cache_dir):
    marks = tmp_path / "measurements"
    marks.mkdir()
    fake_gpu.install(monkeypatch.setattr, marks)
    return marks


def _only_cache_file(cache_dir):
    files = list(cache_dir.glob("*.npz"))
    assert len(files) == 1, files
    return files[0]


def test_second_call_is_served_from_the_cache(fake, cache_dir):
    a = torch_l2topo.calibrate()
    b = torch_l2topo.calibrate()
    assert fake_gpu.measurements(fake) == 1
    assert (a.line_cycles == b.line_cycles).all()
    assert b.meta["cache_key"]["uuid"] == fake_gpu.FAKE.uuid


def test_force_measures_again(fake, cache_dir):
    torch_l2topo.calibrate()
    torch_l2topo.calibrate(force=True)
    assert fake_gpu.measurements(fake) == 2


def test_other_options_use_another_cache_entry(fake, cache_dir):
    torch_l2topo.calibrate()
    torch_l2topo.calibrate(n_lines=256)
    torch_l2topo.calibrate(mode="serialized")
    torch_l2topo.calibrate(backend="cuda")
    assert fake_gpu.measurements(fake) == 4
    assert len(list(cache_dir.glob("*.npz"))) == 4


def test_corrupt_cache_file_is_reported_in_one_line_and_replaced(fake, cache_dir, caplog):
    torch_l2topo.calibrate()
    path = _only_cache_file(cache_dir)
    path.write_bytes(path.read_bytes()[:500])
    with caplog.at_level(logging.WARNING, logger="torch_l2topo"):
        torch_l2topo.calibrate()
    assert fake_gpu.measurements(fake) == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "corrupt" in warnings[0] and "\n" not in warnings[0]
    torch_l2topo.Topology.load(path)  # replaced by a good file
    torch_l2topo.calibrate()
    assert fake_gpu.measurements(fake) == 2


def test_file_made_under_another_key_is_not_trusted(fake, cache_dir, caplog):
    topo = torch_l2topo.calibrate()
    path = _only_cache_file(cache_dir)
    wrong = dict(topo.meta["cache_key"], driver="999.0")  # e.g. copied from another machine
    topo.meta["cache_key"] = wrong
    topo.save(path)
    with caplog.at_level(logging.WARNING, logger="torch_l2topo"):
        torch_l2topo.calibrate()
    assert fake_gpu.measurements(fake) == 2
    assert any("another key" in r.getMessage() for r in caplog.records)


def test_key_holds_everything_that_invalidates_a_calibration():
    dev = fake_gpu.FAKE.as_dict()
    cfg = dataclasses.asdict(torch_l2topo.ProbeConfig())
    base = cache.cache_key(dev, cfg, __version__, "triton", "waves")
    variants = [cache.cache_key(dict(dev, uuid="GPU-other"), cfg, __version__, "triton", "waves"),
                cache.cache_key(dict(dev, sm_count=114), cfg, __version__, "triton", "waves"),
                cache.cache_key(dict(dev, mig=True), cfg, __version__, "triton", "waves"),
                cache.cache_key(dict(dev, driver="1.0"), cfg, __version__, "triton", "waves"),
                cache.cache_key(dict(dev, sm_clock_limit_mhz=1500), cfg, __version__, "triton", "waves"),
                cache.cache_key(dev, cfg, "9.9", "triton", "waves"),
                cache.cache_key(dev, dict(cfg, seed=1), __version__, "triton", "waves")]
    paths = {cache.cache_path(k) for k in [base, *variants]}
    assert len(paths) == 1 + len(variants)


def test_two_processes_calibrating_one_gpu_both_succeed(tmp_path, cache_dir):
    marks = tmp_path / "measurements"
    marks.mkdir()
    ctx = mp.get_context("spawn")  # never fork a process that may hold CUDA state
    with ctx.Pool(2) as pool:
        results = pool.starmap(fake_gpu.calibrate_in_child, [(str(cache_dir), str(marks), 0.5)] * 2)
    assert results[0] == results[1]
    assert fake_gpu.measurements(marks) == 1  # the second waited for the lock and took the fresh result
    torch_l2topo.Topology.load(_only_cache_file(cache_dir))
    assert not list(cache_dir.glob("*.tmp"))


def test_cache_location_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_L2TOPO_CACHE", str(tmp_path / "x"))
    assert cache.cache_dir() == tmp_path / "x"
    monkeypatch.delenv("TORCH_L2TOPO_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "torch_l2topo"


@pytest.fixture
def unusable(tmp_path):
    """A path no directory can be made at, even by root: a regular file stands where its parent should be."""
    (tmp_path / "a-file").write_text("x")
    return tmp_path / "a-file" / "dir"


def test_without_the_cache_no_writable_cache_directory_is_needed(fake, tmp_path, monkeypatch, unusable, caplog):
    import tempfile

    monkeypatch.setenv("TORCH_L2TOPO_CACHE", str(unusable))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    topo = torch_l2topo.calibrate(use_cache=False)
    assert topo.n_sm == 132 and fake_gpu.measurements(fake) == 1
    # the lock was held in the temporary directory instead, and nothing was said: this is the normal way
    assert (tmp_path / "tmp" / "torch_l2topo-locks" / f"{fake_gpu.FAKE.uuid}.lock").exists() and not caplog.records
    monkeypatch.setattr(tempfile, "tempdir", str(unusable))  # nowhere for a lock at all: measured, with a warning
    with caplog.at_level(logging.WARNING, logger="torch_l2topo"):
        assert torch_l2topo.calibrate(use_cache=False).n_sm == 132
    (record,) = caplog.records
    assert "measures without its lock" in record.getMessage() and str(unusable) in record.getMessage()


def test_a_cache_that_cannot_be_written_costs_a_warning_not_the_map(fake, cache_dir, monkeypatch, caplog):
    def full_disk(topo, key):
        raise OSError(28, "No space left on device", str(cache.cache_path(key)))

    monkeypatch.setattr(cache, "store", full_disk)
    with caplog.at_level(logging.WARNING, logger="torch_l2topo"):
        topo = torch_l2topo.calibrate()
    assert topo.n_sm == 132 and topo.meta["trust"]["trusted"]
    (record,) = [r for r in caplog.records if "not cached" in r.getMessage()]
    assert "No space left on device" in record.getMessage() and not list(cache_dir.glob("*.npz"))
