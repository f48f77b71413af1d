"""What the geometry experiments measure with: the device context, checked launches of the geometry kernels
on chosen SMs, the pointer rings they chase, cold and flushed memory, and lines grouped by slice class.

A launch claims every SM and measures on the SMs given a row, all at once (probes.checked_launch: host
deadline, control block decoded into clear errors); the kernels are triton_kernels/geometry.py. Rings are
written on the GPU (write_ring, for footprints of many lines) or from the host (rings/write_words, for a few
lines, with the address every lane must end at, which the experiments check).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..layout import LINE_BYTES, LINE_WORDS

LANES = 128              # one warp, four chases per thread: 128 requests in flight per SM in the contention runs
TIMEOUT_S = 2.0          # the kernels' watchdog


@dataclass
class Context:
    """The device an experiment runs on (make_context): its index and torch.device, SM count, L2 size, each
    SM's L2 partition and the median SM clock from its calibration, and the calibration itself."""

    index: int
    device: object
    n_sm: int
    l2_bytes: int
    sm_partition: np.ndarray  # (n_sm,) 0/1 from the calibration (-1: undecided)
    clock_ghz: float
    calibration: object


def make_context(device=None) -> Context:
    """The suite's view of `device`: its SM count, L2 size and calibration (calibration_for: cached or measured)."""
    import torch

    from ..analysis.labels import sm_labels
    from ..device import device_info, resolve_device
    from ..measure.calibration import calibration_for

    index = resolve_device(device)
    info = device_info(index)
    topo = calibration_for(index)
    return Context(index=index, device=torch.device("cuda", index), n_sm=info.sm_count, l2_bytes=info.l2_bytes,
                   sm_partition=sm_labels(topo).partition, clock_ghz=float(np.median(topo.sm_clock_ghz)),
                   calibration=topo)


def _rows(ctx: Context, sms):
    """rows[sm] = r for the r-th SM of `sms`, -1 for SMs that only claim (on the device)."""
    from ..measure.probes import to_device

    rows = np.full(ctx.n_sm, -1, dtype=np.int32)
    rows[np.asarray(sms)] = np.arange(len(sms))
    return to_device(rows, ctx.device)


def _launch(ctx: Context, kernel: str, loads: int, args: tuple) -> None:
    """`kernel` on every SM at once (the SMs with a row measure), checked (probes.checked_launch)."""
    from ..measure.probes import checked_launch

    checked_launch(ctx.device, kernel, "triton", ctx.n_sm, ctx.n_sm, TIMEOUT_S, loads, args)


def run_offsets(ctx: Context, base: int, offsets: np.ndarray, sms) -> tuple[np.ndarray, np.ndarray]:
    """offsets_chase_kernel: SM sms[r] chases base + offsets[r, :] (one row per SM, all rows at once).
    Returns (cycles (n_rows, n_loads) float64, per_row (n_rows, 4): cycles, ns, start ns, end ns)."""
    import torch

    from ..measure.probes import to_device

    off = np.asarray(offsets, dtype=np.int64).reshape(len(sms), -1)
    n_rows, n = off.shape
    padded = np.concatenate([off, off[:, -1:]], axis=1)  # the read-ahead of the last load reads the padding
    cycles = torch.zeros((n_rows, n), dtype=torch.int32, device=ctx.device)
    per_row = torch.zeros((n_rows, 4), dtype=torch.int64, device=ctx.device)
    _launch(ctx, "offsets_chase", n, (base, to_device(padded, ctx.device), _rows(ctx, sms), cycles, per_row, n, 0))
    return cycles.cpu().numpy().astype(np.float64), per_row.cpu().numpy()


def run_lanes(ctx: Context, starts: np.ndarray, sms, n_warm: int, n_timed: int, lanes: int = LANES):
    """lanes_chase_kernel: SM sms[r] runs `lanes` pointer chases from starts[r]. Returns (n_rows, 5) int64:
    cycles, ns, start ns, end ns, XOR of the final addresses."""
    import torch

    from ..measure.probes import to_device

    starts = np.asarray(starts, dtype=np.int64).reshape(len(sms), lanes)
    out = torch.zeros((len(sms), 5), dtype=torch.int64, device=ctx.device)
    _launch(ctx, "lanes_chase", n_warm + n_timed, (to_device(starts.ravel(), ctx.device), _rows(ctx, sms), out,
                                                   n_warm, n_timed))
    return out.cpu().numpy()


def run_ring(ctx: Context, starts: np.ndarray, sms, n_warm: int, n_timed: int) -> np.ndarray:
    """ring_chase_kernel: SM sms[r] chases the ring from starts[r]. Returns (n_rows, 3) int64: cycles, ns, end."""
    import torch

    from ..measure.probes import to_device

    out = torch.zeros((len(sms), 3), dtype=torch.int64, device=ctx.device)
    _launch(ctx, "ring_chase", n_warm + n_timed, (to_device(np.asarray(starts, dtype=np.int64), ctx.device),
                                                  _rows(ctx, sms), out, n_warm, n_timed))
    return out.cpu().numpy()


def write_ring(words, n_lines: int, word: int, seed: int) -> int:
    """A random cyclic order of the first n_lines lines of `words` (an int64 CUDA tensor) through 8-byte word
    `word` of each line, built on the GPU. Returns the start address."""
    import torch

    g = torch.Generator(device=words.device).manual_seed(seed)
    order = torch.randperm(n_lines, device=words.device, generator=g)
    base = words.data_ptr() + 8 * word
    grid = words[: n_lines * LINE_WORDS].view(n_lines, LINE_WORDS)
    grid[order, word] = base + torch.roll(order, -1) * LINE_BYTES
    return int(base + int(order[0]) * LINE_BYTES)


class Flusher:
    """Evicts the L2 by reading a buffer of 4x its size (and keeps that buffer for the suite's lifetime)."""

    def __init__(self, ctx: Context):
        import torch

        self.buf = torch.ones(4 * ctx.l2_bytes // 4, dtype=torch.float32, device=ctx.device)

    def __call__(self):
        import torch

        self.buf.sum()
        torch.cuda.synchronize(self.buf.device)


def cold_buffer(ctx: Context, nbytes: int):
    """Memory never touched by a kernel since allocation (torch.empty writes nothing), pages already mapped."""
    import torch

    return torch.empty(nbytes, dtype=torch.uint8, device=ctx.device)


def rings(line_addr: np.ndarray, n_rows: int, lanes: int, seed: int):
    """Word w of every line points to word w of the next line of ring w (a random order of the lines, one per
    word). Returns (addresses, values) of the words to write, and after(steps): every lane's address after that
    many steps from its start (after(0): the starts)."""
    rng = np.random.default_rng(seed)
    m = line_addr.size
    at, val, orders = [], [], []
    for w in range(LINE_WORDS):
        order = rng.permutation(m)
        orders.append(order)
        at.append(line_addr[order] + 8 * w)
        val.append(line_addr[np.roll(order, -1)] + 8 * w)
    g = np.arange(n_rows * lanes)
    w, pos = g % LINE_WORDS, (g // LINE_WORDS) % m

    def after(steps):  # each lane's address after `steps` steps, (n_rows, lanes)
        return np.array([line_addr[orders[wi][(pi + steps) % m]] + 8 * wi
                         for wi, pi in zip(w, pos)]).reshape(n_rows, lanes)

    return np.concatenate(at), np.concatenate(val), after


def write_words(buf, addresses: np.ndarray, values: np.ndarray) -> None:
    import torch

    from ..measure.probes import to_device

    idx = (addresses - buf.data_ptr()) // 8
    buf.view(-1)[to_device(idx, buf.device)] = to_device(values, buf.device)
    torch.cuda.synchronize(buf.device)


def ring_through(buf, addrs: np.ndarray) -> int:
    """Word at addrs[i] of `buf` points to addrs[i + 1], the last to the first. Returns the start address."""
    write_words(buf, addrs, np.roll(addrs, -1))
    return int(addrs[0])


@dataclass(frozen=True, eq=False)
class SliceLines:
    """Consecutive lines of one buffer grouped in slice classes. buffer: the line buffer (an int64 CUDA tensor,
    probes.line_buffer); addresses: (n_lines,) each line's address; classes: slices.SliceClasses of the lines."""

    buffer: object
    addresses: np.ndarray
    classes: object

    def sets(self, most: int, power_of_two: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(one, spread): m lines of the largest class (the likeliest to share one L2 slice) and the first
        line of each of m classes, m = min(most, the largest class's size, the class count); with power_of_two
        rounded down to one (a lane count of tl.arange)."""
        labels, sizes = self.classes.labels, self.classes.sizes
        big = int(np.argmax(sizes))
        m = int(min(most, sizes[big], self.classes.count))
        if power_of_two:
            m = 1 << (m.bit_length() - 1)
        return (self.addresses[labels == big][:m],
                np.array([self.addresses[np.flatnonzero(labels == c)[0]] for c in range(m)]))


def slice_lines(ctx: Context, n_lines: int = 512, repeats: int = 3) -> SliceLines:
    """A buffer of n_lines consecutive lines, each SM's latency to each (probes.run_lines, the median of
    `repeats`), and the lines' slice classes (slices.slice_classes on that matrix)."""
    from ..analysis.slices import slice_classes
    from ..measure.probes import line_buffer, run_lines

    lines = line_buffer(n_lines, ctx.device)
    runs = run_lines(ctx.device, ctx.n_sm, n_lines, 2, 8, "triton", "waves", TIMEOUT_S, repeats, lines=lines)
    stack = np.stack([r.cycles for r in runs])
    noise = float(np.median(stack.std(axis=0, ddof=1))) if repeats > 1 else 0.5
    return SliceLines(lines, lines.data_ptr() + np.arange(n_lines, dtype=np.int64) * LINE_BYTES,
                      slice_classes(np.median(stack, axis=0), max(noise, 0.05)))
