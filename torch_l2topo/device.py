"""Which GPU to probe, whether it can be probed, and what identifies it (name, uuid, driver, MIG, board serial).

Result files carry hashes of the uuid and of the board serial, never the raw values (uuid_hash,
board_serial_hash). The serial is the physical ground truth: some machines present a new uuid for the same
board on another day, while the board serial stays.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
from dataclasses import asdict, dataclass

from .errors import DeviceError

MIN_COMPUTE_CAPABILITY = (8, 0)


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    uuid: str
    cc: tuple[int, int]
    sm_count: int
    l2_bytes: int
    total_memory: int
    driver: str
    mig: bool
    sm_clock_limit_mhz: int | None = None  # the SM clock the GPU is set to run at (NVML; None without it)

    @property
    def uuid_hash(self) -> str:
        """A short stable hash of the uuid, for result files that should not carry the raw identifier."""
        return uuid_hash(self.uuid)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["cc"] = list(self.cc)
        return d


def uuid_hash(uuid: str) -> str:
    return hashlib.sha256(uuid.encode()).hexdigest()[:12]


# What NVML and nvidia-smi report when a board has no readable serial (vGPU guests, some consumer boards).
_NO_SERIAL = {"", "n/a", "[n/a]", "not supported", "[not supported]"}
_serial_hashes: dict[str, str | None] = {}  # by uuid: one lookup per process (nvidia-smi takes ~0.1 s)


def board_serial_hash(index: int) -> str | None:
    """sha256 of CUDA device `index`'s board serial number, first 12 hex (the uuid_hash scheme); None when it
    cannot be read. Tries NVML (nvidia-ml-py, the board matched by uuid), then `nvidia-smi`; never raises."""
    try:
        uuid = device_uuid(index)
    except Exception:  # no torch or no such device: no serial either
        return None
    if uuid not in _serial_hashes:
        serial = _serial_from_nvml(uuid) or _serial_from_smi(uuid)
        _serial_hashes[uuid] = uuid_hash(serial) if serial else None
    return _serial_hashes[uuid]


def _clean_serial(value) -> str | None:
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if not isinstance(value, str):
        return None
    value = value.strip()
    return None if value.lower() in _NO_SERIAL else value


def _nvml_uuid(uuid: str) -> str:
    """NVML and nvidia-smi name GPUs 'GPU-<uuid>'; torch prints the bare uuid."""
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def _serial_from_nvml(uuid: str) -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return _clean_serial(pynvml.nvmlDeviceGetSerial(pynvml.nvmlDeviceGetHandleByUUID(_nvml_uuid(uuid))))
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVML is optional; boards without a serial raise NVMLError_NotSupported
        return None


def _serial_from_smi(uuid: str) -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=uuid,serial", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):  # not installed, hung driver
        return None
    if out.returncode != 0:
        return None
    want = _nvml_uuid(uuid).lower()
    for line in out.stdout.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0].lower() == want:
            return _clean_serial(fields[1])
    return None


def visible_gpu_name() -> str | None:
    """The name of the GPU CUDA numbers 0 (torch's current one once CUDA is initialized), found without
    initializing CUDA (a process may still fork): torch's name when it already did, else NVML's for the first
    CUDA_VISIBLE_DEVICES entry (NVML numbers by PCI bus, CUDA fastest first: the model agrees on a machine of one
    model, which is what callers want it for); None when unknown or there is no GPU. Never raises."""
    try:
        import torch

        if torch.cuda.is_initialized():
            return torch.cuda.get_device_name()
    except Exception:  # no torch, a broken driver: unknown
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    first = visible.split(",")[0].strip() if visible is not None else "0"
    if not first:
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(int(first)) if first.isdigit() \
                else pynvml.nvmlDeviceGetHandleByUUID(first)
            name = pynvml.nvmlDeviceGetName(handle)
            return name.decode() if isinstance(name, bytes) else str(name)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVML is optional (nvidia-ml-py); no driver, no such device
        return None


def resolve_device(device=None) -> int:
    """Map None / int / "cuda:N" / torch.device to a CUDA device index, with clear errors."""
    import torch

    if not torch.cuda.is_available():
        raise DeviceError("no CUDA device is available (torch.cuda.is_available() is False); "
                          "torch_l2topo.load_example() returns a bundled real calibration to work with instead "
                          "(`python -m torch_l2topo examples` lists them, one per board and backend)")
    if device is None:
        index = torch.cuda.current_device()
    elif isinstance(device, bool):
        raise DeviceError(f"device must be an index, 'cuda:N' or a torch.device, not {device!r}")
    elif isinstance(device, int):
        index = device
    else:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise DeviceError(f"cannot parse device {device!r}: {exc}") from None
        if dev.type != "cuda":
            raise DeviceError(f"device must be a CUDA device, got {dev}")
        index = torch.cuda.current_device() if dev.index is None else dev.index
    count = torch.cuda.device_count()
    if not 0 <= index < count:
        raise DeviceError(f"CUDA device index {index} is out of range: this machine has {count} "
                          f"device(s), 0..{count - 1}")
    return index


def device_info(index: int) -> DeviceInfo:
    """Read the identity and geometry of CUDA device `index` and check that it can be probed."""
    import torch

    props = torch.cuda.get_device_properties(index)
    cc = (props.major, props.minor)
    uuid = device_uuid(index)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    mig = "MIG" in props.name or uuid.startswith("MIG-") or "MIG-" in visible
    info = DeviceInfo(index=index, name=props.name, uuid=uuid, cc=cc,
                      sm_count=props.multi_processor_count, l2_bytes=int(getattr(props, "L2_cache_size", 0)),
                      total_memory=props.total_memory, driver=driver_version(), mig=mig,
                      sm_clock_limit_mhz=sm_clock_limit_mhz(uuid))
    if cc < MIN_COMPUTE_CAPABILITY:
        raise DeviceError(f"{info.name} (device {index}) has compute capability {cc[0]}.{cc[1]}; the probes "
                          f"need {MIN_COMPUTE_CAPABILITY[0]}.{MIN_COMPUTE_CAPABILITY[1]} or newer")
    return info


def device_uuid(index: int) -> str:
    """The uuid of CUDA device `index` as torch reports it (cheap: no NVML)."""
    import torch

    return str(getattr(torch.cuda.get_device_properties(index), "uuid", "")) or f"unknown-{index}"


def sm_clock_limit_mhz(uuid: str) -> int | None:
    """The SM clock this GPU is set to run at: its application clock (what `nvidia-smi -ac` changes), read
    through NVML when nvidia-ml-py is installed; None otherwise. Part of the calibration cache key: latencies
    in cycles change when the clocks do, so a calibration made at other clock settings is not reused."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
            return int(pynvml.nvmlDeviceGetApplicationsClock(handle, pynvml.NVML_CLOCK_SM))
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVML is optional, and some GPUs or drivers do not report application clocks
        return None


def driver_version() -> str:
    """The kernel driver's version (e.g. 580.159.04), read without requiring NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVML is optional; fall through to the procfs file and then to the CUDA API number
        pass
    try:
        with open("/proc/driver/nvidia/version") as f:
            for word in f.readline().split():
                if word.count(".") >= 1 and word.replace(".", "").isdigit():
                    return word
    except OSError:
        pass
    import torch

    return f"cuda-api-{torch._C._cuda_getDriverVersion()}"
