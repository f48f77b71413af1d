"""Launch an op's Triton kernel the way JITFunction.run does, minus its per-launch check of the kernel's globals.

Triton's launch (JITFunction.run, Triton 3.6 to 3.9) compares on every call each module global that the kernel
and its helpers read with its value at compile time, building constexpr objects for each: a cost per global per
launch, and the ops' kernels read many (most of them the placement helpers'). Those are constants of
torch_l2topo.layout and of the kernels' own modules, which never change while a program runs, so the ops launch
through `lean(kernel)[grid](*args, **kwargs)`:
- the compiled kernel is found as run finds it (Triton's own binder for the specialisation, compute_cache_key
  for the key), so a launch never runs a kernel compiled for other arguments;
- a call whose kernel is not compiled yet, with a launch or pre-run hook set, on a Triton without these
  internals, or in the interpreter, goes through kernel[grid] unchanged (compiling it, checking globals once).
Compile options that run() adds and this module does not know are not in its keys: such calls miss and take
kernel[grid] (slower, the same kernel). tests/test_ops_gpu.py checks that lean launches happen, that no kernel
specialised for other arguments is reused, and that a hook sends calls to kernel[grid]. Docs: docs/ops.md.
"""
from __future__ import annotations

try:
    from triton import knobs
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction, compute_cache_key
except ImportError:  # no Triton, or one without these internals: every launch is kernel[grid]
    knobs = None

_launches = {"lean": 0, "triton": 0}  # how calls went (tests read it)


def _options(kernel, kwargs: dict) -> dict:
    """kwargs with the compile options run() adds before binding (Triton 3.6; 3.9 adds fpsan_homomorphic_casts)."""
    kwargs["debug"] = kwargs.get("debug", kernel.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    if hasattr(knobs.compilation, "fpsan_homomorphic_casts"):
        kwargs["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
    return kwargs


def _set(hook) -> bool:
    """A launch hook that does something: Triton 3.6 keeps an always-present HookChain (empty: no hook)."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _hooked(kernel) -> bool:
    runtime = knobs.runtime
    return bool(kernel.pre_run_hooks or _set(runtime.launch_enter_hook) or _set(runtime.launch_exit_hook)
                or getattr(runtime, "add_stages_inspection_hook", None))


def _launch(kernel, grid: tuple, args: tuple, kwargs: dict):
    if knobs is None or not isinstance(kernel, JITFunction) or _hooked(kernel):  # (interpreted kernels too)
        _launches["triton"] += 1
        return kernel[grid](*args, **kwargs)
    device = driver.active.get_current_device()
    kernel_cache, key_cache, _, _, binder = kernel.device_caches[device]
    bound, specialization, options = binder(*args, **_options(kernel, dict(kwargs)))
    compiled = kernel_cache.get(compute_cache_key(key_cache, specialization, options))
    if compiled is None or hasattr(compiled, "result"):  # not compiled yet (or still compiling): run() does it
        _launches["triton"] += 1
        return kernel[grid](*args, **kwargs)
    _launches["lean"] += 1
    stream = driver.active.get_current_stream(device)
    compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream,
                 compiled.function, compiled.packed_metadata, None, None, None, *bound.values())
    return compiled


class lean:
    """kernel[grid](*args, **kwargs) without the per-launch check of the kernel's globals (module doc)."""

    __slots__ = ("kernel",)

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid: tuple):
        return lambda *args, **kwargs: _launch(self.kernel, grid, args, kwargs)
