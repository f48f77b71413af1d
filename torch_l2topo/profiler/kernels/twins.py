"""Instrumented twins of the process's Triton kernels, swapped in while a profiling cycle is active.

Twins.swap_in(recorders) finds the Triton kernels the process has loaded (loaded_kernels: Triton's JIT caches and
Inductor's launchers), builds each one's twin once per recorder buffer (ptx.instrument, ptxas, a module load in
the kernel's CUDA context) and points each launch path at it: the `function` handle that Triton's launch and
Inductor's static launcher read at every launch, or the copy Inductor's Triton launcher keeps. swap_out()
restores every original handle. Only handles change: arguments, grid, shared memory and stream stay the
launcher's, so a twin runs exactly where and how the original would have. A kernel whose PTX cannot be found,
rewritten or assembled, or whose twin would not launch at its thread count, stays plain and is reported so.
Needs triton (torch for Inductor's kernels); imported only for profile(kernels="triton"). Docs: docs/profiler.md.
"""
from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from .ptx import InstrumentationError, instrument, kernel_name, target

PTXAS_TIMEOUT_S = 120


@dataclass
class LoadedKernel:
    """One loaded Triton kernel: what its twin is built from, and where its launches read the function handle
    (sites: (holder, key), a mapping's key or an object's attribute)."""

    name: str
    key: str        # Triton's hash of the compiled kernel
    device: int
    shared: int
    threads: int
    ptx_source: object  # a callable returning the PTX text, or None when it cannot be found
    sites: list = field(default_factory=list)
    ptxas_options: tuple = ()  # what Triton gave ptxas for the original (FP contraction off, the kernel's options)

    def handle(self) -> int:
        holder, key = self.sites[0]
        return holder[key] if isinstance(holder, dict) else getattr(holder, key)

    def point_at(self, function: int) -> None:
        for holder, key in self.sites:
            if isinstance(holder, dict):
                holder[key] = function
            else:
                setattr(holder, key, function)


def _cache_dir_names(key: str) -> list:
    """The directory names Triton's file cache may keep kernel `key` under: base32 of the hash (Triton >= 3.2),
    else the hash itself."""
    import base64

    try:
        return [base64.b32encode(bytes.fromhex(key)).decode().rstrip("="), key]
    except ValueError:  # not a hex hash
        return [key]


def _cached_ptx(key: str, name: str, device: int, cubin_path=None):
    """The PTX file Triton left in its cache for the kernel of hash `key` (Inductor's kernels keep only the cubin
    in memory): beside the cubin the launcher loaded, else under the cache roots; None where none holds it."""
    candidates = [Path(cubin_path).with_suffix(".ptx")] if cubin_path else []
    roots = [os.environ.get("TRITON_CACHE_DIR")]
    try:
        import triton

        roots.append(triton.knobs.cache.dir)
    except Exception:  # an older Triton without knobs
        pass
    try:
        from torch._inductor.runtime.cache_dir_utils import triton_cache_dir

        roots.append(triton_cache_dir(device))
    except Exception:  # no Inductor
        pass
    candidates += [Path(root) / d / f"{name}.ptx" for root in roots if root for d in _cache_dir_names(key)]
    for path in candidates:
        if path.is_file():
            return path
    return None


def _ptxas_options(meta) -> tuple:
    """The ptxas options of Triton's build of a kernel that change its code: FP contraction off where the kernel was
    compiled without FP fusion, and the kernel's own ptx_options."""
    fmad = () if getattr(meta, "enable_fp_fusion", True) else ("--fmad=false",)
    return fmad + tuple((getattr(meta, "ptx_options", None) or "").split())


def _compiled(kernel, device: int, sites: list) -> LoadedKernel:
    meta = kernel.metadata
    return LoadedKernel(kernel.name, kernel.hash, device, int(meta.shared), 32 * int(meta.num_warps),
                        lambda: kernel.asm["ptx"] if "ptx" in kernel.asm else None, sites, _ptxas_options(meta))


def _static(kernel, device: int) -> LoadedKernel:
    ptx = _cached_ptx(kernel.hash, kernel.name, device, getattr(kernel, "cubin_path", None))
    meta = None  # Triton's defaults, unless its metadata beside the PTX holds the build's options
    if ptx is not None:
        try:
            meta = SimpleNamespace(**json.loads(ptx.with_suffix(".json").read_text()))
        except (OSError, ValueError, TypeError):
            pass
    return LoadedKernel(kernel.name, kernel.hash, device, int(kernel.shared), 32 * int(kernel.num_warps),
                        ptx.read_text if ptx else None, [(kernel, "function")], _ptxas_options(meta))


def _inductor_classes() -> tuple:
    try:
        from torch._inductor.runtime.static_triton_launcher import StaticallyLaunchedCudaKernel
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    except Exception:  # no Inductor here, or another layout of it
        return None, None
    return CachingAutotuner, StaticallyLaunchedCudaKernel


def loaded_kernels() -> list:
    """Every Triton kernel this process has loaded on a GPU, once per (kernel, device), with each launch path's
    site: @triton.jit kernels (their JIT cache, per device) and Inductor's (its autotuners' launchers: a static
    launcher's kernel, or the CompiledKernel and the handle a Triton launcher copied)."""
    from triton.compiler.compiler import CompiledKernel
    from triton.runtime.jit import JITFunction

    autotuner_class, static_class = _inductor_classes()
    found: dict = {}

    def add(loaded: LoadedKernel, obj) -> None:
        entry = found.setdefault((id(obj), loaded.device), loaded)
        if entry is not loaded:
            entry.sites += [s for s in loaded.sites if all(s[0] is not t[0] for t in entry.sites)]

    for obj in gc.get_objects():
        kind = type(obj)  # not isinstance: it reads __class__, which some proxies answer with a warning
        if issubclass(kind, JITFunction):
            for device, caches in list(getattr(obj, "device_caches", {}).items()):
                cache = caches[0] if isinstance(caches, tuple) and caches and isinstance(caches[0], dict) else {}
                for kernel in list(cache.values()):
                    if isinstance(kernel, CompiledKernel) and getattr(kernel, "function", None):
                        add(_compiled(kernel, int(device), [(kernel, "function")]), kernel)
        elif autotuner_class is not None and issubclass(kind, autotuner_class):
            device = int(getattr(getattr(obj, "device_props", None), "index", 0) or 0)
            for launcher in list(getattr(obj, "launchers", ())):
                scope = getattr(launcher, "__globals__", {})
                binary, runner = scope.get("bin"), getattr(scope.get("runner"), "__self__", None)
                if isinstance(binary, CompiledKernel) and scope.get("function"):
                    add(_compiled(binary, device, [(scope, "function"), (binary, "function")]), binary)
                elif static_class is not None and isinstance(runner, static_class) and runner.function:
                    add(_static(runner, device), runner)
    return list(found.values())


def _ptxas_candidates() -> list:
    paths = []
    try:
        import triton

        for tool in ("ptxas_blackwell", "ptxas"):
            path = getattr(getattr(triton.knobs.nvidia, tool, None), "path", None)
            if path:
                paths.append(path)
    except Exception:  # an older Triton
        pass
    return paths + [p for p in [shutil.which("ptxas")] if p]


def assemble(ptx: str, options=()) -> bytes:
    """The cubin of `ptx` for its .target, by the first ptxas (Triton's, then PATH's) that accepts it, given
    `options` as well.

    Raises:
        InstrumentationError: no ptxas assembled it (the last one's first error line says why).
    """
    problem = "no ptxas found (Triton's or on PATH)"
    with tempfile.TemporaryDirectory(prefix="l2topo-twin-") as tmp:
        src, out = Path(tmp) / "twin.ptx", Path(tmp) / "twin.cubin"
        src.write_text(ptx)
        for ptxas in _ptxas_candidates():
            run = subprocess.run([ptxas, *options, f"--gpu-name={target(ptx)}", str(src), "-o", str(out)],
                                 capture_output=True, text=True, timeout=PTXAS_TIMEOUT_S)
            if run.returncode == 0 and out.is_file():
                return out.read_bytes()
            problem = (run.stderr.strip().splitlines() or [f"{ptxas} exited {run.returncode}"])[0]
    raise InstrumentationError(f"the twin did not assemble: {problem}")


def _load(name: str, cubin: bytes, shared: int, device: int) -> tuple:
    """(module, function, max threads per block) of `cubin` loaded in GPU `device`'s context."""
    import torch
    from triton.runtime import driver

    with torch.cuda.device(device):
        loaded = driver.active.utils.load_binary(name, cubin, shared, device)
    module, function = loaded[0], loaded[1]
    return module, function, (loaded[4] if len(loaded) > 4 else None)


class Twins:
    """The process's twins, by (kernel hash, device, buffer address), and the swap of one cycle."""

    def __init__(self):
        self._lock = threading.Lock()
        self._twins: dict = {}      # (key, device, address) -> function handle, or an error string
        self._swapped: list = []    # [(LoadedKernel, original handle)] while a cycle runs twins
        self._found = None          # build()'s scan, which the next swap_in uses (one scan of the heap per cycle)

    def _build(self, kernel: LoadedKernel, address: int, tag: int):
        """The twin's function handle, or a one-line reason why the kernel stays plain."""
        try:
            text = kernel.ptx_source() if kernel.ptx_source else None
            if text is None:
                return "its PTX was not found (neither in memory nor in Triton's cache)"
            cubin = assemble(instrument(text, address, tag), kernel.ptxas_options)
            _module, function, max_threads = _load(kernel_name(text), cubin, kernel.shared, kernel.device)
            if max_threads is not None and max_threads < kernel.threads:
                return f"its twin launches at most {max_threads} threads, the kernel {kernel.threads}"
            return function
        except (InstrumentationError, OSError, subprocess.SubprocessError, RuntimeError) as exc:
            return f"{type(exc).__name__}: {exc}"

    def _built(self, kernels: list, recorders: dict) -> None:
        """Build the twins of `kernels` not built yet for their GPU's recorder buffer, in parallel (each ptxas
        is a process of its own)."""
        todo = {}
        for k in kernels:
            rec = recorders[k.device]
            key = (k.key, k.device, rec.address)
            if key not in self._twins:
                todo.setdefault(key, (k, rec.address, rec.register(k.name)))
        if todo:
            with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
                self._twins.update(zip(todo.keys(), pool.map(lambda job: self._build(*job), todo.values())))

    def build(self, recorders: dict) -> None:
        """Build the twins of every loaded Triton kernel of a GPU in `recorders` ({device: CtaRecorder}) without
        swapping them in (what a profiler's warmup step does, so that the active steps only swap)."""
        with self._lock:
            self._found = [k for k in loaded_kernels() if k.device in recorders]
            self._built(self._found, recorders)

    def swap_in(self, recorders: dict) -> dict:
        """Point every loaded Triton kernel of a GPU in `recorders` ({device: CtaRecorder}) at its twin, built
        first where need be; the kernels are those build() found, if it ran since the last swap_in (a kernel first
        loaded in between is twinned from the next cycle on). Returns {"instrumented": [names], "plain": {name:
        why}} for the cycle's trace."""
        with self._lock:
            self._restore()
            found, self._found = self._found, None
            kernels = [k for k in (found if found is not None else loaded_kernels()) if k.device in recorders]
            self._built(kernels, recorders)
            instrumented, plain = set(), {}
            for k in kernels:
                twin = self._twins[(k.key, k.device, recorders[k.device].address)]
                if isinstance(twin, str):
                    plain[k.name] = twin
                    continue
                self._swapped.append((k, k.handle()))
                k.point_at(twin)
                instrumented.add(k.name)
                recorders[k.device].dirty = True  # the twins write records: reset it before the next cycle
            return {"instrumented": sorted(instrumented), "plain": dict(sorted(plain.items()))}

    def _restore(self) -> None:
        for kernel, original in reversed(self._swapped):
            kernel.point_at(original)
        self._swapped = []

    def swap_out(self) -> None:
        """Every launch path back on its original kernel."""
        with self._lock:
            self._restore()


_twins = Twins()


def shared_twins() -> Twins:
    """The process's Twins (one per process: twins are keyed by the recorder buffers, which are per process)."""
    return _twins
