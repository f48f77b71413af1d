"""ops/eager_kernels.py on the CPU: small eager embedding bags run torch's op and forests the Triton kernel until
the C++ eager module is built, then the module's functions, on every device of its compute capability; one build
per capability, in the background; a failed build or TORCH_L2TOPO_EAGER_KERNELS=0 keeps torch's op and the Triton
kernel. The kernels themselves are tested on a GPU (tests/test_ops_gpu.py: test_eager_kernel_*,
test_eager_forest_*)."""
import logging
import threading
import types

import pytest
import torch
import torch.nn.functional as F

from torch_l2topo.errors import BackendUnavailable
from torch_l2topo.measure import extension
from torch_l2topo.ops import eager_kernels
from torch_l2topo.ops.embedding_bag import MODES, eager_launch


@pytest.fixture
def fresh(monkeypatch):
    """No device seen, nothing built; devices 0-2 report sm_90, sm_90 and sm_80 (fake properties)."""
    caps = {0: (9, 0), 1: (9, 0), 2: (8, 0)}
    monkeypatch.setattr(eager_kernels, "_devices", {})
    monkeypatch.setattr(eager_kernels, "_loaded", {})
    monkeypatch.setattr(eager_kernels, "_builds", {})
    monkeypatch.setattr(eager_kernels, "device_properties",
                        lambda i: types.SimpleNamespace(major=caps[i][0], minor=caps[i][1], L2_cache_size=50 << 20))
    monkeypatch.delenv(eager_kernels.ENV_SWITCH, raising=False)
    return caps


def _fake_module_build(monkeypatch, release: threading.Event, built: list, fail=False, compiled=None):
    """load_eager_kernels replaced: records each cc it loads, waits for `release`; with `compiled` (a list), a load
    that may not compile (compile=False) finds nothing built unless a compile happened first."""
    def load_eager_kernels(cc, compile=True):
        if compiled is not None:
            if compile:
                compiled.append(cc)
            elif cc not in compiled:
                raise BackendUnavailable(f"the CUDA extension for sm{cc[0]}{cc[1]} is not built for these sources")
        built.append(cc)
        release.wait(10)
        if fail:
            raise BackendUnavailable("building the CUDA extension l2topo_eager failed (nvcc: not found)")
        return types.SimpleNamespace(bags=f"bags for sm{cc[0]}{cc[1]}", forest=f"forest for sm{cc[0]}{cc[1]}")

    monkeypatch.setattr(extension, "load_eager_kernels", load_eager_kernels)


def test_small_calls_run_torchs_op_until_the_module_is_built_then_the_module(fresh, monkeypatch):
    release, built = threading.Event(), []
    _fake_module_build(monkeypatch, release, built)
    first = eager_kernels.eager_device(0)
    assert first.bags is eager_kernels.torch_bags and first.l2_bytes == 50 << 20  # the build is still running
    assert first.terms is eager_kernels.TORCH_OP_US  # and the rule estimates torch's time
    assert first.forest is None  # forests run the Triton kernel
    assert eager_kernels.eager_device(0) is first and eager_kernels.eager_device(1).bags is eager_kernels.torch_bags
    release.set()
    assert eager_kernels.wait_for_build(0, timeout=10) and eager_kernels.wait_for_build(1, timeout=10)
    assert first.bags == "bags for sm90" and eager_kernels.eager_device(1).bags == "bags for sm90"
    assert first.forest == "forest for sm90" and eager_kernels.eager_device(1).forest == "forest for sm90"
    second = eager_kernels.eager_device(1)
    assert first.terms is eager_kernels.EAGER_KERNEL_US and second.terms is eager_kernels.EAGER_KERNEL_US
    assert built == [(9, 0)]  # one build for both sm_90 devices
    assert eager_kernels.eager_device(2).bags is eager_kernels.torch_bags  # another capability: its own build
    assert eager_kernels.wait_for_build(2, timeout=10) and built == [(9, 0), (8, 0)]


def test_a_failed_build_keeps_torchs_op_and_the_triton_kernel_and_says_so_once(fresh, monkeypatch, caplog):
    release, built = threading.Event(), []
    release.set()
    _fake_module_build(monkeypatch, release, built, fail=True)
    with caplog.at_level(logging.WARNING, logger="torch_l2topo"):
        assert not eager_kernels.wait_for_build(0, timeout=10)
        assert not eager_kernels.wait_for_build(1, timeout=10)
    assert eager_kernels.eager_device(0).bags is eager_kernels.torch_bags and built == [(9, 0)]
    device = eager_kernels.eager_device(0)
    assert device.terms is eager_kernels.TORCH_OP_US and device.forest is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "keep torch's op and the Triton kernel" in warnings[0]
    assert "nvcc: not found" in warnings[0]


def test_a_first_call_never_compiles_and_build_now_does(fresh, monkeypatch, caplog):
    release, built, compiled = threading.Event(), [], []
    release.set()
    _fake_module_build(monkeypatch, release, built, compiled=compiled)
    with caplog.at_level(logging.WARNING, logger="torch_l2topo"):
        assert not eager_kernels.wait_for_build(0, timeout=10)  # the background load found nothing built
    assert compiled == [] and eager_kernels.eager_device(0).bags is eager_kernels.torch_bags
    assert any("not built" in r.getMessage() for r in caplog.records)
    assert eager_kernels.build_now(0) and compiled == [(9, 0)]  # built here, and used from now on
    assert eager_kernels.eager_device(0).bags == eager_kernels.eager_device(1).bags == "bags for sm90"
    assert eager_kernels.build_now(1) and compiled == [(9, 0)]  # the same capability: nothing more to build


def test_the_environment_switch_never_builds(fresh, monkeypatch):
    built = []
    _fake_module_build(monkeypatch, threading.Event(), built)
    monkeypatch.setenv(eager_kernels.ENV_SWITCH, "0")
    assert not eager_kernels.wait_for_build(0, timeout=1)
    assert built == [] and eager_kernels._builds == {}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_torch_bags_is_torchs_own_op(mode, include_last_offset):
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(50, 8, generator=g)
    input = torch.randint(0, 50, (20,), generator=g)
    offsets = torch.tensor([0, 3, 3, 11, 20] if include_last_offset else [0, 3, 3, 11])
    got = eager_kernels.torch_bags(weight, input, offsets, MODES[mode], include_last_offset)
    expected = F.embedding_bag(input, weight, offsets, mode=mode, include_last_offset=include_last_offset)
    assert torch.equal(got, expected)


def test_cpu_calls_never_take_the_eager_launch(fresh):
    weight = torch.randn(50, 8)
    input, offsets = torch.tensor([1, 2, 3]), torch.tensor([0, 1])
    assert eager_launch(input, weight, offsets, "sum") is None
    assert eager_kernels._devices == {}  # nothing built for a CPU call
