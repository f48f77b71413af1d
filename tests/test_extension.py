"""extension.py on CPU: a lock file left by a killed build does not block the next build; failures are one line."""
import types

import pytest

from torch_l2topo.errors import BackendUnavailable, L2TopoError
from torch_l2topo.measure import extension


@pytest.fixture
def fake_build(monkeypatch, tmp_path):
    """torch.utils.cpp_extension.load replaced by a recorder: torch's real one would wait on `lock`."""
    import torch
    from torch.utils import cpp_extension

    calls = []

    def load(**kw):
        from pathlib import Path

        calls.append(kw)
        assert not (Path(kw["build_directory"]) / "lock").exists(), "a stale lock would make torch wait forever"

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(cpp_extension, "load", load)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(extension, "_loaded", {})
    monkeypatch.setattr(extension, "_failed", {})
    monkeypatch.setattr(torch, "ops", types.SimpleNamespace(l2topo="ops"))
    return calls


def test_stale_lock_from_a_killed_build_is_removed(fake_build, tmp_path):
    build_dir = tmp_path / extension.extension_name((9, 0))
    build_dir.mkdir()
    (build_dir / "lock").touch()  # what a build killed half-way leaves behind
    assert extension.load((9, 0)) == "ops"
    assert len(fake_build) == 1 and fake_build[0]["name"].endswith("_sm90")
    assert extension.load((9, 0)) == "ops" and len(fake_build) == 1  # loaded once per process


def test_extension_name_carries_torch_version_and_arch():
    name = extension.extension_name((8, 6))
    assert name.startswith("l2topo_ext_torch") and name.endswith("_sm86")


def test_no_cuda_torch_is_a_clear_error(monkeypatch):
    import torch

    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(extension, "_loaded", {})
    with pytest.raises(BackendUnavailable, match="no CUDA support"):
        extension.load((9, 0))


def test_a_failed_build_is_not_retried_in_the_same_process(monkeypatch, tmp_path):
    import torch
    from torch.utils import cpp_extension

    calls = []

    def broken(**kw):
        calls.append(kw)
        raise RuntimeError("nvcc: error")

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(cpp_extension, "load", broken)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(extension, "_loaded", {})
    monkeypatch.setattr(extension, "_failed", {})
    for _ in range(2):
        with pytest.raises(BackendUnavailable, match="nvcc: error") as info:
            extension.load((9, 0))
        assert isinstance(info.value, L2TopoError) and "\n" not in str(info.value)  # one line, caught by the CLI
    assert len(calls) == 1
    log = tmp_path / extension.extension_name((9, 0)) / extension.ERROR_LOG
    assert "nvcc: error" in str(info.value) and str(log) in str(info.value) and log.read_text() == "nvcc: error"


def test_the_eager_module_is_a_python_module_of_its_own(fake_build):
    from torch_l2topo import cuda_ext

    extension.load_eager_kernels((9, 0))
    assert len(fake_build) == 1 and fake_build[0]["is_python_module"]
    assert fake_build[0]["name"].startswith("l2topo_eager_torch") and fake_build[0]["name"].endswith("_sm90")
    assert [p.rsplit("/", 1)[-1] for p in fake_build[0]["sources"]] == list(cuda_ext.EAGER_SOURCES)
    extension.load((9, 0))  # the probes' extension: another build, another name
    assert len(fake_build) == 2 and not fake_build[1]["is_python_module"]


def test_a_load_that_may_not_compile_needs_a_build_of_these_very_sources(fake_build, tmp_path, monkeypatch):
    from torch_l2topo import cuda_ext

    with pytest.raises(BackendUnavailable, match="not built.*python -m torch_l2topo build"):
        extension.load_eager_kernels((9, 0), compile=False)
    assert fake_build == []  # no compiler started
    extension.load_eager_kernels((9, 0))  # a build (the `build` verb's) leaves its mark
    name = extension.extension_name((9, 0), "l2topo_eager")
    assert extension.is_built(name, cuda_ext.EAGER_SOURCES)
    monkeypatch.setattr(extension, "_loaded", {})  # a later process
    extension.load_eager_kernels((9, 0), compile=False)
    assert len(fake_build) == 2
    # sources that changed since (an upgrade): not the build's, so not loaded without compiling
    (tmp_path / name / extension.BUILT_MARK).write_text("0" * 64)
    monkeypatch.setattr(extension, "_loaded", {})
    with pytest.raises(BackendUnavailable, match="not built"):
        extension.load_eager_kernels((9, 0), compile=False)
    assert len(fake_build) == 2


def test_build_ahead_builds_both_extensions_and_says_so(fake_build):
    lines = []
    assert extension.build_ahead((9, 0), progress=lines.append) == ["probe kernels", "eager kernels"]
    assert [kw["is_python_module"] for kw in fake_build] == [False, True]
    assert lines[0].startswith("building the probe kernels for sm_90") and lines[-1].strip().startswith("done in")
