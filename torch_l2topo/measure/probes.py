"""One Python API over both probe backends (Triton and the CUDA extension): buffers in, raw arrays out.

The kernels live in triton_kernels/l2_probes.py and cuda_ext/l2_probes.cu; this module builds their
buffers from a plan (rings.py), launches them (launch.py), waits with a host-side deadline, decodes
the control block into clear errors, and checks the invariants the kernels report (every SM claimed once,
every chase back where it started).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .. import layout as L
from ..errors import ProbeError, ProbeTimeout, check_choice
from .launch import BACKENDS, launch
from .rings import ChainPlan, line_offsets, ring_plan

# How many SMs measure at once. "serialized": one SM at a time, the reference (2.3 s on an H200).
# "waves": LINE_WORDS SMs at a time, each on its own ring (plans.py): within 0.05-0.11 cycles of serialized
# per SM on the H200, in 0.23 s. "concurrent": all SMs at once (0.1 s); SMs sharing a ring can trail each
# other, 0.17-0.28 cycles off serialized on a few SMs (benchmarks/bench_calibrate.py).
MODES = ("waves", "serialized", "concurrent")
DEFAULT_MODE = "waves"


def wave_size(mode: str, n_sm: int) -> int:
    check_choice("mode", mode, MODES)
    return {"serialized": 1, "waves": min(L.LINE_WORDS, n_sm), "concurrent": n_sm}[mode]


GRID_FACTOR = 4          # CTAs per SM launched: one wave of 1-warp CTAs, so every SM is offered several
HOST_SLACK_S = 5.0       # host deadline beyond the expected run time: launch, lazy module load
WORST_LOAD_S = 2e-6      # a pessimistic bound on one dependent L2 load, for the host deadline only


@dataclass(frozen=True)
class ProbeConfig:
    """What to measure. Defaults: 2 MiB ring (L2-resident on any cc >= 8.0 GPU), 512 consecutive lines.

    repeats=3 and the median: on one H200 a short disturbance shifted every SM of one wave by 0.6-1.1
    cycles in one of two repeats (GPU d00e55, benchmarks/bench_calibrate.py); the median of
    three drops it. chain_settle: warm loads before the timed pass, for every SM but those of the very first
    wave, which warm with a whole pass: that pass brings every line of the ring buffer into L2 for all rings
    at once, so the others only need their chase to settle.
    """

    chain_bytes: int = 2 << 20
    n_lines: int = 512
    line_warm: int = 2
    line_timed: int = 8
    repeats: int = 3
    seed: int = 0
    timeout_s: float = 2.0
    warmup_ms: float = 50.0
    chain_settle: int = 512

    def validate(self, l2_bytes: int | None = None) -> "ProbeConfig":
        for name in ("chain_bytes", "n_lines", "line_warm", "line_timed", "repeats", "seed", "chain_settle"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"{name} must be an integer, got {value!r}")
            low = 0 if name in ("line_warm", "seed", "chain_settle") else 1
            if value < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        for name in ("timeout_s", "warmup_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) \
                    or value < 0 or (name == "timeout_s" and value == 0):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if self.chain_bytes % L.LINE_BYTES or self.chain_bytes < 2 * L.LINE_BYTES:
            raise ValueError(f"chain_bytes must be a multiple of {L.LINE_BYTES} and at least two lines, "
                             f"got {self.chain_bytes}")
        if l2_bytes and self.chain_bytes > l2_bytes // 2:
            raise ValueError(f"chain_bytes={self.chain_bytes} is over half the L2 ({l2_bytes} bytes): the "
                             "ring would not stay L2-resident and the probe would measure DRAM")
        return self

    @property
    def chain_lines(self) -> int:
        return self.chain_bytes // L.LINE_BYTES


@dataclass(frozen=True)
class ChainResult:
    cycles: np.ndarray      # (n_sm,) clock64 cycles per load
    ns: np.ndarray          # (n_sm,) globaltimer ns per load
    start_ns: np.ndarray    # (n_sm,) %globaltimer when each SM's timed pass began
    elapsed_s: float        # host wall time of the launch, including the wait

    @property
    def clock_ghz(self) -> np.ndarray:
        """Each SM's clock during its timed pass: clock64 cycles / globaltimer ns."""
        return self.cycles / self.ns


@dataclass(frozen=True)
class LineResult:
    cycles: np.ndarray        # (n_sm, n_lines) clock64 cycles per load
    sm_clock_ghz: np.ndarray  # (n_sm,) clock64 cycles / globaltimer ns over each SM's whole run
    line_addresses: np.ndarray  # (n_lines,) virtual address of each probed line
    start_ns: np.ndarray      # (n_sm,) %globaltimer when each SM began
    elapsed_s: float


def wait_with_deadline(device, deadline_s: float, what: str) -> None:
    """Wait for the work queued so far on the current stream, polling, for at most deadline_s."""
    import torch

    done = torch.cuda.Event()
    done.record(torch.cuda.current_stream(device))
    start = time.monotonic()
    while not done.query():
        if time.monotonic() - start > deadline_s:
            raise ProbeTimeout(
                f"the {what} probe on cuda:{device.index} did not finish within {deadline_s:.1f} s: other work "
                "is occupying the GPU, so the probe's CTAs cannot start. The kernel stays queued and exits by "
                "its own watchdog once it runs; calibrate again when the GPU is free")
        time.sleep(2e-4)


def check_control(ctrl: np.ndarray, n_sm: int, timeout_s: float, what: str) -> None:
    """Turn the control block's error code and claims into a clear exception, or return if all is well."""
    code, detail = int(ctrl[L.ERROR]), int(ctrl[L.ERROR_DETAIL])
    claims = ctrl[L.CLAIMS:L.CLAIMS + n_sm]
    missing = np.flatnonzero(claims == 0).tolist()
    if code == L.ERR_SMID_RANGE:
        raise ProbeError(f"{what} probe: a CTA ran on SM id {detail}, but the device reports {n_sm} SMs "
                         "(%smid is not contiguous here: a MIG instance or a restricted context?). "
                         "Calibrate a full GPU")
    if code == L.ERR_BARRIER_TIMEOUT:
        raise ProbeError(f"{what} probe: only {detail} of {n_sm} SMs got a probe CTA within {timeout_s:g} s; "
                         f"SMs not reached: {_ids(missing)}. Other work is occupying them (another kernel or "
                         "process on this GPU)")
    if code == L.ERR_TURN_TIMEOUT:
        raise ProbeError(f"{what} probe: the waves stalled after {detail} SMs had measured, for over "
                         f"{timeout_s:g} s")
    if code != 0:
        raise ProbeError(f"{what} probe: unknown error code {code} (detail {detail})")
    if missing:
        raise ProbeError(f"{what} probe: no CTA measured SMs {_ids(missing)}")


def _ids(ids: list[int]) -> str:
    return ", ".join(map(str, ids[:16])) + (f" ... ({len(ids)} in all)" if len(ids) > 16 else "")


def host_deadline(per_sm_loads: int, n_sm: int, wave: int, timeout_s: float) -> float:
    loads = per_sm_loads * -(-n_sm // wave)
    return loads * WORST_LOAD_S + timeout_s + HOST_SLACK_S


def to_device(a: np.ndarray, device):
    """A host array as a tensor on `device`. To a GPU: pinned and non-blocking, since a pageable copy would
    block the host behind any work queued on the GPU, and the host-side deadline could never fire. Any other
    device (host-side tests, classification on the CPU): a plain copy."""
    import torch

    t = torch.from_numpy(np.ascontiguousarray(a))
    if torch.device(device).type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def checked_launches(device, kernel: str, backend: str, n_sm: int, wave: int, timeout_s: float,
                     per_sm_loads: int, repeats: int, kernel_args, *, measuring_sms: int | None = None):
    """Launch `kernel` (a name in launch.KERNELS on the claim protocol: its arguments are a control block, the
    kernel's own, then n_sm, wave, timeout_ns) `repeats` times on one control block; yield each launch's host
    wall time once it finished within its deadline and its control block shows every SM claimed without
    error. kernel_args(r): the kernel's own arguments for launch r (or a tuple, the same for every launch).
    per_sm_loads: dependent loads of one measuring SM (the host deadline); measuring_sms: how many SMs measure
    (default n_sm), in waves of `wave`. The one launch-and-check sequence of every probe."""
    import torch

    ctrl = torch.zeros(L.control_words(n_sm), dtype=torch.int64, device=device)
    deadline = host_deadline(per_sm_loads, n_sm if measuring_sms is None else measuring_sms, wave, timeout_s)
    what = kernel.removesuffix("_probe")
    for r in range(repeats):
        args = kernel_args(r) if callable(kernel_args) else kernel_args
        ctrl.zero_()
        t0 = time.perf_counter()
        launch(kernel, backend, GRID_FACTOR * n_sm, ctrl, *args, n_sm, wave, int(timeout_s * 1e9))
        wait_with_deadline(device, deadline, what)
        elapsed = time.perf_counter() - t0
        check_control(ctrl.cpu().numpy(), n_sm, timeout_s, what)
        yield elapsed


def checked_launch(device, kernel: str, backend: str, n_sm: int, wave: int, timeout_s: float, per_sm_loads: int,
                   kernel_args: tuple, *, measuring_sms: int | None = None) -> float:
    """One launch of checked_launches: its host wall time."""
    elapsed, = checked_launches(device, kernel, backend, n_sm, wave, timeout_s, per_sm_loads, 1, kernel_args,
                                measuring_sms=measuring_sms)
    return elapsed


def run_chain(device, n_sm: int, plan: ChainPlan, backend: str, mode: str, timeout_s: float,
              repeats: int = 1, settle: int | None = None) -> list[ChainResult]:
    """`repeats` launches of the chain probe over one ring: warm loads and a timed pass on every SM each.

    In the first launch, the first SM of each ring (or the whole first wave, if larger) warms with a whole
    pass, which brings every word of the buffer into L2; every other SM makes `settle` warm loads (default: a
    whole pass too)."""
    import torch

    check_choice("backend", backend, BACKENDS)
    wave = wave_size(mode, n_sm)
    ring = torch.zeros(plan.n_lines * L.LINE_WORDS, dtype=torch.int64, device=device)
    base = ring.data_ptr()
    words = np.zeros((plan.n_lines, L.LINE_WORDS), dtype=np.int64)
    for r in range(plan.n_rings):  # word r of line i points to word r of the line after i in ring r
        words[:, r] = base + plan.successor[r] * L.LINE_BYTES + r * 8
    ring.copy_(to_device(words.ravel(), device))
    starts = to_device(base + plan.start_line * L.LINE_BYTES + plan.start_ring * 8, device)
    out = torch.zeros(n_sm * L.OUT_WORDS, dtype=torch.int64, device=device)
    results = []
    settle = plan.n_lines if settle is None else settle

    n_first = min(n_sm, max(wave, plan.n_rings))

    def args(r):
        return starts, out, plan.n_lines, plan.n_lines if r == 0 else settle, n_first, settle

    for elapsed in checked_launches(device, "chain_probe", backend, n_sm, wave, timeout_s, 2 * plan.n_lines,
                                    repeats, args):
        o = out.view(n_sm, L.OUT_WORDS).cpu().numpy()
        broken = np.flatnonzero(o[:, 2] != 0).tolist()
        if broken:
            raise ProbeError(f"chain probe: the chase did not return to its start on SMs {_ids(broken)}: the "
                             "ring was corrupted or a load returned wrong data")
        results.append(ChainResult(cycles=o[:, 0] / plan.n_lines, ns=o[:, 1] / plan.n_lines, start_ns=o[:, 3],
                                   elapsed_s=elapsed))
    return results


def line_buffer(n_lines: int, device):
    """A buffer of `n_lines` 128-byte lines, each holding its own address in its first word."""
    import torch

    lines = torch.zeros(n_lines * L.LINE_WORDS, dtype=torch.int64, device=device)
    lines.view(n_lines, L.LINE_WORDS)[:, 0] = to_device(_line_addresses(lines), device)
    return lines


def _line_addresses(lines) -> np.ndarray:
    return lines.data_ptr() + line_offsets(lines.numel() // L.LINE_WORDS)


def run_lines(device, n_sm: int, n_lines: int, n_warm: int, n_timed: int, backend: str, mode: str,
              timeout_s: float, repeats: int = 1, lines=None) -> list[LineResult]:
    """`repeats` launches of the line probe over one buffer: every SM times loads of each of `n_lines` lines.

    lines: a buffer from line_buffer() to probe (e.g. one that kernels will localize against later);
    default a fresh one.
    """
    import torch

    check_choice("backend", backend, BACKENDS)
    wave = wave_size(mode, n_sm)
    if lines is None:
        lines = line_buffer(n_lines, device)
    elif lines.numel() != n_lines * L.LINE_WORDS:
        raise ValueError(f"the line buffer holds {lines.numel() // L.LINE_WORDS} lines, not {n_lines}")
    addresses = _line_addresses(lines)
    cycles = torch.zeros(n_sm * n_lines, dtype=torch.int64, device=device)
    per_sm = torch.zeros(n_sm * L.OUT_WORDS, dtype=torch.int64, device=device)
    results = []
    for elapsed in checked_launches(device, "line_probe", backend, n_sm, wave, timeout_s,
                                    n_lines * (n_warm + n_timed), repeats, (lines, cycles, per_sm, n_lines, n_warm,
                                                                            n_timed)):
        s = per_sm.view(n_sm, L.OUT_WORDS).cpu().numpy()
        broken = np.flatnonzero(s[:, 2] != 0).tolist()
        if broken:
            raise ProbeError(f"line probe: a self-pointing line returned another address on SMs {_ids(broken)}")
        results.append(LineResult(cycles=cycles.view(n_sm, n_lines).cpu().numpy() / n_timed,
                                  sm_clock_ghz=s[:, 0] / np.maximum(s[:, 1], 1), line_addresses=addresses,
                                  start_ns=s[:, 3], elapsed_s=elapsed))
    return results


def warm_clocks(device, ms: float) -> None:
    """Keep every SM busy for about `ms` milliseconds so the SM clock leaves its idle state first."""
    import torch

    if ms <= 0:
        return
    a = torch.randn(2048, 2048, device=device, dtype=torch.float16)
    start = time.perf_counter()
    while (time.perf_counter() - start) * 1e3 < ms:
        for _ in range(8):  # ~17 GFLOP a product: each batch is a few hundred microseconds of work
            a = a @ a
            a = a / a.abs().amax().clamp_min(1)
        torch.cuda.synchronize(device)


def measure(device, n_sm: int, config: ProbeConfig, backend: str, mode: str):
    """Warm the clocks, then run the chain and line probes `config.repeats` times each.

    Returns (list[ChainResult], list[LineResult]) in run order.
    """
    warm_clocks(device, config.warmup_ms)
    plan = ring_plan(config.chain_lines, n_sm, config.seed)
    chains = run_chain(device, n_sm, plan, backend, mode, config.timeout_s, config.repeats, config.chain_settle)
    lines = run_lines(device, n_sm, config.n_lines, config.line_warm, config.line_timed, backend, mode,
                      config.timeout_s, config.repeats)
    return chains, lines
