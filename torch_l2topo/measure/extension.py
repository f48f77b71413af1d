"""Builds and loads the CUDA extensions (the sources in cuda_ext/) with torch.utils.cpp_extension: the probes'
(torch.ops.l2topo, `load`) and the eager kernels' module (embedding bags, forests; a pybind11 module,
`load_eager_kernels`).

The build is cached per torch version and GPU architecture (both are in the extension name, so a torch
upgrade or another GPU never loads a stale binary). torch's own build lock is a plain file that a killed
build leaves behind, after which every later load waits on it forever (fixed only in newer torch). We take
an flock first, which the OS releases when its holder dies: whoever holds it is the only builder, so a torch
lock file found while holding it is stale and is removed. A failed build raises BackendUnavailable in one
line and keeps the compiler's output in the build directory. A successful build leaves a mark (BUILT_MARK: a
digest of its sources) that `compile=False` loads require, so a job can load a module built ahead of time
(`python -m torch_l2topo build`, build_ahead) without ever starting a compiler.
"""
from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

from ..errors import BackendUnavailable
from ..files import atomic_write, exclusive

BUILD_LOCK_TIMEOUT_S = 600.0  # a cold build of the bindings takes about a minute on a busy machine
ERROR_LOG = "l2topo-build-error.log"
BUILT_MARK = "l2topo-built.sha256"  # in the build directory: the digest of the sources a build succeeded on
BUILD_COMMAND = "python -m torch_l2topo build"

_loaded: dict[str, object] = {}
_failed: dict[str, str] = {}  # a failed build is not retried in the same process: torch would load a stale .so
# one build at a time in this process: a build sets TORCH_CUDA_ARCH_LIST, and ops/eager_kernels.py builds in a thread
_building = threading.Lock()


def extension_name(cc: tuple[int, int], stem: str = "l2topo_ext") -> str:
    import torch

    torch_version = "".join(ch if ch.isalnum() else "_" for ch in torch.__version__)
    return f"{stem}_torch{torch_version}_sm{cc[0]}{cc[1]}"


def build_root() -> Path:
    """torch's convention: $TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "torch_extensions"


def load(cc: tuple[int, int]):
    """Build (once) and load the probes' extension for compute capability `cc`; returns the torch.ops namespace."""
    import torch

    from torch_l2topo import cuda_ext

    _build(extension_name(cc), cuda_ext.SOURCES, cc, python_module=False)
    return torch.ops.l2topo


def load_eager_kernels(cc: tuple[int, int], compile: bool = True):
    """Build (once) and load the eager kernels' module (cuda_ext/eager_bindings.cpp) for `cc`. compile=False:
    load it only if it was built ahead of time, else raise BackendUnavailable (never start a compiler)."""
    from torch_l2topo import cuda_ext

    return _build(extension_name(cc, "l2topo_eager"), cuda_ext.EAGER_SOURCES, cc, python_module=True,
                  compile=compile)


def build_ahead(cc: tuple[int, int], progress=print) -> list:
    """Build both extensions for `cc` now (the probes' and the eager kernels'), saying what it does through
    progress(line); returns their names. Raises BackendUnavailable as a build does."""
    import time

    names = []
    for what, build in (("probe kernels", load), ("eager kernels", load_eager_kernels)):
        t0 = time.perf_counter()
        progress(f"building the {what} for sm_{cc[0]}{cc[1]} (a minute or two the first time) ...")
        build(cc)
        progress(f"  done in {time.perf_counter() - t0:.1f} s")
        names.append(what)
    return names


def _digest(sources: tuple) -> str:
    from torch_l2topo import cuda_ext

    h = hashlib.sha256()
    for s in sources:
        h.update(s.encode() + b"\0" + (cuda_ext.SOURCE_DIR / s).read_bytes())
    return h.hexdigest()


def is_built(name: str, sources: tuple) -> bool:
    """Whether extension `name` was built from these very sources (its mark in the build directory)."""
    mark = build_root() / name / BUILT_MARK
    try:
        return mark.read_text().strip() == _digest(sources)
    except OSError:
        return False


def _build(name: str, sources: tuple, cc: tuple[int, int], python_module: bool, compile: bool = True):
    """cpp_extension.load of `sources` as extension `name`, once per process, under the locks (module doc)."""
    import torch

    if name in _loaded:
        return _loaded[name]
    if name in _failed:
        raise BackendUnavailable(_failed[name])
    if not compile and not is_built(name, sources):
        raise BackendUnavailable(f"the CUDA extension {name} is not built for these sources; `{BUILD_COMMAND}` "
                                 f"builds it ahead of time")
    if torch.version.cuda is None:
        raise BackendUnavailable("this torch build has no CUDA support; the CUDA backend needs one "
                                 "(backend='triton' needs none)")
    from torch.utils import cpp_extension

    from torch_l2topo import cuda_ext

    build_dir = build_root() / name
    build_dir.mkdir(parents=True, exist_ok=True)
    with _building, exclusive(build_dir / "l2topo.flock", BUILD_LOCK_TIMEOUT_S, "CUDA extension build"):
        if name in _loaded:  # built by another thread while this one waited
            return _loaded[name]
        stale = build_dir / "lock"
        if stale.exists():
            stale.unlink()
        previous = os.environ.get("TORCH_CUDA_ARCH_LIST")
        os.environ["TORCH_CUDA_ARCH_LIST"] = f"{cc[0]}.{cc[1]}"  # this GPU only: faster, no PTX JIT at start
        try:
            module = cpp_extension.load(name=name, sources=[str(cuda_ext.SOURCE_DIR / s) for s in sources],
                                        extra_cflags=["-O2"], extra_cuda_cflags=["-O3"],
                                        build_directory=str(build_dir), is_python_module=python_module,
                                        verbose=False)
        except Exception as exc:  # the compiler's output is long: keep it in a file, say one line
            log = build_dir / ERROR_LOG
            log.write_text(str(exc))
            first = next((ln for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
            _failed[name] = f"building the CUDA extension {name} failed ({first[:200]}); compiler output in {log}"
            raise BackendUnavailable(_failed[name]) from None
        finally:
            if previous is None:
                os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
            else:
                os.environ["TORCH_CUDA_ARCH_LIST"] = previous
        _loaded[name] = module
        atomic_write(build_dir / BUILT_MARK, _digest(sources).encode(), durable=False)
    return module
