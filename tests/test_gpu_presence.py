"""tests/gpu_presence.py on stand-ins for torch: no GPU skips the GPU tests, a GPU that fails fails them."""
import re
from types import SimpleNamespace

import pytest
from gpu_presence import ABSENT, BROKEN, USABLE, gpu_presence


def _torch(cuda="13.0", available=True, capability=(9, 0), raises=None):
    def maybe_raise(value):
        def call(*args):
            if raises is not None and raises[0] == value:
                raise raises[1]
            return {"available": available, "capability": capability}[value]
        return call

    return SimpleNamespace(__version__="2.13.0", version=SimpleNamespace(cuda=cuda),
                           cuda=SimpleNamespace(is_available=maybe_raise("available"),
                                                get_device_capability=maybe_raise("capability")))


@pytest.mark.parametrize("torch,files,environ,state,why", [
    (_torch(cuda=None), [], {}, ABSENT, "CPU build"),
    (_torch(cuda=None), ["/dev/nvidia0"], {}, ABSENT, "CPU build"),  # a CPU wheel on a GPU box tests no GPU code
    (_torch(available=False), [], {}, ABSENT, "no CUDA device"),
    (_torch(available=False), ["/dev/nvidia0"], {"CUDA_VISIBLE_DEVICES": ""}, ABSENT, "hides every GPU"),
    (_torch(capability=(7, 5)), ["/dev/nvidia0"], {}, ABSENT, "7.5, below 8.0"),
    (_torch(), ["/dev/nvidia0"], {}, USABLE, "compute capability 9.0"),
    (_torch(available=False), ["/dev/nvidia0", "/dev/nvidia1"], {}, BROKEN, "/dev/nvidia0, /dev/nvidia1 exist but"),
    (_torch(raises=("available", RuntimeError("CUDA driver initialization failed"))), ["/dev/nvidia0"], {}, BROKEN,
     "is_available\\(\\) raised RuntimeError: CUDA driver initialization failed"),
    (_torch(raises=("capability", RuntimeError("CUDA error: unknown error"))), ["/dev/nvidia0"], {}, BROKEN,
     "visible but fails: RuntimeError: CUDA error: unknown error"),
])
def test_no_gpu_is_told_from_a_gpu_that_fails(torch, files, environ, state, why):
    got, reason = gpu_presence(torch, files, environ)
    assert got == state
    assert re.search(why, reason), reason


class _Item:
    def __init__(self, *keywords):
        self.keywords, self.markers = set(keywords), []

    def add_marker(self, marker):
        self.markers.append(marker)


def test_a_broken_gpu_fails_the_gpu_tests_and_no_gpu_skips_them(monkeypatch):
    """conftest.py's hooks in each state: a GPU test is skipped without a GPU, failed (at setup, so it cannot
    pass) with a GPU that fails, and left alone with a usable one; other tests are never touched."""
    import conftest

    for state, skipped, failed in ((ABSENT, True, False), (BROKEN, False, True), (USABLE, False, False)):
        monkeypatch.setattr(conftest, "GPU_STATE", state)
        gpu, cpu = _Item("gpu"), _Item()
        conftest.pytest_collection_modifyitems(None, [gpu, cpu])
        assert [m.name for m in gpu.markers] == (["skip"] if skipped else []) and not cpu.markers
        conftest.pytest_runtest_setup(cpu)
        if failed:
            with pytest.raises(pytest.fail.Exception, match="a GPU is here but fails"):
                conftest.pytest_runtest_setup(gpu)
        else:
            conftest.pytest_runtest_setup(gpu)
