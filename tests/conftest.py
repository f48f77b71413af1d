"""Shared fixtures. GPU tests carry the `gpu` marker and are skipped where no usable CUDA device exists."""
import os

import pytest

# One BLAS thread: on a 2-core CI machine OpenBLAS's default threads oversubscribe the cores under pytest (one
# 132 x 512 SVD took 2.4 s instead of 0.01 s); set before numpy loads its BLAS.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _have_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available() and torch.cuda.get_device_capability(0) >= (8, 0)
    except Exception:
        return False


HAVE_GPU = _have_gpu()


def pytest_collection_modifyitems(config, items):
    if HAVE_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU of compute capability >= 8.0")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """An empty calibration cache for one test (never the user's real cache)."""
    d = tmp_path / "cache"
    monkeypatch.setenv("TORCH_L2TOPO_CACHE", str(d))
    return d


@pytest.fixture
def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def topos() -> dict:
    """{file stem: Topology} of every recorded H200 calibration (tests/recorded.py says which tuned what)."""
    from recorded import load_all

    return load_all()


@pytest.fixture(scope="session")
def sigs(topos) -> dict:
    """The device signature of every recorded calibration."""
    from torch_l2topo.identity.fingerprint import signature

    return {k: signature(t) for k, t in topos.items()}
