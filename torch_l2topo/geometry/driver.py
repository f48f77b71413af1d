"""The few CUDA driver API calls of the geometry suite, bound with ctypes to libcuda (no extra dependency).

Owns the L2 persisting controls the persisting experiment needs (the set-aside size, an access policy window
on a stream, resetting persisting lines), two device attributes and a context limit. Every call that the
experiment depends on raises ProbeError with the driver's CUresult when it fails; the cleanup calls do not
(release_persisting must not hide the error that ended an experiment). The context is the current one: call
these with the device made current (torch.cuda.device).
"""
from __future__ import annotations

import ctypes

from ..errors import ProbeError

CU_LIMIT_MAX_L2_FETCH_GRANULARITY = 0x05
CU_LIMIT_PERSISTING_L2_CACHE_SIZE = 0x06
CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW = 1
CU_ACCESS_PROPERTY_NORMAL, CU_ACCESS_PROPERTY_STREAMING, CU_ACCESS_PROPERTY_PERSISTING = 0, 1, 2
CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE = 108
CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE = 109


class _Window(ctypes.Structure):  # CUaccessPolicyWindow
    _fields_ = [("base_ptr", ctypes.c_void_p), ("num_bytes", ctypes.c_size_t), ("hitRatio", ctypes.c_float),
                ("hitProp", ctypes.c_int), ("missProp", ctypes.c_int)]


class _AttrValue(ctypes.Union):  # CUlaunchAttributeValue: 64 bytes, of which the window is one member
    _fields_ = [("accessPolicyWindow", _Window), ("pad", ctypes.c_char * 64)]


def libcuda():
    """The CUDA driver library (OSError where it is not installed)."""
    return ctypes.CDLL("libcuda.so.1")


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise ProbeError(f"{what} failed with CUresult {rc}: the persisting-L2 experiment cannot run here")


def context_limit(limit: int) -> int | None:
    """cuCtxGetLimit(limit) of the current context, or None where the driver library is unavailable or the
    call fails."""
    try:
        v = ctypes.c_size_t()
        return int(v.value) if libcuda().cuCtxGetLimit(ctypes.byref(v), limit) == 0 else None
    except OSError:
        return None


def device_attribute(attr: int, index: int) -> int:
    """cuDeviceGetAttribute(attr) of device `index`."""
    v = ctypes.c_int()
    _check(libcuda().cuDeviceGetAttribute(ctypes.byref(v), attr, index), "cuDeviceGetAttribute")
    return int(v.value)


def set_persisting_limit(nbytes: int) -> None:
    """The L2 set aside for persisting accesses in the current context (0: none)."""
    _check(libcuda().cuCtxSetLimit(CU_LIMIT_PERSISTING_L2_CACHE_SIZE, ctypes.c_size_t(nbytes)), "cuCtxSetLimit")


def set_access_window(stream_handle: int, ptr: int, nbytes: int, hit_ratio: float) -> None:
    """An access policy window on the stream: hit_ratio of the accesses to [ptr, ptr + nbytes) persist, the
    rest stream (nbytes 0: no window)."""
    val = _AttrValue()
    val.accessPolicyWindow = _Window(ptr, nbytes, hit_ratio, CU_ACCESS_PROPERTY_PERSISTING,
                                     CU_ACCESS_PROPERTY_STREAMING)
    _check(libcuda().cuStreamSetAttribute(ctypes.c_void_p(stream_handle), CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW,
                                           ctypes.byref(val)), "cuStreamSetAttribute(access policy window)")


def reset_persisting() -> None:
    """Every persisting line in L2 back to normal."""
    _check(libcuda().cuCtxResetPersistingL2Cache(), "cuCtxResetPersistingL2Cache")


def release_persisting(stream_handle: int) -> None:
    """Undo the experiment: no window on the stream (checked), then, best effort, persisting lines reset and
    no L2 set aside."""
    set_access_window(stream_handle, 0, 0, 0.0)
    lib = libcuda()
    lib.cuCtxResetPersistingL2Cache()
    lib.cuCtxSetLimit(CU_LIMIT_PERSISTING_L2_CACHE_SIZE, ctypes.c_size_t(0))
