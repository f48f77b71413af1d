"""Shared fixtures. GPU tests carry the `gpu` marker: skipped where there is no GPU, failed where a GPU is there but
fails (tests/gpu_presence.py tells the two apart)."""
import os

import pytest
from gpu_presence import ABSENT, BROKEN, gpu_presence

# One BLAS thread: on a 2-core CI machine OpenBLAS's default threads oversubscribe the cores under pytest (one
# 132 x 512 SVD took 2.4 s instead of 0.01 s); set before numpy loads its BLAS.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


GPU_STATE, GPU_WHY = gpu_presence()  # tests/gpu_presence.py: absent, usable or broken


def pytest_report_header(config):
    return f"GPU tests: {GPU_STATE} ({GPU_WHY})"


def pytest_collection_modifyitems(config, items):
    if GPU_STATE != ABSENT:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU of compute capability >= 8.0: {GPU_WHY}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_setup(item):
    if GPU_STATE == BROKEN and "gpu" in item.keywords:  # a GPU that fails must not pass as a machine without one
        pytest.fail(f"a GPU is here but fails: {GPU_WHY}", pytrace=False)


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
